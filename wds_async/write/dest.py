"""Where ``wds-async cp`` writes one shard: an async destination that is committed whole or not at all.

* A local path (bare or ``file://``) is written from the loop through ``aiofiles`` (issue 12) by
  :class:`~wds_async._aio.AsyncFileWriter`: to a hidden temporary name in the destination's folder,
  renamed onto its name on ``commit``, removed on ``abort``; a reader of the folder never sees half a
  shard, and a crash leaves only a ``.NAME.*.wds-partial`` file behind.
* Any other destination is a :mod:`wds_async.write.sinks` sink (S3 multipart, GCS resumable, Azure blocks), with
  the reading side's credentials from the environment. Its calls block on the network, so each runs in a
  thread (``asyncio.to_thread``); :meth:`abort` cancels the upload so no half object becomes visible.

:func:`check_destination` is the string check made before anything is read, so that a destination no
sink can write is one line of error (exit status 2), not one failure per shard.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any, Protocol

from ..backends.file import file_identity, local_path
from ..config import RetryPolicy
from ..errors import BackendError, UrlError
from ..io import ObjectIdentity, backend_key, validate_url
from ..urls import redact_url

__all__ = ["WRITABLE", "Destination", "check_destination", "open_destination"]

#: Registry keys (:func:`wds_async.io.backend_key`) that ``cp`` can write to.
WRITABLE = frozenset({"file", "s3", "gs", "az", "azure"})


class Destination(Protocol):
    """One object being written: ``write`` in order, then exactly one of ``commit`` or ``abort``."""

    url: str  # redacted

    async def write(self, data: bytes) -> int: ...

    async def commit(self) -> ObjectIdentity | None: ...

    async def abort(self) -> None: ...


def check_destination(url: str) -> None:
    """Raise :class:`UrlError` (naming the redacted URL and the fix) unless ``cp`` can write ``url``."""
    if backend_key(url) not in WRITABLE:
        raise UrlError("cp writes to local paths, s3://, gs://, az:// and Azure https:// URLs; name one of "
                       "those as the destination", url=redact_url(url))
    validate_url(url)


class LocalDestination:
    """A local file written through :class:`~wds_async._aio.AsyncFileWriter` (a temporary name beside it,
    fsynced and renamed into place on commit, removed on abort)."""

    def __init__(self, url: str) -> None:
        from .._aio import AsyncFileWriter

        self.url = redact_url(url)
        self.path = local_path(url)
        self._out = AsyncFileWriter(self.path)

    async def open(self) -> None:
        try:
            await self._out.open()
        except BackendError as exc:  # named after the temporary file: name the destination instead
            raise type(exc)(exc.message, url=self.url) from None

    async def write(self, data: bytes) -> int:
        await self._out.write(data)
        return len(data)

    async def commit(self) -> ObjectIdentity:
        import aiofiles.os

        await self._out.commit()
        return file_identity(await aiofiles.os.stat(self.path))

    async def abort(self) -> None:
        await self._out.discard()


class SinkDestination:
    """A :mod:`wds_async.write.sinks` sink driven from the loop, each blocking call in a thread. A sink takes one
    call at a time: a call whose caller was cancelled still runs to its end in its thread, and
    :meth:`abort` waits for it first (an abort beside a write still starting the upload would miss it)."""

    def __init__(self, sink: Any) -> None:
        from .._aio import Inflight

        self._sink = sink
        self.url: str = sink.url
        self._calls = Inflight()

    async def write(self, data: bytes) -> int:
        return int(await self._calls.run(asyncio.to_thread(self._sink.write, data)))

    async def commit(self) -> ObjectIdentity | None:
        await self._calls.run(asyncio.to_thread(self._sink.close))  # aborts the upload itself before raising
        identity: ObjectIdentity | None = self._sink.identity
        return identity

    async def abort(self) -> None:
        await self._calls.settle()
        await self._calls.run(asyncio.to_thread(self._sink.abort))


async def open_destination(url: str, *, policy: RetryPolicy | None = None) -> Destination:
    """Start writing ``url``: a :class:`LocalDestination` for local paths, else a sink's upload. A
    cancellation while it opens waits for the open to finish and aborts what it opened (a file created by
    the thread, an upload started), so an interrupted copy leaves nothing behind."""
    opening = asyncio.ensure_future(_open(url, policy))
    try:
        return await asyncio.shield(opening)
    except asyncio.CancelledError:
        with suppress(Exception):
            await (await opening).abort()
        raise


async def _open(url: str, policy: RetryPolicy | None) -> Destination:
    if backend_key(url) == "file":
        local = LocalDestination(url)
        await local.open()
        return local
    from .sinks import open_sink

    sink = await asyncio.to_thread(lambda: open_sink(url, policy=policy))
    return SinkDestination(sink)
