"""The one way the library writes a local file so that it appears whole or not at all.

The bytes go to a temporary file beside the target (same directory, so the final ``os.replace`` is an atomic
rename within one file system), created exclusively (``O_EXCL``: an existing name is an error, never
overwritten or followed); only :meth:`AtomicFile.commit` makes the target appear, complete (and, unless
``durable=False``, on disk: fsync before the rename). :meth:`AtomicFile.discard`, or leaving ``with`` without a
commit, removes the temporary file. A crash leaves at most one named ``.<target name>.<random>.wds-partial``:
a dot first, so a glob for ``*.tar`` never matches it, and :func:`is_partial` recognises it for a sweep.

:class:`AtomicFile` is the blocking writer (local shard sinks, the index, the bench's progress files);
:class:`wds_async._aio.AsyncFileWriter` is the same rule driven from the event loop (``wds-async cp``'s local
destinations). The shard cache names its partial files after the shard instead (``NAME.part``), because the
other processes of the node watch that one file grow while a shard is filled (see :mod:`wds_async.cache`).
"""

from __future__ import annotations

import os
import secrets
from types import TracebackType
from typing import IO, Self

__all__ = ["PARTIAL_SUFFIX", "AtomicFile", "is_partial", "partial_path"]

#: The ending of every temporary file written on the way to a target.
PARTIAL_SUFFIX = ".wds-partial"


def partial_path(target: str | os.PathLike[str]) -> str:
    """A fresh temporary name beside ``target`` (see the module docstring)."""
    directory, name = os.path.split(os.path.abspath(os.fspath(target)))
    return os.path.join(directory, f".{name}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}")


def is_partial(name: str) -> bool:
    """True for the name of a temporary file of :class:`AtomicFile` or ``AsyncFileWriter``."""
    base = os.path.basename(name)
    return base.startswith(".") and base.endswith(PARTIAL_SUFFIX)


class AtomicFile:
    """A local file written under a temporary name and renamed onto ``target`` by :meth:`commit`.

    ``durable``: fsync before the rename (the default; a file that only signals progress to another process
    needs no sync). Errors are the ``OSError`` of the failing call; the temporary file is gone after any of them
    that :meth:`commit` or :meth:`write` raise once :meth:`discard` ran (``with`` does that).
    """

    def __init__(self, target: str | os.PathLike[str], *, durable: bool = True) -> None:
        self.target = os.fspath(target)
        self.durable = durable
        #: The temporary file, which exists from construction until :meth:`commit` or :meth:`discard`.
        self.path = partial_path(self.target)
        self._file: IO[bytes] | None = open(self.path, "xb")  # noqa: SIM115 (closed by commit or discard)

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if self._file is None:
            raise ValueError(f"{self.target}: the file was already committed or discarded")
        return self._file.write(data)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def commit(self) -> None:
        """Make ``target`` the complete file (flush, fsync when durable, close, rename)."""
        f = self._file
        if f is None:
            raise ValueError(f"{self.target}: the file was already committed or discarded")
        f.flush()
        if self.durable:
            os.fsync(f.fileno())
        self._file = None
        f.close()
        os.replace(self.path, self.target)

    def discard(self) -> None:
        """Remove the temporary file (nothing to do after a commit)."""
        f, self._file = self._file, None
        if f is None:
            return
        try:
            f.close()
        finally:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.discard()
