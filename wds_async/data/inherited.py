"""The order of the DataLoader's own sampler, as a forked worker inherits it: read ahead with ``RandomSampler``.

torch's DataLoader draws its sampler's order in the main process and hands each worker one batch of indices at a
time, so a map-style dataset whose sampler it does not know (:meth:`~wds_async.IndexedWebDataset.follow`) reads one
batch at a time and every batch pays the store's time to first byte. A worker started with ``fork`` (the default on
Linux) is a copy of the main process taken *inside* ``iter(loader)``, before the main process has drawn a single
index of the epoch: its memory holds the loader's iterator, that iterator's batch sampler and the random states the
sampler is about to draw from. torch's worker loop reseeds the worker's generators right after the fork, so they
are saved earlier, by a fork hook (:func:`os.register_at_fork`) that runs in the new process before anything else.

:class:`InheritedOrder` replays the sampler there on copies of those states (``torch``'s, ``random``'s and
numpy's global generators, and a copy of the sampler's own ``generator``), which gives the sequence the main process
draws for that epoch: ``RandomSampler``, ``SubsetRandomSampler``, ``WeightedRandomSampler``, ``DistributedSampler``,
samplers of a fixed order, and ``StatefulDataLoader(shuffle=True)``'s own alike. The worker's own generators are
left as torch seeded them.

What it needs, and what happens otherwise (each case reads one batch at a time, as before; none loses a sample):

* the ``fork`` start method: a ``spawn`` or ``forkserver`` worker starts from a pickle, which holds no state of
  the main process's generators;
* torch's ``BatchSampler`` or a subclass of it (``batch_size=`` given to the DataLoader, ``batch_sampler=
  BatchSampler(...)``, torchdata's ``StatefulDataLoader``, whose iterator and samplers are built on torch's); a batch
  sampler of another kind has its own order of batches;
* the dataset given to the DataLoader is the ``IndexedWebDataset`` itself (a ``Subset`` of it maps its indices);
* batches dealt to the workers in turn, as the DataLoader does by default (``in_order=False`` deals them to whichever
  worker has room, so a worker's next batches cannot be named);
* for a persistent worker (``persistent_workers=True``), after its first epoch, an order it can know: one that is a
  function of the epoch (``set_epoch``: ``DistributedSampler``, replayed at the fork's epoch plus the epochs since)
  or of the sampler's own generator (``RandomSampler(generator=g)``, ``DataLoader(shuffle=True, generator=g)``:
  its copy is replayed epoch after epoch, as the main process's moves on). An order drawn from the main process's
  global generators (``RandomSampler(ds)``, ``DataLoader(shuffle=True)``) moves on out of the worker's sight: from
  its second epoch on, such a worker reads one batch at a time;
* nothing drawn from the main process's global generators between the fork and the sampler's first index (torch
  draws none there; a pin-memory or user thread that draws from them then makes the replay differ).

A replay that differs from what the main process drew costs nothing but the work of replaying it: the dataset reads
ahead only when the batch it was handed is exactly the one at the position found (:mod:`wds_async.data.readahead`).

Cost: one walk up the stack of a forked child (at most 64 frames, reading the locals of those named ``__init__``),
only where torch's DataLoader module is loaded. In a worker, the sampler is iterated once per process and epoch, all
of it under the swapped states (so that nothing it draws lazily touches the worker's generators): ``RandomSampler``
then holds its indices as Python lists for a while, about 80 bytes per index, as the main process holds one (0.15 s
and 60 MB for a million indices here, 0.65 s and 300 MB for four million), and the order is kept as
:class:`~wds_async.data.readahead.Ahead` keeps it (8 bytes per index). A sampler longer than :data:`MAX_REPLAY`
indices, or without a length, is not replayed (every worker would hold that much at once, unasked): its workers
read one batch at a time. A sampler the dataset is told to follow (``follow``, :class:`~wds_async.BlockShuffleSampler`)
is replayed whatever its length, as the user chose.
"""

from __future__ import annotations

import copy
import os
import random
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Any

__all__ = ["MAX_REPLAY", "InheritedOrder", "inherited_order", "watch_forks"]


@dataclass
class _Inherited:
    """What a forked DataLoader worker found of its loader at the fork: the dataset, and the order to replay."""

    dataset: Any
    order: InheritedOrder


_inherited: _Inherited | None = None
_STACK_DEPTH = 64  # frames looked through above the fork (torch's iterator is about ten frames up)
#: The longest sampler a worker replays (see the module docstring): 4 Mi indices, about 0.7 s and 300 MB for a while.
MAX_REPLAY = 1 << 22


class InheritedOrder:
    """The sampler's order in the epochs of a worker forked at ``epoch`` 0 (see the module docstring): iterating
    gives that epoch's sequence, or an empty one where it cannot be known. :class:`~wds_async.data.readahead.Ahead`
    iterates copies with ``epoch`` set (the epoch of the last batch found and the next)."""

    def __init__(self, sampler: Any, torch_state: Any, random_state: Any, numpy_state: Any) -> None:
        self.sampler = sampler
        self.epoch = 0
        self._states = (torch_state, random_state, numpy_state)
        #: The state of the sampler's own generator at the start of each epoch replayed so far (shared by copies).
        self._starts: dict[int, Any] = {}

    def __iter__(self) -> Any:
        import torch

        epoch, sampler = self.epoch, copy.copy(self.sampler)
        own = getattr(sampler, "generator", None)
        own = own if isinstance(own, torch.Generator) else None
        if epoch and hasattr(sampler, "set_epoch") and isinstance(getattr(sampler, "epoch", None), int):
            sampler.set_epoch(sampler.epoch + epoch)  # an order of the epoch number (DistributedSampler)
            if own is not None:
                sampler.generator = _twin(own, own.get_state())
        elif epoch and own is None:
            return iter(())  # drawn from the main process's global generators, which moved on out of sight
        elif own is not None:  # the main process's copy of the generator moves on by one epoch's draws each epoch
            starts = self._starts
            if not starts:
                starts[0] = own.get_state()
            known = max(k for k in starts if k <= epoch)
            sampler.generator = twin = _twin(own, starts[known])
            for k in range(known, epoch):
                self._replay(sampler)
                starts[k + 1] = twin.get_state()
            order = self._replay(sampler)
            starts[epoch + 1] = twin.get_state()
            return iter(order)
        return iter(self._replay(sampler))

    def _replay(self, sampler: Any) -> list[Any]:
        """All of ``sampler``'s indices, drawn from the global generators as they were at the fork."""
        import torch

        torch_state, random_state, numpy_state = self._states
        np = sys.modules.get("numpy")
        saved = (torch.get_rng_state(), random.getstate(), np.random.get_state() if np is not None else None)
        try:
            torch.set_rng_state(torch_state)
            random.setstate(random_state)
            if np is not None and numpy_state is not None:
                np.random.set_state(numpy_state)
            return list(iter(sampler))
        finally:
            torch.set_rng_state(saved[0])
            random.setstate(saved[1])
            if np is not None and saved[2] is not None:
                np.random.set_state(saved[2])


def _twin(own: Any, state: Any) -> Any:
    """A generator like ``own`` (a ``torch.Generator``) at ``state``, for a replay: the worker's own copy of the
    sampler's generator stays where the fork left it."""
    import torch

    twin = torch.Generator(device=own.device)
    twin.set_state(state)
    return twin


def inherited_order(dataset: Any) -> InheritedOrder | None:
    """The order this process inherited for ``dataset`` at its fork as a DataLoader worker, or None (see the module
    docstring for when)."""
    found = _inherited
    return found.order if found is not None and found.dataset is dataset else None


def _after_fork(kinds: tuple[type, ...]) -> None:
    """In a forked child: find the DataLoader iterator that is starting its workers on the stack (torch's, or one
    built on it as torchdata's ``StatefulDataLoader``'s is), and where its dataset is one of ``kinds`` keep the order to
    replay: its sampler and the global generators' states (see the module docstring for what it must be)."""
    global _inherited
    _inherited = None
    module = sys.modules.get("torch.utils.data.dataloader")
    base = getattr(module, "_BaseDataLoaderIter", None)
    batch_kind = getattr(sys.modules.get("torch.utils.data.sampler"), "BatchSampler", None)
    if base is None or batch_kind is None:
        return
    frame: FrameType | None = sys._getframe(1)
    loader = None
    for _ in range(_STACK_DEPTH):
        if frame is None:
            return
        if frame.f_code.co_name == "__init__":
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, base) and getattr(candidate, "_num_workers", 0) > 0:
                loader = candidate
                break
        frame = frame.f_back
    if loader is None:
        return
    dataset = getattr(loader, "_dataset", None)
    batch_sampler = getattr(loader, "_index_sampler", None)
    if (not isinstance(dataset, kinds) or not getattr(loader, "_auto_collation", False)
            or not isinstance(batch_sampler, batch_kind) or not getattr(loader, "_in_order", True)):
        return
    sampler = batch_sampler.sampler
    try:
        if len(sampler) > MAX_REPLAY:
            return
    except TypeError:  # no length: no bound on what a replay would hold
        return
    import torch

    np = sys.modules.get("numpy")
    _inherited = _Inherited(dataset, InheritedOrder(sampler, torch.get_rng_state(), random.getstate(),
                                                    np.random.get_state() if np is not None else None))


def _hook(kinds: tuple[type, ...]) -> None:
    global _inherited
    try:
        _after_fork(kinds)
    except Exception:  # a fork hook must not fail the fork: the worker then reads one batch at a time
        _inherited = None


def watch_forks(*kinds: type) -> None:
    """Keep, in every forked DataLoader worker whose dataset is one of ``kinds``, what :func:`inherited_order`
    needs. Call once per kind of dataset (an import-time call)."""
    os.register_at_fork(after_in_child=lambda: _hook(kinds))
