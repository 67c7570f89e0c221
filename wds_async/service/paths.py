"""Where a node service listens, and who may talk to it.

The socket path is the service's namespace: two jobs on one node reach two services when their paths
differ. The default is ``service-{job}.sock`` in ``$XDG_RUNTIME_DIR/wds-async/`` (else
``/tmp/wds-async-{uid}/``), where ``job`` is ``WDS_ASYNC_JOB``, else torchrun's ``TORCHELASTIC_RUN_ID``,
else ``default``. The service creates the directory with mode 0700 (and refuses one that another user
owns), the socket with mode 0600, and checks every peer's uid
(``SO_PEERCRED``): only the user who started the service can connect.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Mapping

from ..errors import ServiceError

__all__ = ["ENV_SERVICE", "default_socket_path", "peer_uid", "prepare_directory", "resolve_service"]

#: ``WebDataset(service=None)`` reads this: ``unix://PATH`` or ``auto``.
ENV_SERVICE = "WDS_ASYNC_SERVICE"
#: Unix socket paths are limited to 107 bytes on Linux.
MAX_PATH = 107


def default_socket_path(job: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The socket of this job's service (see the module docstring), read from ``environ`` (default: this
    process's environment)."""
    env = os.environ if environ is None else environ
    job = job or env.get("WDS_ASYNC_JOB") or env.get("TORCHELASTIC_RUN_ID") or "default"
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in job)
    runtime = env.get("XDG_RUNTIME_DIR")
    directory = os.path.join(runtime, "wds-async") if runtime else f"/tmp/wds-async-{os.getuid()}"
    return os.path.join(directory, f"service-{safe}.sock")


def resolve_service(spec: str | None) -> str | None:
    """``service=`` of a dataset: None (then ``WDS_ASYNC_SERVICE``, else in-process), ``"auto"``, or
    ``"unix://PATH"``; returns None, ``"auto"`` or the absolute socket path. ValueError for anything else."""
    if spec is None:
        spec = os.environ.get(ENV_SERVICE, "").strip() or None
        if spec is None:
            return None
    if spec == "auto":
        return "auto"
    if not isinstance(spec, str) or not spec.startswith("unix://") or len(spec) == len("unix://"):
        raise ValueError(f"service={spec!r}: expected None, 'auto' or 'unix://PATH' (a node service's socket, "
                         "see `wds-async serve --help`)")
    return os.path.abspath(spec[len("unix://"):])


def check_length(path: str) -> None:
    if len(os.fsencode(path)) > MAX_PATH:
        raise ServiceError(f"the socket path is {len(os.fsencode(path))} bytes long, more than a Unix socket "
                           f"allows ({MAX_PATH}); choose a shorter --socket path", url=path)


def prepare_directory(path: str) -> None:
    """Create the socket's directory with mode 0700, or check that an existing one belongs to this user."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError as exc:
        raise ServiceError(f"cannot create the service's directory {directory}: {exc}", url=path) from exc
    info = os.stat(directory)
    if info.st_uid != os.getuid():
        raise ServiceError(f"the directory {directory} belongs to uid {info.st_uid}, not to this user; choose "
                           "another --socket path", url=path)
    # An existing directory of ours keeps its mode (it may be a home directory): the socket's own mode 0600
    # and the peer check keep other users out there.


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
