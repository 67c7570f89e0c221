"""``webdataset.mix``: ``RoundRobin`` and ``RandomMix`` (wds-async's, :mod:`wds_async.data.mix`) and the iterator
functions behind them, which take iterators (``round_robin_shortest(iter(a), iter(b))``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ..data.mix import RandomMix, RoundRobin, _random_samples, _round_robin

__all__ = ["RandomMix", "RoundRobin", "random_samples", "round_robin_longest", "round_robin_shortest"]


def round_robin_shortest(*sources: Iterator[Any]) -> Iterator[Any]:
    """One item from each source in turn, until one of them runs out."""
    return _round_robin(list(sources), longest=False)


def round_robin_longest(*sources: Iterator[Any]) -> Iterator[Any]:
    """One item from each source in turn, dropping sources as they run out, until all have."""
    return _round_robin(list(sources), longest=True)


def random_samples(sources: list[Iterator[Any]], probs: Sequence[float] | None = None,
                   longest: bool = False) -> Iterator[Any]:
    """Items from sources drawn at random (global ``random``) with probabilities ``probs`` (default equal); ends
    when a drawn source is exhausted, or with ``longest`` when all are."""
    return _random_samples(list(sources), probs, longest)
