"""The fluid interface shared by :class:`~wds_async.WebDataset`, :class:`~wds_async.DataPipeline` and
:class:`~wds_async.WebLoader`: chained stage methods, epochs, repetition and ``len()``.

Every method returns a **new** pipeline and leaves the receiver unchanged (webdataset mutates and
returns ``self`` for ``with_epoch``/``repeat``; a copy cannot surprise a second user of the object).
Stages are picklable :class:`Stage` objects, so pipelines cross into spawned DataLoader workers.

Epoch semantics follow webdataset: ``with_epoch(n)`` makes each ``iter()`` yield exactly ``n`` items,
restarting the underlying stream as often as needed; ``repeat(k)`` runs the stream ``k`` times (forever
without ``k``); an empty stream never loops.
"""

from __future__ import annotations

import contextlib
import copy
import random
import sys
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from torch.utils.data import IterableDataset

from . import stages as _s
from .handlers import resolve_handler

__all__ = ["FluidPipeline", "Stage", "pipelinefilter"]

HandlerArg = Callable[[BaseException], bool] | str | None


class Stage:
    """A picklable ``iterator -> iterator`` step: ``fn(data, *args, **kwargs)``."""

    def __init__(self, fn: Callable[..., Iterator[Any]], *args: Any, **kwargs: Any) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self, data: Iterable[Any]) -> Iterator[Any]:
        return self.fn(data, *self.args, **self.kwargs)

    def __repr__(self) -> str:
        return f"{getattr(self.fn, '__name__', self.fn)}{self.args or ''}"


def pipelinefilter(fn: Callable[..., Iterator[Any]]) -> Callable[..., Stage]:
    """Curry a stage function for the pipeline form: ``pipelinefilter(f)(*a, **k)(data) == f(data, *a, **k)``."""

    def make(*args: Any, **kwargs: Any) -> Stage:
        return Stage(fn, *args, **kwargs)

    make.__name__ = getattr(fn, "__name__", "stage")
    make.__doc__ = fn.__doc__
    return make


class FluidPipeline(IterableDataset):  # type: ignore[type-arg]
    """Base: subclasses implement :meth:`_source` (a fresh iterator per pass); stages apply after it."""

    _stages: tuple[Callable[[Iterator[Any]], Iterator[Any]], ...] = ()
    _repetitions: int = 1
    _nsamples: int = -1
    _size: int | None = None

    def _source(self) -> Iterator[Any]:
        raise NotImplementedError

    def _iterate_once(self) -> Generator[Any, None, None]:
        source = self._source()
        stream: Iterator[Any] = source
        for stage in self._stages:
            stream = stage(stream)
        try:
            yield from stream
        finally:
            # Close from the outside in, so resources stop now rather than at garbage collection.
            for it in (stream, source):
                close = getattr(it, "close", None)
                if close is not None:
                    close()

    def __iter__(self) -> Iterator[Any]:
        limit = self._nsamples if self._repetitions != 1 and self._nsamples > 0 else -1
        count = 0
        for _ in range(self._repetitions):
            produced = 0
            with contextlib.closing(self._iterate_once()) as items:
                for item in items:
                    yield item
                    produced += 1
                    count += 1
                    if 0 < limit <= count:
                        return
            if produced == 0:
                return  # an empty stream never loops

    def __len__(self) -> int:
        if self._size is None:
            raise TypeError(f"{type(self).__name__} has no length; set one with .with_length(n)")
        return self._size

    def __enter__(self) -> FluidPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    # -- composition -----------------------------------------------------------------------------
    def compose(self, *stages: Callable[[Iterator[Any]], Iterator[Any]]) -> Any:
        """A new pipeline with ``stages`` (each ``iterator -> iterator``) appended."""
        new = copy.copy(self)
        new._stages = self._stages + tuple(stages)
        return new

    def _with(self, **attrs: Any) -> Any:
        new = copy.copy(self)
        for name, value in attrs.items():
            setattr(new, name, value)
        return new

    def with_length(self, n: int, silent: bool = False) -> Any:
        """Set what ``len()`` returns (it does not change how many samples an epoch has)."""
        return self._with(_size=int(n))

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> Any:
        """Each ``iter()`` yields exactly ``max(nsamples, nbatches)`` items, restarting the stream as needed."""
        return self._with(_repetitions=sys.maxsize, _nsamples=max(nsamples, nbatches))

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> Any:
        """Run the stream ``nepochs`` times (forever when not positive), at most ``nbatches`` items."""
        return self._with(_repetitions=nepochs if nepochs > 0 else sys.maxsize, _nsamples=nbatches)

    # -- stages ----------------------------------------------------------------------------------
    def shuffle(self, size: int, initial: int = 100, seed: int | None = None, rng: random.Random | None = None
                ) -> Any:
        """Shuffle within a buffer of ``size`` items (``size < 1``: unchanged)."""
        if size < 1:
            return self
        return self.compose(Stage(_s.shuffle, bufsize=size, initial=initial, rng=rng, seed=seed))

    def map(self, f: Callable[[Any], Any], handler: HandlerArg = None) -> Any:
        """Apply ``f`` to every item (``None`` results are dropped)."""
        return self.compose(Stage(_s.map_stage, f=f, handler=resolve_handler(handler)))

    def select(self, predicate: Callable[[Any], bool], **kw: Any) -> Any:
        """Keep the items for which ``predicate`` is true."""
        return self.compose(Stage(_s.select, predicate=predicate))

    def to_tuple(self, *keys: str, handler: HandlerArg = None, missing_is_error: bool = True) -> Any:
        """Dict samples -> tuples of fields; ``"jpg;png"`` takes the first present."""
        return self.compose(Stage(_s.to_tuple, *keys, handler=resolve_handler(handler),
                                  missing_is_error=missing_is_error))

    def map_dict(self, handler: HandlerArg = None, **kw: Callable[[Any], Any]) -> Any:
        """Apply a function per field: ``map_dict(jpg=f, cls=g)``."""
        return self.compose(Stage(_s.map_dict, handler=resolve_handler(handler), **kw))

    def map_tuple(self, *fs: Callable[[Any], Any] | None, handler: HandlerArg = None) -> Any:
        """Apply the i-th function to the i-th tuple element."""
        return self.compose(Stage(_s.map_tuple, *fs, handler=resolve_handler(handler)))

    def rename(self, handler: HandlerArg = None, keep: bool = True, **kw: str) -> Any:
        """Rename fields: ``rename(image="jpg;png", label="cls")``."""
        return self.compose(Stage(_s.rename, handler=resolve_handler(handler), keep=keep, **kw))

    def slice(self, *args: int | None) -> Any:
        """``itertools.islice`` over the items."""
        return self.compose(Stage(_s.slice_stage, *args))

    def batched(self, batchsize: int, collation_fn: Callable[[list[Any]], Any] | None = _s.default_collation_fn,
                partial: bool = True) -> Any:
        """Group items into batches of ``batchsize`` collated by ``collation_fn``."""
        return self.compose(Stage(_s.batched, batchsize=batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self) -> Any:
        """Split batches back into items."""
        return self.compose(Stage(_s.unbatched))

    def listed(self, batchsize: int, partial: bool = True) -> Any:
        """Group items into plain lists of ``batchsize``."""
        return self.compose(Stage(_s.batched, batchsize=batchsize, collation_fn=None, partial=partial))

    def unlisted(self) -> Any:
        """Flatten lists of items."""
        return self.compose(Stage(_s.unlisted))

    def decode(self, *args: Any, pre: Any = None, post: Any = None, only: Any = None, partial: bool = False,
               handler: HandlerArg = None, allow_pickle: bool | None = None) -> Any:
        """Decode fields by extension: image specs (``"pil"``, ``"rgb8"``, ``"torchrgb"``, ...) and/or
        handler callables, then the default table. Unpickling formats need ``allow_pickle=True``."""
        from .decoders import decoder_from_args

        decoder = decoder_from_args(*args, pre=pre, post=post, only=only, partial=partial, allow_pickle=allow_pickle)
        return self.compose(Stage(_s.map_stage, f=decoder, handler=resolve_handler(handler)))
