"""Mixing several datasets into one stream: :class:`RoundRobin` and :class:`RandomMix` (webdataset's names,
arguments and draws).

Each takes any iterables (WebDatasets, DataPipelines, lists) and starts a fresh iterator over every one on
each ``iter()``. Both are fluid pipelines, so ``RandomMix([a, b], [3, 1]).shuffle(1000).batched(64)`` works
without webdataset's ``FluidWrapper``. Neither can resume from a checkpoint: the mix has no positions.

``RandomMix`` draws from the global ``random`` module exactly as webdataset 1.0.2 does, one
``random.random()`` per item, so ``random.seed(n)`` reproduces webdataset's mix.
"""

from __future__ import annotations

import bisect
import itertools
import random
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .fluid import FluidPipeline

__all__ = ["RandomMix", "RoundRobin"]


def _no_resume(pipeline: FluidPipeline, resume: Any) -> None:
    if resume is not None:
        raise ValueError(f"a {type(pipeline).__name__} cannot resume from a state: a mix has no source positions")


def _round_robin(sources: list[Iterator[Any]], longest: bool) -> Iterator[Any]:
    """One item from each source in turn. Shortest: stop at the first exhausted source. Longest: drop
    exhausted sources and go on with the rest."""
    i = 0
    while sources:
        i %= len(sources)
        try:
            item = next(sources[i])
        except StopIteration:
            if not longest:
                return
            del sources[i]
            continue
        i += 1
        yield item


class RoundRobin(FluidPipeline):
    """Items from ``datasets`` in turn: one from the first, one from the second, ... Ends when any dataset
    ends, or with ``longest=True`` when all have."""

    def __init__(self, datasets: Sequence[Iterable[Any]], longest: bool = False) -> None:
        super().__init__()
        self.datasets = datasets
        self.longest = longest

    def _source(self, run: Any, resume: Any) -> Iterator[Any]:
        _no_resume(self, resume)
        return _round_robin([iter(d) for d in self.datasets], self.longest)


def _random_samples(sources: list[Iterator[Any]], probs: Sequence[float] | None, longest: bool) -> Iterator[Any]:
    """Draw a source per item with probabilities ``probs`` (default: equal). Ends when the drawn source is
    exhausted, or with ``longest`` drops it and renormalises over the rest."""
    weights = [1.0] * len(sources) if probs is None else [float(p) for p in probs]
    if len(weights) != len(sources):
        raise ValueError(f"RandomMix: {len(weights)} probabilities for {len(sources)} datasets")
    if any(w < 0 for w in weights) or (sources and sum(weights) <= 0):
        raise ValueError(f"RandomMix: probabilities must be non-negative with a positive sum, got {weights}")
    while sources:
        total, r = sum(weights), random.random()
        if total > 0:
            cumulative = list(itertools.accumulate(w / total for w in weights))
            # The index of the first cumulative weight >= r, like numpy's searchsorted; rounding cannot overrun.
            i = min(bisect.bisect_left(cumulative, r), len(sources) - 1)
        else:
            i = 0  # only zero-probability sources are left (longest=True): drain them in order, as webdataset does
        try:
            yield next(sources[i])
        except StopIteration:
            if not longest:
                return
            del sources[i], weights[i]


class RandomMix(FluidPipeline):
    """Items drawn at random from ``datasets``, dataset ``i`` with probability ``probs[i] / sum(probs)``
    (default: equal). Ends when a drawn dataset is exhausted, or with ``longest=True`` when all are."""

    def __init__(self, datasets: Sequence[Iterable[Any]], probs: Sequence[float] | None = None,
                 longest: bool = False) -> None:
        super().__init__()
        self.datasets = datasets
        self.probs = probs
        self.longest = longest

    def _source(self, run: Any, resume: Any) -> Iterator[Any]:
        _no_resume(self, resume)
        return _random_samples([iter(d) for d in self.datasets], self.probs, self.longest)
