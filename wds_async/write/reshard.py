"""Resharding for ``wds-async cp --maxcount/--maxsize``: the samples of many shards, in order, rewritten into
new shards by a :class:`~wds_async.write.writer.ShardWriter`.

Up to ``concurrency`` source shards are read at once (through the loader's reader and tar parser, by
:func:`~wds_async.engine.shard.shard_samples` with this module's grouper), each into a queue of at most
:data:`QUEUE_BATCHES` batches of samples; one writer takes the shards' queues in source order, so the output holds the samples
in the order the sources list them and memory stays bounded by the shards in flight. The writer's calls
block (files, uploads), so each batch is written in a thread.

Grouping is webdataset's (:func:`~wds_async.engine.grouping.split_key`, metadata and resource-fork members
skipped, a repeated extension an error) but keeps each field's extension as the archive spells it: the
bytes and member names are written unchanged (``encoder=False``), in the writer's sorted field order.

A source that fails (missing, truncated, not a tar) is reported and the others go on; the samples it
completed before the failure are written (each sample is whole: it is cut only once the next begins).
A writer failure ends the run: every source not yet written is reported with that error.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from typing import Any

from .._aio import Inflight
from ..engine.grouping import _skipped, split_key
from ..engine.shard import shard_samples
from ..engine.tarstream import Member
from ..errors import SampleError, WdsError
from ..urls import redact_url
from .copy import CopyReport

__all__ = ["QUEUE_BATCHES", "RawGrouper", "reshard_all"]

#: Batches of samples (each what one chunk of a source completed) a source may hold ahead of the writer.
QUEUE_BATCHES = 4


class RawGrouper:
    """Members -> sample dicts ``{"__key__": key, ext: bytes}`` with extensions as written (see the module
    docstring); a repeated extension (compared case-blind, as readers lower-case them) is a SampleError."""

    pending_bytes = 0  # the samples it holds are counted where they are queued, not here

    def __init__(self, url: str) -> None:
        self.url = url
        self._current: dict[str, Any] | None = None
        self._seen: set[str] = set()

    def push(self, members: Sequence[Member]) -> list[dict[str, Any]]:
        done = []
        for member in members:
            if ("__" in member.name or "._" in member.name) and _skipped(member.name):
                continue
            parts = split_key(member.name)
            if parts is None:
                continue
            key, ext = parts
            if self._current is None or self._current["__key__"] != key:
                if self._current is not None:
                    done.append(self._current)
                self._current, self._seen = {"__key__": key}, set()
            if ext.lower() in self._seen:
                raise SampleError(f"repeated extension {ext!r} in sample {key!r} (member {member.name!r})",
                                  url=self.url, offset=member.offset, member=member.name)
            self._seen.add(ext.lower())
            self._current[ext] = member.data
        return done

    def finish(self) -> list[dict[str, Any]]:
        last, self._current = self._current, None
        return [last] if last is not None else []


def _write(writer: Any, samples: list[dict[str, Any]], into: list[str]) -> None:
    """Write ``samples`` (in a thread); add the names of the shards they went into to ``into``."""
    for sample in samples:
        writer.write(sample)
        if not into or into[-1] != writer.fname:
            into.append(writer.fname)


async def reshard_all(urls: Sequence[str], make_writer: Callable[[], Any], concurrency: int, *,
                      on_bytes: Callable[[int], None] | None = None,
                      emit: Callable[[CopyReport], None] | None = None,
                      ) -> tuple[list[CopyReport], list[str], Exception | None]:
    """Read ``urls`` (up to ``concurrency`` at once) and write their samples in order with the
    :class:`~wds_async.write.writer.ShardWriter` ``make_writer()`` returns (called in a thread), closing it at the
    end. Returns one report per source (``dst``: the output shards its samples went into, joined by
    ``,``), emitted in order as each source is handed to the writer; the names of the shards written; and
    the writer's error, if it failed (the sources not yet written are then reported with it)."""
    from asyncio import TaskGroup

    from ..config import EngineConfig
    from ..io import BackendSet

    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(concurrency + 4, "wds-async-reshard"))
    queues: list[asyncio.Queue[list[dict[str, Any]] | WdsError | None]] = [
        asyncio.Queue(QUEUE_BATCHES) for _ in urls]
    reports = [CopyReport(redact_url(url), "") for url in urls]
    todo = iter(enumerate(urls))
    backends = BackendSet(EngineConfig(max_connections=concurrency))

    async def reader() -> None:
        for i, url in todo:
            def count(n: int, report: CopyReport = reports[i]) -> None:
                report.bytes += n
                if on_bytes is not None:
                    on_bytes(n)

            try:
                samples = shard_samples(backends.for_url(url), url, on_bytes=count, grouper=RawGrouper(redact_url(url)))
                async with aclosing(samples) as batches:
                    async for batch in batches:
                        await queues[i].put(batch)
            except WdsError as exc:
                await queues[i].put(exc)
            else:
                await queues[i].put(None)

    shards: list[str] = []
    finished = 0  # reports emitted
    failure: Exception | None = None

    async def writer_task() -> None:
        nonlocal finished
        calls = Inflight()  # the writer's calls, one at a time; a cancelled one still ends in its thread
        making = asyncio.ensure_future(asyncio.to_thread(make_writer))
        try:
            writer = await calls.run(making)
            for i, report in enumerate(reports):
                into: list[str] = []
                while (item := await queues[i].get()) is not None:
                    if isinstance(item, WdsError):
                        report.fail(item)
                        break
                    await calls.run(asyncio.to_thread(_write, writer, item, into))
                    report.samples += len(item)
                report.dst = ",".join(redact_url(name) for name in into)
                for name in into:
                    if not shards or shards[-1] != name:
                        shards.append(name)
                finished += 1
                if emit is not None:
                    emit(report)
            await calls.run(asyncio.to_thread(writer.close))
        except BaseException:
            await calls.settle()  # then abort: the shard being written is discarded, and no index written
            if not making.cancelled() and making.exception() is None:
                await asyncio.to_thread(making.result().abort)
            raise

    try:
        async with TaskGroup() as group:
            group.create_task(writer_task())
            for _ in range(min(concurrency, len(urls))):
                group.create_task(reader())
    except BaseException as exc:
        from ..engine.failures import translate

        error = translate(exc)
        if not isinstance(error, Exception):
            raise  # cancellation, Ctrl-C
        failure = error
        for report in reports[finished:]:  # the writer failed: these sources were not (wholly) written
            report.fail(error)
            if emit is not None:
                emit(report)
    finally:
        await backends.aclose()
    return reports, [redact_url(s) for s in shards], failure
