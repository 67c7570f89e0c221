"""aiohttp's exceptions translated into :mod:`wds_async.errors`, in one table, for every backend on HTTP.

:class:`map_aiohttp_errors` is the one ``except`` ladder for aiohttp: a context manager around one step
of a request, in the shape of httpcore's ``map_exceptions``::

    with map_aiohttp_errors(url, offset):                 # connecting, sending, waiting for headers
        response = await session.get(target)
    with map_aiohttp_errors(url, pos, reading=True, read_timeout=60.0):   # reading the body
        chunk, _ = await response.content.readchunk()

``AIOHTTP_ERRORS`` is its table; the first row whose type matches wins, so the order matters (aiohttp's
``ServerTimeoutError`` is also a ``TimeoutError``; ``TimeoutError`` and ``ClientOSError`` are ``OSError``)::

    exception                          before the headers                 reading the body
    TimeoutError (and aiohttp's)       TransientError "timed out ..."     TransientError "stalled ..."
    aiohttp.InvalidURL                 UrlError                           UrlError
    ClientConnectorCertificateError,   BackendError (TLS, names ca_file)  BackendError
      ssl.SSLCertVerificationError
    ClientPayloadError                 TransientError "closed mid-body"   TransientError "closed mid-body"
    ClientConnectionError, OSError     TransientError "connection failed" TransientError "read failed"
    any other aiohttp.ClientError      BackendError "request failed"      TransientError "read failed"

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
from types import TracebackType

import aiohttp

from wds_async.errors import BackendError, TransientError, UrlError, WdsError
from wds_async.urls import redact_text, redact_url

__all__ = ["AIOHTTP_ERRORS", "map_aiohttp_errors", "translate"]

_CA_HINT = ("; for a store with a private CA pass backend_options={{'ca_file': 'ca.pem'}} or set SSL_CERT_FILE "
            "before starting Python")

#: (exception types, (error class, message) before the headers, (error class, message) reading the body).
#: Messages are ``str.format`` templates over ``name`` (the exception's type), ``detail`` (its scrubbed
#: text) and ``timeout`` (the read timeout).
AIOHTTP_ERRORS: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...],
                            tuple[type[WdsError], str], tuple[type[WdsError], str]], ...] = (
    (asyncio.TimeoutError,
     (TransientError, "timed out connecting or waiting for the response headers"),
     (TransientError, "stalled: no data for {timeout}")),
    (aiohttp.InvalidURL,
     (UrlError, "malformed URL"),
     (UrlError, "malformed URL")),
    ((aiohttp.ClientConnectorCertificateError, ssl.SSLCertVerificationError),
     (BackendError, "TLS certificate verification failed ({detail})" + _CA_HINT),
     (BackendError, "TLS certificate verification failed ({detail})" + _CA_HINT)),
    (aiohttp.ClientPayloadError,
     (TransientError, "connection closed mid-body ({name})"),
     (TransientError, "connection closed mid-body ({name})")),
    ((aiohttp.ClientConnectionError, OSError),
     (TransientError, "connection failed: {detail}"),
     (TransientError, "read failed: {detail}")),
    (aiohttp.ClientError,
     (BackendError, "request failed: {name}: {detail}"),
     (TransientError, "read failed: {name}: {detail}")),
)


def _detail(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):  # the verifier's reason, not the host line
        exc = exc.certificate_error
    return redact_text(str(exc)) or type(exc).__name__


def translate(exc: BaseException, url: str, offset: int | None = None, *, reading: bool = False,
              read_timeout: float | None = None) -> WdsError | None:
    """The error of our tree for ``exc`` by :data:`AIOHTTP_ERRORS`, or None when ``exc`` is not a
    network failure (ours already, a cancellation, a bug)."""
    if isinstance(exc, WdsError):
        return None
    for types, before, body in AIOHTTP_ERRORS:
        if isinstance(exc, types):
            kind, template = body if reading else before
            timeout = f"{read_timeout:g} s" if read_timeout is not None else "the read timeout"
            message = template.format(name=type(exc).__name__, detail=_detail(exc), timeout=timeout)
            return kind(message, url=redact_url(url), offset=None if kind is UrlError else offset)
    return None


class map_aiohttp_errors:  # lower case: used like a function, as contextlib's managers are
    """Translate what aiohttp, asyncio and the socket raise in the ``with`` body by :data:`AIOHTTP_ERRORS`.

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
