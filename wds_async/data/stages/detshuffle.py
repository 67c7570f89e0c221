"""``detshuffle``: a buffer shuffle whose order is a function of ``(seed, epoch)`` alone, the epoch advancing by one
on every new pass, as webdataset's ``detshuffle`` does.

Every process that runs the same pipeline gets the same order in the same epoch, and a pipeline iterated again
gets a new order: ``DataPipeline(SimpleShardList(urls), detshuffle(100), ...)`` shuffles the shard list
identically on every rank before ``split_by_node``, and differently each epoch.

For the same ``(seed, epoch)`` the order is webdataset 1.0.2's: the random generator is seeded with
``seed + epoch`` and drawn from by the buffer shuffle of :class:`~wds_async.data.stages.stateful.Shuffle`, whose
draws are webdataset's ``shuffle``'s. As there, a stage pickled into DataLoader workers advances its epoch in
each worker's copy, so workers that are not persistent start every epoch from the same one. The stage is a
:class:`~wds_async.data.stages.stateful.StatefulStage`, so a fluid pipeline can checkpoint it mid-epoch; its state adds
the epoch to the shuffle's.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

from .stateful import Pairs, Positions, Runner, Shuffle, StatefulStage

__all__ = ["DetShuffle"]


class _EpochRunner(Runner):
    """A shuffle runner for one epoch; its state carries the epoch, restored into the stage on load."""

    def __init__(self, stage: DetShuffle, inner: Runner) -> None:
        self.stage, self.epoch, self.inner = stage, stage.epoch, inner

    def __call__(self, data: Pairs) -> Iterator[Any]:
        return self.inner(data)

    def held(self) -> list[Positions]:
        return self.inner.held()

    def state_dict(self) -> dict[str, Any]:
        return {**self.inner.state_dict(), "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any], pairs: list[tuple[Any, Positions]]) -> None:
        self.epoch = self.stage.epoch = state["epoch"]
        self.inner.load_state_dict(state, pairs)


class DetShuffle(StatefulStage):
    """Shuffle within a buffer of ``bufsize`` items (yielding once ``initial`` are held), seeded with
    ``seed + epoch``; ``epoch`` is incremented before every pass, so the first pass uses ``epoch + 1``.
    A ``bufsize`` below 1 keeps the order (webdataset's too)."""

    streaming = False

    def __init__(self, bufsize: int = 1000, initial: int = 100, seed: int = 0, epoch: int = -1) -> None:
        self.bufsize, self.initial, self.seed, self.epoch = bufsize, initial, int(seed), int(epoch)

    def runner(self) -> Runner:
        self.epoch += 1
        rng = random.Random(self.seed + self.epoch)
        return _EpochRunner(self, Shuffle(self.bufsize, self.initial, rng=rng).runner())

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        """One pass over ``source`` (webdataset's ``PipelineStage.run``)."""
        return self(source)

    def __repr__(self) -> str:
        return f"detshuffle({self.bufsize}, seed={self.seed}, epoch={self.epoch})"
