"""The autotuner inside the engine, against the emulated store: it backs off a store that rejects above N
concurrent requests (with the default retry policy, nothing is lost), reports why, and a fixed int still
fixes the concurrency."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess

MiB = 1 << 20
TOTAL = 592  # samples in the 40 shards make_shards writes with seed 41 (checked from local files below)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tune")
    paths = make_shards(root, n_shards=40, shard_bytes=MiB, sample_bytes=64 << 10, seed=41)
    assert sum(1 for _ in wds.WebDataset([str(p) for p in paths], nodesplitter=None, workersplitter=None)) == TOTAL
    return root


def _urls(store: StoreProcess) -> list[str]:
    return [store.base_url + f"shard-{i:06d}.tar" for i in range(40)]


def test_a_throttling_store_is_backed_off_and_every_sample_arrives_once(shards: Path) -> None:
    with StoreProcess(shards, Knobs(bw=4e6, max_concurrent=6)) as store:
        ds = wds.WebDataset(_urls(store), nodesplitter=None, workersplitter=None)  # auto, default retries
        seen = Counter((s["__url__"], s["__key__"]) for s in ds)
        server = store.stats()
    assert len(seen) == TOTAL and set(seen.values()) == {1}
    stats = ds.stats()
    assert stats["throttled"] > 0 and server["throttled"] == stats["throttled"]
    assert stats["concurrency"] <= 8, stats  # near what the store accepts, far below the start of 32
    # the node share (256) lowered to what half of the default 256 MiB budget holds in stream allowances
    assert stats["concurrency_cap"] == (256 * MiB) // (2 * (640 << 10)) == 204


def test_stats_say_what_the_concurrency_is_and_why(shards: Path) -> None:
    with StoreProcess(shards, Knobs(ttfb=0.02, bw=20e6)) as store:
        auto = wds.WebDataset(_urls(store), nodesplitter=None, workersplitter=None)
        assert sum(1 for _ in auto) == TOTAL
        fixed = wds.WebDataset(_urls(store), max_connections=5, nodesplitter=None, workersplitter=None)
        assert sum(1 for _ in fixed) == TOTAL
    s = auto.stats()
    assert 2 <= s["concurrency"] <= 256 and s["concurrency_reason"] and s["requests"] >= 40
    assert s["ttfb_ms"] is not None and s["ttfb_ms"] >= 15
    f = fixed.stats()
    assert f["concurrency"] == 5 and f["concurrency_reason"] == "fixed: max_connections=5"


def test_the_next_epoch_starts_where_the_tuner_settled(shards: Path) -> None:
    with StoreProcess(shards, Knobs(bw=4e6, max_concurrent=6)) as store:
        ds = wds.WebDataset(_urls(store), nodesplitter=None, workersplitter=None)
        assert sum(1 for _ in ds) == TOTAL
        settled = ds.stats()["concurrency"]
        throttled_first = ds.stats()["throttled"]
        assert sum(1 for _ in ds) == TOTAL
    assert settled < 32
    # it starts at ``settled``, not at 32: far fewer rejections than the first epoch's start
    assert ds.stats()["throttled"] < throttled_first


def test_max_connections_accepts_auto_or_a_positive_int() -> None:
    assert wds.EngineConfig().autotune and wds.EngineConfig(max_connections="auto").autotune
    assert not wds.EngineConfig(max_connections=8).autotune
    for bad in (0, -1, "fast", 2.5, True):
        with pytest.raises(ValueError, match="max_connections"):
            wds.EngineConfig(max_connections=bad)  # type: ignore[arg-type]


def test_a_slow_consumer_makes_it_give_connections_back(shards: Path) -> None:
    import time

    with StoreProcess(shards, Knobs(ttfb=0.01)) as store:
        ds = wds.WebDataset(_urls(store), max_buffered_bytes=32 * MiB, nodesplitter=None, workersplitter=None)
        it = iter(ds)
        for _ in range(120):  # ~3 s at 40 ms a sample: training is the bottleneck, not the store
            next(it)
            time.sleep(0.025)
        stats = ds.stats()
        del it
    # it starts at 25 (what 32 MiB holds in stream allowances) and gives back 20% an interval
    assert stats["concurrency"] <= 10 and "consumer" in stats["concurrency_reason"], stats
