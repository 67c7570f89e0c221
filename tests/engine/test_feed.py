"""The engine's item feed: items submitted while the engine runs are read, an open feed keeps the engine alive
between batches, a closed one ends it, and an item's error reaches the caller without killing later fetches."""

from __future__ import annotations

from pathlib import Path

import pytest

import wds_async as wds
from tests.data.test_indexed import _write
from wds_async.engine.bridge import Bridge
from wds_async.engine.feed import ItemFeed
from wds_async.engine.fetcher import Requests
from wds_async.engine.spec import StreamSpec
from wds_async.engine.work import ItemDone, WorkItem
from wds_async.stats import Stats


@pytest.fixture()
def shards(tmp_path: Path) -> tuple[list[str], wds.ShardIndex]:
    _write(tmp_path, n_shards=2, per_shard=10)
    urls = [str(p) for p in sorted(tmp_path.glob("shard-*.tar"))]
    return urls, wds.ShardIndex.load(tmp_path / "index.jsonl")


def test_a_feed_submitted_before_start_and_closed_ends_the_engine(shards: tuple[list[str], wds.ShardIndex]) -> None:
    urls, _ = shards
    feed = ItemFeed()
    feed.submit([WorkItem(id=1, shard=0, url=urls[0]), WorkItem(id=2, shard=1, url=urls[1])])  # before bind
    bridge = Bridge(feed, StreamSpec(wds.EngineConfig(deterministic=True)), Stats())
    bridge.start()
    try:
        got = []
        for batch in bridge.batches():
            got += batch
            if ItemDone(2) in got:
                feed.close()  # the engine finishes once the feed is closed and drained
        assert [x.id for x in got if isinstance(x, ItemDone)] == [1, 2]
        assert len([x for x in got if not isinstance(x, ItemDone)]) == 20
    finally:
        bridge.close()
    with pytest.raises(wds.EngineError, match="closed item feed"):
        feed.submit([WorkItem(id=3, shard=0, url=urls[0])])


def test_requests_answer_batch_after_batch_on_one_engine(shards: tuple[list[str], wds.ShardIndex]) -> None:
    urls, index = shards
    entry = index.shards[1]
    requests = Requests(StreamSpec(wds.EngineConfig(deterministic=False)))
    try:
        first = requests.fetch([WorkItem(id=1, shard=0, url=urls[0]),
                                WorkItem(id=2, shard=1, url=urls[1], start=entry.offsets[3], end=entry.ends[5])])
        bridge = requests._bridge
        assert [len(first[1]), [s["__key__"] for s in first[2]]] == [10, list(entry.keys[3:6])]
        second = requests.fetch([WorkItem(id=3, shard=1, url=urls[1], start=entry.offsets[9], end=entry.ends[9])])
        assert [s["__key__"] for s in second[3]] == [entry.keys[9]] and requests._bridge is bridge
        with pytest.raises(wds.NotFound):
            requests.fetch([WorkItem(id=4, shard=0, url=urls[0] + ".missing")])
        assert requests._bridge is None  # closed; the next fetch starts a fresh engine
        assert len(requests.fetch([WorkItem(id=5, shard=0, url=urls[0])])[5]) == 10
        with pytest.raises(ValueError, match="distinct ids"):
            requests.fetch([WorkItem(id=6, shard=0, url=urls[0])] * 2)
    finally:
        requests.close()
