"""The shard cache shared by processes through a file lock, against the emulated store on 127.0.0.1: four
processes download each shard once, a filler killed mid-fill leaves nothing trusted, a stalled filler is bypassed,
a full disk abandons the fill and not the shard, and DataLoader workers share one cache.

Filling, reading and evicting copies and the CLI: test_cache.py; damaged copies: test_cache_damaged.py; hostile
and read-only directories: test_cache_security.py. The store (the ``served`` fixture) is in conftest.py, the
shared helpers in cache_common.py."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.conftest import sample_digest
from tests.engine.cache_common import N, read_epoch, shard_urls
from wds_async.cache.disk import ShardCache


def _child(urls: list[str], cache: str, out: str) -> None:
    ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True)
    assert ds.cache is not None
    ds.cache.stall_seconds = 30.0  # what is tested is the sharing: a process descheduled for 1 s on a busy
    # machine would otherwise look stalled to the others, who would then read that shard from the store too
    digest = sample_digest(ds)
    with open(out, "w") as fh:
        json.dump({"digest": list(digest), "stats": ds.stats()}, fh)


def test_processes_share_the_cache_and_download_each_shard_once(tmp_path: Path) -> None:
    root = tmp_path / "store"
    make_shards(root, n_shards=N, shard_bytes=192 << 10, sample_bytes=6 << 10, seed=3)
    # slow enough that the four processes overlap on every shard
    with StoreProcess(root, Knobs(seed=1, ttfb=0.05, bw=2e6)) as server:
        urls = shard_urls(server)
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
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    cache.mkdir()
    expected, _ = read_epoch(urls, None)
    sc = ShardCache(cache)
    held = os.open(sc.path(urls[1], ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # "another process" holds shard 1 and makes no progress
    try:
        ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True)
        assert ds.cache is not None
        ds.cache.stall_seconds = 0.3
        assert sample_digest(ds) == expected
        assert ds.stats()["cache_fills"] == N - 1 and ds.stats()["cache_bypasses"] == 1
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
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    expected, _ = read_epoch(urls, None)
    out = tmp_path / "out.json"
    child = multiprocessing.get_context("spawn").Process(target=_full_disk_child, args=(urls, str(cache), str(out)))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    result = json.loads(out.read_text())
    assert tuple(result["digest"]) == expected and result["fills"] == 0
    assert any("not caching" in line and "shard-0000" in line for line in result["log"])
    assert not [p for p in cache.iterdir() if p.name.endswith((".part", ".json"))]


def test_dataloader_workers_share_one_cache(served: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    from torch.utils.data import DataLoader

    server, _ = served
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    plain = sorted(s["__key__"] for s in wds.WebDataset(urls))
    for epoch in range(2):
        ds = wds.WebDataset(urls, cache_dir=cache)
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
        keys = sorted(s["__key__"] for s in loader)
        assert keys == plain
        stats = ds.stats()  # the workers' counters, summed
        assert (stats["cache_fills"], stats["cache_hits"]) == ((N, 0) if epoch == 0 else (0, N))


def test_a_slow_fill_shows_its_progress_to_waiting_processes(tmp_path: Path) -> None:
    """A process waiting for another's fill watches its ``.part`` file grow and reads the store itself once it
    stops growing for ``stall_seconds``. A fill gathers bytes into 1 MiB writes, so on a slow store it must also
    write what it has after ``FILL_WRITE_SECONDS``, or a live fill would look stalled."""
    import asyncio

    from wds_async.cache import items

    cache = ShardCache(tmp_path / "cache")
    assert cache.ensure_directory() is None
    assert cache.stall_seconds >= 2 * items.FILL_WRITE_SECONDS  # a live fill writes at least twice per stall
    url = "http://127.0.0.1:1/shard-000000.tar"
    fill = cache._take_lock(url)
    assert isinstance(fill, items.CacheFill)
    part = cache.path(url, ".part")

    async def scenario() -> list[int]:
        sizes = []
        await fill.write(b"a" * 1000, 10_000)
        sizes.append(await asyncio.to_thread(os.path.getsize, part))  # gathered, not written yet
        await fill.write(b"b" * 1000, 10_000)
        sizes.append(await asyncio.to_thread(os.path.getsize, part))
        fill._flushed_at -= items.FILL_WRITE_SECONDS  # as if the next chunk came that much later
        await fill.write(b"c" * 1000, 10_000)
        sizes.append(await asyncio.to_thread(os.path.getsize, part))
        await fill.close()
        return sizes

    assert asyncio.run(scenario()) == [0, 0, 3000]
    assert not os.path.exists(part)
