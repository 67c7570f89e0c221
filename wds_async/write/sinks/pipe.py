"""The sink of ``pipe:CMD`` for writers: the command's stdin (see :class:`PipeSink`). ``open_sink`` does not
take ``pipe:`` URLs (a command is not a store); ``TarWriter``/``ShardWriter`` use this class directly."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from contextlib import suppress
from typing import IO, Any

from ...backends.pipe import pipe_command, pipes_allowed
from ...errors import BackendError, NotFound, PipeError, UrlError

__all__ = ["PipeSink"]

#: The bytes of the command's stderr an error message quotes.
_STDERR_TAIL = 2048


class PipeSink:
    """The stdin of ``pipe:CMD``; ``close()`` waits for the command and raises unless it exited 0.

    Waiting is the point for a writer: only the exit status says that an upload or a compressor finished.
    """

    def __init__(self, url: str) -> None:
        if not pipes_allowed():
            raise UrlError("pipe: URLs are disabled (WDS_ASYNC_NO_PIPE is set)", url=url)
        cmd = pipe_command(url)
        self.url, self._stopped_reading, self._done = url, False, False
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed when the command is reaped)
        try:
            # Its own process group, so that abort() reaches the command itself and not only the shell.
            self._proc = subprocess.Popen(cmd, shell=True, stdin=subprocess.PIPE, stderr=self._stderr,
                                          start_new_session=True)
        except OSError as exc:
            self._stderr.close()
            raise BackendError(f"cannot start the shell for the pipe: command: {exc}", url=url) from None
        assert self._proc.stdin is not None
        self._stdin: IO[bytes] = self._proc.stdin

    def write(self, data: Any) -> int:
        try:
            return self._stdin.write(data)
        except BrokenPipeError:
            self._stopped_reading = True
        error = self._finish()
        assert error is not None  # a command that stopped reading is always an error
        raise error

    def flush(self) -> None:
        with suppress(BrokenPipeError):
            self._stdin.flush()

    def abort(self) -> None:
        """Kill the command so that it never commits a half-written archive."""
        if not self._done:
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, signal.SIGKILL)
            self._finish()

    def close(self) -> None:
        error = self._finish()
        if error is not None:
            raise error

    def _finish(self) -> PipeError | NotFound | None:
        """Close stdin, reap the command, and describe its failure (once; later calls return None)."""
        if self._done:
            return None
        self._done = True
        try:
            try:
                self._stdin.close()
            except BrokenPipeError:
                self._stopped_reading = True
            returncode = self._proc.wait()
            self._stderr.seek(max(0, self._stderr.seek(0, os.SEEK_END) - _STDERR_TAIL))
            tail = self._stderr.read().decode("utf-8", "replace").strip()
        finally:
            self._stderr.close()
        if returncode == 0 and not self._stopped_reading:
            return None
        what = f"exited with status {returncode}"
        if returncode < 0:
            what = f"killed by signal {-returncode}"
            with suppress(ValueError):
                what = f"killed by {signal.Signals(-returncode).name}"
        message = f"pipe: command {what}" + (" before reading all its input" if self._stopped_reading else "")
        message += f"; stderr: {tail}" if tail else ""
        if returncode == 127:
            return NotFound(message, url=self.url)
        return PipeError(message, url=self.url, returncode=returncode, stderr_tail=tail)
