"""The per-sample stages of a map-style dataset: the fluid methods (``decode``, ``map``, ``to_tuple``, ...) that
:class:`~wds_async.data.indexed.IndexedWebDataset` offers, each a copy with one more stage, applied to one sample at a
time as it is returned. A stage must give exactly one item per sample: a map-style dataset has one item per index
(filtering belongs to a sampler, batching to the DataLoader)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from . import handlers as _handlers
from .stages import factories as _f
from .stages.base import Stage

if TYPE_CHECKING:
    from typing import Self

__all__ = ["SampleStages"]


class SampleStages:
    """What a map-style dataset mixes in for its per-sample stages (``_stages``, empty at first, is its own)."""

    _stages: list[Stage]

    def _apply(self, sample: Any) -> Any:
        for stage in self._stages:
            out = list(stage([sample]))
            if len(out) != 1:
                raise ValueError(f"stage {stage!r} turned one sample into {len(out)}: a map-style dataset needs "
                                 "exactly one item per index (filter with a sampler, batch with the DataLoader)")
            sample = out[0]
        return sample

    def compose(self, *stages: Callable[[Iterator[Any]], Iterator[Any]]) -> Self:
        """A copy with ``stages`` (``iterator -> iterator``, one item out per item in) applied to every sample."""
        new = copy.copy(self)
        new._stages = [*self._stages, *(s if isinstance(s, Stage) else Stage(_call, s) for s in stages)]
        return new

    def map(self, f: Callable[[Any], Any], handler: Any = None) -> Self:
        return self.compose(_f.map(f, handler=_handlers.resolve_handler(handler)))

    def decode(self, *args: Any, **kw: Any) -> Self:
        """As :meth:`wds_async.WebDataset.decode` (a decoding error raises; there is no sample to skip to)."""
        return self.compose(_f.decode(*args, **kw))

    def to_tuple(self, *keys: str, missing_is_error: bool = True) -> Self:
        return self.compose(_f.to_tuple(*keys, missing_is_error=missing_is_error))

    def map_dict(self, **kw: Callable[[Any], Any]) -> Self:
        return self.compose(_f.map_dict(**kw))

    def map_tuple(self, *fs: Callable[[Any], Any] | None) -> Self:
        return self.compose(_f.map_tuple(*fs))

    def rename(self, keep: bool = True, **kw: str) -> Self:
        return self.compose(_f.rename(keep=keep, **kw))

    def rename_keys(self, *args: tuple[str, str], **kw: Any) -> Self:
        return self.compose(_f.rename_keys(*args, **kw))

    def extract_keys(self, *patterns: str | list[str], **kw: Any) -> Self:
        return self.compose(_f.extract_keys(*patterns, **kw))

    def xdecode(self, *args: tuple[str, Callable[[Any], Any]], **kw: Any) -> Self:
        return self.compose(_f.xdecode(*args, **kw))


def _call(data: Iterable[Any], fn: Callable[[Iterable[Any]], Iterator[Any]]) -> Iterator[Any]:
    return fn(data)
