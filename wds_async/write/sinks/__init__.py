"""Sinks: where a writer streams a tar, committed whole or not at all.

A sink is a small synchronous object (:class:`Sink`): ``write()`` bytes, then ``close()`` to commit, or
``abort()`` to leave nothing behind. Until ``close()`` returns, no object exists under the URL (an object
already there stays as it was); if committing fails, the sink aborts first and then raises. One thread
at a time calls it (which thread may change between calls); store uploads run in its own threads.

* local paths and ``file://``: :class:`~.local.LocalSink` writes ``.NAME.<random>.wds-partial`` beside the
  target, fsyncs it and renames it into place on ``close()`` (unlinked on ``abort()``);
* ``s3://``: a multipart upload (boto3), parts uploaded in the background, ``put_object`` for an object
  smaller than one part (:mod:`.s3`);
* ``gs://``: a resumable upload session (google-resumable-media), chunks resumed at the offset the
  session persisted (:mod:`.gcs`);
* ``az://``, ``azure://`` and ``https://ACCOUNT.blob.core.windows.net/...``: staged blocks committed as a
  block list on ``close()`` (azure-storage-blob) (:mod:`.azure`);
* ``pipe:CMD`` (writers only, not ``open_sink``): the command's stdin, committed when it exits 0 (:mod:`.pipe`).

Store sinks hold at most about three parts in memory whatever the object's size (``buffered_bytes``,
``peak_buffered_bytes``), retry each store call on transient errors with the library's
:class:`~wds_async.config.RetryPolicy`, and take the reading side's credentials: ``options`` are
``backend_options`` in either form (``{"s3": {...}}`` or flat), checked against the reading backend, and
the same environment variables apply. After ``close()``, ``identity`` holds the committed object's size
and ETag or generation, as a reader of it will see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from ...config import RetryPolicy
from ...errors import UrlError
from ...io import ObjectIdentity
from ...io.registry import backend_class, backend_key, scheme_options
from ...urls import redact_url

__all__ = ["DEFAULT_PART_BYTES", "Sink", "open_sink", "put_bytes"]

#: Part (S3), chunk (GCS) or block (Azure) size when none is given.
DEFAULT_PART_BYTES = 8 << 20

_ALIASES = {"az": "azure", "azure": "az"}


@runtime_checkable
class Sink(Protocol):
    """A destination written front to back and committed whole (see the module docstring)."""

    #: The redacted URL, for messages.
    url: str
    #: After ``close()``: the committed object's size and ETag or generation (what a reader sees).
    identity: ObjectIdentity | None

    def write(self, data: bytes | bytearray | memoryview) -> int:
        """Take ``data`` (copied or sent before returning); returns its length in bytes."""
        ...

    def flush(self) -> None:
        """Nothing a caller must rely on: bytes become visible only at ``close()``."""
        ...

    def close(self) -> None:
        """Commit: the object becomes visible now, whole. On failure, abort first, then raise a
        :class:`~wds_async.errors.WdsError` naming the URL. A second call does nothing."""
        ...

    def abort(self) -> None:
        """Discard everything written; never raises, idempotent; no object and no pending upload remain.
        After a successful ``close()`` it does nothing (the object stays)."""
        ...


def open_sink(url: str, *, options: Mapping[str, Any] | None = None, part_bytes: int | None = None,
              policy: RetryPolicy | None = None) -> Sink:
    """A :class:`Sink` writing ``url``: a local path or ``file://`` URL, ``s3://``, ``gs://``, ``az://`` /
    ``azure://`` or an Azure Blob https URL. ``options`` are the reading side's ``backend_options``;
    ``part_bytes`` the upload part size (default :data:`DEFAULT_PART_BYTES`; the store's rules apply:
    at least 5 MiB on S3, a multiple of 256 KiB on GCS); ``policy`` how store calls are retried. Raises
    UrlError for any other URL, MissingDependency when the store's SDK is not installed."""
    key = backend_key(url)
    shown = redact_url(url)
    if key == "file":
        from .local import LocalSink

        return LocalSink(url)
    if key not in ("s3", "gs", "az", "azure"):
        raise UrlError(f"cannot write to {key}: URLs; writers take local paths, s3://, gs://, az:// and Azure "
                       "Blob https URLs (or pipe:COMMAND in TarWriter/ShardWriter)", url=shown)
    backend_class(key, shown)  # MissingDependency with the install hint when the SDK is absent
    nested = scheme_options(options, [url])
    found = nested.get(key)
    opts = dict(found if found is not None else nested.get(_ALIASES.get(key, ""), {}))
    size = DEFAULT_PART_BYTES if part_bytes is None else part_bytes
    if key == "s3":
        from .s3 import S3Sink

        return S3Sink(url, opts, part_bytes=size, policy=policy)
    if key == "gs":
        from .gcs import GcsSink

        return GcsSink(url, opts, part_bytes=size, policy=policy)
    from .azure import AzureSink

    return AzureSink(url, opts, part_bytes=size, policy=policy)


def put_bytes(url: str, data: bytes, *, options: Mapping[str, Any] | None = None,
              policy: RetryPolicy | None = None) -> Sink:
    """Write ``data`` as the whole object ``url`` (a small file such as an index) through a sink: committed whole
    or aborted. Blocking; returns the closed sink (its ``identity``)."""
    sink = open_sink(url, options=options, policy=policy)
    try:
        sink.write(data)
    except BaseException:
        sink.abort()
        raise
    sink.close()
    return sink
