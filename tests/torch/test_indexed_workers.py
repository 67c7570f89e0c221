"""``IndexedWebDataset`` read by DataLoader workers: ``stats()`` in the main process sums them, the metrics export
them, and a worker new this epoch starts its autotuner where the last epoch's worker with its id settled.

Real DataLoaders with two worker processes (fork and spawn) over the emulated store.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import DataLoader, RandomSampler

import wds_async as wds
from tests.torch.levels import first_levels, with_level
from wds_async.stats import watched


@pytest.fixture(scope="module")
def indexed(store: Any) -> tuple[list[str], wds.ShardIndex]:
    urls = [store.base_url + f"shard-{i:06d}.tar" for i in range(8)]
    return urls, wds.build_index(urls)


def _loader(ds: Any, method: str = "fork", workers: int = 2) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(ds, batch_size=16, num_workers=workers, collate_fn=list, sampler=RandomSampler(ds),
                      multiprocessing_context=multiprocessing.get_context(method))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_main_process_sees_the_workers_counters_summed(indexed: Any, method: str) -> None:
    urls, index = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    assert sum(len(batch) for batch in _loader(ds, method)) == len(ds)
    s = ds.stats()
    assert s["workers"] == 2 and s["concurrency_reason"] == "summed over 2 DataLoader workers"
    assert s["samples_delivered"] == s["samples_read"] == len(ds)
    assert s["bytes_read"] > 0 and s["requests"] >= 1


def test_the_metrics_export_an_indexed_dataset_read_by_workers(indexed: Any) -> None:
    urls, index = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    wds.metrics.watch(ds, "indexed-val")  # a TypeError before: only WebDatasets could be named
    assert "indexed-val" not in dict(watched())  # nothing read yet
    assert sum(len(batch) for batch in _loader(ds)) == len(ds)
    snap = dict(watched())["indexed-val"]
    assert snap["samples_delivered"] == len(ds) and snap["workers"] == 2


def _tags(loader: DataLoader) -> Iterator[tuple[int, int]]:  # type: ignore[type-arg]
    return (tag for batch in loader for tag in batch)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_next_epochs_workers_start_where_the_last_ones_settled(indexed: Any, method: str) -> None:
    urls, index = indexed
    ds = wds.IndexedWebDataset(urls, index=index, config=wds.EngineConfig(start_connections=2)).map(with_level)
    assert sorted(first_levels(_tags(_loader(ds, method)))) == [0, 1]
    settled = {int(row["slot"]): int(row["concurrency"]) for row in ds._worker_stats._slots()}
    assert sorted(settled) == [0, 1] and 37 not in settled.values()
    ds.config = ds.config.replace(start_connections=37)  # what a worker that learned nothing would start at
    assert first_levels(_tags(_loader(ds, method))) == settled
    assert first_levels(_tags(_loader(ds, method, workers=1))) == {0: 37}  # another number of workers: afresh
