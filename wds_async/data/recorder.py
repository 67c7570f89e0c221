"""Where the samples a source delivered leave each work item: what a checkpoint of a WebDataset needs.

A source hands its samples over in runs (:func:`~wds_async.data.pipeline.deliver`); a :class:`Recorder` of the
pass (:meth:`wds_async.data.fluid._Pass.recorder`) writes the positions of those yielded, without a call per
sample where no stateful stage reads them one by one.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Recorder"]

_item_of = operator.attrgetter("item")
_end_of = operator.attrgetter("end")


class Recorder:
    """Where a source's delivered samples leave each work item, for checkpoints: ``positions[item]`` is the end
    offset of the item's last sample delivered, and ``finished(item)`` runs once all of them were.

    The source hands its samples over in runs of one hand-off list that hold no end-of-item marker
    (:func:`~wds_async.data.pipeline.deliver`), and :meth:`run` returns what to yield for each. Where no stateful
    stage taps the positions, that is the run's own list iterator, so no bytecode of ours runs per sample, and the
    positions of the samples it has yielded (its length less what is left in the iterator) are written at the
    next run, the next end of an item, or a checkpoint (:meth:`flush`). Where a tap reads ``[item, offset, end]``
    of every sample as the stage takes it, each is recorded as it is yielded."""

    __slots__ = ("_ahead", "_marks", "_pulled", "_samples", "finished", "one_item_runs", "positions")

    def __init__(self, positions: dict[int, int], finished: Callable[[int], None], marks: dict[int, int],
                 pulled: list[list[int]], *, one_item_runs: bool = False) -> None:
        self.positions = positions
        #: The source's engine delivers items in order (``deterministic``), so a run (the samples between two
        #: end-of-item markers) holds samples of one item and a flush writes only the last one taken: the position
        #: an item's later samples would overwrite anyway. Interleaved delivery writes every sample's.
        self.one_item_runs = one_item_runs
        self.finished = finished
        self._marks = marks
        self._pulled = pulled
        self._samples: list[Any] = []  # the run being yielded, and its iterator
        self._ahead: Iterator[Any] = iter(self._samples)

    def run(self, samples: list[Any]) -> Iterator[Any]:
        """What to yield for ``samples``, a run of samples without end-of-item markers."""
        self.close()  # the last run written and dropped: a flush only ever concerns the current run
        if self._marks:
            return self._each(samples)
        self._samples = samples
        self._ahead = ahead = iter(samples)
        return ahead

    def _each(self, samples: list[Any]) -> Iterator[Any]:
        positions, pulled = self.positions, self._pulled
        for sample in samples:
            positions[sample.item] = sample.end
            pulled.append([sample.item, sample.offset, sample.end])
            yield sample

    def flush(self) -> None:
        """Write the positions of the current run's samples yielded so far."""
        samples = self._samples
        taken = len(samples) - operator.length_hint(self._ahead)
        if taken:
            if self.one_item_runs:
                last = samples[taken - 1]
                self.positions[last.item] = last.end
                return
            done = samples if taken == len(samples) else samples[:taken]
            self.positions.update(zip(map(_item_of, done), map(_end_of, done)))

    def close(self) -> None:
        """The source stopped: write what was delivered, and keep no samples."""
        self.flush()
        self._samples = []
        self._ahead = iter(self._samples)

    def item_done(self, item: int) -> None:
        """Every sample of ``item`` was delivered."""
        self.close()  # written and dropped: a later flush must not bring back the position finished() drops
        self.finished(item)
