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
import os
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.work import WorkItem
from ..urls import url_key
from .pipeline import split_by_node, split_by_worker
from .plan import Processes, buffer_shuffled, epoch_seed, index_items, resampled_items, shard_items, shard_order
from .shardlists import default_worker_seed, make_seed
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
    seed: Any = None  # the seed this process's shard shuffle used

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


def _default_seed(seed: Any, shared: bool) -> Any:
    """``seed``, or webdataset's default for ``None``: ``WDS_SEED`` (a string, as webdataset reads it) or a random
    int; ``shared``: one that every process agrees on, ``WDS_SEED`` or 0."""
    if seed is not None:
        return seed
    drawn = os.environ.get("WDS_SEED", random.randint(0, 1000000))  # drawn whether used or not, as webdataset does
    return os.environ.get("WDS_SEED", 0) if shared else drawn


class Planner:
    """Plans epochs for one dataset (see the module docstring).

    ``shardshuffle``: ``True`` (webdataset's 100) or a buffer size; ``False``, ``None`` or 0: shard order.
    ``seed``: the shard shuffle's seed; ``None`` takes webdataset's default, ``WDS_SEED`` or a random one drawn
    here, at construction, so every DataLoader worker shares it (the index order and deterministic resampling,
    which every process must agree on or repeat, take ``WDS_SEED`` or 0 instead). The seed in use is part of
    every state, so a resume rebuilds the same order. ``detshuffle``: the epoch advances by one on every new pass
    in this process (webdataset's ``detshuffle``), counting from the dataset's epoch; without it the epoch is
    the dataset's, 0 unless ``set_epoch`` changed it. ``resampled`` with ``detshuffle`` draws from webdataset's
    deterministic ``ResampledShards`` seed, without from the OS.
    """

    def __init__(self, urls: Sequence[str], *, entries: Sequence[Any] | None, shardshuffle: bool | int | None,
                 seed: Any, resampled: bool, detshuffle: bool, drop_last: bool,
                 splitters: tuple[Callable[..., Any] | None, Callable[..., Any] | None]) -> None:
        self.urls, self.entries = list(urls), entries
        self.bufsize = 100 if shardshuffle is True else max(0, int(shardshuffle or 0))
        self.shardshuffle = self.bufsize > 0
        self.seed = _default_seed(seed, shared=entries is not None or resampled)
        self.resampled, self.detshuffle, self.drop_last = resampled, detshuffle, drop_last
        self.splitters = splitters
        self._passes: tuple[int, int] | None = None  # (the dataset epoch counted from, the next pass's epoch)
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

    def pass_epoch(self, epoch: int) -> int:
        """The epoch the next fresh pass plans, the dataset's epoch being ``epoch`` (see the class docstring)."""
        if self.detshuffle and self._passes is not None and self._passes[0] == epoch:
            return self._passes[1]
        return epoch

    def _passed(self, epoch: int, used: int) -> None:
        if self.detshuffle:
            self._passes = (epoch, used + 1)

    def base(self, epoch: int, seed: Any = None) -> list[list[Any]]:
        """The whole epoch's work as runs: shard order, or with an index this epoch's shuffled shard order."""
        if self.entries is None:
            return [[s, 0, None] for s in range(len(self.urls))]
        order = self._order(epoch, seed)
        return [[s, 0, self.entries[s].nsamples] for s in order if self.entries[s].nsamples]

    def _order(self, epoch: int, seed: Any) -> list[int]:
        return shard_order(len(self.urls), self.seed if seed is None else seed, epoch,
                           self.shardshuffle and self.entries is not None)

    def items(self, base: list[list[Any]], procs: Processes, epoch: int = 0, seed: Any = None) -> list[WorkItem]:
        """This process's items of ``base``: its equal share with an index; else its split of the runs, shuffled
        as webdataset shuffles a process's shards (``seed``: this process's, ``None``: the planner's)."""
        if self.entries is not None:
            return index_items(base, self.entries, self.urls, procs, self.drop_last)
        reorder = None
        if self.shardshuffle:
            bufsize, shuffle_seed = self.bufsize, epoch_seed(self.seed if seed is None else seed, epoch)

            def reorder(entries: list[Any]) -> list[Any]:
                return buffer_shuffled(entries, bufsize, shuffle_seed)

        if self._default_split():
            # By ``procs`` alone: this process counts a disabled splitter as one of one, and an old process of an
            # elastic merge says how it was split, whatever this dataset's splitters are (rebuilt with this one's, a
            # state saved by DataLoader workers and merged into a dataset with workersplitter=None gave every old
            # worker the whole list: samples twice, or offsets of one shard applied to another)
            runs = base[procs.rank::procs.world][procs.worker::procs.workers]
            return shard_items(runs, self.urls, (), reorder)
        return shard_items(base, self.urls, self.splitters, reorder)

    def work_items(self, epoch: int) -> list[WorkItem]:
        """The items the next fresh pass of this process reads, the dataset's epoch being ``epoch``."""
        used = self.pass_epoch(epoch)
        return self.items(self.base(used), self.processes(), used)

    def _resample_seed(self, epoch: int) -> int:
        """webdataset's ``ResampledShards(urls, seed=seed, deterministic=True)`` seed for this process and epoch."""
        return make_seed(default_worker_seed(), epoch, self.seed)

    def _resampled_epoch(self, ep: Epoch) -> Epoch:
        seed, splitters = ep.resample_seed, self.splitters
        ep.remake = lambda: resampled_items(self.urls, seed, splitters)  # type: ignore[method-assign]
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
            used = self.pass_epoch(epoch)
            self._passed(epoch, used)
            if not self.resampled:
                return Epoch(used, procs, self.items(self.base(used), procs, used), seed=self.seed)
            seed = self._resample_seed(used) if self.detshuffle else random.SystemRandom().randrange(2**63)
            return self._resampled_epoch(Epoch(used, procs, [], resample_seed=seed, seed=self.seed))
        self._check(source, procs)
        if source["epoch"] != epoch and not self.detshuffle:
            log.warning("wds-async: resuming epoch %d from the loaded state; the dataset's epoch %d (set_epoch) "
                        "applies from the next iteration on", source["epoch"], epoch)
        self._passed(epoch, source["epoch"])
        seed = self._seed_of(source)
        resumed = source["epoch"]
        progress = Progress.from_dict(source["progress"])
        if self.resampled:
            resample_seed = source["resample_seed"]
            if resample_seed is None:  # a state of an older version, which kept no seed when deterministic
                resample_seed = self._resample_seed(resumed)
            return self._resampled_epoch(Epoch(resumed, procs, [], progress, resample_seed=resample_seed, seed=seed))
        base = source["base"]
        items = self.items(base if base is not None else self.base(resumed, seed), procs, resumed, seed)
        return Epoch(resumed, procs, items, progress, base, seed=seed)

    def _seed_of(self, source: dict[str, Any]) -> Any:
        """The seed the state's process shuffled with. A state without one comes from a wds-async that shuffled
        shards another way (before the split); only its unshuffled or index plans can be rebuilt."""
        if "seed" in source:
            return source["seed"]
        if self.mode == "shards" and self.shardshuffle and source["epoch"] is not None:
            raise ValueError("this state was saved by an older wds-async, whose shard shuffle (before the split by "
                             "rank and worker) is not webdataset's; its shard order cannot be rebuilt: finish that "
                             "epoch with the version that saved it, or start the epoch afresh")
        return self.seed

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
        dataset_epoch = epoch
        epoch = next((s["source"]["epoch"] for s in states if s["source"]["epoch"] is not None),
                     self.pass_epoch(epoch))
        self._passed(dataset_epoch, epoch)
        plans = []
        for state in states:
            source = state["source"]
            self._check(source, Processes(*source["processes"]))
            old = Processes(*source["processes"])
            seed = self._seed_of(source)  # each old process's own: its shards were shuffled with it
            base = source["base"] if source["base"] is not None else self.base(epoch, seed)
            plans.append((self.items(base, old, epoch, seed), Progress.from_dict(source["progress"]), held(state)))
        order = self._order(epoch, self._seed_of(states[0]["source"]))
        base = remaining_runs(plans, self.entries, order)
        return Epoch(epoch, procs, self.items(base, procs, epoch), Progress(), base, seed=self.seed)

    def source_state(self, ep: Epoch | None) -> dict[str, Any]:
        """The JSON-friendly state of ``ep`` (or of an epoch not started yet)."""
        procs = ep.procs if ep is not None else self.processes()
        return {
            "dataset": self.fingerprint, "mode": self.mode, "epoch": ep.epoch if ep is not None else None,
            "processes": procs.as_list(), "base": ep.base if ep is not None else None,
            "resample_seed": ep.resample_seed if ep is not None else None,
            "seed": ep.seed if ep is not None else self.seed,
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
