"""Stage factories for the pipeline form: ``wds.shuffle(1000)``, ``wds.to_tuple("jpg", "cls")``, ...

Each returns a picklable :class:`~wds_async.fluid.Stage` (``iterator -> iterator``), the same steps the
fluid methods append.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any

from . import decoders as _d
from . import stages as _s
from .fluid import Stage, pipelinefilter

__all__ = ["batched", "decode", "detshuffle", "listed", "map", "map_dict", "map_tuple", "rename", "select", "shuffle", "slice",
           "to_tuple", "unbatched", "unlisted"]

shuffle = pipelinefilter(_s.shuffle)
map = pipelinefilter(_s.map_stage)  # noqa: A001 - webdataset's public name
select = pipelinefilter(_s.select)
to_tuple = pipelinefilter(_s.to_tuple)
map_dict = pipelinefilter(_s.map_dict)
map_tuple = pipelinefilter(_s.map_tuple)
rename = pipelinefilter(_s.rename)
slice = pipelinefilter(_s.slice_stage)  # noqa: A001 - webdataset's public name
batched = pipelinefilter(_s.batched)
decode = pipelinefilter(_d.decode)
unlisted = pipelinefilter(_s.unlisted)


def unbatched() -> Stage:
    """Split batches back into items."""
    return Stage(_s.unbatched)


def listed(batchsize: int, partial: bool = True) -> Stage:
    """Group items into plain lists of ``batchsize``."""
    return Stage(_s.batched, batchsize=batchsize, collation_fn=None, partial=partial)


def _detshuffle(data: Iterable[Any], bufsize: int = 1000, initial: int = 100, seed: int = 0, epoch: int = -1
                ) -> Iterator[Any]:
    return _s.shuffle(data, bufsize=bufsize, initial=initial, rng=random.Random(f"{seed}:{epoch}"))


def detshuffle(bufsize: int = 1000, initial: int = 100, seed: int = 0, epoch: int = -1) -> Stage:
    """A shuffle whose order depends only on ``(seed, epoch)``: identical in every process."""
    return Stage(_detshuffle, bufsize=bufsize, initial=initial, seed=seed, epoch=epoch)
