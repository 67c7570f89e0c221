"""An epoch's plan: which work items this process (rank and DataLoader worker) reads, in order.

The plan is a pure function of what every process knows alike (shard list or index, ``seed``,
``epoch``, world size, worker count) and of the epoch's *base*: the work of the whole epoch, as runs.

* **Shard runs** ``(shard, start, end)``: byte ranges of shards (``end=None``: to the end). A fresh epoch
  is one run per shard, in shard order; the node and worker splitters pick this process's runs, and
  ``shardshuffle=n`` then shuffles them as webdataset 1.0.2's ``WebDataset`` does, after the split, with
  its buffer shuffle of size ``n`` seeded by :func:`epoch_seed` (so the same seed gives the same order).
* **Resampled**: shards drawn with replacement, endlessly, as webdataset's ``ResampledShards`` draws them
  (``rng.randint`` over the list), then split by the node and worker splitters as its ``WebDataset`` does.
* **Index runs** ``(shard, lo, hi)``: sample ranges of shards whose sample offsets an index records.
  The runs are laid end to end and cut into ``world * workers`` shares of equal sample counts (a share
  may begin and end mid-shard). ``drop_last=False`` pads the last shares by wrapping around to the
  start, as ``DistributedSampler`` does; ``drop_last=True`` drops the remainder.

After an elastic resume the base is what the old job had left (see :mod:`wds_async.data.state`), split the
same way among the new processes.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..engine.work import WorkItem
from .stages.stateful import Shuffle

__all__ = ["Processes", "buffer_shuffled", "epoch_seed", "index_items", "resampled_items", "shard_items", "shard_order",
           "split_equal"]

Splitter = Callable[[Iterable[Any]], Iterable[Any]]


@dataclass(frozen=True)
class Processes:
    """Where this process stands among all loader processes of the job."""

    rank: int = 0
    world: int = 1
    worker: int = 0
    workers: int = 1

    @property
    def index(self) -> int:
        return self.rank * self.workers + self.worker

    @property
    def count(self) -> int:
        return self.world * self.workers

    def as_list(self) -> list[int]:
        return [self.rank, self.world, self.worker, self.workers]


def shard_order(nshards: int, seed: Any, epoch: int, shuffle: bool) -> list[int]:
    """Shard indices in this epoch's order, the same in every process (the order an index's shares follow)."""
    order = list(range(nshards))
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def epoch_seed(seed: Any, epoch: int) -> Any:
    """The seed of epoch ``epoch``'s shard shuffle: ``seed`` itself in epoch 0 (webdataset's
    ``shuffle(n, seed=seed)``), ``seed + epoch`` after it (webdataset's ``detshuffle``); a seed that is not an
    int (webdataset reads ``WDS_SEED`` as a string) is combined with the epoch as ``"seed:epoch"``."""
    if epoch == 0:
        return seed
    if isinstance(seed, int):
        return seed + epoch
    return f"{seed}:{epoch}"


def buffer_shuffled(entries: Iterable[Any], bufsize: int, seed: Any) -> list[Any]:
    """``entries`` through webdataset's ``shuffle(bufsize, seed=seed)`` (its default ``initial`` of 100): the
    order its ``WebDataset(shardshuffle=bufsize)`` gives the shards of one process."""
    return list(Shuffle(bufsize, 100, seed=seed)(entries))


def shard_items(runs: Sequence[Sequence[Any]], urls: Sequence[str], splitters: Sequence[Splitter | None],
                reorder: Callable[[list[Any]], list[Any]] | None = None) -> list[WorkItem]:
    """This process's items of shard runs ``(shard, start, end)``, chosen by webdataset-style splitters
    (each sees ``{"url": ...}`` dicts and returns the ones to keep), then put in order by ``reorder``."""
    stream: Iterable[Any] = ({"url": urls[run[0]], "shard": run[0], "start": run[1], "end": run[2]} for run in runs)
    for splitter in splitters:
        if splitter is not None:
            stream = splitter(stream)
    entries = list(stream)
    for entry in entries:
        if not isinstance(entry, dict) or "shard" not in entry:
            raise TypeError("a nodesplitter/workersplitter must return the {'url': ...} dicts it was given")
    if reorder is not None:
        entries = reorder(entries)
    return [WorkItem(id=n, shard=entry["shard"], url=urls[entry["shard"]], start=entry["start"], end=entry["end"])
            for n, entry in enumerate(entries)]


def resampled_items(urls: Sequence[str], seed: Any, splitters: Sequence[Splitter | None]) -> Iterator[WorkItem]:
    """Shards drawn with replacement, endlessly: ``random.Random(seed)`` draws ``randint(0, len(urls) - 1)`` for
    each, as webdataset's ``ResampledShards``; the splitters then keep this process's draws (lazily)."""
    rng = random.Random(seed)
    last = len(urls) - 1

    def draws() -> Iterator[dict[str, Any]]:
        while True:
            shard = rng.randint(0, last)
            yield {"url": urls[shard], "shard": shard}

    stream: Iterable[Any] = draws()
    for splitter in splitters:
        if splitter is not None:
            stream = splitter(stream)
    for n, entry in enumerate(stream):
        if not isinstance(entry, dict) or "shard" not in entry:
            raise TypeError("a nodesplitter/workersplitter must return the {'url': ...} dicts it was given")
        yield WorkItem(id=n, shard=entry["shard"], url=urls[entry["shard"]])


def split_equal(runs: Sequence[Sequence[int]], count: int, index: int, drop_last: bool) -> list[tuple[int, int, int]]:
    """Share ``index`` of ``count`` equal shares of the sample runs ``(shard, lo, hi)`` laid end to end.

    Every share has ``floor(N / count)`` samples with ``drop_last``, else ``ceil(N / count)``, the
    shortfall taken by wrapping around to the first samples again."""
    total = sum(hi - lo for _, lo, hi in runs)
    if total == 0:
        return []
    per = total // count if drop_last else -(-total // count)
    first, stop = index * per, (index + 1) * per
    out: list[tuple[int, int, int]] = []
    base = 0  # position of the current lap's first sample in the virtual, wrapped sequence
    while base < stop:
        for shard, lo, hi in runs:
            a, b = base, base + (hi - lo)
            base = b
            if b <= first or a >= stop:
                continue
            cut_lo, cut_hi = max(first, a) - a + lo, min(stop, b) - a + lo
            if out and out[-1][0] == shard and out[-1][2] == cut_lo:
                out[-1] = (shard, out[-1][1], cut_hi)
            else:
                out.append((shard, cut_lo, cut_hi))
            if base >= stop:
                break
    return out


def index_items(runs: Sequence[Sequence[int]], entries: Sequence[Any], urls: Sequence[str], procs: Processes,
                drop_last: bool) -> list[WorkItem]:
    """This process's equal share of the sample runs, as byte-range items checked against the index."""
    items = []
    for n, (shard, lo, hi) in enumerate(split_equal(runs, procs.count, procs.index, drop_last)):
        entry = entries[shard]
        items.append(WorkItem(id=n, shard=shard, url=urls[shard], start=entry.offsets[lo], end=entry.ends[hi - 1],
                              compressed=entry.compressed, expect=entry.identity()))
    return items
