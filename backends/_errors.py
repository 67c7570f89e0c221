"""aiohttp's exceptions translated into :mod:`wds_async.errors`, in one table, for every backend on HTTP.

:class:`map_aiohttp_errors` is the one ``except`` ladder for aiohttp: a context manager around one step
of a request, in the shape of httpcore's ``map_exceptions``::

    with map_aiohttp_errors(url, offset):                 # connecting, sending, waiting for headers
        response = await session.get(target)
    with map_aiohttp_errors(url, pos, reading=True, read_timeout=60.0):   # reading the body
        chunk, _ = await response.content.readchunk()

:func:`error_table` is its table; the first row whose type matches wins, so the order matters (aiohttp's
``ServerTimeoutError`` is also a ``TimeoutError``; ``TimeoutError`` and ``ClientOSError`` are ``OSError``)::

    exception                          before the headers                 reading the body
    TimeoutError (and aiohttp's)       TransientError "timed out ..."     TransientError "stalled ..."
    InvalidURL                         UrlError                           UrlError
    ClientConnectorCertificateError,   BackendError (TLS, names ca_file)  BackendError
      ssl.SSLCertVerificationError
    ClientPayloadError                 TransientError "closed mid-body"   TransientError "closed mid-body"
    ClientConnectionError, OSError     TransientError "connection failed" TransientError "read failed"
    any other ClientError              BackendError "request failed"      TransientError "read failed"

Each aiohttp type in a row stands beside its namesake of the builtin client (:mod:`._h1frame`), which raises its
own types so that its path never imports aiohttp. Nor does this module: the aiohttp rows are read from
``sys.modules`` when an error is translated, since an aiohttp exception exists only once aiohttp was imported.

Errors of our own tree pass through untouched (a :class:`~wds_async.errors.BackendError` is an OSError
too), and so does everything else (``CancelledError``, a bug's ``RuntimeError``). A mapped error carries
``url`` scrubbed by :func:`~wds_async.urls.redact_url` and the ``offset`` given, which is where a
retry resumes; the foreign exception's text goes through :func:`~wds_async.urls.redact_text`, because
aiohttp puts request URLs (with their signatures) into some messages. It is raised ``from None``.

Its sibling for answers, :func:`~wds_async.io.backend.status_error` (an HTTP status to the tree), lives
in :mod:`.base`, which does not import aiohttp.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
from types import ModuleType, TracebackType

from wds_async.errors import BackendError, TransientError, UrlError, WdsError
from wds_async.urls import redact_text, redact_url

from . import _h1frame as h1

__all__ = ["client_errors", "error_table", "map_aiohttp_errors", "translate"]

_CA_HINT = ("; for a store with a private CA pass backend_options={{'ca_file': 'ca.pem'}} or set SSL_CERT_FILE "
            "before starting Python")

_Types = tuple[type[BaseException], ...]
#: (exception types, (error class, message) before the headers, (error class, message) reading the body).
#: Messages are ``str.format`` templates over ``name`` (the exception's type), ``detail`` (its scrubbed
#: text) and ``timeout`` (the read timeout).
_Table = tuple[tuple[_Types, tuple[type[WdsError], str], tuple[type[WdsError], str]], ...]
_TABLES: dict[bool, _Table] = {}


def _aiohttp() -> ModuleType | None:
    """aiohttp once it was imported (fully: a module still importing has no ``ClientError`` yet), else None."""
    module = sys.modules.get("aiohttp")
    return module if module is not None and hasattr(module, "ClientConnectorCertificateError") else None


def error_table() -> _Table:
    """The table (see the module docstring): the builtin client's types, and aiohttp's once it was imported."""
    aiohttp = _aiohttp()
    table = _TABLES.get(aiohttp is not None)
    if table is not None:
        return table

    def both(ours: type[BaseException], name: str) -> _Types:
        return (ours, getattr(aiohttp, name)) if aiohttp is not None else (ours,)

    table = (
        ((asyncio.TimeoutError,),
         (TransientError, "timed out connecting or waiting for the response headers"),
         (TransientError, "stalled: no data for {timeout}")),
        (both(h1.InvalidURL, "InvalidURL"),
         (UrlError, "malformed URL"),
         (UrlError, "malformed URL")),
        (both(ssl.SSLCertVerificationError, "ClientConnectorCertificateError"),
         (BackendError, "TLS certificate verification failed ({detail})" + _CA_HINT),
         (BackendError, "TLS certificate verification failed ({detail})" + _CA_HINT)),
        (both(h1.ClientPayloadError, "ClientPayloadError"),
         (TransientError, "connection closed mid-body ({name})"),
         (TransientError, "connection closed mid-body ({name})")),
        ((*both(h1.ClientConnectionError, "ClientConnectionError"), OSError),
         (TransientError, "connection failed: {detail}"),
         (TransientError, "read failed: {detail}")),
        (client_errors(),
         (BackendError, "request failed: {name}: {detail}"),
         (TransientError, "read failed: {name}: {detail}")),
    )
    _TABLES[aiohttp is not None] = table
    return table


def client_errors() -> _Types:
    """The base types of a failed request: the builtin client's, and aiohttp's once it was imported (for an
    ``except`` that must not import aiohttp to name them)."""
    aiohttp = _aiohttp()
    return (h1.ClientError,) if aiohttp is None else (h1.ClientError, aiohttp.ClientError)


def _detail(exc: BaseException) -> str:
    aiohttp = _aiohttp()
    if aiohttp is not None and isinstance(exc, aiohttp.ClientConnectorCertificateError):
        exc = exc.certificate_error  # the verifier's reason, not the host line
    return redact_text(str(exc)) or type(exc).__name__


def translate(exc: BaseException, url: str, offset: int | None = None, *, reading: bool = False,
              read_timeout: float | None = None) -> WdsError | None:
    """The error of our tree for ``exc`` by :func:`error_table`, or None when ``exc`` is not a
    network failure (ours already, a cancellation, a bug)."""
    if isinstance(exc, WdsError):
        return None
    for types, before, body in error_table():
        if isinstance(exc, types):
            kind, template = body if reading else before
            timeout = f"{read_timeout:g} s" if read_timeout is not None else "the read timeout"
            message = template.format(name=type(exc).__name__, detail=_detail(exc), timeout=timeout)
            return kind(message, url=redact_url(url), offset=None if kind is UrlError else offset)
    return None


class map_aiohttp_errors:  # lower case: used like a function, as contextlib's managers are
    """Translate what the clients, asyncio and the socket raise in the ``with`` body by :func:`error_table`.

    ``url`` may be given raw: it is scrubbed only when an error is raised. ``offset`` is the byte a retry
    would resume at; ``reading`` selects the body column; ``read_timeout`` is named in a stall's message.
    A class rather than ``@contextmanager``: it wraps every chunk read, so it must cost next to nothing.
    """

    __slots__ = ("offset", "read_timeout", "reading", "url")

    def __init__(self, url: str, offset: int | None = None, *, reading: bool = False,
                 read_timeout: float | None = None) -> None:
        self.url = url
        self.offset = offset
        self.reading = reading
        self.read_timeout = read_timeout

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is None:
            return
        error = translate(exc, self.url, self.offset, reading=self.reading, read_timeout=self.read_timeout)
        if error is not None:
            raise error from None
