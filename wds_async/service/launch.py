"""Starting a node service from Python, for launchers: ``start_service(...) -> ServiceHandle``.

The service runs as a subprocess (``python -m wds_async.cli.main serve ...``, the same interpreter), so it
outlives no one by accident: :meth:`ServiceHandle.stop` sends SIGTERM (then SIGKILL after a grace period)
and the handle is a context manager. :func:`start_service` returns once the service answers a ``status``
request on its socket, or raises :class:`~wds_async.errors.ServiceError` with the tail of its stderr.

    with wds_async.service.start_service(socket="/tmp/wds-$USER/job.sock") as svc:
        subprocess.run(["torchrun", ..., "train.py"], env={**os.environ, **svc.env})
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any

from ..errors import ServiceError
from .client import service_status
from .paths import default_socket_path

if TYPE_CHECKING:
    from typing import Self

__all__ = ["ServiceHandle", "start_service"]


class ServiceHandle:
    """A service subprocess: its ``socket`` path, ``url`` (``unix://...``) and ``process``."""

    def __init__(self, process: subprocess.Popen[bytes], socket: str, log_path: str) -> None:
        self.process = process
        self.socket = socket
        self.url = "unix://" + socket
        self._log_path = log_path

    @property
    def env(self) -> dict[str, str]:
        """The environment that makes every ``WebDataset`` of a child process a client of this service."""
        return {"WDS_ASYNC_SERVICE": self.url}

    @property
    def pid(self) -> int:
        return self.process.pid

    def status(self) -> dict[str, Any]:
        """The service's ``status`` answer (see :func:`~wds_async.service.client.service_status`)."""
        return service_status(self.socket)

    def stderr_tail(self, limit: int = 3000) -> str:
        try:
            with open(self._log_path, "rb") as fh:
                return fh.read()[-limit:].decode(errors="replace")
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL; return the exit status."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        try:
            os.unlink(self._log_path)
        except OSError:
            pass
        return self.process.returncode

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _answers_as(path: str, pid: int) -> bool:
    """True when the service answering at ``path`` is process ``pid`` (not another one already there)."""
    try:
        return bool(service_status(path, timeout=5.0)["pid"] == pid)
    except ServiceError:
        return False


def start_service(socket: str | None = None, *, max_connections: int | str = "auto",
                  node_buffered_bytes: int | str | None = None, ring_bytes: int | str | None = None,
                  cache_dir: str | None = None, cache_size: int | str | None = None, verbose: bool = False,
                  timeout: float = 60.0, env: dict[str, str] | None = None, no_pipe: bool = False,
                  max_clients: int | None = None, handshake_timeout: float | None = None,
                  cwd: str | None = None) -> ServiceHandle:
    """Start ``wds-async serve`` as a subprocess and wait until it answers (see the module docstring).
    ``no_pipe``, ``max_clients``, ``handshake_timeout``: ``--no-pipe``, ``--max-clients``,
    ``--handshake-timeout``; ``cwd``: the service's working directory (default: this process's)."""
    full_env = {**os.environ, **(env or {})}
    path = os.path.abspath(socket or default_socket_path(environ=full_env))
    args = [sys.executable, "-m", "wds_async.cli.main"] + (["-v"] if verbose else []) + [
        "serve", "--socket", path, "--max-connections", str(max_connections)]
    for flag, value in (("--node-buffered-bytes", node_buffered_bytes), ("--ring-bytes", ring_bytes),
                        ("--cache-dir", cache_dir), ("--cache-size", cache_size), ("--max-clients", max_clients),
                        ("--handshake-timeout", handshake_timeout)):
        if value is not None:
            args += [flag, str(value)]
    if no_pipe:
        args.append("--no-pipe")
    fd, log_path = tempfile.mkstemp(prefix="wds-async-serve-", suffix=".log")
    with os.fdopen(fd, "wb") as log:
        process = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   env=full_env, cwd=cwd)
    handle = ServiceHandle(process, path, log_path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = handle.stderr_tail()
            handle.stop()
            raise ServiceError(f"the wds-async service exited with status {process.returncode} at start: {tail}",
                               url=path)
        if os.path.exists(path) and _answers_as(path, process.pid):
            return handle
        time.sleep(0.05)
    handle.stop()
    raise ServiceError(f"the wds-async service did not answer within {timeout:.0f} s", url=path)
