"""The engine starts its readers a few per turn of the loop (``START_AT_ONCE``), so the first readers' connections
complete, and their requests go out, while the rest are still being set up: with every reader set up in one turn,
no connection completed before the last reader had started, which put the setup of all of them (tens of ms for
the 128-192 requests of a random-access batch and its read-ahead) before the first request."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import wds_async as wds
from emustore import Knobs, StoreProcess
from wds_async.backends._h1 import H1Pool
from wds_async.engine.engine import START_AT_ONCE, Engine

SHARDS = 64


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    root = tmp_path_factory.mktemp("start")
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=2, verbose=0) as out:
        for i in range(2 * SHARDS):
            out.write({"__key__": f"k{i:04d}", "bin": b"%d" % i})
    with StoreProcess(root, Knobs()) as store:
        yield [store.base_url + p.name for p in sorted(root.glob("shard-*.tar"))]


def test_first_connections_complete_before_the_last_reader_starts(urls: list[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    assert SHARDS > 4 * START_AT_ONCE
    started: list[int] = []
    at_connect: list[int] = []
    reader, connect = Engine._reader, H1Pool._connect

    async def counted_reader(self: Engine, items: Any) -> None:
        started.append(1)
        await reader(self, items)

    async def recorded_connect(self: H1Pool, key: Any) -> Any:
        wire = await connect(self, key)
        at_connect.append(len(started))
        return wire

    monkeypatch.setattr(Engine, "_reader", counted_reader)
    monkeypatch.setattr(H1Pool, "_connect", recorded_connect)
    ds = wds.WebDataset(urls, max_connections=SHARDS, nodesplitter=None, workersplitter=None)
    keys = [s["__key__"] for s in ds]
    assert keys == [f"k{i:04d}" for i in range(2 * SHARDS)]  # every sample, in order
    assert len(started) == SHARDS
    # Connections completed while readers were still starting (every one of them, before the change).
    assert at_connect[0] < SHARDS, at_connect[:8]
