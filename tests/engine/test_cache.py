"""The shard cache against the emulated store (a real aiohttp server on 127.0.0.1): filled while streaming,
read from disk afterwards, refetched when the object changed, never trusting a partial file, LRU by bytes, right
with ranged parts, resume and index shares; ``make_cache``'s options, local and ``pipe:`` shards never cached, and
``wds-async cache ls/du/clear``.

Processes sharing the cache, killed and stalled fillers and a full disk: test_cache_processes.py; a damaged copy
dropped for the store: test_cache_damaged.py; hostile and read-only directories: test_cache_security.py. The store
(the ``served`` fixture) is in conftest.py, the helpers these modules share in cache_common.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

import wds_async as wds
from emustore import StoreProcess
from tests.conftest import sample_digest
from tests.engine.cache_common import N, read_epoch, shard_urls
from wds_async.cache.disk import ShardCache, make_cache


def _copies(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.endswith(".json"))


def test_epoch_two_reads_the_copies(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, _ = served
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    plain, _ = read_epoch(urls, None)
    first, s1 = read_epoch(urls, cache)
    assert first == plain
    assert (s1["cache_fills"], s1["cache_hits"]) == (N, 0)
    assert len(_copies(cache)) == N
    assert not [p for p in cache.iterdir() if p.name.endswith(".part")]
    second, s2 = read_epoch(urls, cache)
    assert second == plain
    assert (s2["cache_fills"], s2["cache_hits"]) == (0, N)
    # the copies are byte for byte the objects
    for entry in ShardCache(cache).entries():
        name = entry.url.rsplit("/", 1)[-1]
        assert (cache / entry.name).read_bytes() == (served[1] / name).read_bytes()


def test_without_validation_no_request_reaches_the_store(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, _root = served
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    expected, _ = read_epoch(urls, cache)
    server.close()  # the store is gone: the copies alone must serve the epoch
    again, stats = read_epoch(urls, cache, cache_validate=False)
    assert again == expected
    assert stats["cache_hits"] == N and stats["requests"] == N  # the copies' reads, no store request


def test_a_changed_object_is_refetched(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, root = served
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    read_epoch(urls, cache)
    # rewrite shard 1 in the store with other content (a different size and ETag)
    shutil.copy(root / "shard-000002.tar", root / "shard-000001.tar.new")
    os.replace(root / "shard-000001.tar.new", root / "shard-000001.tar")
    expected, _ = read_epoch(urls, None)
    got, stats = read_epoch(urls, cache)
    assert got == expected
    assert stats["cache_hits"] == N - 1 and stats["cache_fills"] == 1
    copy = next(e for e in ShardCache(cache).entries() if e.url.endswith("shard-000001.tar"))
    assert (cache / copy.name).read_bytes() == (root / "shard-000001.tar").read_bytes()


def test_partial_and_uncommitted_files_are_never_trusted(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, _root = served
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    expected, _ = read_epoch(urls, cache)
    sc = ShardCache(cache)
    # a crash mid-fill leaves NAME.part; a crash between data rename and metadata leaves data alone
    name0 = os.path.basename(sc.path(urls[0]))
    name1 = os.path.basename(sc.path(urls[1]))
    os.replace(cache / name0, cache / (name0 + ".part"))
    (cache / (name0 + ".json")).unlink()
    (cache / (name1 + ".json")).unlink()
    # and a copy cut short with its metadata in place
    name2 = os.path.basename(sc.path(urls[2]))
    with open(cache / name2, "r+b") as fh:
        fh.truncate(1000)
    got, stats = read_epoch(urls, cache, cache_validate=False)
    assert got == expected
    assert stats["cache_hits"] == 1 and stats["cache_fills"] == 3


def test_lru_eviction_by_bytes(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, root = served
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    size = (root / "shard-000000.tar").stat().st_size
    budget = int(2.5 * size)
    _expected, stats = read_epoch(urls, cache, cache_size=budget, max_connections=1)  # shards committed in order
    assert stats["cache_fills"] == N
    sc = ShardCache(cache, budget)
    assert sc.usage()["bytes"] <= budget and len(sc.entries()) == 2
    kept = {e.url for e in sc.entries()}
    assert kept == set(urls[-2:])  # the two most recently used
    # a hit refreshes: read shard 2 again, then fill shard 0; shard 3 is now the oldest and goes
    read_epoch([urls[2]], cache, cache_size=budget)
    read_epoch([urls[0]], cache, cache_size=budget)
    assert {e.url for e in sc.entries()} == {urls[2], urls[0]}
    # a shard larger than the whole cache is streamed, not cached
    got, stats = read_epoch(urls[:1], tmp_path / "tiny", cache_size=size // 2)
    assert stats["cache_fills"] == 0 and got[0] > 0


def test_ranged_parts_fill_the_cache(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, root = served
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    expected, _ = read_epoch(urls, None)
    got, stats = read_epoch(urls, cache, part_bytes=32 << 10)
    assert got == expected and stats["parts"] > 0 and stats["cache_fills"] == N
    for url in urls:
        name = url.rsplit("/", 1)[-1]
        assert Path(ShardCache(cache).path(url)).read_bytes() == (root / name).read_bytes()


def test_resume_and_index_shares_read_ranges_of_the_copies(served: tuple[StoreProcess, Path],
                                                           tmp_path: Path) -> None:
    server, _root = served
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    index_path = tmp_path / "index.json"
    wds.build_index(urls).save(index_path)
    plain = wds.WebDataset(urls, index=str(index_path), deterministic=True)
    expected = sample_digest(plain)
    read_epoch(urls, cache)  # fill
    ds = wds.WebDataset(urls, index=str(index_path), deterministic=True, cache_dir=cache)
    assert sample_digest(ds) == expected
    # resume mid-epoch from a checkpoint: the rest comes from the copies
    ds = wds.WebDataset(urls, deterministic=True, cache_dir=cache)
    it = iter(ds)
    head = [next(it) for _ in range(7)]
    state = ds.state_dict()
    del it
    ds2 = wds.WebDataset(urls, deterministic=True, cache_dir=cache)
    ds2.load_state_dict(state)
    rest = list(ds2)
    assert sample_digest(head + rest) == sample_digest(wds.WebDataset(urls, deterministic=True))
    assert ds2.stats()["cache_hits"] >= 1


def test_make_cache_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert make_cache(None, None) is None
    monkeypatch.setenv("WDS_ASYNC_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("WDS_ASYNC_CACHE_SIZE", "2MiB")
    cache = make_cache(None, None)
    assert cache is not None and cache.max_bytes == 2 << 20 and cache.directory == str(tmp_path / "c")
    assert make_cache(tmp_path, "-1").max_bytes is None  # type: ignore[union-attr]
    assert make_cache(tmp_path, 0) is None
    assert make_cache(tmp_path, "1GB").max_bytes == 10**9  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="cache_size"):
        make_cache(tmp_path, "lots")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="not a directory"):
        make_cache(tmp_path / "file", None)


def test_local_and_pipe_shards_are_not_cached(shard_dir: Path, tmp_path: Path) -> None:
    urls = [str(shard_dir / "shard-000000.tar"), f"pipe:cat {shard_dir / 'shard-000001.tar'}"]
    cache = tmp_path / "cache"
    _, stats = read_epoch(urls, cache)
    assert (stats["cache_fills"] == 0 and not cache.exists()) or not any(cache.iterdir())



def test_cli_cache_ls_du_clear(served: tuple[StoreProcess, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    from wds_async.cli.main import main

    server, root = served
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    read_epoch(urls, cache)
    (cache / "deadbeefdeadbeef.stale.tar.part").write_bytes(b"x" * 100)  # a crash's leftover, no lock held
    assert main(["cache", "ls", str(cache)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == N and {line.split()[-1] for line in lines} == set(urls)
    assert main(["cache", "ls", "--json", str(cache)]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    sizes = {r["url"]: r["bytes"] for r in rows}
    assert sizes == {u: (root / u.rsplit("/", 1)[-1]).stat().st_size for u in urls}
    assert main(["cache", "du", "--json", str(cache)]) == 0
    usage = json.loads(capsys.readouterr().out)
    assert usage["copies"] == N and usage["bytes"] == sum(sizes.values()) and usage["partial_files"] == 1
    assert main(["cache", "clear", str(cache)]) == 0
    assert "removed" in capsys.readouterr().out
    assert ShardCache(cache).usage() == {"copies": 0, "bytes": 0, "partial_files": 0, "partial_bytes": 0}
    assert main(["cache", "du", str(tmp_path / "nope")]) == 2
    assert "no such cache directory" in capsys.readouterr().err
