"""An elastic resume (``merge_states``) of a checkpoint taken by DataLoader workers, read by one process.

The merge rebuilds each old process's shards from its ``[rank, world, worker, workers]``. It rebuilt them with the
new dataset's splitters: into a ``WebDataset(..., workersplitter=None)`` (a single process that needs no worker
split), every old worker got the whole list, and the rest of the epoch came twice, or a worker's offset into its
own shard was applied to another (``ShardFormatError``). Found by the soak's elastic resume trials.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("elastic")
    make_shards(root, n_shards=6, shard_bytes=96 << 10, sample_bytes=4 << 10, seed=100)
    return [str(Path(root) / f"shard-{i:06d}.tar") for i in range(6)]


@pytest.mark.parametrize("splitter", ["default", "none"])
@pytest.mark.parametrize("cut", [5, 23])
def test_a_merge_of_two_workers_read_by_one_process_gives_the_rest_once(urls: list[str], splitter: str,
                                                                        cut: int) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    everything = sorted(s["__key__"] for s in wds.WebDataset(urls))
    loader = StatefulDataLoader(wds.WebDataset(urls, nodesplitter=None, deterministic=True), batch_size=None,
                                num_workers=2)
    it = iter(loader)
    first = [next(it)["__key__"] for _ in range(cut)]
    state = loader.state_dict()
    del it, loader
    options: dict[str, Any] = {"workersplitter": None} if splitter == "none" else {}
    ds = wds.WebDataset(urls, nodesplitter=None, deterministic=True, **options)
    ds.load_state_dict(wds.merge_states([state]))
    rest = [s["__key__"] for s in ds]
    assert sorted(first + rest) == everything
