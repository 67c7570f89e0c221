"""Stage factories for the pipeline form: ``wds.shuffle(1000)``, ``wds.to_tuple("jpg", "cls")``, ...

Each returns a picklable :class:`~wds_async.data.stages.base.Stage` (``iterator -> iterator``), the same steps the
fluid methods append; ``detshuffle`` is a :class:`~wds_async.data.stages.detshuffle.DetShuffle`, whose epoch advances on
every pass.
"""

from __future__ import annotations

from .. import decoders as _d
from . import patterns as _p
from . import plain as _s
from .base import Stage, pipelinefilter
from .detshuffle import DetShuffle

__all__ = ["batched", "decode", "detshuffle", "extract_keys", "listed", "map", "map_dict", "map_tuple", "rename",
           "rename_keys", "rsample", "select", "shuffle", "slice", "to_tuple", "unbatched", "unlisted", "xdecode"]

shuffle = pipelinefilter(_s.shuffle)
map = pipelinefilter(_s.map_stage)  # webdataset's public name
select = pipelinefilter(_s.select)
to_tuple = pipelinefilter(_s.to_tuple)
map_dict = pipelinefilter(_s.map_dict)
map_tuple = pipelinefilter(_s.map_tuple)
rename = pipelinefilter(_s.rename)
slice = pipelinefilter(_s.slice_stage)  # webdataset's public name
batched = pipelinefilter(_s.batched)
decode = pipelinefilter(_d.decode)
unlisted = pipelinefilter(_s.unlisted)
rsample = pipelinefilter(_s.rsample)
extract_keys = pipelinefilter(_p.extract_keys)
rename_keys = pipelinefilter(_p.rename_keys)
xdecode = pipelinefilter(_p.xdecode)


def unbatched() -> Stage:
    """Split batches back into items."""
    return Stage(_s.unbatched)


def listed(batchsize: int, partial: bool = True) -> Stage:
    """Group items into plain lists of ``batchsize``."""
    return Stage(_s.batched, batchsize=batchsize, collation_fn=None, partial=partial)


#: webdataset's ``detshuffle`` is a class too: ``wds.detshuffle(100, seed=1)`` builds the stage.
detshuffle = DetShuffle
