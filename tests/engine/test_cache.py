"""The shard cache against the emulated store (a real aiohttp server on 127.0.0.1): filled while streaming,
read from disk afterwards, refetched when the object changed, never trusting a partial file, LRU by bytes,
shared by processes through a file lock, right with ranged parts, resume and index shares, and a damaged copy
dropped for the store. Hostile and read-only directories: test_cache_security.py."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.conftest import sample_digest
from wds_async.cache.disk import ShardCache, make_cache

N = 4


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[StoreProcess, Path]]:
    """A private store over its own folder, so a test may rewrite an object."""
    root = tmp_path / "store"
    make_shards(root, n_shards=N, shard_bytes=192 << 10, sample_bytes=6 << 10, seed=3)
    with StoreProcess(root, Knobs(seed=1)) as server:
        yield server, root


def _urls(server: StoreProcess) -> list[str]:
    return [server.base_url + f"shard-{i:06d}.tar" for i in range(N)]


def _read(urls: list[str], cache: Path | None, **kw: object) -> tuple[tuple[int, str], dict]:  # type: ignore[type-arg]
    ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True, **kw)  # type: ignore[arg-type]
    digest = sample_digest(ds)
    return digest, ds.stats()


def _copies(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.iterdir() if p.name.endswith(".json"))


def test_epoch_two_reads_the_copies(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, _ = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    plain, _ = _read(urls, None)
    first, s1 = _read(urls, cache)
    assert first == plain
    assert (s1["cache_fills"], s1["cache_hits"]) == (N, 0)
    assert len(_copies(cache)) == N
    assert not [p for p in cache.iterdir() if p.name.endswith(".part")]
    second, s2 = _read(urls, cache)
    assert second == plain
    assert (s2["cache_fills"], s2["cache_hits"]) == (0, N)
    # the copies are byte for byte the objects
    for entry in ShardCache(cache).entries():
        name = entry.url.rsplit("/", 1)[-1]
        assert (cache / entry.name).read_bytes() == (served[1] / name).read_bytes()


def test_without_validation_no_request_reaches_the_store(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, _root = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    expected, _ = _read(urls, cache)
    server.close()  # the store is gone: the copies alone must serve the epoch
    again, stats = _read(urls, cache, cache_validate=False)
    assert again == expected
    assert stats["cache_hits"] == N and stats["requests"] == N  # the copies' reads, no store request


def test_a_changed_object_is_refetched(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, root = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    _read(urls, cache)
    # rewrite shard 1 in the store with other content (a different size and ETag)
    shutil.copy(root / "shard-000002.tar", root / "shard-000001.tar.new")
    os.replace(root / "shard-000001.tar.new", root / "shard-000001.tar")
    expected, _ = _read(urls, None)
    got, stats = _read(urls, cache)
    assert got == expected
    assert stats["cache_hits"] == N - 1 and stats["cache_fills"] == 1
    copy = next(e for e in ShardCache(cache).entries() if e.url.endswith("shard-000001.tar"))
    assert (cache / copy.name).read_bytes() == (root / "shard-000001.tar").read_bytes()


def test_partial_and_uncommitted_files_are_never_trusted(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, _root = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    expected, _ = _read(urls, cache)
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
    got, stats = _read(urls, cache, cache_validate=False)
    assert got == expected
    assert stats["cache_hits"] == 1 and stats["cache_fills"] == 3


def test_lru_eviction_by_bytes(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, root = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    size = (root / "shard-000000.tar").stat().st_size
    budget = int(2.5 * size)
    _expected, stats = _read(urls, cache, cache_size=budget, max_connections=1)  # shards committed in order
    assert stats["cache_fills"] == N
    sc = ShardCache(cache, budget)
    assert sc.usage()["bytes"] <= budget and len(sc.entries()) == 2
    kept = {e.url for e in sc.entries()}
    assert kept == set(urls[-2:])  # the two most recently used
    # a hit refreshes: read shard 2 again, then fill shard 0; shard 3 is now the oldest and goes
    _read([urls[2]], cache, cache_size=budget)
    _read([urls[0]], cache, cache_size=budget)
    assert {e.url for e in sc.entries()} == {urls[2], urls[0]}
    # a shard larger than the whole cache is streamed, not cached
    got, stats = _read(urls[:1], tmp_path / "tiny", cache_size=size // 2)
    assert stats["cache_fills"] == 0 and got[0] > 0


def test_ranged_parts_fill_the_cache(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, root = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    expected, _ = _read(urls, None)
    got, stats = _read(urls, cache, part_bytes=32 << 10)
    assert got == expected and stats["parts"] > 0 and stats["cache_fills"] == N
    for url in urls:
        name = url.rsplit("/", 1)[-1]
        assert Path(ShardCache(cache).path(url)).read_bytes() == (root / name).read_bytes()


def test_resume_and_index_shares_read_ranges_of_the_copies(served: tuple[StoreProcess, Path],
                                                           tmp_path: Path) -> None:
    server, _root = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    index_path = tmp_path / "index.json"
    wds.build_index(urls).save(index_path)
    plain = wds.WebDataset(urls, index=str(index_path), deterministic=True)
    expected = sample_digest(plain)
    _read(urls, cache)  # fill
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


def _child(urls: list[str], cache: str, out: str) -> None:
    ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True)
    digest = sample_digest(ds)
    with open(out, "w") as fh:
        json.dump({"digest": list(digest), "stats": ds.stats()}, fh)


def test_processes_share_the_cache_and_download_each_shard_once(tmp_path: Path) -> None:
    root = tmp_path / "store"
    make_shards(root, n_shards=N, shard_bytes=192 << 10, sample_bytes=6 << 10, seed=3)
    # slow enough that the four processes overlap on every shard
    with StoreProcess(root, Knobs(seed=1, ttfb=0.05, bw=2e6)) as server:
        urls = _urls(server)
        cache = tmp_path / "cache"
        ctx = multiprocessing.get_context("spawn")
        outs = [str(tmp_path / f"out{i}.json") for i in range(4)]
        procs = [ctx.Process(target=_child, args=(urls, str(cache), out)) for out in outs]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
    results = [json.loads(Path(out).read_text()) for out in outs]
    assert len({tuple(r["digest"]) for r in results}) == 1
    fills = sum(r["stats"]["cache_fills"] for r in results)
    hits = sum(r["stats"]["cache_hits"] for r in results)
    assert fills == N and hits == 3 * N  # each shard downloaded once; the others waited and read the copy


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
    _, stats = _read(urls, cache)
    assert (stats["cache_fills"] == 0 and not cache.exists()) or not any(cache.iterdir())


def _crash_child(urls: list[str], cache: str) -> None:
    ds = wds.WebDataset(urls, cache_dir=cache, max_connections=1)
    for _ in ds:
        pass


def test_a_process_killed_mid_fill_leaves_nothing_trusted(tmp_path: Path) -> None:
    import signal
    import time

    root = tmp_path / "store"
    make_shards(root, n_shards=1, shard_bytes=3 << 20, sample_bytes=64 << 10, seed=4)
    with StoreProcess(root, Knobs(seed=1, bw=1e6)) as server:  # ~3 s for the shard; the fill writes 1 MiB at a time
        urls = [server.base_url + "shard-000000.tar"]
        cache = tmp_path / "cache"
        part = Path(ShardCache(cache).path(urls[0], ".part"))
        child = multiprocessing.get_context("spawn").Process(target=_crash_child, args=(urls, str(cache)))
        child.start()
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert part.exists(), "the child never started filling"
        os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join()
        assert part.exists() and not Path(ShardCache(cache).path(urls[0], ".json")).exists()
        assert ShardCache(cache).usage()["partial_files"] == 1
        # the lock died with the child: the next reader refills without waiting for a stall
        expected = sample_digest(wds.WebDataset(urls, deterministic=True))
        ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True, cache_validate=False)
        ds_cache = ds.cache
        assert ds_cache is not None
        ds_cache.stall_seconds = 3600
        assert sample_digest(ds) == expected
        assert ds.stats()["cache_fills"] == 1 and not part.exists()


def test_a_stalled_filler_is_bypassed(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    import fcntl

    server, _ = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    cache.mkdir()
    expected, _ = _read(urls, None)
    sc = ShardCache(cache)
    held = os.open(sc.path(urls[1], ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # "another process" holds shard 1 and makes no progress
    try:
        ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True)
        assert ds.cache is not None
        ds.cache.stall_seconds = 0.3
        assert sample_digest(ds) == expected
        assert ds.stats()["cache_fills"] == N - 1
    finally:
        os.close(held)
    assert {e.url for e in sc.entries()} == set(urls) - {urls[1]}


def _full_disk_child(urls: list[str], cache: str, out: str) -> None:
    import logging
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (100 << 10, 100 << 10))
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("wds_async").addHandler(handler)
    ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True)
    digest = sample_digest(ds)
    with open(out, "w") as fh:
        json.dump({"digest": list(digest), "fills": ds.stats()["cache_fills"], "log": records}, fh)


def test_a_full_disk_abandons_the_fill_not_the_shard(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    server, _ = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    expected, _ = _read(urls, None)
    out = tmp_path / "out.json"
    child = multiprocessing.get_context("spawn").Process(target=_full_disk_child, args=(urls, str(cache), str(out)))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    result = json.loads(out.read_text())
    assert tuple(result["digest"]) == expected and result["fills"] == 0
    assert any("not caching" in line and "shard-0000" in line for line in result["log"])
    assert not [p for p in cache.iterdir() if p.name.endswith((".part", ".json"))]


def test_cli_cache_ls_du_clear(served: tuple[StoreProcess, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    from wds_async.cli.main import main

    server, root = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    _read(urls, cache)
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


def test_dataloader_workers_share_one_cache(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    server, _ = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    plain = sorted(s["__key__"] for s in wds.WebDataset(urls))
    for epoch in range(2):
        ds = wds.WebDataset(urls, cache_dir=cache)
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        keys = sorted(s["__key__"] for s in loader)
        assert keys == plain
        stats = ds.stats()  # the workers' counters, summed
        assert (stats["cache_fills"], stats["cache_hits"]) == ((N, 0) if epoch == 0 else (0, N))


# -- damaged copies: a format error from a copy drops it and reads the store once (``ItemReads.fetch``) --------


def _samples(urls: list[str], cache: Path | None, **kw: object) -> tuple[list[dict], dict]:  # type: ignore[type-arg]
    ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True, **kw)  # type: ignore[arg-type]
    return list(ds), ds.stats()


def _order(samples: list[dict]) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(s["__url__"], s["__key__"]) for s in samples]


def _damage_header(path: str, offset: int) -> None:
    """Overwrite the checksum field of the tar header at ``offset`` (the file keeps its size)."""
    with open(path, "r+b") as fh:
        fh.seek(offset + 148)
        fh.write(b"XXXXXXX\0")


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "wds_async" and r.levelno >= logging.WARNING]


def test_a_copy_damaged_in_its_first_header_is_dropped_and_read_from_the_store(
        served: tuple[StoreProcess, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A copy whose first header is damaged, same size, same metadata (so every lookup trusts it): before the
    fallback, every epoch raised ShardFormatError although the store held a good copy. Now the epoch delivers
    every sample once, in order, from the store, with one warning; the copy is gone, and the next epoch caches
    the shard again, byte for byte."""
    server, root = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    plain, _ = _samples(urls, None)
    _read(urls, cache)
    copy = ShardCache(cache).path(urls[1])
    size = os.path.getsize(copy)
    _damage_header(copy, 0)
    assert os.path.getsize(copy) == size
    with caplog.at_level(logging.WARNING, logger="wds_async"):
        got, stats = _samples(urls, cache)
    assert _order(got) == _order(plain) and sample_digest(got) == sample_digest(plain)
    assert (stats["cache_hits"], stats["cache_fills"]) == (N, 0)  # opened as a hit, then dropped
    warned = _warnings(caplog)
    assert len(warned) == 1 and "local copy of" in warned[0] and "shard-000001.tar is damaged" in warned[0], warned
    assert not os.path.exists(copy) and not os.path.exists(copy + ".json")
    again, stats = _samples(urls, cache)
    assert sample_digest(again) == sample_digest(plain)
    assert (stats["cache_hits"], stats["cache_fills"]) == (N - 1, 1)
    assert Path(copy).read_bytes() == (root / "shard-000001.tar").read_bytes()


def test_a_copy_damaged_in_the_middle_reads_the_rest_from_the_store(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """A 3 MiB copy damaged in the header of the first sample past 2 MiB, with one byte of sample 1 changed (a
    mark: a sample delivered from the copy carries it). The copy is read in 1 MiB chunks and a chunk's samples
    are delivered once the chunk is parsed, so the samples of the chunks before the damaged one come from the
    copy (sample 1 has the mark); the rest, from the end of the last sample delivered, from the store, byte for
    byte; the epoch's order is the store's, no sample lost or repeated."""
    import tarfile

    root = tmp_path / "store"
    make_shards(root, n_shards=2, shard_bytes=3 << 20, sample_bytes=64 << 10, seed=5)
    with StoreProcess(root, Knobs(seed=1)) as server:
        urls = [server.base_url + f"shard-{i:06d}.tar" for i in range(2)]
        cache = tmp_path / "cache"
        plain, _ = _samples(urls, None)
        _read(urls, cache)
        with tarfile.open(root / "shard-000001.tar") as tf:
            members = tf.getmembers()
        first = {}
        for m in members:
            first.setdefault(m.name.split(".", 1)[0], m)
        damaged = next(key for key, m in first.items() if m.offset >= 2 << 20)
        copy = ShardCache(cache).path(urls[1])
        marked = first["s000001_000001"].offset_data
        with open(copy, "r+b") as fh:
            fh.seek(marked)
            byte = fh.read(1)
            fh.seek(marked)
            fh.write(bytes([byte[0] ^ 0xFF]))
        _damage_header(copy, first[damaged].offset)
        with caplog.at_level(logging.WARNING, logger="wds_async"):
            got, stats = _samples(urls, cache)
    assert _order(got) == _order(plain)
    by_key = {s["__key__"]: s for s in got}
    expected = {s["__key__"]: s for s in plain}
    mark = bytearray(expected["s000001_000001"]["bin"])
    mark[0] ^= 0xFF
    assert by_key["s000001_000001"]["bin"] == bytes(mark)  # from the copy
    later = [k for k in expected if k.startswith("s000001_") and k >= damaged]
    assert len(later) >= 5 and all(by_key[k] == expected[k] for k in later)  # from the store
    assert all(by_key[k] == expected[k] for k in expected if k != "s000001_000001")
    assert len(_warnings(caplog)) == 1 and stats["cache_hits"] == 2
    assert not os.path.exists(copy)


def test_a_damaged_copy_when_the_store_fails_too_is_a_clear_error(
        served: tuple[StoreProcess, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The copy is damaged and the store no longer has the object (read with ``cache_validate=False``, so no
    request asks before the copy is read): the error is the store's (NotFound, naming the shard), chained to the
    copy's format error, after the one warning that says the copy was damaged; not a hang, not a silent end.
    The damaged copy is dropped all the same."""
    from wds_async.errors import NotFound, ShardFormatError

    server, root = served
    urls = _urls(server)
    cache = tmp_path / "cache"
    _read(urls, cache)
    copy = ShardCache(cache).path(urls[1])
    _damage_header(copy, 0)
    (root / "shard-000001.tar").unlink()
    ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True, cache_validate=False)
    with caplog.at_level(logging.WARNING, logger="wds_async"), \
            pytest.raises(NotFound, match=r"shard-000001\.tar") as raised:
        list(ds)
    assert isinstance(raised.value.__context__, ShardFormatError)
    assert [w for w in _warnings(caplog) if "is damaged" in w and "shard-000001.tar" in w]
    assert not os.path.exists(copy)
