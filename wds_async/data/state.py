"""Checkpoint state: what this process has delivered of its plan, and how to resume or re-split it.

A dataset's state is positions, never sample bytes: for every work item of this process's plan
(:mod:`wds_async.data.plan`), whether all its samples were delivered, or the byte offset just past the last
delivered one. Items are read in order, so the done ones are kept as ``done_below`` (every id under it)
plus the few finished out of order. Samples of one item are delivered in order (the channel keeps each
item's order even when items interleave), so one offset per item in flight is exact.

Resuming in the same processes rebuilds the same plan and starts each item where it stopped.
Resuming with another world size or worker count (elastic) needs every old process's state:
:func:`merge_states` turns them into the *remaining* work of the epoch, which the new processes split
among themselves (equal sample shares with an index, whole remaining shard ranges without).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.work import WorkItem

__all__ = ["STATE_VERSION", "Progress", "dataset_states", "merge_states", "remaining_runs"]

STATE_VERSION = 1


@dataclass
class Progress:
    """Delivery progress of one process's plan (see the module docstring). ``pos`` maps an item in flight to the
    byte just past its last delivered sample, written by the pass's :class:`~wds_async.data.recorder.Recorder`."""

    done_below: int = 0
    done: set[int] = field(default_factory=set)
    pos: dict[int, int] = field(default_factory=dict)

    def finished(self, item: int) -> None:
        """Every sample of ``item`` reached the consumer."""
        self.pos.pop(item, None)
        self.done.add(item)
        while self.done_below in self.done:
            self.done.discard(self.done_below)
            self.done_below += 1

    def is_done(self, item: int) -> bool:
        return item < self.done_below or item in self.done

    def resume(self, item: WorkItem) -> WorkItem | None:
        """``item`` as it still has to be read, or None when it is complete."""
        if self.is_done(item.id):
            return None
        start = self.pos.get(item.id)
        if start is None:
            return item
        if item.end is not None and start >= item.end:
            return None
        return WorkItem(id=item.id, shard=item.shard, url=item.url, start=start, end=item.end,
                        compressed=item.compressed, expect=item.expect)

    def to_dict(self) -> dict[str, Any]:
        return {"done_below": self.done_below, "done": sorted(self.done),
                "pos": [[k, v] for k, v in sorted(self.pos.items())]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Progress:
        return cls(int(data["done_below"]), {int(i) for i in data["done"]}, {int(k): int(v) for k, v in data["pos"]})


def dataset_states(states: Iterable[Any]) -> list[dict[str, Any]]:
    """The wds-async dataset states inside ``states``: each may be one (from ``ds.state_dict()``) or a
    ``StatefulDataLoader.state_dict()`` holding one per worker (torchdata 0.11 layout)."""
    found: list[dict[str, Any]] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            if node.get("wds_async") == STATE_VERSION:
                found.append(dict(node))
                return
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    for state in states:
        walk(state)
    return found


def _sample_range(offsets: Sequence[int], start: int, end: int | None) -> tuple[int, int]:
    """Sample indices whose first header lies in ``[start, end)``."""
    lo = bisect.bisect_left(offsets, start)
    hi = len(offsets) if end is None else bisect.bisect_left(offsets, end)
    return lo, hi


def remaining_runs(plans: Sequence[tuple[Sequence[WorkItem], Progress, Sequence[Sequence[int]]]],
                   entries: Sequence[Any] | None, order: Sequence[int]) -> list[list[Any]]:
    """What the processes of an old job left of the epoch, as runs for a new split.

    ``plans`` holds per old process its items, its progress and the positions ``[item, offset, end]``
    of samples it had handed to stages that still held them (a shuffle buffer): those count as not
    delivered. With ``entries`` (an index) the result is sample runs ``[shard, lo, hi]`` in which every
    sample the old job owed appears exactly once (a sample delivered by any process, its padding copies
    included, is not owed again); without, byte runs ``[shard, start, end]``. ``order`` is the shard order
    of the epoch; runs follow it.
    """
    if entries is not None:
        owed: dict[int, set[int]] = {}
        delivered: dict[int, set[int]] = {}
        for items, progress, held in plans:
            by_id = {item.id: item for item in items}
            for item in items:
                offsets = entries[item.shard].offsets
                lo, hi = _sample_range(offsets, item.start, item.end)
                samples = set(range(lo, hi))
                owed.setdefault(item.shard, set()).update(samples)
                if progress.is_done(item.id):
                    got = samples
                elif item.id in progress.pos:
                    got = set(range(lo, _sample_range(offsets, progress.pos[item.id], None)[0]))
                else:
                    got = set()
                delivered.setdefault(item.shard, set()).update(got)
            for item_id, offset, _end in held:
                shard = by_id[item_id].shard
                index = bisect.bisect_left(entries[shard].offsets, offset)
                delivered.setdefault(shard, set()).discard(index)
        runs: list[list[Any]] = []
        for shard in order:
            left = sorted(owed.get(shard, set()) - delivered.get(shard, set()))
            for index in left:
                if runs and runs[-1][0] == shard and runs[-1][2] == index:
                    runs[-1][2] = index + 1
                else:
                    runs.append([shard, index, index + 1])
        return runs
    byte_runs: dict[int, list[list[Any]]] = {}
    for items, progress, held in plans:
        by_id = {item.id: item for item in items}
        for item in items:
            rest = progress.resume(item)
            if rest is not None:
                byte_runs.setdefault(item.shard, []).append([item.shard, rest.start, rest.end])
        for item_id, offset, end in held:
            shard = by_id[item_id].shard
            byte_runs.setdefault(shard, []).append([shard, offset, end])
    return [run for shard in order for run in sorted(byte_runs.get(shard, []), key=lambda r: r[1])]


def merge_states(states: Iterable[Any]) -> dict[str, Any]:
    """One state for an elastic resume, from the states of *every* process of the old job.

    ``states`` may be dataset states or ``StatefulDataLoader`` states (one per rank; each holds its
    workers'). Load the result with ``ds.load_state_dict(...)`` into the dataset of each new process,
    before its DataLoader starts (not through ``StatefulDataLoader.load_state_dict``, which insists on
    the old worker count). Raises ValueError when states are missing, duplicated, or from different
    datasets or epochs.
    """
    found = dataset_states(states)
    if not found:
        raise ValueError("merge_states: no wds-async dataset state found in what was given")
    first = found[0]
    if isinstance(first.get("source"), dict) and "mix" in first["source"]:
        return _merge_mixes(found)
    epochs = {state["source"]["epoch"] for state in found} - {None}  # None: saved before its first sample
    if len(epochs) > 1:
        raise ValueError(f"merge_states: the states are from epochs {sorted(epochs)}; they are not from one epoch")
    for state in found[1:]:
        for key in ("dataset", "mode"):
            if state["source"][key] != first["source"][key]:
                raise ValueError(f"merge_states: the states disagree on {key!r} ({first['source'][key]!r} vs "
                                 f"{state['source'][key]!r}); they are not from one job")
    count = first["source"]["processes"][1] * first["source"]["processes"][3]
    seen: dict[int, dict[str, Any]] = {}
    for state in found:
        rank, _world, worker, workers = state["source"]["processes"]
        seen.setdefault(rank * workers + worker, state)
    missing = sorted(set(range(count)) - set(seen))
    if missing:
        raise ValueError(f"merge_states: the old job had {count} loader processes (ranks x workers) but the states "
                         f"of processes {missing[:8]} are missing; an elastic resume needs every rank's checkpoint")
    return {"wds_async": STATE_VERSION, "elastic": [seen[i] for i in range(count)]}


def _merge_mixes(found: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`merge_states` for the states of a mix (:mod:`wds_async.data.mix`): each source's states merged as
    a dataset's are; the new processes restart the draws with the mix's weights."""
    mixes = [state["source"] for state in found]
    if any(mix is None for mix in mixes):
        raise ValueError("merge_states: a mix's state without its sources' states (saved by an older wds-async); "
                         "merge states saved by this version")
    first = mixes[0]
    for mix in mixes[1:]:
        for key in ("mix", "datasets", "weights", "longest", "draws"):
            if mix.get(key) != first.get(key):
                raise ValueError(f"merge_states: the mix states disagree on {key!r} ({first.get(key)!r} vs "
                                 f"{mix.get(key)!r}); they are not from one job")
    sources: list[dict[str, Any] | None] = []
    for i in range(len(first["sources"])):
        saved = [mix["sources"][i] for mix in mixes]
        if any(not isinstance(state, dict) or state.get("wds_async") != STATE_VERSION for state in saved):
            raise ValueError(f"merge_states: source {i} of the mix is not a WebDataset (a list or a DataPipeline); "
                             "an elastic resume re-splits WebDataset sources only")
        if all(state["source"]["epoch"] is None for state in saved):
            sources.append(None)  # this source had not started anywhere: it starts afresh
            continue
        sources.append(merge_states(saved))
    identity = {key: first[key] for key in ("mix", "datasets", "weights", "longest", "draws", "seeded")}
    return {"wds_async": STATE_VERSION, "elastic": "mix",
            "source": {**identity, "elastic": True, "sources": sources}}
