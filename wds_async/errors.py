"""One exception tree for everything wds-async raises.

Backends translate their native errors (aiohttp, OSError, subprocess status, SDK exceptions) into
this tree at the boundary; nothing above the backends sees a foreign exception type::

    WdsError                                   base; attributes url, offset (either may be None)
    ├── UrlError(WdsError, ValueError)         malformed URL, unknown scheme, bad brace pattern, empty list
    ├── MissingDependency(WdsError, ImportError)   an optional extra is not installed
    ├── BackendError(WdsError, OSError)        the source could not deliver the bytes
    │   ├── NotFound(.., FileNotFoundError)    404, missing file, unknown command
    │   ├── PermissionDenied(.., PermissionError)  401/403, unreadable file
    │   ├── TransientError                     worth retrying: 5xx, 429, reset, stall, short body
    │   ├── ObjectChanged                      the object is not the version an index or checkpoint names
    │   └── PipeError                          a ``pipe:`` command exited non-zero or was killed
    ├── ShardFormatError(WdsError, ValueError, tarfile.ReadError)   the bytes are not a valid (gzipped) tar
    │   └── TruncatedShard                     the archive ends mid-member or before its end marker
    ├── SampleError(WdsError, ValueError)      a member breaks the grouping rules (repeated extension)
    │   └── SampleTooLarge                     a member or sample is larger than ``max_sample_bytes``
    ├── EmptyShards(WdsError, ValueError)      this process's shards held no sample at all (``empty_check``)
    ├── EngineError(WdsError, RuntimeError)    an unexpected exception inside the engine, chained as cause
    ├── ServiceError(WdsError, ConnectionError)   the node service is absent, died, or broke the protocol
    └── DecodingError(WdsError, ValueError)    a field could not be decoded (cause chained; pickle not allowed)

Context lives in attributes (``url``, ``offset``, ``member``), never appended to ``args``; ``str()``
renders them after the message so a log line always names the shard and the byte.

Every error scrubs its own ``message`` and ``url`` (at construction and whenever either is set again) with
:func:`scrub_secrets`, the project's one credential scrubber, so a password or a signature reaches neither
``str()``, ``repr()``, a traceback, a log line nor a pickled copy, whoever raised the error and whatever URL it
was given. The scrubber lives here, at the bottom of the layers, for that reason;
:func:`wds_async.urls.redact_url` and :func:`wds_async.urls.redact_text` are its public names.
"""

from __future__ import annotations

import re
import tarfile

__all__ = [
    "BackendError",
    "DecodingError",
    "EmptyShards",
    "EngineError",
    "MissingDependency",
    "NotFound",
    "ObjectChanged",
    "PermissionDenied",
    "PipeError",
    "SampleError",
    "SampleTooLarge",
    "ServiceError",
    "ShardFormatError",
    "TransientError",
    "TruncatedShard",
    "UrlError",
    "WdsError",
]

# -- the scrubber ------------------------------------------------------------------------------------------------
# Text-level on purpose: it never parses a URL, so a URL that urllib or yarl refuse (an unclosed ``[``, a missing
# slash) is scrubbed like any other, and so is a URL inside a message, a repr or a shell command.

#: A parameter (``name=value`` after ``?``, ``&``, ``;`` or ``#``, or standing alone in text) whose value is shown
#: as ``***``: names ending in one of these words, case-insensitively (``X-Amz-Signature``, ``access_token``,
#: ``AWSAccessKeyId``, ``api_key``, ``GoogleAccessId``, Azure's ``sig``, ``AccountKey`` and
#: ``SharedAccessSignature``); Azure SAS fields by their exact names; and every ``X-Amz-*`` / ``X-Goog-*``
#: parameter except the four that only say how and when a URL was signed (kept: they explain an expired URL).
_SECRET_SUFFIXES = ("sig", "signature", "token", "jwt", "credential", "credentials", "secret", "password", "passwd",
                    "passphrase", "pass", "pwd", "key", "keyid", "accessid", "auth", "authorization", "bearer",
                    "session", "sessionid", "cookie", "hmac", "sas")
_SAS_FIELDS = frozenset({"se", "sp", "sv", "skoid", "sktid", "skt", "ske", "sks", "skv"})
_SIGNING_SHOWN = frozenset({"algorithm", "date", "expires", "signedheaders"})


def _secret_name(name: str) -> bool:
    lower = name.lower()
    if lower.endswith(_SECRET_SUFFIXES) or lower in _SAS_FIELDS:
        return True
    return lower.startswith(("x-amz-", "x-goog-")) and lower.split("-", 2)[2] not in _SIGNING_SHOWN


#: Where a parameter name may start: the start of the text, a URL's delimiters (``?&;#``), or what separates
#: words in text (blanks, quotes, brackets, ``,|:~``). Not after ``/``: a path segment such as ``key=3`` (hive
#: style partitions) names data, not a credential, and stays visible (and part of a shard's identity). The
#: delimiter is matched and put back (a lookbehind costs several times as much).
_PARAM_START = r"(^|[?&;#\s'\"(\[{<,|:~])"
#: In a string that is one URL, a value runs to the next ``&``, ``;``, ``#`` or blank; in free text it also stops
#: at quotes, brackets and backslashes, which end a URL quoted in a message or a repr.
_URL_PARAM = re.compile(_PARAM_START + r"([\w.-]+)=([^&;#\s]*)")
_TEXT_PARAM = re.compile(_PARAM_START + r"([\w.-]+)=([^&;#\s'\"<>()\[\]\\]*)")
#: What ends a URL's authority (RFC 3986: ``/``, ``?``, ``#``), and what ends a URL in text.
_AUTHORITY_ENDS = "/?#\"<>\\ \t\n\r\f\v"
_AUTHORITY_END = re.compile("[" + re.escape(_AUTHORITY_ENDS) + "]")
#: A userinfo with no ``//`` before it (``scheme:user:password@``, ``user:password@``) starts with a word and
#: a colon.
_BARE_LEAD = re.compile(r"(?<![A-Za-z0-9_+.-])[A-Za-z0-9][A-Za-z0-9_+.-]*:")
#: ``Bearer TOKEN`` (an Authorization header in a ``pipe:curl`` command or a client's message), and anything
#: shaped like a JSON Web Token wherever it stands.
_BEARER = re.compile(r"\b(bearer\s+)[^\s'\"<>]+", re.IGNORECASE)
_JWT = re.compile(r"\beyJ[\w-]{4,}\.[\w-]{4,}\.[\w-]*")
_BLANK = re.compile(r"\s")


def _mask_userinfo(text: str) -> str:
    """Every userinfo in ``text`` masked. An authority runs from the last of ``_AUTHORITY_ENDS`` before an ``@``
    to the next one after it, as RFC 3986 reads it, whatever else it holds (a host that no parser accepts
    included); its userinfo is everything before its last ``@``, so an ``@`` or ``:`` inside a password goes
    with the rest. After ``//`` (``scheme://``, ``//``) or ``scheme:/`` the user name is kept and the password
    masked; with no slash before it (``scheme:user:password@``, ``user:password@``) which part is the user is
    not knowable, so all of it after the first ``word:`` goes. Linear: each character is looked at a bounded
    number of times (an authority's start is searched back to the previous one's end only)."""
    out: list[str] = []
    done, previous_end, at = 0, 0, text.find("@")
    while at != -1:
        found = _AUTHORITY_END.search(text, at)
        end = found.start() if found is not None else len(text)
        at = text.rfind("@", at, end)  # the last @ of this authority
        start = max(text.rfind(c, previous_end, at) for c in _AUTHORITY_ENDS) + 1
        start = max(start, previous_end)
        info = text[start:at]
        shown = info
        if start >= 2 and text[start - 1] == "/" and text[start - 2] in "/:":
            if ":" in info:
                shown = info.split(":", 1)[0] + ":***"  # a user name alone is shown, as before
        else:
            lead = _BARE_LEAD.search(info)
            if lead is not None and lead.end() < len(info):
                shown = info[:lead.end()] + "***"
        out.append(text[done:start] + shown)
        done, previous_end = at, end
        at = text.find("@", end)
    out.append(text[done:])
    return "".join(out)


def _mask_param(m: re.Match[str]) -> str:
    start, name, value = m.groups()
    if not value or value == "***" or not _secret_name(name):
        return m.group(0)
    return f"{start}{name}=***"


def scrub_secrets(text: str, *, one_url: bool = False) -> str:
    """``text`` with every credential replaced by ``***``: the password of ``scheme://user:password@`` (the user
    name is kept), the whole userinfo of a malformed ``scheme:user:password@``, the value of every secret
    parameter (see ``_SECRET_SUFFIXES``) in a query, a ``;``-parameter or a ``#``-fragment, a ``Bearer`` token and
    a JSON Web Token. Works on any string, parsable as a URL or not; text with nothing to hide comes back
    unchanged, and scrubbing twice changes nothing more.

    ``one_url=True`` says that ``text`` is a single URL, so a value runs to the next ``&``, ``;``, ``#`` or
    blank; in free text (the default) a quote, bracket or backslash ends it too, as it ends a URL quoted in a
    message."""
    # Each rule runs only where its mark is present: most URLs hold no "@", and many no "=".
    if "@" in text:
        text = _mask_userinfo(text)
    if "=" in text:
        text = (_URL_PARAM if one_url else _TEXT_PARAM).sub(_mask_param, text)
    if "bearer" in text.lower():
        text = _BEARER.sub(r"\1***", text)
    if "eyJ" in text:
        text = _JWT.sub("***", text)
    return text


def _scrub_url(url: str | None) -> str | None:
    """An error's ``url``: one URL (or a ``pipe:`` command, scrubbed as text), None as it is."""
    if url is None:
        return None
    return scrub_secrets(url, one_url=_BLANK.search(url) is None)


class WdsError(Exception):
    """Base of every error wds-async raises.

    ``url`` is the shard, ``offset`` the byte position in the (decompressed) shard stream where the problem
    was seen, when known. ``message`` and ``url`` are scrubbed of credentials (:func:`scrub_secrets`) when the
    error is made and whenever they are set again, so that no caller can let a secret through.
    """

    def __init__(self, message: str, *, url: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.message = message  # both properties: scrubbed on the way in
        self.url = url
        self.offset = offset

    @property
    def message(self) -> str:
        """The message (the first of ``args``), scrubbed."""
        return self._message

    @message.setter
    def message(self, value: str) -> None:
        self._message = scrub_secrets(value) if isinstance(value, str) else value
        self.args = (self._message,)

    @property
    def url(self) -> str | None:
        """The shard's URL (or the service's socket), scrubbed; None when not known."""
        return self._url

    @url.setter
    def url(self, value: str | None) -> None:
        self._url = _scrub_url(value) if isinstance(value, str) else value

    def __str__(self) -> str:
        where = []
        if self.url is not None:
            where.append(f"url={self.url}")
        if self.offset is not None:
            where.append(f"offset={self.offset}")
        return f"{self.message} ({', '.join(where)})" if where else self.message

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Keyword-only context must survive pickling across DataLoader worker processes.
        return (_rebuild, (type(self), self.message, dict(self.__dict__)))


def _rebuild(cls: type[WdsError], message: str, state: dict) -> WdsError:  # type: ignore[type-arg]
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class UrlError(WdsError, ValueError):
    """A URL, brace pattern or URL list that cannot be used."""


class MissingDependency(WdsError, ImportError):
    """An optional dependency (an extra such as ``wds-async[s3]``) is not installed."""


class BackendError(WdsError, OSError):
    """The source could not deliver the bytes."""


class NotFound(BackendError, FileNotFoundError):
    """The object, file or command does not exist."""


class PermissionDenied(BackendError, PermissionError):
    """The credentials in use may not read the object."""


class TransientError(BackendError):
    """A failure worth retrying: server errors, throttling, dropped or stalled connections."""


class Throttled(TransientError):
    """The store asked the client to slow down: HTTP 429 or 503 (S3 ``SlowDown``, GCS
    ``rateLimitExceeded``, Azure ``ServerBusy``). Retried like any transient error; the concurrency
    autotuner also takes it as the signal to lower the number of requests in flight."""


class ObjectChanged(BackendError):
    """The object's identity (size, ETag, generation) differs from the one recorded earlier: between two
    attempts of one read, or since an index or a checkpoint was made. Never retried: splicing two
    versions of a shard, or splitting one by another's byte ranges, would deliver wrong samples."""


class PipeError(BackendError):
    """A ``pipe:`` command exited with a non-zero status or was killed by a signal."""

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        offset: int | None = None,
        returncode: int | None = None,
        stderr_tail: str = "",
    ) -> None:
        super().__init__(message, url=url, offset=offset)
        self.returncode = returncode
        self.stderr_tail = scrub_secrets(stderr_tail)  # a command's own output may echo its URL


class ShardFormatError(WdsError, ValueError, tarfile.ReadError):
    """The bytes of a shard are not a valid tar (or gzipped tar) archive.

    Also a :class:`tarfile.ReadError`, which is what webdataset raises for truncated and corrupt tars, so
    code written for webdataset (``except tarfile.ReadError``) catches it unchanged."""


class TruncatedShard(ShardFormatError):
    """The archive ended inside a member or without its end-of-archive marker."""


class SampleError(WdsError, ValueError):
    """A member breaks the grouping rules, for example a repeated extension within one sample."""

    def __init__(
        self, message: str, *, url: str | None = None, offset: int | None = None, member: str | None = None
    ) -> None:
        super().__init__(message, url=url, offset=offset)
        self.member = member


class SampleTooLarge(SampleError):
    """A member, or a whole sample, is larger than ``EngineConfig.max_sample_bytes``.

    Raised from the size a tar header announces, before its bytes are buffered, so a corrupt or hostile
    header (``8 GiB`` of zeros) fails the shard at once instead of exhausting memory. The shard ends there;
    the handler decides as for any shard error. ``key`` is the sample's key (None when the member's name
    carries none), ``size`` the announced (or accumulated) byte count, ``limit`` the setting in force.
    """

    def __init__(self, message: str, *, url: str | None = None, offset: int | None = None,
                 member: str | None = None, key: str | None = None, size: int = 0, limit: int = 0) -> None:
        super().__init__(message, url=url, offset=offset, member=member)
        self.key = key
        self.size = size
        self.limit = limit

    def __str__(self) -> str:
        where = [f"{name}={value}" for name, value in (("url", self.url), ("offset", self.offset), ("key", self.key))
                 if value is not None]
        return f"{self.message} ({', '.join(where)})" if where else self.message


class EmptyShards(WdsError, ValueError):
    """This process was given shards but they held no sample at all (``WebDataset(empty_check=True)``).

    A ``ValueError`` too, as webdataset raises one here. ``shards`` is how many work items the process had;
    ``url`` the first of them. Often a sign of fewer shards than ranks times DataLoader workers, or of
    shards that are empty tars (only end-of-archive blocks)."""

    def __init__(self, message: str, *, url: str | None = None, offset: int | None = None, shards: int = 0) -> None:
        super().__init__(message, url=url, offset=offset)
        self.shards = shards


class EngineError(WdsError, RuntimeError):
    """An exception of no kind above escaped the engine: a bug, or an error raised by a user callback such
    as ``select_files`` or ``rename_files``. The original is chained as ``__cause__``; ``url`` names the
    shard being read when it is known."""


class ServiceError(WdsError, ConnectionError):
    """The node service (``wds-async serve``) could not be reached, stopped while serving, or sent what a
    client cannot read. ``url`` is the service's socket path; the message says what to do (start or restart
    the service, then resume from the last checkpoint)."""


class DecodingError(WdsError, ValueError):
    """A field of a sample could not be decoded; the cause is chained as ``__cause__``.

    ``key`` is the sample's ``__key__``, ``field`` the failing field (its extension, ``"seg.json"``).
    """

    def __init__(self, message: str, *, url: str | None = None, offset: int | None = None,
                 key: str | None = None, field: str | None = None) -> None:
        super().__init__(message, url=url, offset=offset)
        self.key = key
        self.field = field

    k = property(lambda self: self.field, doc="webdataset's name for ``field``.")
