"""``MockDataset``: one sample repeated, for measuring a pipeline's own cost and for tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .fluid import FluidPipeline

__all__ = ["MockDataset"]


class MockDataset(FluidPipeline):
    """Yields ``sample`` ``length`` times per iteration (the same object each time, as webdataset does).

    A fluid pipeline, so ``MockDataset(sample, 1000).batched(16)`` measures the stages without any I/O."""

    def __init__(self, sample: Any, length: int) -> None:
        super().__init__()
        if length < 0:
            raise ValueError(f"MockDataset: length must be >= 0, got {length}")
        self.sample = sample
        self.length = length

    def _source(self, run: Any, resume: Any) -> Iterator[Any]:
        if resume is not None:
            raise ValueError("a MockDataset cannot resume from a state: it has no source positions")
        return (self.sample for _ in range(self.length))
