"""DataLoader with 0 and N workers, under fork and spawn: every sample exactly once."""

from __future__ import annotations

import multiprocessing
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader

import wds_async as wds


def _keys(pattern: str, **loader_kw: object) -> Counter:  # type: ignore[type-arg]
    ds = wds.WebDataset(pattern, max_connections=4).to_tuple("__url__", "__key__")
    loader = DataLoader(ds, batch_size=None, **loader_kw)  # type: ignore[arg-type]
    return Counter(tuple(x) for x in loader)


def test_num_workers_0(pattern: str, manifest: dict) -> None:  # type: ignore[type-arg]
    keys = _keys(pattern, num_workers=0)
    assert len(keys) == manifest["expected_samples"] and set(keys.values()) == {1}


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_share_shards_disjointly(pattern: str, manifest: dict, method: str) -> None:  # type: ignore[type-arg]
    ctx = multiprocessing.get_context(method)
    keys = _keys(pattern, num_workers=2, multiprocessing_context=ctx)
    assert len(keys) == manifest["expected_samples"] and set(keys.values()) == {1}


def test_fork_after_parent_iterated(pattern: str, manifest: dict) -> None:  # type: ignore[type-arg]
    """The parent used the dataset (engine thread, sessions) before forking workers: they rebuild their own."""
    ds = wds.WebDataset(pattern, max_connections=4).to_tuple("__url__", "__key__")
    assert len(list(ds)) == manifest["expected_samples"]
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=multiprocessing.get_context("fork"))
    keys = Counter(tuple(x) for x in loader)
    assert len(keys) == manifest["expected_samples"] and set(keys.values()) == {1}


def test_batched_samples_collate_in_dataloader(pattern: str) -> None:
    ds = wds.WebDataset(pattern).map(lambda s: (torch.tensor([int(s["cls"])]), s["__key__"])).batched(4)
    batch = next(iter(DataLoader(ds, batch_size=None, num_workers=0)))
    assert batch[0].shape == (4, 1) and len(batch[1]) == 4


def test_worker_error_reaches_the_main_process_with_the_url(store, tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = store.url("missing-shard.tar")
    ds = wds.WebDataset([store.url("shard-000000.tar"), missing])
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=multiprocessing.get_context("fork"))
    with pytest.raises(Exception) as info:
        list(loader)
    assert "missing-shard.tar" in str(info.value) and "404" in str(info.value)


def test_distributed_env_splits_by_rank(pattern: str, manifest: dict, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[type-arg]
    seen: Counter = Counter()  # type: ignore[type-arg]
    for rank in range(3):
        monkeypatch.setenv("WORLD_SIZE", "3")
        monkeypatch.setenv("RANK", str(rank))
        ds = wds.WebDataset(pattern).to_tuple("__url__", "__key__")
        seen.update(tuple(x) for x in DataLoader(ds, batch_size=None, num_workers=2,
                               multiprocessing_context=multiprocessing.get_context("fork")))
    assert len(seen) == manifest["expected_samples"] and set(seen.values()) == {1}


def test_shardshuffle_is_per_epoch_and_identical_across_processes(pattern: str) -> None:
    ds = wds.WebDataset(pattern, shardshuffle=True, seed=5, nodesplitter=None)
    first = ds.shard_list()
    assert sorted(first) == sorted(wds.expand_urls(pattern))
    assert ds.shard_list() == first  # same epoch, same order (every rank/worker computes the same)
    ds.set_epoch(1)
    assert ds.shard_list() != first


def test_pin_memory_keeps_samples_whole(pattern: str) -> None:
    """What ``DataLoader(pin_memory=True)``'s pinning thread does to a sample (torch's ``pin_memory`` function, whose
    dict path runs without a GPU): the same type, fields and positions. On a CUDA machine,
    ``python -m benchmarks.gpu_feed`` checks the whole DataLoader path and that batches arrive pinned."""
    from torch.utils.data._utils.pin_memory import pin_memory

    for sample in wds.WebDataset(pattern, max_connections=4).slice(5):
        pinned = pin_memory(sample)
        assert type(pinned) is type(sample) and dict(pinned) == dict(sample)
        assert (pinned.item, pinned.offset, pinned.end) == (sample.item, sample.offset, sample.end)
