"""What a cache directory holds: its copies and partial files, eviction by least recent use, listing, clearing.

The functions take the directory of a :class:`~wds_async.cache.disk.ShardCache` (whose methods call them) and
touch only regular files of this user with the names the cache makes (:func:`~wds_async.cache.files.is_cache_name`):
never a link, another user's file, or a name the cache would not make. Eviction runs under ``DIR/.evict.lock``, so
the processes of a node evict one at a time.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
from dataclasses import dataclass

from ..io import ObjectIdentity
from .files import (
    IDENTITY_FIELDS,
    META_MAX_BYTES,
    is_cache_name,
    open_entry,
    open_lock,
    size_or_zero,
    try_lock,
    unlink,
    unlock,
)

__all__ = ["CacheEntry", "clear", "entries", "make_room", "scan", "usage"]

log = logging.getLogger("wds_async")


@dataclass(frozen=True)
class CacheEntry:
    """One complete copy on disk (what ``wds-async cache ls`` prints)."""

    name: str
    url: str
    size: int
    last_used: float
    identity: ObjectIdentity


def scan(directory: str) -> tuple[list[tuple[float, str, int]], list[int]]:
    """Complete copies as (last used, name, size), and the sizes of partial files. Only regular files of
    ours with the cache's names count (never a link, another user's file, a name the cache would not make)."""
    copies, partial = [], []
    me = os.geteuid()
    try:
        with os.scandir(directory) as found:
            entries = {}
            for e in found:
                if is_cache_name(e.name):
                    with contextlib.suppress(FileNotFoundError):
                        st = e.stat(follow_symlinks=False)
                        if stat.S_ISREG(st.st_mode) and st.st_uid == me:
                            entries[e.name] = st
    except FileNotFoundError:
        return [], []
    for name, st in entries.items():
        if name.endswith(".json") and name[:-5] in entries:
            copies.append((st.st_mtime, name[:-5], entries[name[:-5]].st_size))
        elif name.endswith(".part"):
            partial.append(st.st_size)
    return copies, partial

def make_room(directory: str, max_bytes: int | None, incoming: int, keep: str | None = None) -> bool:
    """Evict least recently used copies until they, the partial files and ``incoming`` bytes fit in
    ``max_bytes``. False when ``incoming`` alone (plus copies that cannot go) is too large."""
    if max_bytes is None:
        return True
    if incoming > max_bytes:
        return False
    lock = open_lock(os.path.join(directory, ".evict.lock"))
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        copies, partial = scan(directory)
        total = sum(partial) + incoming + sum(size for _, _, size in copies)
        for _, name, size in sorted(copies):
            if total <= max_bytes:
                break
            if name == keep:
                continue
            unlink(os.path.join(directory, name + ".json"))
            unlink(os.path.join(directory, name))
            total -= size
            log.debug("cache: evicted %s (%d bytes)", name, size)
        return total <= max_bytes
    finally:
        os.close(lock)

def entries(directory: str) -> list[CacheEntry]:
    """The complete copies, most recently used first."""
    out = []
    for last_used, name, size in sorted(scan(directory)[0], reverse=True):
        try:
            with open(open_entry(os.path.join(directory, name + ".json")), "rb") as fh:
                meta = json.loads(fh.read(META_MAX_BYTES))
            identity = ObjectIdentity(**{k: meta.get(k) for k in IDENTITY_FIELDS})
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        out.append(CacheEntry(name, str(meta.get("url", "?")), size, last_used, identity))
    return out

def usage(directory: str) -> dict[str, int]:
    """Bytes and counts: complete copies, and partial files (fills in progress or left by a crash)."""
    copies, partial = scan(directory)
    return {"copies": len(copies), "bytes": sum(size for _, _, size in copies), "partial_files": len(partial),
            "partial_bytes": sum(partial)}

def clear(directory: str) -> tuple[int, int]:
    """Remove every complete copy, every untrusted leftover (data without metadata, temporary metadata, an
    entry that is not a regular file) and every partial file no process is filling; return (files, bytes)
    freed. Only names the cache makes are touched (:func:`~wds_async.cache.files.is_cache_name`): another
    directory given by mistake loses nothing. Fills in progress go on and commit their copies when done.
    Lock files stay: removing one while a process opens it could let two processes hold "the" lock on two
    files."""
    files = freed = 0
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return 0, 0
    present = set(names)
    for name in names:
        path = os.path.join(directory, name)
        if not is_cache_name(name) or name.endswith(".lock") or not _removable(path):
            continue  # not the cache's, a lock (kept), gone already, or a directory (the cache makes none)
        if name.endswith(".part"):
            try:
                fd = try_lock(os.path.join(directory, name[:-5] + ".lock"))
            except OSError:
                continue  # its lock cannot be taken (not ours, or a read-only directory)
            if fd is None:
                continue  # a fill in progress
            try:
                size = size_or_zero(path)
                unlink(path)
            finally:
                unlock(fd)
        elif name.endswith(".json") and name[:-5] in present:
            continue  # removed with its data file
        else:
            size = size_or_zero(path)
            if name.endswith(".json") or name.endswith(".json.tmp") or name + ".json" not in present:
                unlink(path)  # leftovers: metadata without data, or data never committed
            else:
                _drop_name(directory, name)
        files, freed = files + 1, freed + size
    return files, freed

def _drop_name(directory: str, name: str) -> None:
    unlink(os.path.join(directory, name + ".json"))
    unlink(os.path.join(directory, name))


def _removable(path: str) -> bool:
    """True when ``path`` is there and is no directory (a file, a link, a FIFO: ``unlink`` removes the name)."""
    try:
        return not stat.S_ISDIR(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False
