"""Reading ahead along a followed sampler's order (IndexedWebDataset.follow, BlockShuffleSampler): where a batch
falls in the order and which batches a worker gets next, the same samples as without reading ahead (through
DataLoader workers, under 503s and cut connections), errors raised only by the batch that holds the failing
sample, and guesses that miss dropped without harm."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from emustore import Knobs, StoreProcess
from tests.conftest import queued_in, wait_until
from tests.data.test_indexed import PER_SHARD, RETRY, _plain, _write
from wds_async.data.readahead import Ahead


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], wds.ShardIndex, list[Any]]]:
    root = tmp_path_factory.mktemp("readahead")
    _write(root)
    with StoreProcess(root, Knobs(seed=4)) as store:
        urls = [store.base_url + p.name for p in sorted(root.glob("shard-*.tar"))]
        yield urls, wds.build_index(urls), [_plain(s) for s in wds.WebDataset(urls)]


def _batches(order: list[int], size: int) -> list[list[int]]:
    return [order[lo:lo + size] for lo in range(0, len(order), size)]


def test_a_batch_is_placed_in_the_order_and_a_worker_s_next_batches_are_named() -> None:
    sampler = wds.BlockShuffleSampler(100, block_size=1, seed=3)
    order = list(sampler)
    ahead = Ahead(sampler, workers=2, depth=2)
    batches = _batches(order, 8)
    assert ahead.place(batches[3]) == (0, 24)
    assert ahead.upcoming((0, 24), 8) == [((0, 40), batches[5]), ((0, 56), batches[7])]  # this worker's: every second batch
    assert ahead.place(batches[5]) == (0, 40)
    assert ahead.upcoming((0, 88), 8) == []  # past the end: nothing to guess
    assert ahead.place([order[0], order[2]]) is None  # not a run of the order: no guess
    assert ahead.place(batches[12]) == (0, 96)  # the short last batch


def test_a_persistent_worker_finds_the_next_epochs_order() -> None:
    sampler = wds.BlockShuffleSampler(60, block_size=4, seed=1)
    ahead = Ahead(sampler, workers=1, depth=1)  # the worker's copy stays at epoch 0
    moved = wds.BlockShuffleSampler(60, block_size=4, seed=1)
    moved.set_epoch(1)  # the main process moved on
    batch = _batches(list(moved), 10)[2]
    assert list(wds.BlockShuffleSampler(60, block_size=4, seed=1))[20:30] != batch
    assert ahead.place(batch) == (1, 20)
    assert ahead.upcoming((1, 20), 10) == [((1, 30), list(moved)[30:40])]


def test_a_persistent_worker_moves_on_epoch_by_epoch_holding_two_orders_at_most() -> None:
    sampler = wds.BlockShuffleSampler(50, block_size=1, seed=4)
    ahead = Ahead(sampler, workers=1, depth=1)  # its copy of the sampler stays at epoch 0
    for epoch in range(4):
        moved = wds.BlockShuffleSampler(50, block_size=1, seed=4)
        moved.set_epoch(epoch)
        assert ahead.place(list(moved)[10:20]) == (epoch, 10)
        assert ahead.place([49, 48, 47]) is None or ahead.epoch == epoch  # a miss looks in this epoch and the next
        assert len(ahead._orders) <= 2


def test_ranks_follow_their_own_share() -> None:
    shares = [wds.BlockShuffleSampler(90, block_size=1, seed=2, num_replicas=3, rank=r) for r in range(3)]
    for sampler in shares:
        mine = list(sampler)
        ahead = Ahead(sampler, workers=1, depth=1)
        assert ahead.place(mine[10:20]) == (0, 10) and ahead.upcoming((0, 10), 10) == [((0, 20), mine[20:30])]


def test_getitems_reads_the_next_batches_ahead_and_returns_the_same_samples(served: Any) -> None:
    urls, index, streamed = served
    ds = wds.IndexedWebDataset(urls, index=index, readahead=2)
    sampler = wds.BlockShuffleSampler(ds, block_size=1, seed=7)
    assert ds._order is sampler
    batches = _batches(list(sampler), 16)
    got = ds.__getitems__(batches[0])
    proc = ds._proc
    assert proc is not None and sorted(proc.pending) == [(0, 16), (0, 32)]  # one process: the next two batches
    got += ds.__getitems__(batches[1])
    assert sorted(proc.pending) == [(0, 32), (0, 48)]
    for batch in batches[2:]:
        got += ds.__getitems__(batch)
    assert not proc.pending
    assert [_plain(s) for s in got] == [streamed[i] for b in batches for i in b]


def test_a_new_epoch_never_takes_the_last_epoch_s_guesses(served: Any) -> None:
    urls, index, streamed = served
    ds = wds.IndexedWebDataset(urls, index=index)
    sampler = wds.BlockShuffleSampler(ds, block_size=1, seed=7)
    ds.__getitems__(_batches(list(sampler), 16)[0])  # epoch 0: positions 16 and 32 read ahead
    sampler.set_epoch(1)
    second = _batches(list(sampler), 16)[1]  # epoch 1's batch at position 16: other indices
    assert [_plain(s) for s in ds.__getitems__(second)] == [streamed[i] for i in second]
    assert ds._proc is not None and sorted(ds._proc.pending) == [(1, 32), (1, 48)]


def test_iterating_in_index_order_reads_nothing_ahead(served: Any) -> None:
    urls, index, streamed = served
    ds = wds.IndexedWebDataset(urls, index=index)
    wds.BlockShuffleSampler(ds, block_size=1, seed=7)
    assert [_plain(s) for s in ds] == streamed
    assert ds._proc is not None and ds._proc.ahead is None and not ds._proc.pending


def test_a_batch_off_the_order_drops_the_guesses_and_is_served(served: Any) -> None:
    urls, index, streamed = served
    ds = wds.IndexedWebDataset(urls, index=index)
    sampler = wds.BlockShuffleSampler(ds, block_size=1, seed=7)
    batches = _batches(list(sampler), 16)
    ds.__getitems__(batches[0])
    proc = ds._proc
    assert proc is not None and proc.pending
    other = [5, 3, 200, 7]
    assert [_plain(s) for s in ds.__getitems__(other)] == [streamed[i] for i in other]
    assert not proc.pending and not proc.requests._found  # nothing kept for the dropped guesses
    assert [_plain(s) for s in ds.__getitems__(batches[1])] == [streamed[i] for i in batches[1]]


def test_under_503s_and_cut_connections(served: Any) -> None:
    urls, index, streamed = served
    faulty = [u + "?fail_rate=0.3&drop_rate=0.3" for u in urls]
    ds = wds.IndexedWebDataset(faulty, index=index, retry=RETRY, readahead=3)
    sampler = wds.BlockShuffleSampler(ds, block_size=2, seed=11)
    got = [s for batch in _batches(list(sampler), 20) for s in ds.__getitems__(batch)]
    assert [_plain(s, ("__url__",)) for s in got] == [_plain(streamed[i], ("__url__",)) for i in sampler]
    assert ds.stats()["retries"] > 0


def test_an_error_is_raised_by_the_batch_that_holds_the_sample_not_by_the_one_before(tmp_path: Path) -> None:
    _write(tmp_path)
    with StoreProcess(tmp_path, Knobs()) as store:
        urls = [store.base_url + p.name for p in sorted(tmp_path.glob("shard-*.tar"))]
        ds = wds.IndexedWebDataset(urls, index=wds.build_index(urls), readahead=1)
        sampler = wds.BlockShuffleSampler(ds, shuffle=False)  # index order: batch k is shard k
        batches = _batches(list(sampler), PER_SHARD)
        other = tmp_path / "other"
        other.mkdir()
        _write(other, seed=9)
        os.replace(other / "shard-000001.tar", tmp_path / "shard-000001.tar")  # shard 1 changes after the index
        first = ds.__getitems__(batches[0])  # reads batch 1 (shard 1) ahead: its failure is not this batch's
        assert [s["__key__"] for s in first] == [f"s0_{i:05d}" for i in range(PER_SHARD)]
        with pytest.raises(wds.ObjectChanged) as caught:
            ds.__getitems__(batches[1])
        assert "shard-000001.tar" in str(caught.value) or "shard-000001.tar" in (caught.value.url or "")
        assert [s["__key__"] for s in ds.__getitems__(batches[2])][:2] == ["s0_00080", "s0_00081"]


def _until_an_error_is_queued(ds: wds.IndexedWebDataset, timeout: float = 20.0) -> None:
    """Wait until the engine of this process has put an error in its channel."""
    bridge = ds._proc.requests._bridge if ds._proc is not None else None
    assert bridge is not None and bridge.channel is not None
    channel = bridge.channel
    if not wait_until(lambda: any(isinstance(item, BaseException) for item, _ in queued_in(channel)), timeout):
        raise AssertionError(f"no error reached the channel within {timeout} s")


def test_a_dropped_guess_that_fails_is_not_raised_by_the_batch_after_it(tmp_path: Path) -> None:
    _write(tmp_path)
    with StoreProcess(tmp_path, Knobs()) as store:
        # Shard 1 answers 0.5 s late, so the guess that reads it fails after batch 0 has returned.
        urls = [store.url(p.name, **({"ttfb": 0.5} if p.name == "shard-000001.tar" else {}))
                for p in sorted(tmp_path.glob("shard-*.tar"))]
        ds = wds.IndexedWebDataset(urls, index=wds.build_index(urls), readahead=1)
        sampler = wds.BlockShuffleSampler(ds, shuffle=False)
        other = tmp_path / "other"
        other.mkdir()
        _write(other, seed=9)
        os.replace(other / "shard-000001.tar", tmp_path / "shard-000001.tar")
        ds.__getitems__(_batches(list(sampler), PER_SHARD)[0])  # guesses batch 1: shard 1, which fails
        _until_an_error_is_queued(ds)  # the guess's failure waits in the channel, ahead of the next batch's reads
        off = list(range(3 * PER_SHARD - 1, 2 * PER_SHARD - 1, -1))  # shard 2 backwards: off the order
        assert [s["__key__"] for s in ds.__getitems__(off)] == [f"s0_{i:05d}" for i in off]


@pytest.mark.parametrize("workers,persistent", [(1, False), (2, False), (2, True)])
def test_dataloader_workers_read_ahead_every_sample_once_in_order(served: Any, workers: int,
                                                                  persistent: bool) -> None:
    pytest.importorskip("torch")
    from torch.utils.data import DataLoader

    urls, index, streamed = served
    ds = wds.IndexedWebDataset(urls, index=index)
    sampler = wds.BlockShuffleSampler(ds, block_size=1, seed=5)
    loader = DataLoader(ds, batch_size=12, sampler=sampler, num_workers=workers, collate_fn=list,
                        persistent_workers=persistent)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        seen = [_plain(s) for batch in loader for s in batch]
        assert seen == [streamed[i] for i in sampler]  # the DataLoader's order, every sample once


@pytest.mark.parametrize("readahead,follow", [(2, True), (3, True), (2, False)])
def test_the_engine_starts_at_what_the_first_batch_puts_in_flight(served: Any, readahead: int, follow: bool) -> None:
    urls, index, _ = served
    ds = wds.IndexedWebDataset(urls, index=index, readahead=readahead, node_connections=1024)
    sampler = wds.BlockShuffleSampler(ds, block_size=1, seed=2) if follow else None
    order = list(sampler) if sampler is not None else list(range(len(ds)))
    ds.__getitems__(order[:70])  # more than START_CONNECTIONS (64) in one batch
    expected = 70 * (1 + readahead) if follow else 70  # the batch and the ones read ahead with it
    assert ds._proc is not None and ds._proc.requests.spec.config.start_connections == expected


def test_a_chosen_config_keeps_its_start(served: Any) -> None:
    urls, index, _ = served
    ds = wds.IndexedWebDataset(urls, index=index, config=wds.EngineConfig(start_connections=5))
    wds.BlockShuffleSampler(ds, block_size=1, seed=2)
    ds.__getitems__(list(range(70)))
    assert ds._proc is not None and ds._proc.requests.spec.config.start_connections == 5
