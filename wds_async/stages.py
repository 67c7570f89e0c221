"""Synchronous pipeline stages: each is ``stage(iterator) -> iterator``, composed by the dataset.

They run in the consumer's thread (the DataLoader worker), after the bridge, and never block on I/O.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from .handlers import reraise_exception

__all__ = ["batched", "default_collation_fn", "map_stage", "select", "shuffle", "to_tuple"]


def shuffle(data: Iterable[Any], bufsize: int = 1000, initial: int = 100, rng: random.Random | None = None
            ) -> Iterator[Any]:
    """Shuffle within a buffer of ``bufsize`` items, starting to yield once ``initial`` are held."""
    rng = rng or random.Random()
    initial = max(1, min(initial, bufsize))
    buf: list[Any] = []
    for n, item in enumerate(data):
        buf.append(item)
        if len(buf) < initial:
            continue
        if len(buf) < bufsize and n % 2 == 0:
            continue  # grow the buffer by one every other item until it holds bufsize
        index = rng.randrange(len(buf))
        buf[index], buf[-1] = buf[-1], buf[index]
        yield buf.pop()
    rng.shuffle(buf)
    yield from buf


def map_stage(data: Iterable[Any], f: Callable[[Any], Any], handler: Callable[[BaseException], bool] = reraise_exception
              ) -> Iterator[Any]:
    for item in data:
        try:
            result = f(item)
        except Exception as exn:
            if handler(exn):
                continue
            break
        if result is None:
            continue
        yield result


def select(data: Iterable[Any], predicate: Callable[[Any], bool]) -> Iterator[Any]:
    for item in data:
        if predicate(item):
            yield item


def _getfirst(sample: dict[str, Any], spec: str, missing_is_error: bool) -> Any:
    for key in spec.split(";"):
        if key in sample:
            return sample[key]
    if missing_is_error:
        raise ValueError(f"to_tuple: none of {spec.split(';')} in sample {sample.get('__key__')!r} "
                         f"(fields: {sorted(sample)})")
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


def _combine(values: Sequence[Any]) -> Any:
    first = values[0]
    if isinstance(first, (bool, int, float, np.integer, np.floating)):
        return np.array(values)
    if isinstance(first, np.ndarray):
        return np.stack(values)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None  # type: ignore[assignment]
    if torch is not None and isinstance(first, torch.Tensor):
        return torch.stack(list(values))
    return list(values)


def default_collation_fn(samples: Sequence[Any]) -> Any:
    """Batch tuples column-wise (or dicts key-wise): numbers -> numpy arrays, arrays/tensors stacked,
    anything else -> a list."""
    first = samples[0]
    if isinstance(first, dict):
        keys = list(first)
        return {k: _combine([s[k] for s in samples]) for k in keys}
    if isinstance(first, (list, tuple)):
        return [_combine(column) for column in zip(*samples)]
    return _combine(samples)


def batched(data: Iterable[Any], batchsize: int, collation_fn: Callable[[list[Any]], Any] | None = default_collation_fn,
            partial: bool = True) -> Iterator[Any]:
    """Group items into lists of ``batchsize`` and collate them; ``partial=False`` drops a short tail."""
    if batchsize < 1:
        raise ValueError(f"batchsize must be >= 1, got {batchsize}")
    batch: list[Any] = []
    for item in data:
        batch.append(item)
        if len(batch) == batchsize:
            yield collation_fn(batch) if collation_fn is not None else batch
            batch = []
    if batch and partial:
        yield collation_fn(batch) if collation_fn is not None else batch
