"""How an :class:`~wds_async.IndexedWebDataset` reads: :class:`ShardLayout` plans a batch's work items from where its
samples lie (coalescing neighbours, or a whole shard to learn or cache) and checks what they delivered;
:class:`ProcessReads` is what one process reads with (its engine, its item ids, the shards it knows to have a local
copy, and the batches it reads ahead); :class:`Planned` is the reads of one batch."""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..engine.fetcher import Requests
from ..engine.grouping import Sample
from ..engine.spec import StreamSpec
from ..engine.work import WorkItem
from ..errors import ShardFormatError
from ..index.format import ShardEntry
from ..stats import Stats
from ..urls import redact_url
from .dataset import _path_setter
from .readahead import Ahead

__all__ = ["Planned", "ProcessReads", "ShardLayout"]


@dataclasses.dataclass
class Planned:
    """The reads of one batch: its work items, per item id its shard and ``{offset: sample}`` (None: a shard read
    whole to learn its layout), and the samples asked for by shard."""

    items: list[WorkItem]
    wanted: dict[int, tuple[int, dict[int, int] | None]]
    by_shard: dict[int, set[int]]


class ProcessReads:
    """What one process reads with: its engine, its item ids, the shards it knows to have a local copy, and the
    batches it reads ahead (by their position in the followed order)."""

    def __init__(self, spec: StreamSpec) -> None:
        self.pid = os.getpid()
        self.requests = Requests(spec, Stats())
        self.lock = threading.Lock()
        self._ids = 0
        self.copied: set[int] = set()
        self.ahead: Ahead | None = None
        #: Batches read ahead, by (epoch, position) in the followed order; guarded by ahead_lock, as is ahead.
        self.pending: dict[tuple[int, int], Planned] = {}
        self.ahead_lock = threading.Lock()
        #: Guesses were submitted to this engine since it last failed: an error may be theirs, not the batch's.
        self.guessed = False

    def drop_ahead(self, keep_after: tuple[int, int] | None = None) -> None:
        """Forget the batches read ahead, but those of the same epoch after the position ``keep_after`` names."""
        for key in [k for k in self.pending if keep_after is None or k[0] != keep_after[0] or k[1] <= keep_after[1]]:
            self.requests.discard(item.id for item in self.pending.pop(key).items)

    def submit_ahead(self, order: Any, depth: int, workers: int, indices: Sequence[int],
                     located: list[tuple[int, int]], layout: ShardLayout,
                     locate: Callable[[int], tuple[int, int]]) -> Planned:
        """The reads of the batch ``indices`` (at ``located``), taken from the batches read ahead where it is one of
        them, else submitted now; then this process's next ``depth`` batches along ``order`` (it is one of
        ``workers``), submitted as guesses (see :mod:`wds_async.data.readahead`)."""
        with self.ahead_lock:  # the bookkeeping of one batch at a time (a DataLoader worker has one thread anyway)
            ahead = self.ahead
            if ahead is None or ahead.sampler is not order:
                self.drop_ahead()
                ahead = self.ahead = Ahead(order, workers=workers, depth=depth)
            key = ahead.place(indices)
            planned = self.pending.pop(key, None) if key is not None else None
            if planned is not None:
                self.requests.stats.batches_read_ahead += 1
            self.drop_ahead(keep_after=key)  # guesses before this batch (or off the order) will not be asked for
            if planned is None:
                planned = layout.plan(self, located)
                self.requests.submit(planned.items)
            if key is not None:
                for upcoming_key, upcoming in ahead.upcoming(key, len(indices)):
                    if upcoming_key not in self.pending:
                        guess = layout.plan(self, [locate(i) for i in upcoming])
                        self.requests.submit(guess.items)
                        self.pending[upcoming_key] = guess
                        self.guessed = True
        return planned

    def forget_guesses(self) -> None:
        """After a failure among reads that guesses were part of: drop them all (the engine stopped them)."""
        with self.ahead_lock:
            self.drop_ahead()
            self.guessed = False

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def has_copy(self, cache: Any, shard: int, url: str) -> bool:
        if shard in self.copied or not cache.cacheable(url):
            return True
        if os.path.exists(cache.path(url, ".json")) and os.path.exists(cache.path(url)):
            self.copied.add(shard)
            return True
        return False


class ShardLayout:
    """Where a dataset's samples lie and how a batch of them is read: per shard its URL, its index entry (None for
    a shard whose layout this process has not learned yet: read whole, then learned) and its sample count; the
    coalescing limit; the shard cache (a shard without a local copy is read whole into it)."""

    def __init__(self, urls: list[str], entries: list[ShardEntry | None], counts: list[int], coalesce_bytes: int,
                 cache: Any, *, local: bool) -> None:
        self.urls, self.entries, self.counts = urls, entries, counts  # entries: the dataset's own list, learned in place
        self.coalesce_bytes, self.cache, self.local = coalesce_bytes, cache, local

    def plan(self, proc: ProcessReads, located: Iterable[tuple[int, int]]) -> Planned:
        """The work items that read ``located`` (coalesced runs, or whole shards to learn or cache), with ids of
        ``proc``."""
        by_shard: dict[int, set[int]] = {}
        for shard, sample in located:
            by_shard.setdefault(shard, set()).add(sample)
        items: list[WorkItem] = []
        # item id -> (shard, {offset: sample}); None for a shard read whole to learn its layout
        wanted: dict[int, tuple[int, dict[int, int] | None]] = {}
        with proc.lock:
            for shard, samples in by_shard.items():
                entry = self.entries[shard]
                if entry is None or (self.cache is not None and not proc.has_copy(self.cache, shard,
                                                                                   self.urls[shard])):
                    item_id = proc.next_id()
                    items.append(WorkItem(id=item_id, shard=shard, url=self.urls[shard], compressed=None if entry
                                          is None else entry.compressed,
                                          expect=None if entry is None else entry.identity()))
                    wanted[item_id] = (shard, None if entry is None else {entry.offsets[j]: j for j in samples})
                    continue
                for run in self._runs(entry, sorted(samples)):
                    item_id = proc.next_id()
                    items.append(WorkItem(id=item_id, shard=shard, url=self.urls[shard], start=entry.offsets[run[0]],
                                          end=entry.ends[run[-1]], compressed=entry.compressed,
                                          expect=entry.identity()))
                    wanted[item_id] = (shard, {entry.offsets[j]: j for j in run})
        return Planned(items, wanted, by_shard)

    def finish(self, proc: ProcessReads, planned: Planned, found: dict[int, list[Sample]]
               ) -> dict[tuple[int, int], Sample]:
        """The samples ``planned`` asked for, out of what its items delivered (``found``), each checked; the shards
        it read whole into the cache are recorded in ``proc``."""
        items, wanted, by_shard = planned.items, planned.wanted, planned.by_shard
        if self.cache is not None:
            proc.copied.update(item.shard for item in items if item.end is None)
        set_path = _path_setter() if self.local else None
        out: dict[tuple[int, int], Sample] = {}
        for item_id, (shard, offsets) in wanted.items():
            got_all = found[item_id]
            if offsets is None:  # a shard read whole to learn where its samples lie
                learned = self._learn(shard, got_all)
                offsets = {learned.offsets[j]: j for j in by_shard[shard]}
            entry = self.entries[shard]
            assert entry is not None
            for got in got_all:
                j = offsets.get(got.offset)  # type: ignore[arg-type]
                if j is None:
                    continue  # another sample of a shard read whole
                if got.get("__key__") != entry.keys[j]:
                    raise ShardFormatError(
                        f"{redact_url(self.urls[shard])}: the sample at byte {got.offset} has key "
                        f"{got.get('__key__')!r} but the index says {entry.keys[j]!r}: the index does not "
                        "describe this shard (rebuild it with wds-async index)", url=self.urls[shard],
                        offset=got.offset)
                if set_path is not None:
                    set_path(got)
                out[(shard, j)] = got
            for offset, j in offsets.items():
                if (shard, j) not in out:
                    raise ShardFormatError(
                        f"{redact_url(self.urls[shard])}: no sample starts at byte {offset} (index sample "
                        f"{entry.keys[j]!r}): the index does not describe this shard (rebuild it with "
                        "wds-async index)", url=self.urls[shard], offset=offset)
        return out

    def _learn(self, shard: int, samples: list[Sample]) -> ShardEntry:
        """The layout of a shard read whole (no index): its samples' keys, offsets and ends, checked against the
        count the dataset was given."""
        url = self.urls[shard]
        if len(samples) != self.counts[shard]:
            raise ShardFormatError(f"{redact_url(url)} holds {len(samples)} samples but the shard list says "
                                   f"{self.counts[shard]}: fix the list (or build an index with wds-async index)",
                                   url=url)
        entry = ShardEntry(url=redact_url(url), size=None, keys=tuple(s["__key__"] for s in samples),
                           offsets=tuple(s.offset for s in samples),  # type: ignore[misc]
                           ends=tuple(s.end for s in samples))  # type: ignore[misc]
        self.entries[shard] = entry  # learned in this process (a DataLoader worker keeps its own)
        return entry

    def _runs(self, entry: ShardEntry, samples: list[int]) -> list[list[int]]:
        """``samples`` (sorted) cut into runs of neighbours, each at most ``coalesce_bytes`` long."""
        runs: list[list[int]] = []
        offsets, ends, limit = entry.offsets, entry.ends, self.coalesce_bytes
        for j in samples:
            if runs:
                run = runs[-1]
                last = run[-1]
                if j == last + 1 and ends[last] == offsets[j] and ends[j] - offsets[run[0]] <= limit:
                    run.append(j)
                    continue
            runs.append([j])
        return runs
