"""Copying shards between stores as they are, verifying each as it passes (``wds-async cp``).

Each shard is streamed once: read through a :class:`~wds_async.io.reader.RangeReader` (retries resume at the
byte reached), fed to a :class:`~wds_async.engine.tarstream.TarParser` and a :class:`~wds_async.engine.grouping.Grouper`
(the rules ``verify`` applies), and handed through a queue of at most :data:`QUEUE_CHUNKS` chunks to a
destination (:mod:`wds_async.write.dest`) that writes the bytes unchanged. Memory is therefore about
``concurrency x (QUEUE_CHUNKS + 2)`` chunks, whatever the shard sizes. The destination is opened at the
first chunk, so a source that cannot be read never starts an upload.

A shard is committed (renamed into place, upload completed) only when the parser saw the whole archive,
the grouping rules held, and the bytes read equal the size the source announced (when it did) and the
bytes written; otherwise its destination is aborted, so nothing half-written becomes visible, and the
shard's :class:`CopyReport` carries the error. A failing shard never stops the others.

Destinations (:func:`plan_copies`): a folder (a URL ending in ``/``, or an existing local folder) gets each
shard under its source's file name; a single shard may also be copied to a full object name.
"""

from __future__ import annotations

import asyncio
import os
import shlex
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..backends.file import local_path
from ..config import RetryPolicy
from ..engine.grouping import Sample
from ..engine.shard import ShardParse, read_shard
from ..errors import BackendError, UrlError
from ..index.format import ShardEntry
from ..io import Backend, ObjectIdentity
from ..io.reader import RangeReader, ReadContext
from ..urls import redact_url, scheme_of
from .dest import Destination, check_destination, open_destination

__all__ = ["QUEUE_CHUNKS", "CopyReport", "copy_all", "copy_shard", "is_folder", "plan_copies", "source_name"]

#: Chunks a shard may hold between its reader and its writer: enough to overlap the two, few enough that
#: memory is bounded by the number of shards in flight, not their size.
QUEUE_CHUNKS = 4


@dataclass
class CopyReport:
    """What copying one shard gave: samples and bytes copied, or the error (``ok`` False)."""

    src: str
    dst: str
    ok: bool = True
    samples: int = 0
    bytes: int = 0
    error: str | None = None
    error_type: str | None = None

    def line(self) -> str:
        if self.ok:
            return f"ok   {self.src} -> {self.dst}: {self.samples} samples, {self.bytes} bytes"
        return f"FAIL {self.src} -> {self.dst}: {self.error}"

    def fail(self, exc: BaseException) -> None:
        self.ok, self.error, self.error_type = False, str(exc), type(exc).__name__


def source_name(url: str) -> str:
    """The file name a copy of ``url`` gets in a destination folder (``pipe:``: its command's last word)."""
    if scheme_of(url) == "pipe":
        words = shlex.split(url[len("pipe:"):]) or [""]
        name = words[-1].rsplit("/", 1)[-1].split("?", 1)[0]
    elif scheme_of(url) == "file":
        name = os.path.basename(local_path(url))
    else:
        name = urlsplit(url).path.rsplit("/", 1)[-1]
    if not name or name in (".", ".."):
        raise UrlError("the source has no file name to copy it under: give the destination's full object "
                       "name, or copy it alone", url=redact_url(url))
    return name


def is_folder(dst: str) -> bool:
    """Whether ``dst`` names a folder: it ends in ``/`` (before any query), or is an existing local folder."""
    if scheme_of(dst) in ("http", "https"):
        return dst.split("?", 1)[0].endswith("/")
    return dst.endswith("/") or (scheme_of(dst) == "file" and os.path.isdir(local_path(dst)))


def _join(folder: str, name: str) -> str:
    if scheme_of(folder) in ("http", "https") and "?" in folder:  # an Azure folder with a SAS query
        base, query = folder.split("?", 1)
        return f"{base.rstrip('/')}/{name}?{query}"
    return f"{folder.rstrip('/')}/{name}"


def plan_copies(sources: Sequence[str], dst: str) -> list[tuple[str, str]]:
    """``(source, destination)`` for each source shard; :class:`UrlError` (before anything is read) for a
    destination that cannot be written, a name two sources share, or several sources and one object name."""
    if scheme_of(dst) == "file" and not is_folder(dst) and len(sources) == 1:
        pairs = [(sources[0], dst)]
    elif is_folder(dst):
        pairs = [(src, _join(dst, source_name(src))) for src in sources]
    else:
        raise UrlError(f"the destination names one object and there are {len(sources)} source shards: end it "
                       "with / to copy into a folder, or reshard with --maxcount/--maxsize and a %-format "
                       "(out-%06d.tar)", url=redact_url(dst))
    seen: dict[str, str] = {}
    for src, target in pairs:
        check_destination(target)
        if target in seen:
            raise UrlError(f"two sources would be copied to one name: {redact_url(seen[target])} and "
                           f"{redact_url(src)}; copy them into different folders", url=redact_url(target))
        seen[target] = src
    return pairs


async def copy_shard(backend: Backend, src: str, dst: str, *, policy: RetryPolicy | None = None,
                     on_bytes: Callable[[int], None] | None = None) -> tuple[CopyReport, ShardEntry | None]:
    """Copy one shard (see the module docstring): its report, and its index entry (``None`` on failure)."""
    from asyncio import TaskGroup

    from ..engine.failures import translate

    policy = policy or RetryPolicy()
    report = CopyReport(redact_url(src), redact_url(dst))
    reader = RangeReader(backend, src, context=ReadContext(policy))
    parse = ShardParse(report.src)
    queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE_CHUNKS)
    rows: list[tuple[str, int, int]] = []  # (key, offset, end) per sample: its bytes are dropped at once
    target: Destination | None = None
    written = 0

    def keep(samples: list[Sample]) -> None:
        rows.extend((s["__key__"], s.offset or 0, s.end or 0) for s in samples)

    async def pump() -> None:  # read and verify, then hand each chunk on
        # A truncated shard or one that is not a tar fails in here, before its end reaches the writer.
        async with aclosing(read_shard(reader, parse)) as reads:
            async for chunk, samples in reads:
                keep(samples)
                if chunk:
                    report.bytes += len(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
                    await queue.put(chunk)
        size = (reader.identity or ObjectIdentity()).size
        if size is not None and report.bytes != size:
            raise BackendError(f"read {report.bytes} bytes and the source announced {size}; copy it again",
                               url=report.src)
        await queue.put(None)

    async def drain() -> None:  # write, opening the destination at the first chunk
        nonlocal target, written
        while (chunk := await queue.get()) is not None:
            if target is None:
                target = await open_destination(dst, policy=policy)
            written += await target.write(chunk)

    try:
        async with TaskGroup() as group:
            group.create_task(pump())
            group.create_task(drain())
        if target is None:  # (a whole archive is never empty: the parser refused one)
            raise BackendError("nothing was read to write", url=report.src)
        if written != report.bytes:
            raise BackendError(f"wrote {written} of {report.bytes} bytes", url=report.dst)
        identity = await target.commit()
    except BaseException as exc:
        if target is not None:
            await target.abort()
        error = translate(exc, url=report.src)  # the one error of a TaskGroup's exception group
        if not isinstance(error, Exception):
            raise  # cancellation, Ctrl-C: the destination is aborted, the interrupt goes on
        report.fail(error)
        return report, None
    report.samples = len(rows)
    seen = identity or ObjectIdentity()
    return report, ShardEntry(url=report.dst, size=report.bytes, etag=seen.etag, generation=seen.generation,
                              last_modified=seen.last_modified, compressed=bool(parse.parser.compressed),
                              keys=tuple(r[0] for r in rows), offsets=tuple(r[1] for r in rows),
                              ends=tuple(r[2] for r in rows))


async def copy_all(pairs: Sequence[tuple[str, str]], concurrency: int, *,
                   on_bytes: Callable[[int], None] | None = None,
                   emit: Callable[[CopyReport], None] | None = None,
                   ) -> tuple[list[CopyReport], list[ShardEntry]]:
    """Copy ``pairs`` with ``concurrency`` shards in flight; ``emit`` each report in source order as soon as
    it and all before it are done. Returns every report and the entries of the shards copied, in order.
    Local reads and writes and sink calls run in the loop's default executor, which this replaces with one
    of ``2 * concurrency + 4`` threads (the CLI runs it on a private loop, see :mod:`wds_async._loop`)."""
    from asyncio import TaskGroup

    from ..config import EngineConfig
    from ..io import BackendSet

    # Reads of local files, local writes and sink calls all hop to threads: size the pool to the work.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(2 * concurrency + 4, "wds-async-cp"))
    results: list[tuple[CopyReport, ShardEntry | None] | None] = [None] * len(pairs)
    todo = iter(enumerate(pairs))  # shared by the workers, so shards open in list order
    emitted = 0
    backends = BackendSet(EngineConfig(max_connections=concurrency))

    async def worker() -> None:
        nonlocal emitted
        for i, (src, dst) in todo:
            results[i] = await copy_shard(backends.for_url(src), src, dst, on_bytes=on_bytes)
            while emitted < len(results) and (ready := results[emitted]) is not None:
                if emit is not None:
                    emit(ready[0])
                emitted += 1

    try:
        async with TaskGroup() as group:
            for _ in range(min(concurrency, len(pairs))):
                group.create_task(worker())
    finally:
        await backends.aclose()
    done = [r for r in results if r is not None]
    return [r for r, _ in done], [e for _, e in done if e is not None]
