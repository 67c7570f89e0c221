"""A local file written whole or not at all, through :class:`wds_async._atomic.AtomicFile`: a temporary file
beside it (``.NAME.<random>.wds-partial``), fsynced and renamed on ``close()``, unlinked by ``abort()``. A reader
never sees half a shard, and a crash leaves at most a partial file, never a short ``PATH``. A target that exists
and is not a regular file (``/dev/null``, a FIFO) is written in place: there is nothing to rename over it.
"""

from __future__ import annotations

import os
import stat
from contextlib import suppress
from typing import IO

from ..._atomic import AtomicFile
from ...backends.file import file_identity, local_path
from ...errors import BackendError, NotFound, PermissionDenied
from ...io import ObjectIdentity
from ...urls import redact_url

__all__ = ["LocalSink"]


def _os_error(exc: OSError, doing: str, url: str) -> BackendError:
    if isinstance(exc, FileNotFoundError):
        return NotFound(f"cannot {doing}: its directory does not exist", url=url)
    if isinstance(exc, PermissionError):
        return PermissionDenied(f"permission denied: cannot {doing}", url=url)
    return BackendError(f"cannot {doing}: {exc.strerror or exc}", url=url)


class LocalSink:
    """A :class:`~wds_async.write.sinks.Sink` for a local path or ``file://`` URL (see the module docstring)."""

    def __init__(self, url: str) -> None:
        self.url = redact_url(url)
        self.path = local_path(url)
        self.identity: ObjectIdentity | None = None
        self.closed = False
        try:
            special = not stat.S_ISREG(os.stat(self.path).st_mode)
        except OSError:
            special = False
        self._atomic: AtomicFile | None = None
        try:
            if special:
                self._file: IO[bytes] | AtomicFile = open(self.path, "wb")  # noqa: SIM115
            else:
                self._file = self._atomic = AtomicFile(self.path)
        except OSError as exc:
            raise _os_error(exc, "create the file", self.url) from None
        #: Where the bytes go until ``close()``; None when the target is written in place.
        self.partial: str | None = self._atomic.path if self._atomic is not None else None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        try:
            return self._file.write(data)
        except ValueError:  # closed
            raise BackendError("write to a closed sink", url=self.url) from None
        except OSError as exc:
            error = _os_error(exc, "write the file", self.url)
        self.abort()
        raise error

    def flush(self) -> None:
        with suppress(ValueError):
            self._file.flush()

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._atomic is not None:
                self._atomic.commit()
            else:
                self._file.flush()
                self._file.close()  # type: ignore[union-attr]
            st = os.stat(self.path) if self._atomic is not None else None
        except OSError as exc:
            error = _os_error(exc, "finish the file", self.url)
        except BaseException:
            self.abort()
            raise
        else:
            self.closed, self.identity = True, ObjectIdentity() if st is None else file_identity(st)
            return
        self.abort()
        raise error

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        with suppress(OSError):
            if self._atomic is not None:
                self._atomic.discard()
            else:
                self._file.close()  # type: ignore[union-attr]
