"""Samplers for :class:`~wds_async.IndexedWebDataset` that keep requests large.

A uniformly random order (``RandomSampler``) makes every sample its own ranged request. :class:`BlockShuffleSampler`
shuffles *blocks* of ``block_size`` neighbouring indices (and the indices within each block), so a batch holds
runs of neighbours that the dataset coalesces into one request each.

What ``block_size`` trades: requests against randomness. ``block_size=1`` is a uniform shuffle (one request per
sample, each paying the store's time to first byte); ``block_size=batch_size`` makes a batch one or two requests but
fills it with neighbours, which were written together (often from one source, one class, one time); a value
between keeps a batch spread over ``batch_size / block_size`` places in the data. Blocks never cross the order of
the index, so they may span two shards; the dataset splits such a run in two requests.

Distributed: with ``num_replicas`` and ``rank`` (default: from ``torch.distributed`` when it is initialized), the
epoch's order is cut into ``num_replicas`` contiguous, equal shares (padded by wrapping around, or the remainder
dropped with ``drop_last``), as ``DistributedSampler`` does, so every rank draws the same number of samples by
construction and a share stays made of whole blocks. ``set_epoch(n)`` selects the permutation, the same on every
rank for a given ``(seed, epoch)``.

Reading ahead: given an :class:`~wds_async.IndexedWebDataset` (not only its length), the sampler registers with it
(:meth:`~wds_async.IndexedWebDataset.follow`), and each DataLoader worker then keeps its next batches in flight
while the current one is used. torch's ``RandomSampler`` draws its permutation in the main process, out of the
workers' sight, so with it each worker reads one batch at a time; ``BlockShuffleSampler(ds, block_size=1)`` is a
uniform shuffle that workers can follow.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized

__all__ = ["BlockShuffleSampler", "distributed_rank"]


def distributed_rank(num_replicas: int | None, rank: int | None) -> tuple[int, int]:
    """``(num_replicas, rank)``: those given, else torch.distributed's when it is initialized, else ``(1, 0)``."""
    if num_replicas is None or rank is None:
        world, me = 1, 0
        import sys

        dist = sys.modules.get("torch.distributed")  # only where torch is already in use
        if dist is not None and dist.is_available() and dist.is_initialized():
            world, me = dist.get_world_size(), dist.get_rank()
        num_replicas = world if num_replicas is None else num_replicas
        rank = me if rank is None else rank
    if not isinstance(num_replicas, int) or num_replicas < 1:
        raise ValueError(f"num_replicas must be a positive int, not {num_replicas!r}")
    if not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, {num_replicas}), not {rank!r}")
    return num_replicas, rank


class BlockShuffleSampler:
    """Indices of a map-style dataset in shuffled blocks of neighbours (see the module docstring).

    Args:
        data_source: the dataset (anything with ``len()``) or its length.
        block_size: neighbouring indices kept together (1: a uniform shuffle).
        shuffle: shuffle the blocks and the indices within each block (False: index order).
        seed: the permutation's seed, combined with the epoch.
        num_replicas: ranks sharing the data (default: torch.distributed's world size, else 1).
        rank: this rank (default: torch.distributed's rank, else 0).
        drop_last: drop the remainder instead of padding the last shares by wrapping around.
    """

    def __init__(self, data_source: Sized | int, *, block_size: int = 64, shuffle: bool = True, seed: int = 0,
                 num_replicas: int | None = None, rank: int | None = None, drop_last: bool = False) -> None:
        n = data_source if isinstance(data_source, int) else len(data_source)
        if n < 0:
            raise ValueError("the dataset length must be >= 0")
        if not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be a positive int, not {block_size!r}")
        self.n, self.block_size, self.shuffle, self.seed, self.drop_last = n, block_size, shuffle, seed, drop_last
        self.num_replicas, self.rank = distributed_rank(num_replicas, rank)
        self.epoch = 0
        if drop_last:
            self.per_rank = n // self.num_replicas
        else:
            self.per_rank = math.ceil(n / self.num_replicas) if n else 0
        follow = getattr(data_source, "follow", None)
        if callable(follow):  # an IndexedWebDataset: it reads its next batches ahead along this order
            follow(self)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> list[int]:
        """The whole epoch's order, before the split among ranks."""
        blocks = [list(range(lo, min(lo + self.block_size, self.n))) for lo in range(0, self.n, self.block_size)]
        if self.shuffle:
            rng = random.Random(f"{self.seed}/{self.epoch}")
            rng.shuffle(blocks)
            for block in blocks:
                rng.shuffle(block)
        return [i for block in blocks for i in block]

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        total = self.per_rank * self.num_replicas
        if total > len(order) and order:
            order += (order * math.ceil((total - len(order)) / len(order)))[: total - len(order)]
        lo = self.rank * self.per_rank
        return iter(order[lo: lo + self.per_rank])

    def __len__(self) -> int:
        return self.per_rank

    def __repr__(self) -> str:
        return (f"BlockShuffleSampler(n={self.n}, block_size={self.block_size}, shuffle={self.shuffle}, "
                f"rank={self.rank}/{self.num_replicas})")
