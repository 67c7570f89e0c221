"""``webdataset.compat``: ``WebDataset``, ``WebLoader``, ``FluidWrapper`` and the fluid interface, wds-async's.

``FluidInterface`` is wds-async's fluid base class (:class:`wds_async.data.fluid.FluidPipeline`): every method
returns a new pipeline rather than changing the one it is called on, so ``ds = ds.with_epoch(n)`` is the form that
works under both libraries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..data.dataset import WebDataset
from ..data.fluid import FluidPipeline
from ..data.pipeline import FluidWrapper, WebLoader
from ..data.shardlists import non_empty

__all__ = ["FluidInterface", "FluidWrapper", "WebDataset", "WebLoader", "check_empty"]

FluidInterface = FluidPipeline


def check_empty(source: Iterable[Any]) -> Iterator[Any]:
    """Pass the items through; :class:`ValueError` at the end if there were none."""
    return non_empty(source)
