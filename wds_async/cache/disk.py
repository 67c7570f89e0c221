"""The shard cache on local disk: each remote shard downloaded once per node, read from disk afterwards.

``WebDataset(urls, cache_dir=DIR, cache_size=BYTES)`` (webdataset's option names; ``WDS_ASYNC_CACHE_DIR`` and
``WDS_ASYNC_CACHE_SIZE`` when not given) hands the engine a :class:`ShardCache`. For every work item of a
remote shard (``http(s)``, ``s3``, ``gs``, ``az``; local files and ``pipe:`` are never cached) the engine asks
:meth:`ShardCache.open_item`:

* **Hit.** A complete copy is on disk. Unless ``validate=False``, one 1-byte ranged read asks the store for the
  object's current identity (size, ETag, generation, Last-Modified); a copy of another version is dropped and
  the shard refetched. The copy is then read through the file backend's reader (page-cache reads on the loop,
  others off it), reporting the *store's* identity, so an index's or checkpoint's identity check still holds.
  Items starting mid-shard (resume) or covering a byte range (index shares) read their range of the copy.
* **Fill.** No copy, and the item is a whole shard: the process takes the shard's file lock and the engine
  writes every byte it receives to ``NAME.part`` *while* it parses them (no second download; ranged parts
  arrive in order, so they fill the file like one stream). Only when the whole object has arrived, its byte
  count equals the size the store announced and every request saw one identity (the reader refuses to
  splice versions) is the file renamed into place, then its metadata (``NAME.json``, written to a temporary
  name and renamed) makes it trusted. A process that dies at any point leaves at most a ``.part`` file or a
  data file without metadata; neither is ever read, and both are swept later. A full disk abandons the fill
  and the shard keeps streaming from the store.
  The copy is not fsynced, as in webdataset's, litdata's and MosaicML streaming's caches: a sync per shard
  made the first epoch 1.6x longer here (0.92 -> 1.5 s for 537 MB: the disk, not the network, set the pace),
  and what it guards against, a power loss before the kernel wrote the file back, leaves on ext4 (data=ordered)
  a file shorter than its metadata says, which a lookup refuses (the size is checked on every open).
* **Another process is filling it** (a rank or DataLoader worker on this node; ``fcntl.flock`` on
  ``NAME.lock``, released by the kernel if that process dies): wait while its ``.part`` file grows, then read
  the copy. If it stops growing for ``stall_seconds`` (1 s; a fill writes what it received at least every half
  second), that process is blocked, most often on its own consumer: read the shard from the store without caching
  it. The wait is short because such a block is usually a wait on *this* process: DataLoader workers hand their
  batches to the main process in turn, and ranks meet at every all-reduce, so a filler whose consumer waits for
  this process's samples fills its byte budget and stops, and neither moves until the waiter gives up.
* **Anything else** (a partial item that is not cached, a shard larger than ``max_bytes``): the store.
* **A directory this user cannot write** (read-only, on a read-only file system, or one that cannot be created):
  copies already in it are still read; every other shard is read from the store, with one warning per process
  naming the directory, not one per shard.
* **A damaged copy.** A copy is checked for its size and metadata on every open, not for its bytes. A format
  error met while reading one (the engine is told by the item's ``local`` flag) drops it (:meth:`ShardCache.drop`)
  and the rest of the item is read from the store once; the next whole read of the shard caches it again.

Eviction is least-recently-used by bytes: a hit touches the metadata file's mtime; before a fill and after a
commit, under ``DIR/.evict.lock``, the oldest complete copies are removed until the copies plus the partial
files on disk plus the incoming shard fit in ``max_bytes`` (None: no limit, as webdataset's default). An
evicted copy that a reader has open stays readable (POSIX unlink); it is gone for the next lookup.

Here: the directory's layout, lookups and locks (:class:`ShardCache`). Eviction and inspection (what the
directory holds) are in :mod:`wds_async.cache.inventory`, the objects the engine reads through in
:mod:`wds_async.cache.items`, the file-level helpers in :mod:`wds_async.cache.files`.

Names are ``<16 hex of sha256(url)>.<basename>``: the URL with its secrets removed (a presigned URL's
signature changes, its object does not), hashed so that any URL is a safe, distinct file name.

Security. The names are predictable, so whoever can create entries in the directory could plant a link at
``NAME.part`` or ``NAME.json.tmp`` (the cache would write shard bytes through it, as root over a root-only file)
or a forged copy at ``NAME`` (read as the shard). Hence:

* **The directory must be this user's alone.** Before its first use in a process (and when a dataset is made,
  if the directory exists), :meth:`ShardCache.check_directory` raises :class:`UnsafeCacheDirectory` when it is
  owned by another user, is writable by other users (``o+w``, sticky bit or not; ``chmod 700 DIR`` fixes it),
  or is a symbolic link owned by another user (root's links are trusted). A directory the cache creates gets
  mode 0700; an existing one of ours with mode 0755 (or group-writable) is accepted. ``wds-async cache`` applies
  the same rule.
* **No entry is followed or trusted unless it is a regular file of ours** (:mod:`wds_async.cache.files`): files
  the cache writes (``.part``, ``.json.tmp``) are created with ``O_EXCL | O_NOFOLLOW`` (mode 0600) after the
  name is unlinked; copies, metadata and locks are opened with ``O_NOFOLLOW`` and checked with ``fstat``; a link,
  a FIFO, another user's file is treated as no copy at all (the shard is fetched and the entry replaced; a lock
  that is not ours leaves that shard uncached, with a warning). Eviction counts and removes only regular files
  with the cache's names; ``cache clear`` removes only entries with the cache's names, and removing a link
  never touches what it points to.

What is not defended: a parent directory of the cache writable by another user without the sticky bit (they
could swap the whole path), and members of a group given write access (``g+w``) to the directory, who can
remove entries (never make the cache trust theirs).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import hashlib
import json
import logging
import os
import time
from typing import Any

from .._aio import in_thread_or_undo
from ..config import RetryPolicy
from ..errors import WdsError
from ..io import Backend, ObjectIdentity
from ..node import parse_bytes
from ..stats import Stats
from ..urls import redact_url, scheme_of
from . import inventory
from .files import (
    IDENTITY_FIELDS,
    META_MAX_BYTES,
    META_VERSION,
    directory_problem,
    open_entry,
    refused,
    size_or_minus_one,
    touch,
    try_lock,
    unlink,
    unlock,
    writable,
)
from .inventory import CacheEntry
from .items import FILL_WRITE_BYTES, CacheFill, CacheHit, Prechecks, store_identity

__all__ = ["FILL_WRITE_BYTES", "CacheEntry", "CacheFill", "CacheHit", "Prechecks", "ShardCache",
           "UnsafeCacheDirectory", "make_cache"]

log = logging.getLogger("wds_async")

#: Schemes whose objects are cached: those read over the network. Local files are already on disk, and a
#: ``pipe:`` command has no identity to check a copy against.
CACHED_SCHEMES = frozenset({"http", "https", "s3", "gs", "az", "azure"})


class UnsafeCacheDirectory(WdsError, ValueError):
    """The cache directory could let another user plant files or links in it (see "Security" in the module
    docstring): it is another user's, writable by other users, or a link another user owns."""


def _name_for(url: str) -> str:
    shown = redact_url(url)
    digest = hashlib.sha256(shown.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    base = shown.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    base = "".join(c if c.isalnum() or c in "._-" else "_" for c in base)[-80:] or "object"
    return f"{digest}.{base}"


def make_cache(cache_dir: str | os.PathLike[str] | None, cache_size: int | str | None, *,
               validate: bool = True) -> ShardCache | None:
    """The dataset's cache from webdataset's options and the environment (see ``WebDataset``'s docstring);
    None when there is none. Checks the options now; the directory is created on first use."""
    env = os.environ.get
    if cache_dir is None:
        cache_dir = env("WDS_ASYNC_CACHE_DIR") or env("WDS_CACHE") or None
    if cache_dir is None or os.fspath(cache_dir) == "":
        return None
    if cache_size is None:
        cache_size = env("WDS_ASYNC_CACHE_SIZE") or env("WDS_CACHE_SIZE") or None
    if isinstance(cache_size, str):
        text = cache_size.strip()
        cache_size = int(text) if text.lstrip("-").isdigit() else parse_bytes(text, "cache_size")
    if cache_size is not None and (isinstance(cache_size, bool) or not isinstance(cache_size, int)):
        raise ValueError(f"cache_size must be a number of bytes, a size such as '200GB', or -1, not {cache_size!r}")
    if cache_size == 0:
        return None
    cache = ShardCache(cache_dir, None if cache_size is None or cache_size < 0 else cache_size, validate=validate)
    if os.path.exists(cache.directory) and not os.path.isdir(cache.directory):
        raise ValueError(f"cache_dir {cache.directory} exists and is not a directory")
    cache.check_directory()
    return cache


#: How long a process waits for another's fill of a shard that makes no progress before it reads the shard from
#: the store itself (see "Another process is filling it" in the module docstring).
STALL_SECONDS = 1.0


class ShardCache:
    """A cache directory shared by the processes of one node (see the module docstring).

    Only plain settings live here, so a dataset holding one pickles into spawned DataLoader workers.
    """

    def __init__(self, directory: str | os.PathLike[str], max_bytes: int | None = None, *, validate: bool = True,
                 stall_seconds: float = STALL_SECONDS) -> None:
        self.directory = os.path.abspath(os.path.expanduser(os.fspath(directory)))
        if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
            raise ValueError(f"cache_size must be a positive number of bytes or None (no limit), got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.validate = validate
        self.stall_seconds = stall_seconds
        self._ready_pid = 0  # the process that created and checked the directory (once per process)
        self._writable = True  # in that process: False once the directory proved read-only (hits only)
        self._warned = False  # in that process: the one warning about a read-only directory was given

    def __repr__(self) -> str:
        return f"ShardCache({self.directory!r}, max_bytes={self.max_bytes}, validate={self.validate})"

    # -- paths ----------------------------------------------------------------------------------------
    def cacheable(self, url: str) -> bool:
        """True for the URLs this cache keeps: objects read over the network."""
        return scheme_of(url) in CACHED_SCHEMES

    def path(self, url: str, suffix: str = "") -> str:
        """Where the copy of ``url`` lives (``suffix``: ``.json``, ``.part``, ``.lock``)."""
        return os.path.join(self.directory, _name_for(url) + suffix)

    def check_directory(self) -> None:
        """Raise :class:`UnsafeCacheDirectory` when the directory, if it exists, could let another user plant
        files or links in it (see "Security" in the module docstring)."""
        try:
            found = directory_problem(self.directory)
        except FileNotFoundError:
            return
        if found is None:
            return
        problem, by_chmod = found
        remedy = (f"run `chmod 700 {self.directory}` (or `chmod o-w`), or pass another cache_dir" if by_chmod else
                  f"pass a cache_dir of your own (or set WDS_ASYNC_CACHE_DIR), and remove {self.directory} if "
                  "nobody should have created it")
        raise UnsafeCacheDirectory(f"refusing the cache directory {self.directory}: it {problem}, so another user "
                                   f"could plant links or files there for the cache to write through or read as "
                                   f"shards; {remedy}")

    def ensure_directory(self) -> str | None:
        """Create the directory (mode 0700) if it is missing and check it (:meth:`check_directory`, which may
        raise); return why nothing can be written in it (copies in it are still read), or None."""
        try:
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
        except OSError as exc:
            if os.path.lexists(self.directory):
                self.check_directory()  # a link or directory planted there outranks the error
            return f"cannot create it ({exc.strerror or exc})"
        self.check_directory()  # after the create: whoever made the directory, it is checked as found
        if not writable(self.directory):
            return "it is not writable by this user"
        return None

    def _process_state(self) -> None:
        """Forget what another process (the parent of a fork) learnt of the directory."""
        if self._ready_pid != os.getpid():
            self._writable, self._warned = True, False

    def read_only(self, why: str) -> None:
        """Stop filling the cache in this process (its copies are still read); one warning per process."""
        self._writable = False
        if not self._warned:
            self._warned = True
            log.warning("cache: nothing can be written in the cache directory %s: %s; shards not cached there "
                        "are read from the store", self.directory, why)

    def cannot_fill(self, url: str, exc: OSError, doing: str) -> None:
        """Filling ``url`` failed on ``exc`` while ``doing`` it: a directory this user may not write (or a
        read-only file system) stops every later fill in this process, with one warning; an entry of the shard
        that is not a regular file of ours (:func:`~wds_async.cache.files.refused`), a full disk or any other
        error concerns this shard alone (one warning for it)."""
        if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and not refused(exc):
            self.read_only(exc.strerror or str(exc))
            return
        if exc.errno == errno.ENOSPC:
            why = "the disk is full"
        else:
            why = f"{doing} failed: {exc.strerror or exc}" + (f" ({exc.filename})" if exc.filename else "")
        log.warning("cache: not caching %s: %s; it is read from the store", redact_url(url), why)

    # -- the engine's entry point ---------------------------------------------------------------------
    async def open_item(self, url: str, *, whole: bool, backend: Backend, policy: RetryPolicy,
                        stats: Stats | None = None, prechecks: Prechecks | None = None
                        ) -> CacheHit | CacheFill | None:
        """What the engine reads ``url`` from: a copy (:class:`CacheHit`), the store while filling the cache
        (:class:`CacheFill`, only when ``whole``), or the store alone (None)."""
        if self._ready_pid != os.getpid():
            self._process_state()
            why = await asyncio.to_thread(self.ensure_directory)
            self._ready_pid = os.getpid()
            if why is not None:
                self.read_only(why)
        stalled_since: float | None = None
        seen = -1
        while True:
            hit = await self._hit(url, backend, policy, stats, prechecks)
            if hit is not None or not whole or not self._writable:
                return hit
            try:
                fill = await in_thread_or_undo(functools.partial(self._take_lock, url), _release_fill)
            except OSError as exc:
                self.cannot_fill(url, exc, "locking it")
                return None
            if fill is _RETRY:
                continue
            if fill is not None:
                return fill
            # Another process fills this shard: wait while its partial file grows, then look again.
            size = await asyncio.to_thread(size_or_minus_one, self.path(url, ".part"))
            now = time.monotonic()
            if size != seen or stalled_since is None:
                seen, stalled_since = size, now
            elif now - stalled_since >= self.stall_seconds:
                log.info("cache: %s has been filled by another process without progress for %.1f s; reading "
                         "it from the store", redact_url(url), self.stall_seconds)
                if stats is not None:
                    stats.cache_bypasses += 1
                return None
            await asyncio.sleep(0.1)

    async def _hit(self, url: str, backend: Backend, policy: RetryPolicy, stats: Stats | None,
                   prechecks: Prechecks | None = None) -> CacheHit | None:
        found = await in_thread_or_undo(functools.partial(self._open_copy, url), _close_copy)
        if found is None:
            return None
        fd, identity = found
        try:
            if self.validate:
                current = await (prechecks.identity(url, backend) if prechecks is not None else
                                 store_identity(backend, url, policy, stats))
                conflict = identity.conflicts_with(current)
                if conflict:
                    log.info("cache: %s changed in the store (%s); refetching it", redact_url(url), conflict)
                    os.close(fd)
                    await asyncio.to_thread(self.drop, url)
                    return None
        except BaseException:
            os.close(fd)
            raise
        if stats is not None:
            stats.cache_hits += 1
        return CacheHit(self, fd, identity, self.path(url))

    def _open_copy(self, url: str) -> tuple[int, ObjectIdentity] | None:
        """The open data file and recorded identity of a complete copy, touching it as recently used. Its data
        and metadata must be regular files of ours, never links (:func:`~wds_async.cache.files.open_entry`)."""
        meta_fd = fd = -1
        try:
            meta_fd = open_entry(self.path(url, ".json"))
            with open(meta_fd, "rb", closefd=False) as fh:
                meta = json.loads(fh.read(META_MAX_BYTES))
            identity = ObjectIdentity(**{k: meta.get(k) for k in IDENTITY_FIELDS})
            fd = open_entry(self.path(url))
            if meta.get("version") != META_VERSION or os.fstat(fd).st_size != identity.size:
                raise ValueError("not what was committed")  # a truncated copy, another format: never trusted
            touch(meta_fd)
        except (OSError, ValueError, TypeError, AttributeError):
            if fd >= 0:
                os.close(fd)
            return None
        finally:
            if meta_fd >= 0:
                os.close(meta_fd)
        return fd, identity

    def _take_lock(self, url: str) -> CacheFill | None:
        fd = try_lock(self.path(url, ".lock"))
        if fd is None:
            return None
        try:
            found = self._open_copy(url)
            if found is not None:  # committed while we waited: read it instead
                os.close(found[0])
                unlock(fd)
                return _RETRY
            self.drop(url)  # whatever is there is not a complete copy (cut short, metadata lost): replaced
            return CacheFill(self, url, fd)
        except BaseException:
            unlock(fd)
            raise

    def drop(self, url: str) -> bool:
        """Forget the copy of ``url``: metadata first, so the data is untrusted before it goes. False when it
        could not be removed (a read-only directory): it stays, and is checked as any copy on its next use."""
        try:
            unlink(self.path(url, ".json"))
            unlink(self.path(url))
        except OSError as exc:
            log.debug("cache: cannot remove the copy of %s: %s", redact_url(url), exc)
            return False
        return True

    # -- eviction and inspection (see inventory.py) ---------------------------------------------------
    def make_room(self, incoming: int, keep: str | None = None) -> bool:
        """Evict least recently used copies until they, the partial files and ``incoming`` bytes fit in
        ``max_bytes``. False when ``incoming`` alone (plus copies that cannot go) is too large."""
        return inventory.make_room(self.directory, self.max_bytes, incoming, keep)

    def entries(self) -> list[CacheEntry]:
        """The complete copies, most recently used first."""
        return inventory.entries(self.directory)

    def usage(self) -> dict[str, int]:
        """Bytes and counts: complete copies, and partial files (fills in progress or left by a crash)."""
        return inventory.usage(self.directory)

    def clear(self) -> tuple[int, int]:
        """Remove what :func:`~wds_async.cache.inventory.clear` removes; return (files, bytes) freed."""
        return inventory.clear(self.directory)


#: ``_take_lock``'s answer when the copy was committed while it waited: look it up again.
_RETRY: Any = object()


def _release_fill(fill: CacheFill | None) -> None:
    """Undo a lock taken for a caller that was cancelled meanwhile (:func:`~wds_async._aio.in_thread_or_undo`): a
    lock left held would make every later fill of the shard in this process wait ``stall_seconds`` for a
    filler that is gone."""
    if isinstance(fill, CacheFill):
        unlock(fill.lock_fd)
        fill.lock_fd = -1


def _close_copy(found: tuple[int, ObjectIdentity] | None) -> None:
    """Close a copy opened for a caller that was cancelled meanwhile."""
    if found is not None:
        os.close(found[0])
