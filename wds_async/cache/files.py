"""The file-level pieces of the shard cache (:mod:`wds_async.cache.disk`): per-shard locks, quiet removal, use
stamps and sizes. Blocking calls: the cache runs them in threads, or where a stat costs nothing."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time

__all__ = ["IDENTITY_FIELDS", "META_VERSION", "size_or_minus_one", "size_or_zero", "touch", "try_lock", "unlink",
           "unlock"]

#: The version of a copy's metadata file; another version is never trusted.
META_VERSION = 1
#: The ObjectIdentity fields a copy's metadata records.
IDENTITY_FIELDS = ("size", "etag", "generation", "last_modified")


def try_lock(path: str) -> int | None:
    """An fd holding an exclusive ``flock`` on ``path`` (created if missing), or None when another open
    file description holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
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


def touch(path: str) -> None:
    """Mark a copy as used now, with the clock's nanoseconds: the kernel stamps files from a coarse clock
    (a few ms), too coarse to order uses that close together."""
    now = time.time_ns()
    with contextlib.suppress(OSError):
        os.utime(path, ns=(now, now))


def size_or_minus_one(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def size_or_zero(path: str) -> int:
    return max(0, size_or_minus_one(path))
