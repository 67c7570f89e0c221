"""The backend interface and what every backend shares.

A backend turns a URL into bytes. It is a small object created once per event loop (so once per
process and DataLoader worker) and handed to the engine; the engine never looks one up mid-pipeline.

``open(url, start=, end=)`` is an async context manager that yields a :class:`ByteStream`: an async
iterator of ``bytes`` chunks beginning exactly at byte ``start``. A source that cannot seek (a pipe, a
server that ignores Range) skips the first ``start`` bytes itself, so callers never see the difference.
The iterator raises instead of ending quietly when the source failed: a short body, a non-zero pipe
exit status. Leaving the context releases the connection, file or process on every path.

Every backend translates its native errors into :mod:`wds_async.errors` at the boundary. HTTP answers
go through :func:`status_error` here (the one status table); aiohttp's exceptions through
:class:`._errors.map_aiohttp_errors`, kept in its own module so that importing this one (as the file
and pipe backends do) does not import aiohttp.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

from wds_async.errors import (
    BackendError,
    NotFound,
    ObjectChanged,
    PermissionDenied,
    Throttled,
    TransientError,
    UrlError,
    WdsError,
)
from wds_async.urls import redact_url

__all__ = ["Backend", "ByteStream", "Capabilities", "ObjectIdentity", "capabilities_of", "check_http_url", "glob_prefix", "glob_regex", "has_glob",
           "status_error"]


@dataclass(frozen=True)
class ObjectIdentity:
    """What identifies one version of an object; compared between attempts so that a retry never
    splices two versions of a shard. ``None`` fields are unknown and not compared."""

    size: int | None = None
    etag: str | None = None
    generation: str | None = None
    last_modified: str | None = None

    def conflicts_with(self, other: ObjectIdentity) -> str | None:
        """A description of the first known field that differs, or None."""
        for name in ("size", "etag", "generation", "last_modified"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine is not None and theirs is not None and mine != theirs:
                return f"{name} changed from {mine!r} to {theirs!r}"
        return None


@dataclass
class ByteStream:
    """The chunks of one open source plus what is known about it.

    ``chunks`` yields bytes from ``start``; ``identity.size`` is the whole object's size when the source
    announced it. ``info`` carries backend details for error messages (e.g. HTTP status).
    """

    chunks: AsyncIterator[bytes]
    start: int = 0
    identity: ObjectIdentity = field(default_factory=ObjectIdentity)
    info: Mapping[str, object] = field(default_factory=dict)

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self.chunks

    async def aclose(self) -> None:
        """Finalize the chunk iterator now rather than whenever the garbage collector gets to it."""
        closer = getattr(self.chunks, "aclose", None)
        if closer is not None:
            await closer()


@dataclass(frozen=True)
class Capabilities:
    """What a backend can do, declared once by the backend and read by the layers above (the range reader,
    ranged parts, listing) instead of probing for attributes.

    The defaults describe a plain seekable store: any byte range can be asked for, nothing more is promised.
    """

    #: ``open(url, start=n)`` starts at byte ``n`` without reading what comes before it. False for a source
    #: that can only stream from its start (``pipe:``): it skips ``start`` bytes itself, and a large object is
    #: never split into ranged parts.
    ranged_reads: bool = True
    #: Every object answers a Range request with exactly that range (the cloud stores). A plain http server may
    #: ignore Range and send the whole object; without this guarantee ranged parts are used only after the
    #: first answer showed the server honours ranges.
    ranges_guaranteed: bool = False
    #: ``open(..., expect=ObjectIdentity)`` makes the request conditional on that version (``If-Match``,
    #: ``ifGenerationMatch``): a store that changed answers 412, so a resumed read never splices two versions.
    conditional_reads: bool = False
    #: ``list(pattern)`` expands a glob URL.
    listing: bool = False
    #: Bytes the transport may hold for one open stream outside the engine's counters (socket and parser
    #: buffers); the byte budget counts this much per open stream, so memory stays bounded at any concurrency.
    buffer_allowance: int = 1 << 20
    #: Reads come from this machine's own storage (local files): there is no time to first byte to hide, and
    #: the page cache already holds what was read recently. An autotuned engine whose items all come from such a
    #: backend starts at ``min_connections`` rather than ``start_connections`` and ramps from there when more
    #: readers pay (a cold disk, a network file system); reading 32 shards ahead of a consumer from the page
    #: cache only copied them into a growing buffer.
    local_reads: bool = False

    def __post_init__(self) -> None:
        if self.buffer_allowance < 0:
            raise ValueError(f"buffer_allowance must be >= 0, not {self.buffer_allowance}")


#: What a backend that declares nothing gets (one written for the registry before capabilities existed).
_DEFAULT_CAPABILITIES = Capabilities()


def capabilities_of(backend: object) -> Capabilities:
    """``backend.capabilities``; the defaults for a custom backend that declares none."""
    declared = getattr(backend, "capabilities", None)
    if declared is None:
        return _DEFAULT_CAPABILITIES
    if not isinstance(declared, Capabilities):
        raise TypeError(f"{type(backend).__name__}.capabilities must be a wds_async.io.Capabilities, "
                        f"not {type(declared).__name__}")
    return declared


@runtime_checkable
class Backend(Protocol):
    """What the engine needs from a storage scheme. Each built-in backend also declares its
    :class:`Capabilities` as ``capabilities`` (read through :func:`capabilities_of`, which gives a custom backend
    that declares none the defaults)."""

    def open(self, url: str, *, start: int = 0, end: int | None = None) -> AbstractAsyncContextManager[ByteStream]:
        """Stream the bytes ``[start, end)`` of ``url`` (``end=None``: to the end).

        A backend whose capabilities say ``conditional_reads`` also takes ``expect=ObjectIdentity``
        and makes the request conditional on that version (a store that changed answers 412)."""
        ...

    async def size(self, url: str) -> int | None:
        """The object's size in bytes, or None when the source cannot tell without reading it."""
        ...

    async def list(self, pattern: str) -> list[str]:
        """The sorted URLs of the objects matching a glob URL (see :func:`glob_regex`)."""
        ...

    async def aclose(self) -> None:
        """Release sessions and other resources; the backend is unusable afterwards."""
        ...


def check_http_url(url: str) -> None:
    """Raise UrlError unless ``url`` is an http(s) URL with a host. Called for every request, so its imports sit at
    the top: ``from urllib.parse import ...`` inside a function asks that module for ``__path__`` on every call,
    which its module-level ``__getattr__`` answers by raising an AttributeError (5% of a random-access engine
    thread's samples in a py-spy profile)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise UrlError("malformed http(s) URL: it needs a host, as in https://host/path/shard.tar",
                       url=redact_url(url))


#: Store error codes whose HTTP status alone would classify them wrongly (S3 answers a timed-out upload
#: or download with 400 RequestTimeout; GCS has answered rate limits with 403).
_CODE_KINDS: dict[str, type[WdsError]] = {
    "RequestTimeout": TransientError,
    "SlowDown": Throttled,
    "rateLimitExceeded": Throttled,
    "userRateLimitExceeded": Throttled,
}


def status_error(status: int, url: str, reason: str = "", *, offset: int | None = None, code: str | None = None,
                 notes: Iterable[str] = ()) -> WdsError:
    """Map an HTTP status to the error tree: 404/410 not found, 401/403 permission, 429/503 throttled,
    408/5xx transient, 412 object changed, 416 and the rest permanent. ``code``, the store's error code
    when the answer names one, overrides the status for the codes in ``_CODE_KINDS``. The non-empty
    ``notes`` (the store's code or message, the credential in use) end the message in brackets."""
    error = _status_error(status, url, reason, offset, _CODE_KINDS.get(code or ""))
    shown = [note for note in notes if note]
    if shown:
        error.message = f"{error.message} [{'; '.join(shown)}]"
    return error


def _status_error(status: int, url: str, reason: str, offset: int | None, kind: type[WdsError] | None) -> WdsError:
    text = f"HTTP {status}{' ' + reason if reason else ''}"
    if kind is Throttled or (kind is None and status in (429, 503)):
        return Throttled(f"{text}: the store asks to slow down; will retry with fewer requests in flight",
                         url=url, offset=offset)
    if kind is TransientError or status == 408 or 500 <= status < 600:
        return TransientError(f"{text}: the server is failing or throttling; will retry", url=url, offset=offset)
    if status in (404, 410):
        return NotFound(f"{text}: the object does not exist; check the URL", url=url, offset=offset)
    if status in (401, 403):
        return PermissionDenied(f"{text}: access denied; check the credentials or the object's permissions",
                                url=url, offset=offset)
    if status == 412:
        return ObjectChanged(f"{text}: the object is no longer the version the first request for it saw "
                             "(If-Match / ifGenerationMatch failed); refusing to splice two versions",
                             url=url, offset=offset)
    if status == 416:
        return BackendError(f"{text}: requested range not satisfiable (object shorter than expected?)",
                            url=url, offset=offset)
    return BackendError(f"{text}: unexpected answer", url=url, offset=offset)


_GLOB_CHARS = "*?["


def has_glob(key: str) -> bool:
    """True when an object key or path contains glob wildcards."""
    return any(c in key for c in _GLOB_CHARS)


def glob_prefix(key: str) -> str:
    """The literal part of a glob key before its first wildcard: what a store's list API filters on."""
    cut = min((key.index(c) for c in _GLOB_CHARS if c in key), default=len(key))
    return key[:cut]


def glob_regex(key: str) -> re.Pattern[str]:
    """Shell-style matching on object keys: ``*`` and ``?`` stay within one ``/`` level, ``**/`` matches
    zero or more directories (as ``glob.glob(recursive=True)``), ``[abc]`` is a character class."""
    out, i = [], 0
    while i < len(key):
        c = key[i]
        if key.startswith("**/", i):
            out.append("(?:.*/)?")  # zero or more directories, as in glob.glob(recursive=True)
            i += 3
            continue
        if key.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "[":
            end = key.find("]", i + 1)
            if end == -1:
                out.append(re.escape(c))
            else:
                body = key[i + 1 : end]
                out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
                i = end + 1
                continue
        else:
            out.append(re.escape(c))
        i += 1
    return re.compile("".join(out) + r"\Z")
