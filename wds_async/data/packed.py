"""Batches of samples whose bytes cross from DataLoader workers in shared memory: :func:`pack_samples`.

A ``DataLoader`` worker hands each item to the main process through one queue: pickled, written to a pipe, read
and unpickled there. Tensors are the exception: torch moves their storage to shared memory and sends a file
descriptor. Samples whose values are ``bytes`` (a pipeline that decodes in the main process, on the GPU say) take
the pickled road, and that road carries about 1 GB/s into one main process however many workers feed it
(``python -m benchmarks.cpu --workers N``; see docs/training.md).

:func:`pack_samples` is a collation function for ``.batched(n, collation_fn=wds.pack_samples)`` (or a DataLoader's
``collate_fn``): it copies the ``bytes`` values of a batch, in order, into one ``uint8`` tensor, allocated in shared
memory when it runs in a DataLoader worker (as torch's ``default_collate`` stacks tensors there), and keeps the
other values (keys, URLs, numbers, tensors) beside it as they are. What crosses the queue is then a file descriptor
and the small values. In the main process :class:`PackedSamples` gives the batch back: ``packed.values("jpg")`` as
tensor views of the one buffer (no copy: ready for ``torchvision.io.decode_jpeg(..., device="cuda")``), or the
samples themselves with their ``bytes`` restored (one copy each).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Sequence
from typing import Any

from ._torch import require_torch

__all__ = ["PackedSamples", "pack_samples"]


class PackedSamples:
    """A batch packed by :func:`pack_samples`: ``len()`` samples, their ``bytes`` values in one ``uint8`` tensor
    (:attr:`data`), the rest as they were.

    Iterating gives the samples back, each a ``dict`` (or a ``tuple``, as packed) whose ``bytes`` values are
    ``bytes`` again; :meth:`values` gives one field of every sample, the ``bytes`` ones as tensor views of
    :attr:`data` with no copy."""

    def __init__(self, data: Any, fields: list[list[tuple[Any, Any]]], tuples: bool) -> None:
        #: One ``uint8`` tensor holding every ``bytes`` value of the batch, sample after sample.
        self.data = data
        # Per sample, per field: (name or position, value), where a bytes value is stored as _Span(offset, length).
        self._fields = fields
        self._tuples = tuples

    def __len__(self) -> int:
        return len(self._fields)

    def __iter__(self) -> Iterator[Any]:
        for i in range(len(self._fields)):
            yield self[i]

    def __getitem__(self, index: int) -> Any:
        """Sample ``index``, its ``bytes`` values copied out of :attr:`data`."""
        fields = self._fields[index]
        if self._tuples:
            return tuple(self._restore(value) for _, value in fields)
        return {name: self._restore(value) for name, value in fields}

    def values(self, field: Any) -> list[Any]:
        """Field ``field`` (a key of dict samples, a position of tuple samples) of every sample, in order:
        ``bytes`` values as ``uint8`` tensor views of :attr:`data` (no copy), others as they were. A sample without
        the field raises ``KeyError`` naming it."""
        out = []
        for index, fields in enumerate(self._fields):
            for name, value in fields:
                if name == field:
                    out.append(self.data[value.start:value.start + value.length] if type(value) is _Span else value)
                    break
            else:
                raise KeyError(f"sample {index} of the packed batch has no field {field!r} "
                               f"(it has {[name for name, _ in fields]})")
        return out

    def pin_memory(self, device: Any = None) -> PackedSamples:
        """The batch with :attr:`data` in page-locked memory, and the tensors among the other values too: what
        ``DataLoader(pin_memory=True)`` calls on each batch (as it pins the tensors of a batch torch collated),
        so that ``packed.data.to("cuda", non_blocking=True)`` and the views of :meth:`values` copy asynchronously.
        Needs an accelerator, as ``Tensor.pin_memory()`` does."""
        from torch.utils.data._utils.pin_memory import pin_memory

        fields = [[(name, value if type(value) is _Span else pin_memory(value, device)) for name, value in row]
                  for row in self._fields]
        return PackedSamples(self.data.pin_memory(), fields, self._tuples)

    def _restore(self, value: Any) -> Any:
        if type(value) is not _Span:
            return value
        return ctypes.string_at(self.data.data_ptr() + value.start, value.length)

    def __repr__(self) -> str:
        return f"PackedSamples({len(self)} samples, {self.data.numel()} bytes packed)"


class _Span:
    """Where one ``bytes`` value lies in the packed tensor."""

    __slots__ = ("length", "start")

    def __init__(self, start: int, length: int) -> None:
        self.start = start
        self.length = length

    def __reduce__(self) -> tuple[Any, ...]:
        return _Span, (self.start, self.length)


def pack_samples(samples: Sequence[Any]) -> PackedSamples:
    """Pack a batch of samples (dicts, or tuples from ``.to_tuple()``) for the hand-over from a DataLoader worker:
    every ``bytes`` value copied, in order, into one ``uint8`` tensor (in shared memory inside a worker), every
    other value kept as it is. Use it as ``.batched(n, collation_fn=wds.pack_samples)`` or as a DataLoader's
    ``collate_fn``; see :class:`PackedSamples` for the other side. Needs torch."""
    require_torch("pack_samples")
    import torch
    from torch.utils.data import get_worker_info

    samples = list(samples)
    tuples = bool(samples) and isinstance(samples[0], tuple)
    fields: list[list[tuple[Any, Any]]] = []
    chunks: list[bytes] = []
    at = 0
    for index, sample in enumerate(samples):
        if isinstance(sample, dict) and not tuples:
            items = sample.items()
        elif isinstance(sample, tuple) and tuples:
            items = enumerate(sample)  # type: ignore[assignment]
        else:
            raise TypeError(f"pack_samples packs a batch of dicts or of tuples; sample {index} is a "
                            f"{type(sample).__name__} (and sample 0 a {type(samples[0]).__name__})")
        row: list[tuple[Any, Any]] = []
        for name, value in items:
            if isinstance(value, bytes):
                row.append((name, _Span(at, len(value))))
                chunks.append(value)
                at += len(value)
            else:
                row.append((name, value))
        fields.append(row)
    if get_worker_info() is not None:  # a worker: the storage in shared memory, so the queue carries its descriptor
        data = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(at))
    else:
        data = torch.empty(at, dtype=torch.uint8)
    address = data.data_ptr()
    for chunk in chunks:
        ctypes.memmove(address, chunk, len(chunk))
        address += len(chunk)
    return PackedSamples(data, fields, tuples)
