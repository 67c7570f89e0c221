"""Where a DataLoader's batches fall in a known sampler order, and which batches one process reads next.

torch's DataLoader queues batches of indices for each worker (``prefetch_factor`` of them) but hands the dataset one
at a time, out of sight of the rest, so a map-style dataset that reads each batch when asked has one batch in flight
per worker, and every batch pays the store's time to first byte. Given the order its sampler follows
(:meth:`~wds_async.IndexedWebDataset.follow`), the dataset can do better: the DataLoader cuts the sampler's sequence
into consecutive batches of ``batch_size`` and deals them to its ``num_workers`` workers in turn, so a worker that
was handed the batch at position ``p`` gets the batches at ``p + k * num_workers * batch_size`` next. :class:`Ahead`
finds ``p`` (through the position of each index in the sequence) and names the next ``depth`` batches of this
process, which the dataset starts reading at once.

A guess that turns out wrong (another batch sampler, a worker that died, an epoch the worker did not expect) costs
the bytes read ahead, never a wrong sample: a batch is always served from the indices it was handed, and read
ahead only when they are exactly the ones at the position found.

Which epoch: a worker made for this epoch (``persistent_workers=False``) holds a copy of the sampler at the epoch the
main process set; a persistent worker keeps the copy of its first epoch while the main process moves on. So a batch
is looked for in the epoch of the last batch found and in the next one (at first: the sampler's epoch and the next).

Memory: per epoch looked in (two at most), the rank's sequence and each index's position in it, 8 bytes per sample
per process (16 with more than 2**31 samples): 8 MB for a million samples; and at most ``depth`` batches' samples
beyond the current one.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["Ahead"]


class Ahead:
    """This process's place in ``sampler``'s order (see the module docstring).

    ``sampler`` is iterated on copies (``set_epoch``, or ``epoch`` set, on a copy) for the epochs a batch is looked
    for in (see the module docstring).
    """

    def __init__(self, sampler: Any, *, workers: int, depth: int) -> None:
        self.sampler, self.workers, self.depth = sampler, max(1, workers), depth
        self._orders: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # epoch -> (sequence, position of each index)
        self.epoch: int | None = None  # the epoch the last batch was found in

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        found = self._orders.get(epoch)
        if found is None:
            sampler = copy.copy(self.sampler)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            elif hasattr(sampler, "epoch"):  # wids' ShardListSampler counts its epochs without set_epoch
                sampler.epoch = epoch
            sequence = np.fromiter(iter(sampler), dtype=np.int64)
            size = int(sequence.max()) + 1 if len(sequence) else 0
            kind = np.int32 if max(size, len(sequence)) < 2**31 else np.int64
            sequence = sequence.astype(kind)
            where = np.full(size, -1, dtype=kind)
            where[sequence[::-1]] = np.arange(len(sequence) - 1, -1, -1, dtype=kind)  # given twice: its first place
            found = self._orders[epoch] = (sequence, where)
        return found

    def place(self, indices: Sequence[int]) -> tuple[int, int] | None:
        """``(epoch, position)`` of ``indices`` (a batch, in order) in that epoch's sequence, or None where it is
        not there."""
        if not indices:
            return None
        wanted = np.asarray(indices, dtype=np.int64)
        first = int(wanted[0])
        now = self.epoch if self.epoch is not None else int(getattr(self.sampler, "epoch", 0) or 0)
        for epoch in (now, now + 1):
            sequence, where = self._order(epoch)
            if not 0 <= first < len(where) or where[first] < 0:
                continue
            at = int(where[first])
            if np.array_equal(sequence[at:at + len(wanted)], wanted):
                if epoch != self.epoch:  # moved on: the epoch before is not looked in again
                    self._orders = {e: o for e, o in self._orders.items() if e >= epoch}
                self.epoch = epoch
                return epoch, at
        return None

    def upcoming(self, key: tuple[int, int], size: int) -> list[tuple[tuple[int, int], list[int]]]:
        """The next ``depth`` batches this process should get after the one of ``size`` at ``key`` (as
        :meth:`place` gives it): ``((epoch, position), indices)`` each, within the sequence."""
        epoch, at = key
        sequence = self._order(epoch)[0]
        out = []
        step = self.workers * size
        for k in range(1, self.depth + 1):
            start = at + k * step
            if start >= len(sequence):
                break
            out.append(((epoch, start), sequence[start:start + size].tolist()))
        return out
