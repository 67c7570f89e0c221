"""The file-level pieces of the shard cache (:mod:`wds_async.cache.disk`): per-shard locks, quiet removal, use
stamps and sizes, and the rules every file of the cache is opened by. Blocking calls: the cache runs them in
threads, or where a stat costs nothing.

No name in the cache directory is trusted to be what it says (see "Security" in :mod:`wds_async.cache.disk`):

* an existing entry is opened with ``O_NOFOLLOW`` (a symbolic link fails with ``ELOOP``) and ``O_NONBLOCK`` (a
  FIFO cannot hang the open), then ``fstat``-ed: anything but a regular file owned by this process's user is
  refused (:func:`open_entry`, :func:`try_lock`);
* a file the cache writes is created under a name just unlinked, with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and
  mode 0600 (:func:`create_new`): a link or file planted there makes the create fail, never writes through;
* stamps and sizes never follow links (:func:`touch`, :func:`size_or_minus_one`); unlinking a link removes the
  link, not its target.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import time

__all__ = ["IDENTITY_FIELDS", "META_MAX_BYTES", "META_VERSION", "RefusedEntry", "create_new", "directory_problem",
           "is_cache_name", "open_entry", "open_lock", "refused", "size_or_minus_one", "size_or_zero", "touch", "try_lock",
           "unlink", "unlock", "writable"]

#: The version of a copy's metadata file; another version is never trusted.
META_VERSION = 1

#: The most bytes of a copy's metadata read (a few hundred are written): a larger file is not ours to parse.
META_MAX_BYTES = 64 << 10

#: The ObjectIdentity fields a copy's metadata records.
IDENTITY_FIELDS = ("size", "etag", "generation", "last_modified")
#: A name the cache gives its files: 16 hex digits, a dot, the object's base name (and a suffix). Inspection and
#: eviction touch no other name, so a wrong ``DIR`` given to ``cache clear`` removes nothing of anyone's.
_CACHE_NAME = re.compile(r"[0-9a-f]{16}\.[\w.-]+\Z")
#: Flags every open of an existing entry adds: never through a link, never blocking on a FIFO, not inherited.
_EXISTING = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def is_cache_name(name: str) -> bool:
    """True for a name the cache could have made (a copy, its metadata, ``.part``, ``.lock``, ``.json.tmp``)."""
    return _CACHE_NAME.match(name) is not None


class RefusedEntry(PermissionError):
    """An entry of the cache directory that is not a regular file of ours (a link, a FIFO, another user's file)."""


def _check_ours(fd: int, path: str) -> None:
    """Raise :class:`RefusedEntry` unless ``fd`` is a regular file owned by this process's (effective) user."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise RefusedEntry(errno.EPERM, "not a regular file", path)
    if st.st_uid != os.geteuid():
        raise RefusedEntry(errno.EPERM, f"a file of another user (uid {st.st_uid})", path)


def refused(exc: OSError) -> bool:
    """True when ``exc`` says an entry is not a regular file of ours (:class:`RefusedEntry`, or ``ELOOP``: a
    link met by an ``O_NOFOLLOW`` open), as opposed to a directory the cache cannot write."""
    return isinstance(exc, RefusedEntry) or exc.errno == errno.ELOOP


def open_entry(path: str, flags: int = os.O_RDONLY) -> int:
    """An fd on the existing entry ``path``, which must be a regular file of ours (not a link, a FIFO, a device,
    another user's file); OSError otherwise."""
    fd = os.open(path, flags | _EXISTING)
    try:
        _check_ours(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def create_new(path: str) -> int:
    """A new, empty file at ``path`` (mode 0600), open for writing; FileExistsError when anything (a link
    included) is there already."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def directory_problem(path: str) -> tuple[str, bool] | None:
    """Why the existing ``path`` must not hold this user's cache, or None when it may, as (the reason, whether
    ``chmod`` by its owner fixes it). Refused: a directory of another user, one writable by other users (the
    sticky bit does not help: they could still plant names the cache has not created yet), a symbolic link
    another user owns (they could point it anywhere later; root's links are trusted). FileNotFoundError when
    there is nothing at ``path``."""
    me = os.geteuid()
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        return f"is a symbolic link owned by another user (uid {link.st_uid})", False
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory", False
    if st.st_uid != me:
        return f"is owned by another user (uid {st.st_uid}; this process runs as uid {me})", False
    if st.st_mode & stat.S_IWOTH:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})", True
    return None


def writable(path: str) -> bool:
    """Whether this process may create and remove files in the directory ``path`` (its effective ids)."""
    return os.access(path, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids)


def open_lock(path: str) -> int:
    """An fd on the lock file ``path`` (created, mode 0600, if missing; not locked yet). OSError when ``path`` is
    a link or anything but a regular file of ours: lock files are never removed (see ``ShardCache.clear``), so
    one planted there is refused, not replaced."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | _EXISTING, 0o600)
    try:
        _check_ours(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def try_lock(path: str) -> int | None:
    """An fd holding an exclusive ``flock`` on ``path`` (created, mode 0600, if missing), or None when another
    open file description holds it; OSError as :func:`open_lock`."""
    fd = open_lock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the description releases the flock


def unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def touch(target: str | int) -> None:
    """Mark a copy as used now (``target``: its metadata's open fd, or its path, whose link is never followed),
    with the clock's nanoseconds: the kernel stamps files from a coarse clock (a few ms), too coarse to order
    uses that close together. Quiet when it cannot (a read-only cache)."""
    now = time.time_ns()
    with contextlib.suppress(OSError):
        if isinstance(target, int):
            os.utime(target, ns=(now, now))
        else:
            os.utime(target, ns=(now, now), follow_symlinks=False)


def size_or_minus_one(path: str) -> int:
    """The size of the entry ``path`` itself (a link's own, never its target's); -1 when there is none."""
    try:
        return os.lstat(path).st_size
    except OSError:
        return -1


def size_or_zero(path: str) -> int:
    return max(0, size_or_minus_one(path))
