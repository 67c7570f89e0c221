"""Small known ranges (a random-access read: one per sample or run of samples) are read whole and parsed in one
go (``AT_ONCE_BYTES``): the same samples as streaming, through retries, with nothing left in the byte budget
after a success or a failure; larger ranges still stream."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest

import wds_async as wds
from emustore import Knobs, StoreProcess
from wds_async.engine.fetcher import Requests
from wds_async.engine.itemread import AT_ONCE_BYTES
from wds_async.engine.spec import StreamSpec
from wds_async.engine.work import WorkItem

RETRY = wds.RetryPolicy(attempts=60, base_delay=0.0, max_delay=0.005)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[str], wds.ShardIndex]]:
    root = tmp_path_factory.mktemp("at_once")
    rng = random.Random(5)
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=30, index=str(root / "index.jsonl"),
                         verbose=0) as out:
        for i in range(60):  # samples of 1 byte to 100 KiB: several socket reads each, up to 3 a range
            out.write({"__key__": f"k{i:03d}", "bin": rng.randbytes(rng.randrange(1, 100_000)), "cls": b"%d" % i})
    with StoreProcess(root, Knobs(seed=1)) as store:
        urls = [store.base_url + p.name for p in sorted(root.glob("shard-*.tar"))]
        yield urls, wds.build_index(urls)


def _items(urls: list[str], index: wds.ShardIndex, runs: list[tuple[int, int, int]], query: str = ""
           ) -> list[WorkItem]:
    """Work items for ``(shard, first, last)`` runs of samples, each one range."""
    items = []
    for k, (shard, first, last) in enumerate(runs, 1):
        entry = index.shards[shard]
        items.append(WorkItem(id=k, shard=shard, url=urls[shard] + query, start=entry.offsets[first],
                              end=entry.ends[last], compressed=False, expect=entry.identity()))
    return items


def _fetch(items: list[WorkItem], **config: Any) -> tuple[dict[int, list[Any]], wds.Stats]:
    requests = Requests(StreamSpec(wds.EngineConfig(retry=RETRY, **config)))
    try:
        got = requests.fetch(items)
        return got, requests.stats
    finally:
        requests.close()


def test_small_ranges_equal_the_streamed_samples_through_503s_and_cuts(served: Any) -> None:
    urls, index = served
    streamed = {s["__key__"]: s for s in wds.WebDataset(urls)}
    runs = [(0, j, j) for j in range(30)] + [(1, 0, 1), (1, 5, 7), (1, 29, 29)]
    items = _items(urls, index, runs, "?fail_rate=0.3&drop_rate=0.3")
    got, stats = _fetch(items)
    for item, (shard, first, last) in zip(items, runs):
        keys = list(index.shards[shard].keys[first:last + 1])
        assert [s["__key__"] for s in got[item.id]] == keys
        for sample in got[item.id]:
            assert sample["bin"] == streamed[sample["__key__"]]["bin"]
            assert sample["cls"] == streamed[sample["__key__"]]["cls"]
    assert stats.retries > 0 and stats.parts == 0
    assert stats.snapshot()["buffered_bytes"] == 0  # every byte counted while read is given back


def test_a_range_that_does_not_end_at_a_member_fails_naming_the_url_and_gives_its_bytes_back(served: Any) -> None:
    urls, index = served
    entry = index.shards[0]
    bad = WorkItem(id=1, shard=0, url=urls[0], start=entry.offsets[2], end=entry.ends[2] - 100, compressed=False,
                   expect=entry.identity())
    assert bad.end - bad.start <= AT_ONCE_BYTES
    requests = Requests(StreamSpec(wds.EngineConfig(retry=RETRY)))
    try:
        with pytest.raises(wds.ShardFormatError, match=r"shard-000000\.tar"):
            requests.fetch([bad])
        assert requests.stats.snapshot()["buffered_bytes"] == 0
    finally:
        requests.close()


def test_a_range_over_the_limit_is_streamed_in_chunks(served: Any) -> None:
    urls, index = served
    entry = index.shards[1]
    assert entry.ends[29] - entry.offsets[0] > AT_ONCE_BYTES
    got, stats = _fetch(_items(urls, index, [(1, 0, 29)]), part_bytes=0)
    assert [s["__key__"] for s in got[1]] == list(entry.keys)
    assert stats.snapshot()["buffered_bytes"] == 0
