"""``ds.stats()`` in the main process sums the counters of the DataLoader workers that did the work (issue 11).

Real DataLoaders with two worker processes, under fork and spawn, persistent or not, over local shards and over
the emulated store with injected faults.
"""

from __future__ import annotations

import copy
import multiprocessing
import pickle
import time
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import wds_async as wds
from tests.torch.levels import first_levels, with_level


def _loader(ds: Any, method: str = "fork", **kw: Any) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=multiprocessing.get_context(method),
                      **kw)


def _local(shard_dir: Path) -> str:
    return str(shard_dir / "shard-{000000..000007}.tar")


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_main_process_sees_the_workers_counters_summed(shard_dir: Path, manifest: dict[str, Any], method: str) -> None:
    ds = wds.WebDataset(_local(shard_dir), max_connections=4).to_tuple("__key__", "bin")
    assert ds.stats()["samples_delivered"] == 0 and "workers" not in ds.stats()
    keys = [key for key, _ in _loader(ds, method)]
    s = ds.stats()
    assert len(keys) == manifest["expected_samples"]
    assert s["workers"] == 2 and s["concurrency_reason"] == "summed over 2 DataLoader workers"
    assert s["samples_delivered"] == s["samples_read"] == manifest["expected_samples"]
    assert s["bytes_read"] == manifest["total_bytes"]
    assert s["shards_done"] == s["shards_total"] == manifest["n_shards"]
    assert s["mb_per_s"] > 0 and s["samples_per_s"] > 0 and s["elapsed_s"] > 0
    assert s["requests"] >= manifest["n_shards"] and s["wait_s"] >= 0 and 0 <= s["wait_fraction"] <= 1


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_persistent_workers_show_the_latest_epoch(shard_dir: Path, manifest: dict[str, Any], method: str) -> None:
    ds = wds.WebDataset(_local(shard_dir), max_connections=4, shardshuffle=True)
    loader = _loader(ds, method, persistent_workers=True)
    for epoch in range(2):
        ds.set_epoch(epoch)
        assert sum(1 for _ in loader) == manifest["expected_samples"]
        s = ds.stats()
        assert s["workers"] == 2 and s["samples_delivered"] == manifest["expected_samples"]  # this epoch, not both
        assert s["bytes_read"] == manifest["total_bytes"]
    del loader


def test_counters_are_live_during_the_epoch(shard_dir: Path, manifest: dict[str, Any]) -> None:
    ds = wds.WebDataset(_local(shard_dir), max_connections=4)
    during = None
    for seen, _ in enumerate(_loader(ds, prefetch_factor=1), 1):
        if seen == 10:
            time.sleep(0.5)  # a thread in each worker publishes every 0.1 s, also while the worker waits on the queue
            during = ds.stats()
    assert during is not None and during["workers"] == 2
    assert 10 <= during["samples_delivered"] <= manifest["expected_samples"] and during["bytes_read"] > 0


def test_retries_from_workers_are_counted(store: Any, manifest: dict[str, Any]) -> None:
    pattern = store.base_url + "shard-{000000..000007}.tar?drop_rate=0.3&fail_rate=0.2"
    retry = wds.RetryPolicy(attempts=40, base_delay=0.0, max_delay=0.01)
    for _ in range(5):  # the store's fault dice are server-wide: repeat until a fault really happened
        ds = wds.WebDataset(pattern, max_connections=4, retry=retry)
        assert sum(1 for _ in _loader(ds)) == manifest["expected_samples"]
        if ds.stats()["retries"]:
            break
    s = ds.stats()
    assert s["retries"] > 0 and s["requests"] > manifest["n_shards"]
    assert s["samples_delivered"] == manifest["expected_samples"]


def test_own_iteration_after_the_workers_wins(shard_dir: Path, manifest: dict[str, Any]) -> None:
    ds = wds.WebDataset(_local(shard_dir), max_connections=4)
    assert sum(1 for _ in _loader(ds)) == manifest["expected_samples"]
    assert ds.stats()["workers"] == 2
    first_shard = sum(1 for _ in wds.WebDataset(str(shard_dir / "shard-000000.tar")))
    assert sum(1 for _ in ds.slice(first_shard)) == first_shard  # the main process iterates itself now
    s = ds.stats()
    assert "workers" not in s and s["samples_delivered"] >= first_shard


def test_copies_outside_a_process_start_get_their_own_counters(shard_dir: Path, manifest: dict[str, Any]) -> None:
    ds = wds.WebDataset(_local(shard_dir), max_connections=4)
    assert sum(1 for _ in _loader(ds)) == manifest["expected_samples"]
    for other in (pickle.loads(pickle.dumps(ds)), copy.deepcopy(ds)):
        assert other.stats()["samples_delivered"] == 0
    assert ds.stats()["samples_delivered"] == manifest["expected_samples"]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_next_epochs_workers_start_where_the_last_ones_settled(store: Any, method: str) -> None:
    """Non-persistent workers are new processes every epoch: each starts at the level its slot's last run ended
    at (the autotuner's memory of a dataset across epochs), not at ``start_connections`` again."""
    ds = wds.WebDataset(store.base_url + "shard-{000000..000007}.tar",
                        config=wds.EngineConfig(start_connections=2)).map(with_level)
    assert sorted(first_levels(_loader(ds, method))) == [0, 1]
    settled = {int(row["slot"]): int(row["concurrency"]) for row in ds._worker_stats._slots()}
    assert sorted(settled) == [0, 1] and all(level >= 1 for level in settled.values())
    ds.config = ds.config.replace(start_connections=37)  # what a worker that learned nothing would start at
    assert 37 not in settled.values()
    assert first_levels(_loader(ds, method)) == settled
    # A DataLoader with another number of workers splits the work otherwise: it starts afresh.
    one = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context=multiprocessing.get_context(method))
    assert first_levels(one) == {0: 37}


def test_a_mix_s_next_pass_in_new_workers_starts_where_the_last_settled(store: Any) -> None:
    shards = [store.base_url + f"shard-{i:06d}.tar" for i in range(8)]
    mix = wds.RandomMix([wds.WebDataset(shards[:4], config=wds.EngineConfig(start_connections=2)),
                         wds.WebDataset(shards[4:], config=wds.EngineConfig(start_connections=2))], seed=0)
    staged = mix.map(with_level)
    assert sorted(first_levels(_loader(staged))) == [0, 1]
    settled = {int(row["slot"]): int(row["concurrency"]) for row in mix._worker_stats._slots()}
    assert sorted(settled) == [0, 1] and 37 not in settled.values()
    for source in mix.datasets:
        source.config = source.config.replace(start_connections=37)
    assert first_levels(_loader(staged)) == settled
