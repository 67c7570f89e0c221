"""Random access under a real torchrun launch: 2 ranks, each with ``DistributedSampler`` and 2 forked DataLoader
workers over the emulated store (``tests/torch/indexed_rank.py``). Each rank gets exactly its sampler's share, the
two shares together are every sample (DistributedSampler pads the shorter to equal length), and the workers read
ahead along the order the rank's main process draws, in every epoch (non-persistent workers are forked anew each
epoch, after ``set_epoch``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DistributedSampler

import wds_async as wds
from tests.conftest import free_port
from tests.torch.children import Launches

pytestmark = pytest.mark.slow

CHILD = str(Path(__file__).resolve().parent / "indexed_rank.py")
WORLD = 2
BATCH = 8


def test_ranks_read_their_distributed_share_ahead(store: Any, tmp_path: Path) -> None:
    urls = [store.base_url + f"shard-{i:06d}.tar" for i in range(8)]
    index = wds.build_index(urls)
    index_path = tmp_path / "index.jsonl"
    index.save(str(index_path))
    ds = wds.IndexedWebDataset(urls, index=index)
    keys = [ds.locate(i) for i in range(len(ds))]
    names = [index.shards[shard].keys[at] for shard, at in keys]
    with Launches(CHILD) as job:
        job.start(["--nproc-per-node", str(WORLD), "--master-port", str(free_port())],
                  [json.dumps(urls), str(index_path), str(tmp_path)], tmp_path / "torchrun.out")
        assert job.wait(120.0) == [0], job.output()
    got = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(WORLD)]
    for epoch in range(2):
        seen = []
        for rank, result in enumerate(got):
            sampler = DistributedSampler(ds, num_replicas=WORLD, rank=rank, shuffle=True, seed=7)
            sampler.set_epoch(epoch)
            order = [names[i] for i in sampler]
            assert [k for batch in result["epochs"][epoch] for k in batch] == order, (epoch, rank)
            seen += order
            # Each epoch's workers are new forks: a worker's first batch is read when asked, every later one ahead.
            batches = len(result["epochs"][epoch])
            assert result["counters"][epoch] == {"read_ahead": batches - 2, "delivered": len(order), "workers": 2}
        assert set(seen) == set(names)
