"""BlockShuffleSampler: every index once per epoch, blocks of neighbours, equal shares per rank; torch's samplers
over an IndexedWebDataset give each rank the samples its indices name."""

from __future__ import annotations

from pathlib import Path

import pytest

import wds_async as wds
from tests.data.test_indexed import _write


@pytest.mark.parametrize("n,block,world", [(100, 8, 1), (101, 8, 3), (7, 16, 2), (1000, 1, 4), (0, 4, 2)])
def test_blocks_shares_and_epochs(n: int, block: int, world: int) -> None:
    shares = [list(wds.BlockShuffleSampler(n, block_size=block, num_replicas=world, rank=r, seed=2))
              for r in range(world)]
    assert len({len(s) for s in shares}) == 1  # equal shares by construction
    assert all(len(s) == len(wds.BlockShuffleSampler(n, block_size=block, num_replicas=world, rank=0))
               for s in shares)
    flat = [i for s in shares for i in s]
    assert set(flat) == set(range(n)) and len(flat) - n < world  # every index, padded by fewer than a rank
    whole = wds.BlockShuffleSampler(n, block_size=block, seed=2).order()
    runs = [i // block for k, i in enumerate(whole) if k == 0 or i // block != whole[k - 1] // block]
    assert len(runs) == len(set(runs))  # each block of neighbours comes out in one piece
    sampler = wds.BlockShuffleSampler(n, block_size=block, seed=2)
    sampler.set_epoch(1)
    if n > block:
        assert sampler.order() != whole
    dropped = wds.BlockShuffleSampler(n, block_size=block, num_replicas=world, rank=0, drop_last=True)
    assert len(dropped) == n // world
    assert list(wds.BlockShuffleSampler(n, block_size=block, shuffle=False)) == list(range(n))


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="block_size"):
        wds.BlockShuffleSampler(10, block_size=0)
    with pytest.raises(ValueError, match="rank must be in"):
        wds.BlockShuffleSampler(10, num_replicas=2, rank=2)


def test_torch_samplers_over_the_dataset(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    _write(tmp_path, n_shards=3, per_shard=20)
    urls = [str(p) for p in sorted(tmp_path.glob("shard-*.tar"))]
    ds = wds.IndexedWebDataset(urls, index=tmp_path / "index.jsonl")
    streamed = [s["__key__"] for s in wds.WebDataset(urls)]
    keys = []
    for rank in range(4):
        sampler = DistributedSampler(ds, num_replicas=4, rank=rank, seed=0)
        loader = DataLoader(ds, batch_size=5, sampler=sampler, collate_fn=list)
        got = [s["__key__"] for batch in loader for s in batch]
        assert got == [streamed[i] for i in sampler]
        keys += got
    assert sorted(keys) == sorted(streamed)
    batches = BatchSampler(wds.BlockShuffleSampler(ds, block_size=4, seed=1), batch_size=8, drop_last=False)
    loader = DataLoader(ds, batch_sampler=batches, collate_fn=list)
    assert sorted(s["__key__"] for batch in loader for s in batch) == sorted(streamed)
