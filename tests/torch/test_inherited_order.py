"""Forked DataLoader workers of an ``IndexedWebDataset`` read ahead along torch's own ``RandomSampler``: the order the
main process draws is replayed from what the worker inherited at the fork (:mod:`wds_async.data.inherited`).

Real DataLoaders with two worker processes over the emulated store; ``stats()["batches_read_ahead"]`` counts the
batches whose reads had started before they were asked for.
"""

from __future__ import annotations

import gc
import multiprocessing
from typing import Any

import pytest
import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

import wds_async as wds
from tests.data.test_indexed import _plain

BATCH = 16


@pytest.fixture(scope="module")
def indexed(store: Any) -> tuple[list[str], wds.ShardIndex, dict[str, bytes]]:
    urls = [store.base_url + f"shard-{i:06d}.tar" for i in range(8)]
    streamed = {s["__key__"]: s for s in wds.WebDataset(urls, shardshuffle=False)}
    return urls, wds.build_index(urls), streamed


def _loader(ds: Any, sampler: Any, method: str = "fork", **kw: Any) -> DataLoader:  # type: ignore[type-arg]
    return DataLoader(ds, batch_size=BATCH, sampler=sampler, num_workers=2, collate_fn=list,
                      multiprocessing_context=multiprocessing.get_context(method), **kw)


def _batches(ds: Any) -> int:
    return -(-len(ds) // BATCH)


def test_random_sampler_without_a_generator_is_read_ahead(indexed: Any) -> None:
    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    seen = [s for batch in _loader(ds, RandomSampler(ds)) for s in batch]
    assert sorted(s["__key__"] for s in seen) == sorted(streamed)  # every sample once
    assert all(_plain(s) == _plain(streamed[s["__key__"]]) for s in seen)
    # Each worker's first batch is read when asked for; every later one was in flight before.
    assert ds.stats()["batches_read_ahead"] == _batches(ds) - 2


def test_random_sampler_with_its_own_generator_keeps_the_main_process_order(indexed: Any) -> None:
    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    expected = list(RandomSampler(ds, generator=torch.Generator().manual_seed(7)))
    loader = _loader(ds, RandomSampler(ds, generator=torch.Generator().manual_seed(7)))
    keys = sorted(streamed)  # the index's order is the shards' order, and keys grow within it
    assert [s["__key__"] for batch in loader for s in batch] == [keys[i] for i in expected]
    assert ds.stats()["batches_read_ahead"] == _batches(ds) - 2


def test_a_sequential_sampler_is_read_ahead_too(indexed: Any) -> None:
    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    assert [s["__key__"] for batch in _loader(ds, SequentialSampler(ds)) for s in batch] == sorted(streamed)
    assert ds.stats()["batches_read_ahead"] == _batches(ds) - 2


@pytest.mark.parametrize("kind", ["subset", "weighted", "distributed"])
def test_torch_s_other_samplers_are_read_ahead(indexed: Any, kind: str) -> None:
    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    n = len(ds)
    sampler = {"subset": lambda: SubsetRandomSampler(range(n)),  # the global generator, drawn without a seed
               "weighted": lambda: WeightedRandomSampler([1.0] * n, n, replacement=False),
               "distributed": lambda: DistributedSampler(ds, num_replicas=1, rank=0, seed=5)}[kind]()
    assert sorted(s["__key__"] for batch in _loader(ds, sampler) for s in batch) == sorted(streamed)
    assert ds.stats()["batches_read_ahead"] == _batches(ds) - 2


def test_spawned_workers_read_one_batch_at_a_time(indexed: Any) -> None:
    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    seen = [s["__key__"] for batch in _loader(ds, RandomSampler(ds), "spawn") for s in batch]
    assert sorted(seen) == sorted(streamed)
    assert ds.stats()["batches_read_ahead"] == 0  # nothing of the main process's generators reaches a pickle


def test_persistent_workers_read_ahead_in_their_first_epoch_only(indexed: Any) -> None:
    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    loader = _loader(ds, RandomSampler(ds), persistent_workers=True)
    for _ in range(2):
        assert sorted(s["__key__"] for batch in loader for s in batch) == sorted(streamed)
    del loader  # the workers exit, and publish their counters a last time as they do
    gc.collect()
    # The second epoch's order is drawn after the fork, from generators the workers no longer see: its batches
    # are not found in the replayed order and are read as asked for. The counters are the workers' two epochs.
    assert ds.stats()["samples_delivered"] == 2 * len(ds)
    assert ds.stats()["batches_read_ahead"] == _batches(ds) - 2


@pytest.mark.parametrize("kind", ["distributed", "own-generator"])
def test_persistent_workers_read_ahead_every_epoch_of_an_order_they_can_know(indexed: Any, kind: str) -> None:
    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    keys = sorted(streamed)

    def sampler() -> Any:
        if kind == "distributed":  # an order of the epoch number
            return DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=9)
        return RandomSampler(ds, generator=torch.Generator().manual_seed(9))  # its own generator moves on

    used, twin = sampler(), sampler()
    loader = _loader(ds, used, persistent_workers=True)
    for epoch in range(3):
        if kind == "distributed":
            used.set_epoch(epoch)
            twin.set_epoch(epoch)
        assert [s["__key__"] for batch in loader for s in batch] == [keys[i] for i in twin], epoch
    del loader
    gc.collect()
    assert ds.stats()["batches_read_ahead"] == 3 * (_batches(ds) - 2)


def _draw(sample: dict[str, Any]) -> tuple[str, float]:
    return sample["__key__"], float(torch.rand(()).item())


def test_the_workers_own_generators_are_left_as_torch_seeded_them(indexed: Any) -> None:
    urls, index, _ = indexed
    draws = []
    for readahead in (0, 2):
        ds = wds.IndexedWebDataset(urls, index=index, readahead=readahead).map(_draw)
        loader = _loader(ds, RandomSampler(ds, generator=torch.Generator().manual_seed(3)),
                         generator=torch.Generator().manual_seed(11))  # the workers' seeds
        draws.append([pair for batch in loader for pair in batch])
        assert ds.stats()["batches_read_ahead"] == (_batches(ds) - 2 if readahead else 0)
    assert draws[0] == draws[1]


def test_a_subset_of_the_dataset_is_read_one_batch_at_a_time(indexed: Any) -> None:
    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    part = torch.utils.data.Subset(ds, list(range(0, len(ds), 2)))
    seen = [s["__key__"] for batch in _loader(part, RandomSampler(part)) for s in batch]
    assert sorted(seen) == sorted(streamed)[::2]
    assert ds.stats()["batches_read_ahead"] == 0  # its indices are the Subset's, not the dataset's


def test_statefuldataloader_workers_read_ahead_and_resume_exactly(indexed: Any) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)

    def loader() -> StatefulDataLoader:  # type: ignore[type-arg]
        return StatefulDataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=list, shuffle=True,
                                  generator=torch.Generator().manual_seed(21))

    whole = [s["__key__"] for batch in loader() for s in batch]
    assert sorted(whole) == sorted(streamed)
    assert ds.stats()["batches_read_ahead"] == _batches(ds) - 2  # torchdata's iterator and samplers are torch's kind

    first = loader()
    it = iter(first)
    before = [s["__key__"] for _ in range(5) for s in next(it)]
    state = first.state_dict()
    del it, first
    again = loader()
    again.load_state_dict(state)
    assert before + [s["__key__"] for batch in again for s in batch] == whole


def test_a_sampler_longer_than_the_replay_bound_is_read_one_batch_at_a_time(indexed: Any,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    from wds_async.data import inherited

    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    monkeypatch.setattr(inherited, "MAX_REPLAY", len(ds) - 1)  # forked workers inherit the patched bound
    assert sorted(s["__key__"] for batch in _loader(ds, RandomSampler(ds)) for s in batch) == sorted(streamed)
    assert ds.stats()["batches_read_ahead"] == 0


def test_batches_dealt_out_of_turn_are_read_one_at_a_time(indexed: Any) -> None:
    urls, index, streamed = indexed
    ds = wds.IndexedWebDataset(urls, index=index)
    loader = _loader(ds, RandomSampler(ds), in_order=False)  # a worker's next batches cannot be named
    assert sorted(s["__key__"] for batch in loader for s in batch) == sorted(streamed)
    assert ds.stats()["batches_read_ahead"] == 0
