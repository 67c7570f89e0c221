"""Reading one work item, for the engine's readers: open it, stream its bytes, parse them, deliver its samples.

:meth:`ItemReads.fetch` opens the item through its source (the store, or the shard cache wrapped around it), reads
its bytes through a :class:`~wds_async.engine.parts.PartedRead` (a :class:`~wds_async.io.reader.RangeReader`, which
retries transient failures, resuming at the byte reached, and checks the object's identity on every open; plus
concurrent ranged parts on extra tokens when the object is large) into a sans-IO
:class:`~wds_async.engine.tarstream.TarParser` started at the item's offset and a
:class:`~wds_async.engine.grouping.Grouper`, and puts complete samples, tagged with the item's id, into the channel.
Before every read it waits on the byte budget (:meth:`~wds_async.engine.tokens.Tokens.wait_for_room`). A compressed
item is inflated from byte 0 and its members outside ``[start, end)`` dropped. A small known range (at most
``AT_ONCE_BYTES`` and ``part_bytes``: a random-access read) is read whole by one ``RangeReader`` after one wait for
room, counted in the budget as it arrives, and parsed in one go. Opening the item in the channel, its end marker and
its errors are the caller's (:meth:`~wds_async.engine.engine.Engine._read_item`).
"""

from __future__ import annotations

import functools
import logging
from asyncio import TaskGroup
from contextlib import aclosing
from dataclasses import replace

from ..config import EngineConfig
from ..errors import SampleTooLarge, ShardFormatError
from ..io import Backend, BackendSet
from ..io.reader import RangeReader, ReadContext
from ..io.source import ItemSource, OpenedItem, StoreSource
from ..stats import Stats
from ..urls import redact_url
from .channel import SampleChannel
from .grouping import Grouper, Sample, sample_nbytes
from .limiter import Limiter
from .outcomes import Outcomes
from .parts import Lanes, PartedRead
from .shard import ShardParse, read_shard
from .tokens import Tokens
from .work import WorkItem

__all__ = ["AT_ONCE_BYTES", "ItemReads"]

#: A known range of at most this many bytes (and no larger than ``part_bytes``) is read whole, then parsed at once
#: (a random-access read); it stays within what a stream's allowance already counts in the byte budget.
AT_ONCE_BYTES = 256 << 10

log = logging.getLogger("wds_async")


class ItemReads:
    """How an engine reads one item (see the module docstring): what all its readers share."""

    def __init__(self, source: ItemSource, backends: BackendSet, channel: SampleChannel, stats: Stats,
                 config: EngineConfig, outcomes: Outcomes, tokens: Tokens, limiter: Limiter) -> None:
        self.source = source
        self._store_only = StoreSource()
        self.backends = backends
        self.channel = channel
        self.budget = channel.budget
        self.stats = stats
        self.config = config
        self._outcomes = outcomes
        #: What every read shares (retries, counters, the byte budget); each item adds its token's requeue.
        self._reads = ReadContext(config.retry, stats, channel.budget)
        self._tokens = tokens
        self.limiter = limiter

    def _emit(self, token: object, item: WorkItem, samples: list[Sample], held: int, parse: ShardParse,
              progress: _Progress) -> int:
        """Put complete samples into the channel and re-account the bytes this reader holds."""
        emitted = 0
        for sample in samples:
            nbytes = sample_nbytes(sample)
            emitted += nbytes
            sample.item = item.id
            self.channel.put(token, sample, nbytes)
            progress.end = sample.end
        self.stats.samples_read += len(samples)
        new_held = parse.pending_bytes
        self.budget.add(new_held + emitted - held)
        return new_held

    async def _is_gzip(self, backend: Backend, item: WorkItem) -> bool:
        """Look at the first two bytes of an object whose compression is unknown."""
        head = b""
        reader = RangeReader(backend, item.url, start=0, end=2, expect=item.expect,
                             context=ReadContext(self.config.retry))
        async with aclosing(reader.chunks()) as chunks:
            async for chunk in chunks:
                head += chunk
        return head[:2] == b"\x1f\x8b"

    async def fetch(self, item: WorkItem, token: object) -> None:
        """Stream one work item through its source, a parser and a grouper into the channel.

        An uncompressed item is read as the byte range ``[start, end)`` and must end at a member boundary
        (or, without ``end``, at the archive's end marker). A compressed one is inflated from byte 0; its
        members outside ``[start, end)`` are dropped before grouping, and reading stops at ``end``
        (:class:`~wds_async.engine.shard.ShardParse`). A format error in a local copy of the object (the
        source says ``local``) may be the copy's own damage: the source forgets the copy and the rest of the
        item, from the end of the last sample delivered, is read once more, from the store.
        """
        progress = _Progress()
        try:
            await self._fetch_once(item, token, progress)
        except ShardFormatError as exc:
            opened = progress.opened
            if opened is None or not opened.local:
                raise
            log.warning("wds-async: the local copy of %s is damaged (%s); dropped, reading the shard from the store",
                        redact_url(item.url), exc)
            await opened.discard(item.url)
            rest = item if progress.end is None else replace(item, start=progress.end)
            await self._fetch_once(rest, token, _Progress(), store=True)

    async def _fetch_once(self, item: WorkItem, token: object, progress: _Progress, *, store: bool = False) -> None:
        backend = self.backends.for_url(item.url)
        source = self._store_only if store else self.source
        whole = item.start == 0 and item.end is None
        async with source.open(item.url, whole=whole, backend=backend) as opened:
            progress.opened = opened
            if opened.reserve:
                self.budget.reserve(opened.reserve)
            try:
                await self._read_opened(item, token, opened, progress)
            finally:
                if opened.reserve:
                    self.budget.unreserve(opened.reserve)

    async def _read_opened(self, item: WorkItem, token: object, opened: OpenedItem, progress: _Progress) -> None:
        backend = opened.backend
        compressed = item.compressed
        if compressed is None and item.start > 0:
            compressed = await self._is_gzip(backend, item)
        ranged = not compressed
        part_bytes = self.config.part_bytes
        if (ranged and item.end is not None and item.end - item.start <= min(AT_ONCE_BYTES, part_bytes or AT_ONCE_BYTES)
                and opened.on_chunk is None):
            # A small known range (a random-access read is one per sample or run of samples): one request, read
            # whole, parsed in one go; no parts, so no helper tasks and no TaskGroup to own them.
            reader = RangeReader(backend, item.url, start=item.start, end=item.end, expect=item.expect,
                                 context=self._context(token))
            await self._parse_item(item, token, reader, reader, ranged, opened, progress, at_once=True)
            return
        if not part_bytes or (ranged and item.end is not None and item.end - item.start <= part_bytes):
            # Never split into parts: no helper tasks, so no TaskGroup to own them.
            await self._read_parts(item, token, opened, progress, ranged, None)
            return
        failure: BaseException | None = None
        async with TaskGroup() as group:
            try:
                await self._read_parts(item, token, opened, progress, ranged, group)
            except BaseException as exc:  # re-raised below, outside the group
                failure = exc
        if failure is not None:
            raise failure

    def _context(self, token: object) -> ReadContext:
        """The engine's read context with ``token``'s requeue (awaited before a throttled request is retried)."""
        shared = self._reads
        return ReadContext(shared.policy, shared.stats, shared.budget, functools.partial(self._tokens.requeue, token))

    async def _read_parts(self, item: WorkItem, token: object, opened: OpenedItem, progress: _Progress, ranged: bool,
                          group: TaskGroup | None) -> None:
        """Read the item through a :class:`PartedRead` whose helpers (if it splits) run in ``group``."""
        lanes = Lanes(self.limiter, self.channel, token, self.config.part_bytes, group)
        reader = PartedRead(opened.backend, item.url, start=item.start if ranged else 0,
                            end=item.end if ranged else None, expect=item.expect,
                            context=self._context(token), lanes=lanes)
        try:
            await self._parse_item(item, token, reader, reader.first, ranged, opened, progress)
        finally:
            reader.close()

    async def _parse_item(self, item: WorkItem, token: object, source: PartedRead | RangeReader, first: RangeReader,
                          ranged: bool, opened: OpenedItem, progress: _Progress, *, at_once: bool = False) -> None:
        """Feed the item's bytes (``source``'s chunks; ``first`` is its first request, which says the object's
        identity) to a parser and a grouper and its samples to the channel; the source sees every chunk as it
        passes (``on_chunk``) and hears when the whole item was read and parsed (``done``). ``at_once``: a small
        range, waited for once, read whole and parsed in one go."""
        limit = self.config.max_sample_bytes
        rules = self._outcomes.rules(item)
        grouper = Grouper(first.shown, self._outcomes.on_sample_error(item), select_files=rules.select_files,
                          rename_files=rules.rename_files, max_sample_bytes=limit)
        parse = ShardParse(first.shown, start=item.start, end=item.end, ranged=ranged, grouper=grouper,
                           max_member_bytes=limit)
        held = 0
        try:
            if at_once:
                # Counted as they arrive, as a streamed chunk is once parsed; the parser's own buffer then takes over
                await self._tokens.wait_for_room(token)
                pieces: list[bytes] = []
                async with aclosing(source.chunks()) as chunks:
                    async for chunk in chunks:
                        pieces.append(chunk)
                        self.budget.add(len(chunk))
                        held += len(chunk)
                whole = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                pieces = []
                samples = parse.feed(whole)
                samples += parse.finish()
                held = self._emit(token, item, samples, held, parse, progress)
                samples = []
            else:
                on_chunk = None
                if opened.on_chunk is not None:
                    tee = opened.on_chunk

                    async def on_chunk(chunk: bytes) -> None:
                        await tee(chunk, first.identity.size if first.identity else None)

                async with aclosing(read_shard(source, parse, before_read=lambda: self._tokens.wait_for_room(token),
                                               on_chunk=on_chunk)) as reads:
                    async for _chunk, samples in reads:
                        held = self._emit(token, item, samples, held, parse, progress)
                        # Drop the chunk's samples before the next await: alive across it, tens of thousands of
                        # small objects per reader reach the collector's oldest generation and cost full collections.
                        samples = []
            held = 0
            if not parse.done:
                await opened.done(first.identity)
        except SampleTooLarge as exc:  # refused from its tar header: name the sample it would have started
            if exc.key is None and exc.member is not None:
                exc.key = grouper.key_of(exc.member)
            raise
        finally:
            if held:
                self.budget.release(held)


class _Progress:
    """How far one item got, and where its bytes came from (for the fallback from a damaged local copy)."""

    __slots__ = ("end", "opened")

    def __init__(self) -> None:
        self.end: int | None = None  # just past the last sample delivered
        self.opened: OpenedItem | None = None  # what the item's source opened (is it a local copy? how to drop it)
