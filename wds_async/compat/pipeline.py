"""``webdataset.pipeline``: ``DataPipeline``, wds-async's (:class:`wds_async.DataPipeline`).

A stage is called with the stream; a :class:`~wds_async.compat.utils.PipelineStage` subclass (open_clip's and timm's
``detshuffle2``) is called through its ``run(src)``, an ``IterableDataset`` source is iterated, as in webdataset.
"""

from __future__ import annotations

from typing import Any

from ..data.pipeline import DataPipeline

__all__ = ["DataPipeline", "add_length_method"]


def add_length_method(obj: Any) -> Any:
    """Give ``obj`` (a pipeline with a ``size`` attribute) a ``__len__`` returning it; returns ``obj``."""

    def length(self: Any) -> int:
        return int(self.size)

    obj.__class__ = type(obj.__class__.__name__, (obj.__class__,), {"__len__": length})
    return obj
