"""Synchronous pipeline stages: each is ``stage(iterator) -> iterator``, composed by the dataset.

They run in the consumer's thread (the DataLoader worker), after the bridge, and never block on I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..handlers import reraise_exception
from .stateful import Batched, Shuffle, Slice

__all__ = ["batched", "default_collation_fn", "map_dict", "map_stage", "map_tuple", "rename", "rsample", "select",
           "shuffle", "slice_stage", "to_tuple", "unbatched", "unlisted"]


def shuffle(data: Iterable[Any], bufsize: int = 1000, initial: int = 100, rng: random.Random | None = None,
            seed: Any = None, handler: Any = None) -> Iterator[Any]:
    """Shuffle within a buffer of ``bufsize`` items, starting to yield once ``initial`` are held, drawing as
    webdataset's ``shuffle`` does (see :class:`~wds_async.data.stages.stateful.Shuffle`). ``handler`` is accepted
    and unused, as in webdataset: nothing here can fail."""
    return Shuffle(bufsize, initial, seed=seed, rng=rng)(data)


def map_stage(data: Iterable[Any], f: Callable[[Any], Any], handler: Callable[[BaseException], bool] = reraise_exception
              ) -> Iterator[Any]:
    """Apply ``f``; ``None`` results are dropped; a dict result keeps the sample's ``__key__``."""
    for item in data:
        try:
            result = f(item)
        except Exception as exn:
            if handler(exn):
                continue
            break
        if result is None:
            continue
        if isinstance(item, dict) and isinstance(result, dict):
            result["__key__"] = item.get("__key__")
        yield result


def select(data: Iterable[Any], predicate: Callable[[Any], bool]) -> Iterator[Any]:
    for item in data:
        if predicate(item):
            yield item


def rsample(data: Iterable[Any], p: float = 0.5) -> Iterator[Any]:
    """Keep each item with probability ``p``, drawn from the global ``random`` module as webdataset does (so
    ``random.seed(n)`` makes it repeatable)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"rsample: p must be within [0, 1], got {p}")
    return (item for item in data if random.uniform(0.0, 1.0) < p)


def _getfirst(sample: dict[str, Any], spec: str | Sequence[str], missing_is_error: bool) -> Any:
    keys = spec.split(";") if isinstance(spec, str) else list(spec)
    for key in keys:
        if key in sample:
            return sample[key]
    if missing_is_error:
        raise ValueError(f"none of {keys} in sample {sample.get('__key__')!r} (fields: {sorted(map(str, sample))})")
    return None


def to_tuple(data: Iterable[dict[str, Any]], *keys: str, handler: Callable[[BaseException], bool] = reraise_exception,
             missing_is_error: bool = True) -> Iterator[tuple[Any, ...]]:
    """Turn dict samples into tuples of the named fields; ``"jpg;png"`` takes the first present."""
    specs = keys[0].split() if len(keys) == 1 and " " in keys[0] else list(keys)
    for sample in data:
        try:
            yield tuple(_getfirst(sample, spec, missing_is_error) for spec in specs)
        except ValueError as exn:
            if handler(exn):
                continue
            break


def _combine(values: Sequence[Any], field: str = "the samples") -> Any:
    """webdataset's rules: Python ints/floats -> numpy array, tensors -> torch.stack, arrays -> stacked
    numpy array (shapes must agree), anything else -> list."""
    first = values[0]
    if isinstance(first, (int, float)):
        return np.array(list(values))
    from .._torch import Tensor  # torch.Tensor, or without torch a stand-in that no value is an instance of

    if isinstance(first, (Tensor, np.ndarray)):
        shape = tuple(first.shape)
        other = next((i for i, v in enumerate(values) if tuple(v.shape) != shape), None)
        if other is not None:
            raise ValueError(
                f"cannot batch {field}: shapes differ, {shape} in sample 0 and {tuple(values[other].shape)} in "
                f"sample {other} of {len(values)}; the default collation stacks equal shapes only. Pad or crop "
                "them in a collation_fn (.batched(n, collation_fn=my_collate)), or get lists of samples with "
                ".batched(n, collation_fn=list)")
        if isinstance(first, np.ndarray):
            return np.array(list(values))
        import torch

        return torch.stack(list(values))
    return list(values)


def default_collation_fn(samples: Sequence[Any]) -> Any:
    """Batch tuples column-wise (a tuple of columns) or dicts key-wise (a dict), as webdataset does."""
    first = samples[0]
    if isinstance(first, dict):
        keys = set(first)
        for sample in samples[1:]:
            if set(sample) != keys:
                raise ValueError(f"keys don't match in different samples: {sorted(keys)} vs {sorted(sample)}")
        return {k: _combine([s[k] for s in samples], f"field {k!r}") for k in first}
    if isinstance(first, (list, tuple)):
        return tuple(_combine(column, f"tuple field {i}") for i, column in enumerate(zip(*samples)))
    return _combine(samples)


def batched(data: Iterable[Any], batchsize: int, collation_fn: Callable[[list[Any]], Any] | None = default_collation_fn,
            partial: bool = True) -> Iterator[Any]:
    """Group items into lists of ``batchsize`` and collate them; ``partial=False`` drops a short tail."""
    return Batched(batchsize, collation_fn, partial)(data)


def unbatched(data: Iterable[Any]) -> Iterator[Any]:
    """Turn batches (tuples of columns or dicts of columns) back into samples."""
    for batch in data:
        if isinstance(batch, (list, tuple)):
            for i in range(len(batch[0])):
                yield tuple(column[i] for column in batch)
        elif isinstance(batch, dict):
            lengths = {len(v) for v in batch.values()}
            if len(lengths) != 1:
                raise ValueError(f"unbatched: columns of different lengths {sorted(lengths)}")
            for i in range(lengths.pop()):
                yield {k: v[i] for k, v in batch.items()}
        else:
            raise ValueError(f"unbatched: unknown batch type {type(batch).__name__}")


def unlisted(data: Iterable[list[Any]]) -> Iterator[Any]:
    """Flatten lists of samples (the inverse of ``batched(n, collation_fn=None)``)."""
    for batch in data:
        if not isinstance(batch, list):
            raise ValueError(f"unlisted expects lists, got {type(batch).__name__}")
        yield from batch


def rename(data: Iterable[dict[str, Any]], handler: Callable[[BaseException], bool] = reraise_exception,
           keep: bool = True, **kw: str) -> Iterator[dict[str, Any]]:
    """``rename(img="jpg;png")``: the first present old key becomes the new key. ``keep=False`` keeps only
    the renamed fields."""
    replaced = {old for spec in kw.values() for old in (spec.split(";") if isinstance(spec, str) else spec)}
    for sample in data:
        try:
            renamed = {new: _getfirst(sample, spec, True) for new, spec in kw.items()}
        except ValueError as exn:
            if handler(exn):
                continue
            break
        if keep:
            result = {k: v for k, v in sample.items() if k not in replaced}
            result.update(renamed)
            yield result
        else:
            yield renamed


def map_dict(data: Iterable[dict[str, Any]], handler: Callable[[BaseException], bool] = reraise_exception,
             **kw: Callable[[Any], Any]) -> Iterator[dict[str, Any]]:
    """Apply ``f`` to field ``key`` for every ``key=f``."""
    if not kw:
        raise ValueError("map_dict needs at least one key=function")
    for key, f in kw.items():
        if not callable(f):
            raise TypeError(f"map_dict: {key}={f!r} is not callable")
    for sample in data:
        try:
            for key, f in kw.items():
                sample[key] = f(sample[key])
        except Exception as exn:
            if handler(exn):
                continue
            break
        yield sample


def map_tuple(data: Iterable[Sequence[Any]], *fs: Callable[[Any], Any] | None,
              handler: Callable[[BaseException], bool] = reraise_exception) -> Iterator[tuple[Any, ...]]:
    """Apply the i-th function to the i-th element of each tuple (``None``: leave it)."""
    for sample in data:
        values = list(sample)
        try:
            for i, f in enumerate(fs[: len(values)]):
                if f is not None:
                    values[i] = f(values[i])
        except Exception as exn:
            if handler(exn):
                continue
            break
        yield tuple(values)


def slice_stage(data: Iterable[Any], *args: int | None) -> Iterator[Any]:
    """``itertools.islice`` as a stage: ``slice(stop)`` or ``slice(start, stop[, step])``."""
    return Slice(*args)(data)
