"""Where a DataLoader's batches fall in a known sampler order, and which batches one process reads next.

torch's DataLoader hands a worker its next batch of indices only when the last one is done, so a map-style dataset
that reads each batch when asked has one batch in flight per worker, and every batch pays the store's time to first
byte. Given the order its sampler follows (:meth:`~wds_async.IndexedWebDataset.follow`), the dataset can do better:
the DataLoader cuts the sampler's sequence into consecutive batches of ``batch_size`` and deals them to its
``num_workers`` workers in turn, so a worker that was handed the batch at position ``p`` gets the batches at
``p + k * num_workers * batch_size`` next. :class:`Ahead` finds ``p`` (where the batch is expected, else by a scan of
the sequence) and names the next ``depth`` batches of this process, which the dataset starts reading at once.

A guess that turns out wrong (another batch sampler, a worker that died, an epoch the worker did not expect) costs
the bytes read ahead, never a wrong sample: a batch is always served from the indices it was handed, and read
ahead only when they are exactly the ones at the position found.

Memory: the rank's sequence is kept as 8 bytes per sample per process (8 MB for a million samples), and at most
``depth`` batches' samples beyond the current one.
"""

from __future__ import annotations

import copy
from array import array
from collections.abc import Sequence
from typing import Any

__all__ = ["Ahead"]


class Ahead:
    """This process's place in ``sampler``'s order (see the module docstring).

    ``sampler`` is iterated on copies (``set_epoch`` on a copy) for the epoch it names and the next two: a persistent
    worker keeps the sampler of its first epoch while the main process moves on.
    """

    def __init__(self, sampler: Any, *, workers: int, depth: int) -> None:
        self.sampler, self.workers, self.depth = sampler, max(1, workers), depth
        self._epoch: int | None = None
        self._sequence = array("q")
        self._sequences: dict[int, array[int]] = {}  # the last few epochs' sequences: a scan must not rebuild them
        self._expected: int | None = None  # where this process's next batch should start

    def _load(self, epoch: int) -> None:
        if epoch != self._epoch:
            sequence = self._sequences.get(epoch)
            if sequence is None:
                sampler = copy.copy(self.sampler)
                if hasattr(sampler, "set_epoch"):
                    sampler.set_epoch(epoch)
                elif hasattr(sampler, "epoch"):  # wids' ShardListSampler counts its epochs without set_epoch
                    sampler.epoch = epoch
                sequence = self._sequences[epoch] = array("q", iter(sampler))
                while len(self._sequences) > 3:
                    del self._sequences[min(self._sequences)]
            self._sequence, self._epoch = sequence, epoch

    def place(self, indices: Sequence[int]) -> int | None:
        """The position of ``indices`` (a batch, in order) in the sequence, or None where it is not there."""
        if not indices:
            return None
        wanted = array("q", indices)
        size = len(wanted)
        if self._epoch is not None and self._expected is not None:
            at = self._expected
            if self._sequence[at:at + size] == wanted:
                return self._found(at, size)
        base = getattr(self.sampler, "epoch", 0)
        for epoch in (self._epoch, base, base + 1, base + 2):
            if epoch is None:
                continue
            self._load(epoch)
            sequence = self._sequence
            at = 0
            while True:
                try:
                    at = sequence.index(wanted[0], at)
                except ValueError:
                    break
                if sequence[at:at + size] == wanted:
                    return self._found(at, size)
                at += 1
        self._expected = None
        return None

    def _found(self, at: int, size: int) -> int:
        self._expected = at + self.workers * size
        return at

    def upcoming(self, at: int, size: int) -> list[tuple[int, list[int]]]:
        """The next ``depth`` batches this process should get after the one of ``size`` at ``at``:
        ``(position, indices)`` each, within the sequence."""
        out = []
        step = self.workers * size
        for k in range(1, self.depth + 1):
            start = at + k * step
            if start >= len(self._sequence):
                break
            out.append((start, list(self._sequence[start:start + size])))
        return out
