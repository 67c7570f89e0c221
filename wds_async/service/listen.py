"""The node service's listening socket: bound once per socket path, refused connections told why.

:func:`bind` makes the socket a service listens on and takes its lock file; :func:`unbind` removes both when the
service stops; :func:`refuse` tells one accepted connection why it is turned away and closes it. The accept loop
and its counts stay with :class:`~wds_async.service.server.Service`, which knows the sessions.

Invariants:

* One service per socket path: the lock file beside the socket is held (``flock``, released by the kernel if the
  process dies) for the service's whole life, and a socket file that something still answers on is never
  replaced. A socket file nobody answers on (its service died without removing it) is.
* The socket is born mode 0600 (the umask is set around ``bind``), so there is no moment where another user may
  connect; :mod:`wds_async.service.paths` makes the directory private.
* Refusing never waits: the ``error`` frame is sent on a non-blocking socket, best effort, then it is closed.
"""

from __future__ import annotations

import fcntl
import os
import socket

from ..errors import ServiceError
from .paths import prepare_directory
from .protocol import encode, error_to_json

__all__ = ["bind", "refuse", "unbind"]


def bind(path: str) -> tuple[socket.socket, int]:
    """The listening socket at ``path`` (mode 0600, non-blocking) and the held lock file's descriptor;
    :class:`~wds_async.errors.ServiceError` if a service is alive on it."""
    prepare_directory(path)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(lock)
        raise ServiceError("a wds-async service is already running on this socket; stop it first or choose "
                           "another --socket (each job needs its own)", url=path) from None
    try:
        if os.path.exists(path):
            if _answers(path):
                raise ServiceError("a wds-async service already answers on this socket; stop it first or "
                                   "choose another --socket", url=path)
            os.unlink(path)  # stale: its service died without removing it
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)  # the socket is born 0600: no moment where others may connect
        try:
            listener.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        listener.listen(128)
        listener.setblocking(False)
    except BaseException:
        os.close(lock)
        raise
    return listener, lock


def unbind(path: str, listener: socket.socket, lock: int) -> None:
    """Close the listening socket, remove the socket and lock files, release the lock."""
    listener.close()
    for name in (path, path + ".lock"):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass
    os.close(lock)


def refuse(conn: socket.socket, path: str, message: str) -> None:
    """Tell a connection to the service at ``path`` that it is refused (an ``error`` frame, best effort, never
    waiting) and close it."""
    error = ServiceError(f"the wds-async service at {path} refused this connection: {message}", url=path)
    try:
        conn.setblocking(False)
        conn.send(encode({"type": "error", "error": error_to_json(error)}))
    except OSError:
        pass
    finally:
        conn.close()


def _answers(path: str) -> bool:
    """True when something accepts connections on the Unix socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2.0)
    try:
        probe.connect(path)
        return True
    except OSError:
        return False
    finally:
        probe.close()
