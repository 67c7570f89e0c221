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
"""

from __future__ import annotations

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


class WdsError(Exception):
    """Base of every error wds-async raises.

    ``url`` is the shard (already redacted of credentials by whoever raised), ``offset`` the byte
    position in the (decompressed) shard stream where the problem was seen, when known.
    """

    def __init__(self, message: str, *, url: str | None = None, offset: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.url = url
        self.offset = offset

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
        self.stderr_tail = stderr_tail


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
