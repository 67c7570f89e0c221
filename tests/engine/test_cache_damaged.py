"""Damaged copies in the shard cache, against the emulated store on 127.0.0.1: a format error from a copy drops
it and reads the store once (``ItemReads.fetch``), from the start or from the last sample delivered, and a store
that fails too is a clear error.

Filling, reading and evicting copies and the CLI: test_cache.py; processes sharing the cache and killed fillers:
test_cache_processes.py; hostile and read-only directories: test_cache_security.py. The store (the ``served``
fixture) is in conftest.py, the shared helpers in cache_common.py."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import functools
import gc
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.conftest import sample_digest
from tests.engine.cache_common import N, read_epoch, shard_urls
from wds_async.cache.disk import ShardCache
from wds_async.cache.items import CacheFill

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
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    plain, _ = _samples(urls, None)
    read_epoch(urls, cache)
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
        read_epoch(urls, cache)
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
    urls = shard_urls(server)
    cache = tmp_path / "cache"
    read_epoch(urls, cache)
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


# -- a fill cancelled while its file opens: no descriptor closed twice -----------------------------------------


class _Stepped(concurrent.futures.ThreadPoolExecutor):  # asyncio's default executor must be one; no thread starts
    """A default executor whose calls run only when the test says so, in the test's thread: :meth:`start`
    marks the next one running (a cancel no longer stops it), :meth:`finish` runs it."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.calls: collections.deque[tuple[concurrent.futures.Future[Any], Callable[[], Any]]] = collections.deque()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.calls.append((future, functools.partial(fn, *args, **kwargs)))
        return future

    def start(self) -> bool:
        return self.calls[0][0].set_running_or_notify_cancel()

    def finish(self) -> None:
        future, call = self.calls.popleft()
        try:
            future.set_result(call())
        except BaseException as exc:
            future.set_exception(exc)

    def step(self) -> None:
        if self.start():
            self.finish()
        else:
            self.calls.popleft()


def _is_open(call: Callable[[], Any]) -> bool:
    """Whether an executor call is a file's open (aiofiles runs ``open`` with its arguments in a partial)."""
    return isinstance(call, functools.partial) and call.func is open


def test_a_fill_cancelled_while_its_file_opens_closes_no_other_files_descriptor(tmp_path: Path) -> None:
    """The reader filling a copy is cancelled (its consumer left) while the ``.part`` file's open runs in its
    thread. That open must not end up owning the descriptor number of a file opened meanwhile (closing it
    later, under that file): the other file stays open, the part file goes, the shard's lock is released."""
    cache = ShardCache(tmp_path / "cache")
    assert cache.ensure_directory() is None
    url = "http://127.0.0.1:1/shard-000000.tar"
    fill = cache._take_lock(url)
    assert isinstance(fill, CacheFill)

    async def scenario() -> int:
        stepped = _Stepped()
        asyncio.get_running_loop().set_default_executor(stepped)
        task = asyncio.create_task(fill.write(b"x" * 100, 100))
        for _ in range(50):  # the fill's calls before its file's open (make room, unlink) run as they come
            await asyncio.sleep(0)
            if stepped.calls and _is_open(stepped.calls[0][1]):
                break
            if stepped.calls:
                stepped.step()
        else:
            raise AssertionError("the fill never opened its file")
        assert stepped.start()  # the open is in its thread: a cancel does not stop it
        task.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        victim = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)  # the lowest free number
        stepped.finish()  # the open returns
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(20):  # and whatever cleans up after it
            await asyncio.sleep(0)
            if stepped.calls:
                stepped.step()
        await fill.close()
        while stepped.calls:
            stepped.step()
            await asyncio.sleep(0)
        gc.collect()  # a file object left unclosed closes its descriptor now
        return victim

    victim = asyncio.run(scenario())
    try:
        assert os.write(victim, b"still mine") == 10  # EBADF where a late close took its number
    finally:
        os.close(victim)
    assert not os.path.exists(cache.path(url, ".part"))
    assert fill.lock_fd == -1


def test_a_fill_cancelled_while_it_takes_the_lock_leaves_the_shard_unlocked(tmp_path: Path) -> None:
    """Cancelled while the shard's lock is being taken in its thread: the lock, once taken, is released, so the
    next fill of the shard in this process takes it at once (a lock left held made it wait ``stall_seconds``
    for a filler that was gone, then read the store uncached)."""
    cache = ShardCache(tmp_path / "cache", validate=False)
    url = "http://127.0.0.1:1/shard-000000.tar"

    async def scenario() -> None:
        stepped = _Stepped()
        asyncio.get_running_loop().set_default_executor(stepped)
        task = asyncio.create_task(cache.open_item(url, whole=True, backend=None, policy=wds.RetryPolicy()))  # type: ignore[arg-type]
        for _ in range(50):  # the calls before (the directory, the lookup of a copy) run as they come
            await asyncio.sleep(0)
            if stepped.calls and "_take_lock" in repr(stepped.calls[0][1]):
                break
            if stepped.calls:
                stepped.step()
        else:
            raise AssertionError("the fill never took the shard's lock")
        assert stepped.start()
        task.cancel()
        for _ in range(5):
            await asyncio.sleep(0)
        stepped.finish()  # the lock is taken, for a caller that is gone
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(5):
            await asyncio.sleep(0)

    asyncio.run(scenario())
    fill = cache._take_lock(url)
    assert isinstance(fill, CacheFill), "the shard's lock is still held"
    asyncio.run(fill.close())
