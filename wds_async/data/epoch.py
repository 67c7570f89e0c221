"""One process's epoch of a :class:`~wds_async.WebDataset`: its plan, its progress, how it resumes.

:class:`Planner` knows what every process knows alike (shards, index, seed, splitting rules) and makes
an :class:`Epoch` for this process: the work items it reads (see :mod:`wds_async.data.plan`) and a
:class:`~wds_async.data.state.Progress` that the dataset updates as samples reach the consumer. Its state
names shards by their index in the URL list and by the dataset's fingerprint (URLs without their
query, so a job may resume with freshly signed URLs), never by a URL.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.work import WorkItem
from ..urls import url_key
from .pipeline import split_by_node, split_by_worker
from .plan import Processes, index_items, shard_items, shard_order
from .state import Progress, remaining_runs
from .topology import node_info, worker_info

__all__ = ["Epoch", "Planner"]

log = logging.getLogger("wds_async")


@dataclass
class Epoch:
    """This process's work in one epoch and what it delivered of it."""

    epoch: int
    procs: Processes
    items: Iterable[WorkItem]
    progress: Progress = field(default_factory=Progress)
    base: list[list[Any]] | None = None  # set when the epoch's work came from an elastic merge
    resample_seed: int | None = None

    def todo(self) -> Iterator[WorkItem]:
        """The items still to read, each starting where its delivered samples end."""
        for item in self.items:
            left = self.progress.resume(item)
            if left is not None:
                yield left

    def item(self, item_id: int) -> WorkItem:
        """The planned item ``item_id`` (ids are positions in the plan)."""
        if isinstance(self.items, list):
            return self.items[item_id]
        return next(itertools.islice(self.remake(), item_id, None))

    def remake(self) -> Iterable[WorkItem]:
        """A fresh iterator over a lazy plan (replaced for resampled epochs)."""
        return iter(self.items)


class Planner:
    """Plans epochs for one dataset (see the module docstring)."""

    def __init__(self, urls: Sequence[str], *, entries: Sequence[Any] | None, shardshuffle: bool, seed: int,
                 resampled: bool, detshuffle: bool, drop_last: bool,
                 splitters: tuple[Callable[..., Any] | None, Callable[..., Any] | None]) -> None:
        self.urls, self.entries = list(urls), entries
        self.shardshuffle, self.seed = shardshuffle, seed
        self.resampled, self.detshuffle, self.drop_last = resampled, detshuffle, drop_last
        self.splitters = splitters
        self.mode = "resampled" if resampled else "index" if entries is not None else "shards"
        digest = hashlib.sha256(self.mode.encode())
        for n, url in enumerate(self.urls):
            digest.update(f"\n{url_key(url)}".encode())
            if entries is not None:
                entry = entries[n]
                digest.update(f" {entry.size} {entry.etag} {entry.generation} {entry.nsamples}".encode())
        self.fingerprint = digest.hexdigest()[:32]

    def processes(self) -> Processes:
        """This process among the job's loader processes (a disabled splitter counts as one of one)."""
        node, worker = self.splitters
        rank, world = node_info() if node is not None else (0, 1)
        wid, workers = worker_info() if worker is not None else (0, 1)
        return Processes(rank, world, wid, workers)

    def _default_split(self) -> bool:
        return self.splitters[0] in (None, split_by_node) and self.splitters[1] in (None, split_by_worker)

    def base(self, epoch: int) -> list[list[Any]]:
        """The whole epoch's work as runs, in this epoch's shard order."""
        order = shard_order(len(self.urls), self.seed, epoch, self.shardshuffle)
        if self.entries is None:
            return [[s, 0, None] for s in order]
        return [[s, 0, self.entries[s].nsamples] for s in order if self.entries[s].nsamples]

    def items(self, base: list[list[Any]], procs: Processes) -> list[WorkItem]:
        if self.entries is not None:
            return index_items(base, self.entries, self.urls, procs, self.drop_last)
        if self._default_split():
            node, worker = self.splitters
            runs = base[procs.rank::procs.world] if node is not None else base
            runs = runs[procs.worker::procs.workers] if worker is not None else runs
            return shard_items(runs, self.urls, ())
        return shard_items(base, self.urls, self.splitters)

    def _resampled(self, epoch: int, procs: Processes, seed: int | None) -> Iterator[WorkItem]:
        rng = random.Random(f"{self.seed}:{procs.rank}:{procs.worker}:{epoch}" if seed is None else seed)
        for n in itertools.count():
            shard = rng.randrange(len(self.urls))
            yield WorkItem(id=n, shard=shard, url=self.urls[shard])

    def _resampled_epoch(self, ep: Epoch) -> Epoch:
        ep.remake = lambda: self._resampled(ep.epoch, ep.procs, ep.resample_seed)  # type: ignore[method-assign]
        ep.items = ep.remake()
        return ep

    def start(self, epoch: int, resume: dict[str, Any] | None, held: Callable[[dict[str, Any]], list[list[int]]]
              ) -> Epoch:
        """This process's epoch: fresh, resumed from its own state, or re-split from an elastic merge.
        ``held(state)`` lists the positions a pipeline state's stages held (they count as undelivered)."""
        procs = self.processes()
        if resume is not None and "elastic" in resume:
            return self._elastic(resume["elastic"], procs, held, epoch)
        source = resume["source"] if resume is not None else None
        if source is not None and source["epoch"] is None:  # saved before its first sample: a fresh start
            self._check(source, procs)
            source = None
        if source is None:
            seed = None if self.detshuffle else random.SystemRandom().randrange(2**63)
            if not self.resampled:
                return Epoch(epoch, procs, self.items(self.base(epoch), procs))
            return self._resampled_epoch(Epoch(epoch, procs, [], resample_seed=seed))
        self._check(source, procs)
        if source["epoch"] != epoch:
            log.warning("wds-async: resuming epoch %d from the loaded state; the dataset's epoch %d (set_epoch) "
                        "applies from the next iteration on", source["epoch"], epoch)
        epoch = source["epoch"]
        progress = Progress.from_dict(source["progress"])
        if self.resampled:
            return self._resampled_epoch(Epoch(epoch, procs, [], progress, resample_seed=source["resample_seed"]))
        base = source["base"]
        return Epoch(epoch, procs, self.items(base if base is not None else self.base(epoch), procs), progress, base)

    def _check(self, source: dict[str, Any], procs: Processes) -> None:
        if source["dataset"] != self.fingerprint or source["mode"] != self.mode:
            raise ValueError("this state belongs to another dataset (other shards, index or mode: "
                             f"{source['mode']!r} vs {self.mode!r}); it cannot be resumed here")
        if source["processes"] != procs.as_list():
            raise ValueError(f"this state was saved by process {source['processes']} ([rank, world, worker, workers]) "
                             "but "
                             f"is loaded in {procs.as_list()}; to resume with another world size or worker count, "
                             "merge every process's state with wds_async.merge_states() and load that")

    def _elastic(self, states: list[dict[str, Any]], procs: Processes,
                 held: Callable[[dict[str, Any]], list[list[int]]], epoch: int) -> Epoch:
        if self.resampled:
            raise ValueError("an elastic resume re-splits the rest of an epoch; a resampled dataset has no fixed "
                             "epoch to split: start it afresh with the new world size")
        if self.entries is None and not self._default_split():
            raise ValueError("an elastic resume without an index needs the default node and worker splitters")
        # A process that had not delivered its first sample saved no epoch: it owes its whole share.
        epoch = next((s["source"]["epoch"] for s in states if s["source"]["epoch"] is not None), epoch)
        plans = []
        for state in states:
            source = state["source"]
            self._check(source, Processes(*source["processes"]))
            old = Processes(*source["processes"])
            base = source["base"] if source["base"] is not None else self.base(epoch)
            plans.append((self.items(base, old), Progress.from_dict(source["progress"]), held(state)))
        order = shard_order(len(self.urls), self.seed, epoch, self.shardshuffle)
        base = remaining_runs(plans, self.entries, order)
        return Epoch(epoch, procs, self.items(base, procs), Progress(), base)

    def source_state(self, ep: Epoch | None) -> dict[str, Any]:
        """The JSON-friendly state of ``ep`` (or of an epoch not started yet)."""
        procs = ep.procs if ep is not None else self.processes()
        return {
            "dataset": self.fingerprint, "mode": self.mode, "epoch": ep.epoch if ep is not None else None,
            "processes": procs.as_list(), "base": ep.base if ep is not None else None,
            "resample_seed": ep.resample_seed if ep is not None else None,
            "progress": (ep.progress if ep is not None else Progress()).to_dict(),
        }

    def reread_items(self, ep: Epoch, positions: list[list[int]]) -> list[WorkItem]:
        """Items that re-read the samples at ``positions`` ``[item, offset, end]``: one per shard, spanning
        them (a compressed shard can only be entered at its start anyway)."""
        spans: dict[int, list[int]] = {}
        for item_id, offset, end in positions:
            item = ep.item(item_id)
            span = spans.setdefault(item.shard, [offset, end])
            span[0], span[1] = min(span[0], offset), max(span[1], end)
        out = []
        for n, (shard, (start, end)) in enumerate(spans.items()):
            entry = self.entries[shard] if self.entries is not None else None
            out.append(WorkItem(id=n, shard=shard, url=self.urls[shard], start=start, end=end,
                                compressed=entry.compressed if entry is not None else None,
                                expect=entry.identity() if entry is not None else None))
        return out
