"""The shared-memory ring a service session writes sample bytes into and its client reads them from.

The ring is one anonymous shared file (``memfd_create``), mapped by both processes: the service passes its
descriptor to the client with ``SCM_RIGHTS``, so only that client can map it, and it vanishes with the last
process holding it. A field's bytes are copied once into the ring by the service and once out of it, into
``bytes``, by the client; the socket carries only their offsets.

**Sealed.** The client holds a descriptor of the very file the service has mapped. Were it to shrink the
file (``ftruncate``), the service's next write into the mapping would touch pages that no longer exist and
the kernel would kill the whole service with SIGBUS, every other client with it. So the ring is created
with ``MFD_ALLOW_SEALING``, sized, then sealed with ``F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL``: its
size can never change again, by anyone (``ftruncate`` fails with EPERM), and the seals cannot be removed.
:class:`Ring` reads the seals back (``F_GET_SEALS``) and refuses to serve from a file without them; there
is no unsealed fallback (a plain file in ``/dev/shm`` cannot be sealed), so a kernel without sealing
(before Linux 3.17) cannot run the service. Files of one sample (:func:`one_shot`) are written with
``pwrite``, never mapped by the service, and need no seal.

Space is handed out in order, as one contiguous block per sample (the fields of a sample lie end to end);
a block that would cross the ring's end starts at offset 0 instead and the skipped tail counts as used.
``head`` and ``tail`` count bytes since the start (they never wrap): ``head - tail`` are in use. The client
acknowledges, in order, the bytes of each batch it has copied out (:meth:`Ring.ack`), and nothing is
written over bytes not yet acknowledged. **Invariant:** ``0 <= head - tail <= size``.

A sample larger than half the ring (:meth:`Ring.fits`) never waits for room (it might never get it while
the ring is fragmented): it goes alone in a file of its own (:func:`one_shot`), passed with its frame and
closed by the client after reading, so a large sample costs one extra file, never an error. Half, not the
whole ring, so that a block always fits once the ring is empty, wherever ``head`` stands.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import tempfile

from ..errors import ServiceError

__all__ = ["SEALS", "Ring", "RingReader", "one_shot", "sealed_file", "shared_file"]

#: The seals every ring carries: its size is fixed for good (see the module docstring).
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def shared_file(size: int, name: str = "wds-async-ring") -> int:
    """A descriptor of a new anonymous shared file of ``size`` bytes (close-on-exec), not sealed."""
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None:
        try:
            fd = memfd(name, getattr(os, "MFD_CLOEXEC", 1))
        except OSError:
            fd = -1
    else:
        fd = -1
    if fd < 0:
        directory = "/dev/shm" if os.path.isdir("/dev/shm") else None
        fd, path = tempfile.mkstemp(prefix=name + "-", dir=directory)
        os.unlink(path)  # only descriptors keep it now: it goes with the last of them
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        raise
    return fd


def sealed_file(size: int, name: str = "wds-async-ring") -> int:
    """A new memfd of ``size`` bytes whose size no one can change (:data:`SEALS`, checked); ServiceError when
    this kernel cannot seal one. OSError (EMFILE, ENOMEM) passes through."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        try:
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
        except OSError as exc:
            raise ServiceError(f"cannot seal the shared-memory ring ({exc}): this kernel lacks memfd seals "
                               "(Linux >= 3.17), which the service needs so that no client can resize "
                               "memory the service writes into") from None
        if seals & SEALS != SEALS:
            raise ServiceError(f"the shared-memory ring carries seals {seals:#x}, not {SEALS:#x}: refusing to "
                               "serve from memory a client could resize")
    except BaseException:
        os.close(fd)
        raise
    return fd


class Ring:
    """The service side: allocation of ring space and the bytes written into it (see module docstring)."""

    def __init__(self, size: int) -> None:
        if size < 4096:
            raise ValueError(f"ring_bytes must be at least 4096, got {size}")
        self.size = size
        self.fd = sealed_file(size)
        self._map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.head = 0
        self.tail = 0

    @property
    def used(self) -> int:
        return self.head - self.tail

    def fits(self, nbytes: int) -> bool:
        """True when a block of ``nbytes`` goes into the ring (else it travels in a file of its own)."""
        return nbytes <= self.size // 2

    def allocate(self, nbytes: int) -> tuple[int, int] | None:
        """``(offset, consumed)`` of a new block of ``nbytes`` (``consumed`` includes a skipped tail), or None
        when the unacknowledged bytes leave no room for it now."""
        at = self.head % self.size
        skip = self.size - at if at + nbytes > self.size else 0
        if self.used + skip + nbytes > self.size:
            return None
        self.head += skip + nbytes
        return (0 if skip else at), skip + nbytes

    def write(self, offset: int, data: bytes) -> None:
        """Copy ``data`` into the ring at ``offset`` (inside a block from :meth:`allocate`)."""
        self._map[offset:offset + len(data)] = data

    def ack(self, nbytes: int) -> None:
        """The client copied out the next ``nbytes``: they may be written again."""
        if nbytes < 0 or self.tail + nbytes > self.head:
            raise ServiceError(f"the client acknowledged {nbytes} ring bytes but only {self.used} are in use")
        self.tail += nbytes

    def close(self) -> None:
        """Unmap and close the descriptor (the client's mapping, if any, stays valid until it unmaps)."""
        if self.fd >= 0:
            self._map.close()
            os.close(self.fd)
            self.fd = -1


def one_shot(blocks: list[bytes]) -> tuple[int, list[int]]:
    """A shared file holding ``blocks`` end to end: ``(fd, offsets)``. The caller passes and closes ``fd``."""
    fd = shared_file(max(1, sum(len(b) for b in blocks)), "wds-async-sample")
    offsets = []
    at = 0
    try:
        for block in blocks:
            offsets.append(at)
            view = memoryview(block)
            while view:
                written = os.pwrite(fd, view, at)
                view, at = view[written:], at + written
    except BaseException:
        os.close(fd)
        raise
    return fd, offsets


class RingReader:
    """The client side: the ring mapped read-only; fields are copied out into ``bytes``."""

    def __init__(self, fd: int, size: int) -> None:
        try:
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
        finally:
            os.close(fd)  # the mapping keeps the file alive
        self.size = size

    def read(self, offset: int, length: int) -> bytes:
        if offset < 0 or offset + length > self.size:
            raise ServiceError(f"a field at {offset}+{length} lies outside the ring of {self.size} bytes")
        return self._map[offset:offset + length]

    def close(self) -> None:
        self._map.close()
