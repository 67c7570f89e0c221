"""``webdataset.utils``: ``PipelineStage``, the worker/rank helpers and the small utilities code imports from it.

``pytorch_worker_info`` and ``pytorch_worker_seed`` read the same sources as webdataset 1.0.2, in the same order:
``RANK``/``WORLD_SIZE`` from the environment, else ``torch.distributed``; ``WORKER``/``NUM_WORKERS``, else the
DataLoader's worker info. The seed is ``rank * 1000 + worker``, as there: open_clip and timm seed their shard
shuffles from it.
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import itertools
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from ..urls import braceexpand
from ._names import refusing

__all__ = [
    "ObsoleteException", "PipelineStage", "compute_sample_weights", "deprecated", "enforce_security",
    "fnmatch_with_braces", "glob_with_braces", "guess_batchsize", "identity", "is_iterable", "make_seed", "obsolete",
    "pytorch_worker_info", "pytorch_worker_seed", "repeatedly", "repeatedly0",
]

#: webdataset's ``WDS_SECURE`` switch. wds-async never evaluates strings and never unpickles unless told to
#: (``WDS_ASYNC_ALLOW_PICKLE``), whatever this says.
enforce_security = bool(int(os.environ.get("WDS_SECURE", "0")))

__getattr__ = refusing("webdataset.utils", {
    "safe_eval": "it evaluates Python text (webdataset's old way of naming decoders); wds-async evaluates no "
                 "strings - name the function itself",
    "lookup_sym": "it looks a name up among webdataset's own internal modules, which are not wds-async's",
})


class PipelineStage:
    """Base class of a pipeline stage written as a class: a subclass defines ``run(src) -> iterator``.

    A :class:`~wds_async.DataPipeline` calls a stage with the stream (``stage(src)``), which here calls
    ``self.run(src)``; webdataset's pipeline calls ``run`` directly. open_clip's and timm's ``detshuffle2``
    subclass this."""

    def invoke(self, *args: Any, **kw: Any) -> Any:
        """webdataset's placeholder; subclasses define :meth:`run` instead."""
        raise NotImplementedError

    def __call__(self, *args: Any, **kw: Any) -> Any:
        run = getattr(self, "run", None)
        if run is None:
            raise NotImplementedError(f"{type(self).__name__} is a PipelineStage without a run(src) method")
        return run(*args, **kw)


def make_seed(*args: Any) -> int:
    """A 31-bit seed from ``args``, folded as webdataset folds them (``seed * 31 + hash(arg)``); ``hash`` of a
    ``str`` changes between processes unless ``PYTHONHASHSEED`` is set, as there."""
    seed = 0
    for arg in args:
        seed = (seed * 31 + hash(arg)) & 0x7FFFFFFF
    return seed


def is_iterable(obj: Any) -> bool:
    """Whether ``obj`` is iterable, ``str`` and ``bytes`` not counted."""
    if isinstance(obj, (str, bytes)):
        return False
    return isinstance(obj, Iterable)


def identity(x: Any) -> Any:
    """``x`` itself."""
    return x


def glob_with_braces(pattern: str) -> list[str]:
    """``glob`` over each brace expansion of ``pattern``."""
    return [name for expanded in braceexpand(pattern) for name in glob.glob(expanded)]


def fnmatch_with_braces(filename: str, pattern: str) -> bool:
    """Whether ``filename`` matches any brace expansion of ``pattern``."""
    return any(fnmatch.fnmatch(filename, expanded) for expanded in braceexpand(pattern))


def repeatedly0(loader: Iterable[Any], nepochs: int = sys.maxsize, nbatches: int = sys.maxsize) -> Iterator[Any]:
    """``nepochs`` passes over ``loader``, at most ``nbatches`` items each."""
    for _ in range(nepochs):
        yield from itertools.islice(loader, nbatches)


def guess_batchsize(batch: Any) -> int:
    """The length of a batch's first field."""
    return len(batch[0])


def repeatedly(source: Iterable[Any], nepochs: int | None = None, nbatches: int | None = None,
               nsamples: int | None = None, batchsize: Callable[[Any], int] = guess_batchsize) -> Iterator[Any]:
    """Iterate ``source`` again and again until ``nepochs`` passes, ``nbatches`` items or ``nsamples`` samples
    (counted with ``batchsize(batch)``) have gone by; without a limit, forever. A source that yields nothing ends
    it (webdataset would loop on it for ever)."""
    epoch = batches = total = 0
    while True:
        empty = True
        for item in source:
            empty = False
            yield item
            batches += 1
            if nbatches is not None and batches >= nbatches:
                return
            if nsamples is not None:
                total += batchsize(item)
                if total >= nsamples:
                    return
        epoch += 1
        if empty or (nepochs is not None and epoch >= nepochs):
            return


def pytorch_worker_info(group: Any = None) -> tuple[int, int, int, int]:
    """``(rank, world_size, worker, num_workers)``, read as webdataset 1.0.2 reads them (see the module)."""
    rank, world_size, worker, num_workers = 0, 1, 0, 1
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    else:
        try:
            import torch.distributed as dist
        except ImportError:  # pragma: no cover - torch is installed wherever the shim runs
            pass
        else:
            if dist.is_available() and dist.is_initialized():
                group = group or dist.group.WORLD
                rank, world_size = dist.get_rank(group=group), dist.get_world_size(group=group)
    if "WORKER" in os.environ and "NUM_WORKERS" in os.environ:
        worker, num_workers = int(os.environ["WORKER"]), int(os.environ["NUM_WORKERS"])
    else:
        try:
            from torch.utils.data import get_worker_info
        except ImportError:  # pragma: no cover
            pass
        else:
            info = get_worker_info()
            if info is not None:
                worker, num_workers = info.id, info.num_workers
    return rank, world_size, worker, num_workers


def pytorch_worker_seed(group: Any = None) -> int:
    """``rank * 1000 + worker``: distinct per worker and node, the same on every run."""
    rank, _world, worker, _workers = pytorch_worker_info(group=group)
    return rank * 1000 + worker


def deprecated(arg: Any = None) -> Any:
    """Decorator (bare, or with a reason): calling the function warns with a :class:`DeprecationWarning`."""
    reason = None if callable(arg) else arg

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def call(*args: Any, **kwargs: Any) -> Any:
            message = f"Call to deprecated function {func.__name__}."
            if reason is not None:
                message += f" Reason: {reason}"
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return func(*args, **kwargs)

        return call

    return decorate(arg) if callable(arg) else decorate


class ObsoleteException(Exception):
    """Raised by a function marked :func:`obsolete` unless ``ALLOW_OBSOLETE=1``."""


def obsolete(func: Callable[..., Any] | None = None, *, reason: str | None = None) -> Any:
    """Decorator: calling the function raises :class:`ObsoleteException` unless the environment has
    ``ALLOW_OBSOLETE=1``."""
    if func is None:
        return functools.partial(obsolete, reason=reason)
    target = func

    @functools.wraps(target)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not int(os.environ.get("ALLOW_OBSOLETE", "0")):
            message = f"Call to obsolete function {target.__name__}. Set env ALLOW_OBSOLETE=1 to permit."
            if reason is not None:
                message += f" Reason: {reason}"
            raise ObsoleteException(message)
        return target(*args, **kwargs)

    return call


def compute_sample_weights(n_w_pairs: Iterable[tuple[float, float]]) -> Any:
    """``n * w`` per ``(n, w)`` pair, scaled so that the largest is 1."""
    pairs = list(n_w_pairs)
    weighted = np.array([n for n, _ in pairs]) * np.array([w for _, w in pairs])
    return weighted / np.amax(weighted)
