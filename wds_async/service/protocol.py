"""The node service's wire format, sans-IO: length-prefixed JSON frames and the values they carry.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON, one object with a
``"type"``. :func:`encode` makes one; :class:`FrameDecoder` takes bytes as they arrive (any split) and
returns the complete frames. Sample bytes never travel in frames: they lie in the session's shared-memory
ring (:mod:`wds_async.service.ring`) and a frame names their offsets. File descriptors travel beside a
frame (``SCM_RIGHTS``) and the frame says how many (``"fds": n``).

Client -> service:
    ``hello`` {version, pid, socket}: first frame of a session; ``status`` {version} instead asks for the
    service's counters (answered with ``status``, then the connection closes).
    ``open`` {items: [work item], settings: {...}, backend_options, cache}: read these items; the session
    answers with ``batch`` frames and one ``end``; another ``open`` may follow (the next chunk of items).
    ``ack`` {bytes}: that many bytes of the ring, in order, may be written again.
    ``close``: the session ends (so does a closed socket).
Service -> client:
    ``ready`` {ring_bytes, session, fds: 1}: the ring's file descriptor is passed with this frame.
    ``batch`` {entries, span, fds: 0 or 1}: in delivery order, ``["s", key, url, offset, end, item,
    [[name, ring_offset, length], ...]]`` a sample, ``["d", item]`` every sample of item was sent,
    ``["e", error]`` an error at this position; ``span`` is the ring bytes the batch took (acked back once
    copied out). A sample too large for the ring comes alone, in a memfd passed with the frame (``fds: 1``:
    offsets are then in that file and ``span`` is 0).
    ``alive``: nothing to send for a while (the client's stall guard restarts).
    ``end``: the items of the last ``open`` are done. ``error`` {error}: the session cannot go on.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from ..engine.work import WorkItem
from ..errors import ServiceError
from ..io import ObjectIdentity

__all__ = ["MAX_FRAME", "MAX_REQUEST_FRAME", "OPEN_FRAME_BYTES", "VERSION", "FrameDecoder", "encode",
           "error_from_json", "error_to_json", "item_from_json", "item_to_json"]

#: Bumped when a message changes meaning; a service refuses a client of another version.
VERSION = 1
#: The largest frame a client accepts from the service (batches are far smaller; a sample's bytes never
#: travel in a frame).
MAX_FRAME = 64 << 20
#: The largest frame the service accepts from a client. A connection holds at most one frame under assembly,
#: so this bounds what one connection can make the service buffer (it was 64 MiB: 20 connections sending
#: partial frames held 1.27 GB). 4 MiB is sixteen times what a client packs into one ``open``
#: (:data:`OPEN_FRAME_BYTES`), so one item with a very long URL still fits.
MAX_REQUEST_FRAME = 4 << 20
#: A client splits its work items into ``open`` frames of at most about this size (a single larger item goes
#: alone). 256 KiB holds 1000 to 3000 items, as many as a lazy stream's chunk, so the drain between two
#: opens costs no more than it did for lazy streams, and 256 sessions' opens fit the service's request pool.
OPEN_FRAME_BYTES = 256 << 10
_HEADER = struct.Struct(">I")


def encode(message: dict[str, Any]) -> bytes:
    """One frame holding ``message`` (a JSON-serialisable dict with a ``"type"``)."""
    body = json.dumps(message, separators=(",", ":")).encode()
    if len(body) > MAX_FRAME:
        raise ServiceError(f"a {message.get('type')!r} frame of {len(body)} bytes is over the limit of {MAX_FRAME}")
    return _HEADER.pack(len(body)) + body


class FrameDecoder:
    """Bytes in, complete frames out. ``what`` names the peer in errors (the socket path); a frame announcing
    more than ``limit`` bytes is refused before any of its body is kept."""

    def __init__(self, what: str = "the peer", limit: int = MAX_FRAME) -> None:
        self.what = what
        self.limit = limit
        self._buffer = bytearray()

    @property
    def pending(self) -> int:
        """Bytes received that do not yet make a complete frame."""
        return len(self._buffer)

    @property
    def announced(self) -> int | None:
        """The full size (header included) of the incomplete frame at the front, once its header is in;
        None when nothing or less than a header is pending."""
        if len(self._buffer) < _HEADER.size:
            return None
        return _HEADER.size + int(_HEADER.unpack_from(self._buffer, 0)[0])

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """Take ``data``; return every frame it completes, in order. Garbage raises :class:`ServiceError`."""
        self._buffer += data
        frames: list[dict[str, Any]] = []
        buffer = self._buffer
        start = 0
        while len(buffer) - start >= _HEADER.size:
            (length,) = _HEADER.unpack_from(buffer, start)
            if length > self.limit:
                self._buffer = bytearray()
                raise ServiceError(f"bad frame from {self.what}: announced {length} bytes, more than {self.limit} "
                                   "(not a wds-async service or client, or a version mismatch)")
            if len(buffer) - start - _HEADER.size < length:
                break
            body = bytes(buffer[start + _HEADER.size:start + _HEADER.size + length])
            start += _HEADER.size + length
            frames.append(self._parse(body))
        del buffer[:start]
        return frames

    def _parse(self, body: bytes) -> dict[str, Any]:
        try:
            message = json.loads(body)
        except (UnicodeDecodeError, ValueError):
            self._buffer = bytearray()
            raise ServiceError(f"bad frame from {self.what}: not JSON ({body[:40]!r}...)") from None
        except RecursionError:  # arrays or objects nested thousands deep
            self._buffer = bytearray()
            raise ServiceError(f"bad frame from {self.what}: JSON nested too deeply") from None
        if not isinstance(message, dict) or not isinstance(message.get("type"), str):
            self._buffer = bytearray()
            raise ServiceError(f"bad frame from {self.what}: a JSON object with a 'type' was expected")
        return message


# -- values ------------------------------------------------------------------------------------------------
def item_to_json(item: WorkItem) -> list[Any]:
    """A work item as a compact JSON list (``expect`` as a dict of its four fields, or None)."""
    expect = item.expect
    identity = None if expect is None else {"size": expect.size, "etag": expect.etag,
                                            "generation": expect.generation, "last_modified": expect.last_modified}
    return [item.id, item.shard, item.url, item.start, item.end, item.compressed, identity]


def item_from_json(value: Any) -> WorkItem:
    """The inverse of :func:`item_to_json`; ServiceError for anything else (wrong types, a negative or
    reversed byte range, an identity with other fields)."""
    try:
        ident, shard, url, start, end, compressed, identity = value
        if not isinstance(url, str) or not url:
            raise ValueError("the URL must be a non-empty string")
        for name, number in (("id", ident), ("shard", shard), ("start", start), ("end", end)):
            if not (number is None and name == "end") and (type(number) is not int or number < 0):
                raise ValueError(f"{name} must be an int >= 0")
        if end is not None and end < start:
            raise ValueError("end is before start")
        if compressed is not None and not isinstance(compressed, bool):
            raise ValueError("compressed must be true, false or null")
        if identity is not None and not (isinstance(identity, dict) and all(
                v is None or type(v) is _IDENTITY.get(k) for k, v in identity.items())):
            raise ValueError("the identity must be null or an object of size (int), etag, generation and "
                             "last_modified (strings)")
        expect = None if identity is None else ObjectIdentity(**identity)
        return WorkItem(id=ident, shard=shard, url=url, start=start, end=end, compressed=compressed, expect=expect)
    except (TypeError, ValueError) as exc:
        raise ServiceError(f"bad work item in an 'open' frame: {_short(value)} ({exc})") from None


_IDENTITY = {"size": int, "etag": str, "generation": str, "last_modified": str}


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


_CONTEXT = ("url", "offset", "member", "key", "size", "limit", "shards", "field", "returncode", "stderr_tail")


def error_to_json(exc: BaseException) -> dict[str, Any]:
    """An exception as ``{type, message, url, offset, ...}`` (its class name and context attributes)."""
    out: dict[str, Any] = {"type": type(exc).__name__, "message": getattr(exc, "message", None) or str(exc)}
    for name in _CONTEXT:
        value = getattr(exc, name, None)
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            out[name] = value
    return out


def error_from_json(value: dict[str, Any]) -> BaseException:
    """Rebuild an error of our tree (or ``MemoryError``) from :func:`error_to_json`; an unknown class
    becomes :class:`~wds_async.errors.EngineError` with the original name in its message."""
    from .. import errors

    name = str(value.get("type", "EngineError"))
    message = str(value.get("message", ""))
    if name == "MemoryError":
        return MemoryError(message)
    cls = getattr(errors, name, None)
    if not (isinstance(cls, type) and issubclass(cls, errors.WdsError)):
        cls, message = errors.EngineError, f"{name}: {message}"
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.message, err.url, err.offset = message, None, None
    for key in _CONTEXT:
        if key in value or key in ("member", "key"):  # those two are read by ``__str__`` of some classes
            setattr(err, key, value.get(key))
    return err
