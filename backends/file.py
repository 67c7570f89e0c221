"""Local files: bare paths and ``file://`` URLs.

Files are read in chunks of ``chunk_bytes`` (1 MiB by default). The blocking work goes through aiofiles
(:mod:`wds_async._aio`): the open, and every chunk that is not in the page cache, each one hop to the
loop's default executor, whose threads are reused. A chunk whose first and last bytes are in the page
cache (a ``preadv(RWF_NOWAIT)`` probe, Linux) is read on the loop with no thread at all: that is not
blocking I/O, and doing it through aiofiles measured far over the 5% the project allows
(``python -m benchmarks.file_io``, 16 files x 32 MiB, 8 readers, one uvloop, 2 cores: page-cached reads
with a hop per chunk ran at 0.53-0.77x the MB/s for 1.7-2.2x the CPU s/GB). This backend beside the
executor-only path it replaced: page-cached 0.98x MB/s, 1.02x CPU; evicted from the page cache (31
interleaved rounds) 1.02x MB/s, 1.02x CPU, where two copies of the same code differed by 1.02x and 0.99x.

Reads name their offset (``pread``), so a range starts with no seek, and a file opened for reading is closed
on the loop (:func:`~wds_async._aio.close_reader`). A random-access read of one 64 KiB range in the page cache
used to make three hops (the open, a seek, the close) and now makes one: 391 against 235-296 us of CPU per
sample, 2,615-2,698 against 3,500-4,490 samples/s (``IndexedWebDataset`` over local shards, 4,000 random
samples in batches of 64, one process).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import unquote, urlsplit

from aiofiles.threadpool.binary import AsyncFileIO

from wds_async._aio import Inflight, close_reader, open_file
from wds_async.errors import BackendError, NotFound, PermissionDenied, UrlError
from wds_async.io.backend import ByteStream, Capabilities, ObjectIdentity

__all__ = ["FileBackend", "file_identity", "local_path"]


def local_path(url: str) -> str:
    """The filesystem path of a bare path or ``file://`` URL."""
    if url.startswith("file://"):
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise UrlError(f"file:// URLs name local files only, not host {parts.netloc!r}", url=url)
        path = unquote(parts.path)
    elif url.startswith("file:"):
        path = url[len("file:"):]
    else:
        path = url
    if not path:
        raise UrlError("empty file path", url=url)
    return os.path.expanduser(path)


def file_identity(st: os.stat_result) -> ObjectIdentity:
    """A local file's identity, from its ``stat``: its size and modification time (what a read of it reports, what
    ``wds-async index`` records and what a writer of it commits)."""
    return ObjectIdentity(size=st.st_size, last_modified=str(st.st_mtime_ns))


def _open_error(exc: OSError, url: str) -> BackendError:
    if isinstance(exc, FileNotFoundError):
        return NotFound("no such file; check the path and the brace pattern", url=url)
    if isinstance(exc, PermissionError):
        return PermissionDenied("permission denied reading the file", url=url)
    if isinstance(exc, IsADirectoryError):
        return BackendError("is a directory, not a shard file", url=url)
    return BackendError(f"cannot read file: {exc.strerror or exc}", url=url)


_NOWAIT = getattr(os, "RWF_NOWAIT", None)


def _cached(fd: int, pos: int, n: int) -> bool:
    """True when the first and last bytes of ``[pos, pos + n)`` are in the page cache (Linux ``preadv``
    with ``RWF_NOWAIT`` reads them without blocking, or fails). Such a chunk is read on the loop: a thread
    pool hop per chunk cost 1588 against 2157 MB/s on 1 MB samples in the page cache (benchmarks/cpu.py).
    Readahead keeps ranges contiguous, so a page evicted in the middle is rare; it would block the loop for
    one read."""
    if _NOWAIT is None or n <= 0:
        return False
    probe = bytearray(1)
    try:
        return os.preadv(fd, [probe], pos, _NOWAIT) == 1 and os.preadv(fd, [probe], pos + n - 1, _NOWAIT) == 1
    except OSError:
        return False


_PREAD = getattr(os, "pread", None)


def _read_at(fd: int, n: int, pos: int) -> bytes:
    """Up to ``n`` bytes of ``fd`` at ``pos``: ``pread`` (the file's offset is not used, so a range starts with
    no seek); a seek and a read where the platform has no ``pread``."""
    if _PREAD is not None:
        return _PREAD(fd, n, pos)
    os.lseek(fd, pos, os.SEEK_SET)
    return os.read(fd, n)


def _glob_files(path: str) -> list[str]:
    """The regular files matching ``path`` (``**`` recursive), sorted; run in a thread, as it stats each match."""
    import glob

    return sorted(m for m in glob.glob(path, recursive=True) if os.path.isfile(m))


class FileBackend:
    """Streams local files in large chunks; opens and page-cache misses run through aiofiles."""

    def __init__(self, *, chunk_bytes: int = 1 << 20) -> None:
        self.chunk_bytes = chunk_bytes
        #: One read in flight per open file, counted in the engine's budget while the file is open.
        self.capabilities = Capabilities(listing=True, buffer_allowance=chunk_bytes, local_reads=True)

    @asynccontextmanager
    async def open(self, url: str, *, start: int = 0, end: int | None = None) -> AsyncIterator[ByteStream]:
        try:
            f = await open_file(local_path(url), "rb")
        except OSError as exc:
            raise _open_error(exc, url) from None
        calls = Inflight()
        try:
            st = os.fstat(f.fileno())  # the inode the open just read: no disk access
            stream = ByteStream(self._chunks(f, calls, url, start, end), start=start, identity=file_identity(st))
            try:
                yield stream
            finally:
                await stream.aclose()
        finally:
            await close_reader(f, calls)

    async def _chunks(self, f: AsyncFileIO, calls: Inflight, url: str, start: int, end: int | None
                      ) -> AsyncIterator[bytes]:
        # Reads name their offset (pread): a range starts without a seek, which would be one more thread hop.
        pos = start
        fd = f.fileno()
        loop = asyncio.get_running_loop()
        while end is None or pos < end:
            want = self.chunk_bytes if end is None else min(self.chunk_bytes, end - pos)
            try:
                if _cached(fd, pos, want):
                    chunk = _read_at(fd, want, pos)  # from the page cache: cheaper than a thread hop
                    cached = True
                else:
                    chunk = await calls.run(loop.run_in_executor(None, _read_at, fd, want, pos))
                    cached = False
            except OSError as exc:
                raise BackendError(f"read failed: {exc.strerror or exc}", url=url, offset=pos) from None
            if not chunk:
                break
            pos += len(chunk)
            yield chunk
            if cached:
                await asyncio.sleep(0)  # a read that did not suspend: let the loop's other tasks run

    async def size(self, url: str) -> int | None:
        try:
            return os.stat(local_path(url)).st_size
        except OSError as exc:
            raise _open_error(exc, url) from None

    async def list(self, pattern: str) -> list[str]:
        """Local glob (``*`` within a directory, ``**`` across), sorted; keeps the ``file://`` form."""
        files = await asyncio.to_thread(_glob_files, local_path(pattern))
        prefix = "file://" if pattern.startswith("file://") else ""
        return [prefix + m for m in files]

    async def aclose(self) -> None:
        return None
