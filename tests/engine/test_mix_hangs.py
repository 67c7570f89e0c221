"""Mixes on the emulated store that once hung for good, each read to its end with every sample exactly once.

Each test is one way the shared engine of a mix stopped making progress: the budget's overdraft kept by a route the
consumer had left, the http pool capped at ``max_connections`` and held whole by readers waiting for room, and a
source's next item queued for a token behind the helpers of ranged parts. A pass runs in a thread with a 60 s guard,
so a hang fails with the count of samples reached. The routed channel and the shared engine themselves are tested
in ``test_shared.py``; a wider draw of settings in ``test_matrix.py``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.conftest import sample_digest


def _local_digests(root: Path) -> list[tuple[int, str]]:
    """The digest of every sample of the shards under ``root`` (``s*/shard-*.tar``), sorted."""
    local = wds.WebDataset(sorted(str(p) for p in root.glob("s*/shard-*.tar")), nodesplitter=None, workersplitter=None)
    return sorted(sample_digest([{k: v for k, v in s.items() if k != "__local_path__"}]) for s in local)


def _every_sample_once(mix: Any, expected: list[tuple[int, str]], label: str = "the mix", *,
                       pause: bool = False) -> None:
    """Iterate ``mix`` in a thread that must end within 60 s, with ``expected`` (sorted digests) exactly;
    ``pause``: 0.5 ms after every third sample."""
    got: list[tuple[int, str]] = []

    def consume() -> None:
        for n, sample in enumerate(mix):
            got.append(sample_digest([sample]))
            if pause and n % 3 == 0:
                time.sleep(0.0005)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), f"{label} hung after {len(got)} of {len(expected)} samples"
    assert sorted(got) == expected


def test_a_mix_of_twenty_sources_under_a_tight_budget_delivers_every_sample(tmp_path: Path) -> None:
    """Twenty sources of two 1 MiB shards under an 8 MiB budget, on a store with 50 ms to first byte and 20 MB/s
    per connection: the overdraft taken for one route and kept after the consumer moved to another hung this
    mix for good (seed 5, in each of four runs; seeds 0-4 passed)."""
    weights = [0.3 * (0.005 / 0.3) ** (i / 19) for i in range(20)]
    for k in range(20):
        make_shards(tmp_path / f"s{k}", n_shards=2, shard_bytes=1 << 20, sample_bytes=100 << 10, seed=60 + k)
    expected = _local_digests(tmp_path)
    with StoreProcess(tmp_path, Knobs(seed=3, ttfb=0.05, bw=20e6)) as store:
        urls = [store.base_url + f"s{k}/shard-{{000000..000001}}.tar" for k in range(20)]
        for seed in (5, 1):
            mix = wds.RandomMix([wds.WebDataset(url, max_buffered_bytes=8 << 20, nodesplitter=None,
                                                workersplitter=None) for url in urls], weights, seed=seed, longest=True)
            # a consumer a little slower than the store: the budget fills
            _every_sample_once(mix, expected, f"the mix (seed {seed})", pause=True)


@pytest.mark.parametrize("connections", [1, 2])
@pytest.mark.parametrize("kind", ["round-robin", "random"])
def test_a_mix_with_fixed_connections_under_a_small_budget_delivers_every_sample(
        tmp_path: Path, kind: str, connections: int) -> None:
    """A route's reader waiting for room gives its token back and keeps its stream, so a mix can hold more streams
    open than ``max_connections``. With the http pool capped at ``max_connections``, readers the consumer did not wait
    for held every connection while the one it waited for, token in hand, queued for a connection for good (both
    kinds of mix, both settings, on the first pass)."""
    for k in range(2):
        make_shards(tmp_path / f"s{k}", n_shards=6, shard_bytes=96 << 10, sample_bytes=4 << 10, seed=100 + k)
    expected = _local_digests(tmp_path)
    with StoreProcess(tmp_path, Knobs(seed=3, ttfb=0.005)) as store:
        sources = [wds.WebDataset(store.base_url + f"s{k}/shard-{{000000..000005}}.tar", max_buffered_bytes=256 << 10,
                                  max_connections=connections, nodesplitter=None, workersplitter=None)
                   for k in range(2)]
        mix = (wds.RoundRobin(sources, longest=True) if kind == "round-robin" else
               wds.RandomMix(sources, seed=0, longest=True))
        _every_sample_once(mix, expected)


def test_a_mixs_next_item_takes_a_token_over_the_limit_when_the_consumer_starves_for_it(tmp_path: Path) -> None:
    """One token, five sources, shards of 1 MiB read as ranged parts of 128 KiB under a 256 KiB budget: the helpers
    reading parts ahead of their parser keep their token while they wait for room, and a source's next item, queued
    for a token behind them, was the one the consumer waited for: the mix hung after 13 of 66 samples. Now that item
    takes a token over the limit once the consumer starves for it."""
    shape = {"big": (3, 1 << 20, 300 << 10), "mid": (4, 400 << 10, 40 << 10), "one": (1, 64 << 10, 8 << 10)}
    groups = ["big", "mid", "big", "big", "one"]
    for i, group in enumerate(groups):
        n, shard_bytes, sample_bytes = shape[group]
        make_shards(tmp_path / f"s{i}", n_shards=n, shard_bytes=shard_bytes, sample_bytes=sample_bytes, seed=100 + i)
    expected = _local_digests(tmp_path)
    with StoreProcess(tmp_path, Knobs(seed=1)) as store:
        sources = [wds.WebDataset(store.base_url + f"s{i}/shard-{{000000..{shape[g][0] - 1:06d}}}.tar",
                                  max_buffered_bytes=256 << 10, max_connections=1, part_bytes=128 << 10,
                                  nodesplitter=None, workersplitter=None) for i, g in enumerate(groups)]
        mix = wds.RandomMix(sources, [0.5 ** i for i in range(5)], seed=455, longest=True)
        _every_sample_once(mix, expected)
