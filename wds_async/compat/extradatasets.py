"""``webdataset.extradatasets``: ``MockDataset`` (wds-async's) and the epoch/length wrappers.

``repeatedly``, ``with_epoch`` and ``with_length`` are datasets wrapping another and, as pipeline stages, wrappers
of the stream handed to them (``DataPipeline(src, ..., with_epoch(None, 1000))`` or ``with_epoch(ds, 1000)``).
The fluid methods ``.with_epoch(n)``, ``.with_length(n)`` and ``.repeat()`` do the same on a pipeline.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ..data.mock import MockDataset
from .pytorch import IterableDataset
from .utils import PipelineStage
from .utils import repeatedly as _repeatedly

__all__ = ["MockDataset", "repeatedly", "with_epoch", "with_length"]


class repeatedly(IterableDataset, PipelineStage):  # type: ignore[type-arg]
    """``source`` again and again: ``nepochs`` passes or ``nbatches`` items at most (forever without either)."""

    def __init__(self, source: Any = None, nepochs: int | None = None, nbatches: int | None = None,
                 length: int | None = None) -> None:
        super().__init__()
        self.source, self.nepochs, self.nbatches, self.length = source, nepochs, nbatches, length

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        return _repeatedly(source, nepochs=self.nepochs, nbatches=self.nbatches)

    invoke = run

    def __iter__(self) -> Iterator[Any]:
        return self.run(self.source)

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("repeatedly(...) was given no length")
        return self.length


class with_epoch(IterableDataset, PipelineStage):  # type: ignore[type-arg]
    """Epochs of exactly ``length`` items cut from a stream that continues across them: each pass takes the next
    ``length`` items, restarting ``dataset`` when it runs out (an empty one ends the pass)."""

    def __init__(self, dataset: Any, length: int) -> None:
        super().__init__()
        self.dataset, self.length = dataset, length
        self.source: Iterator[Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["source"] = None  # an iterator in flight does not cross into a worker
        return state

    def run(self, dataset: Iterable[Any]) -> Iterator[Any]:
        if self.source is None:
            self.source = iter(dataset)
        for _ in range(self.length):
            try:
                sample = next(self.source)
            except StopIteration:
                self.source = iter(dataset)
                try:
                    sample = next(self.source)
                except StopIteration:
                    return
            yield sample
        self.source = None

    invoke = run

    def __iter__(self) -> Iterator[Any]:
        return self.run(self.dataset)

    def __len__(self) -> int:
        return self.length


class with_length(IterableDataset, PipelineStage):  # type: ignore[type-arg]
    """``dataset`` unchanged, with ``len()`` = ``length``."""

    def __init__(self, dataset: Any, length: int) -> None:
        super().__init__()
        self.dataset, self.length = dataset, length

    def run(self, dataset: Iterable[Any]) -> Iterator[Any]:
        return iter(dataset)

    invoke = run

    def __iter__(self) -> Iterator[Any]:
        return iter(self.dataset)

    def __len__(self) -> int:
        return self.length
