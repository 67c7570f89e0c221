"""Large shards read as concurrent ranged parts: the same samples as one stream, retries per part, one
object version per shard, bounded memory with a slow consumer, and sequential reads where ranges can't be."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.conftest import sample_digest

MiB = 1 << 20
PART = MiB // 2
RETRY = wds.RetryPolicy(attempts=40, base_delay=0.0, max_delay=0.01)


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StoreProcess, Path]]:
    root = tmp_path_factory.mktemp("big")
    make_shards(root, n_shards=2, shard_bytes=6 * MiB, sample_bytes=40 << 10, seed=11)
    make_shards(root, n_shards=1, shard_bytes=6 * MiB, sample_bytes=40 << 10, seed=12, gz=True, prefix="gz")
    with StoreProcess(root, Knobs()) as server:
        yield server, root


def _same_as_one_stream(url: str, **options: object) -> wds.WebDataset:
    """Read ``url`` with ``options`` (parts on), check it delivers what one stream delivers, return it for
    its stats."""
    ds = wds.WebDataset(url, part_bytes=PART, deterministic=True, **options)  # type: ignore[arg-type]
    whole = wds.WebDataset(url.split("?")[0], part_bytes=0, deterministic=True)  # the same object, plain
    assert sample_digest(ds) == sample_digest(whole)
    return ds


def test_parts_deliver_the_same_samples_as_one_stream(big: tuple[StoreProcess, Path]) -> None:
    store, _ = big
    urls = store.base_url + "shard-{000000..000001}.tar"
    whole = sample_digest(wds.WebDataset(urls, deterministic=True, part_bytes=0))
    parted = wds.WebDataset(urls, deterministic=True, part_bytes=PART)
    assert sample_digest(parted) == whole and whole[0] > 100
    stats = parted.stats()
    assert stats["parts"] >= 2 * (6 * MiB // PART - 2)  # helpers fetched most parts
    assert stats["requests"] >= stats["parts"] + 2


def test_a_gzipped_shard_is_split_too_and_inflated_in_order(big: tuple[StoreProcess, Path]) -> None:
    store, root = big
    url = store.base_url + "gz-000000.tar.gz"
    size = (root / "gz-000000.tar.gz").stat().st_size
    assert size > 4 * PART
    assert _same_as_one_stream(url).stats()["parts"] > 0


def test_with_one_token_every_part_is_read_in_order_by_the_item_itself(big: tuple[StoreProcess, Path]) -> None:
    store, _ = big
    url = store.base_url + "shard-000000.tar"
    ds = _same_as_one_stream(url, max_connections=1)
    assert ds.stats()["parts"] == 0  # no helper ever got a token: no deadlock, no extra request in flight


def test_parts_are_retried_one_by_one_at_their_own_offset(big: tuple[StoreProcess, Path]) -> None:
    store, _ = big
    urls = store.base_url + "shard-{000000..000001}.tar"
    clean = sample_digest(wds.WebDataset(urls, deterministic=True, part_bytes=0))
    for _ in range(5):  # the store's dice are server-wide: repeat until a part really was cut
        faulty = wds.WebDataset(urls + "?drop_rate=0.3&fail_rate=0.2", deterministic=True, part_bytes=PART,
                                retry=RETRY)
        assert sample_digest(faulty) == clean
        if faulty.stats()["retries"]:
            break
    assert faulty.stats()["retries"] > 0 and faulty.stats()["parts"] > 0


def test_a_shard_replaced_between_parts_fails_clearly(big: tuple[StoreProcess, Path], tmp_path: Path) -> None:
    store, root = big
    shutil.copy(root / "shard-000000.tar", tmp_path / "old.tar")
    shutil.copy(root / "shard-000001.tar", tmp_path / "new.tar")
    target = root / "victim.tar"
    shutil.copy(tmp_path / "old.tar", target)
    # A small budget keeps the later parts from opening before the object is replaced.
    ds = wds.WebDataset(store.base_url + "victim.tar", part_bytes=PART, max_buffered_bytes=3 * MiB,
                        max_connections=2, deterministic=True)
    it = iter(ds)
    next(it)
    os.replace(_newer_copy(tmp_path / "new.tar", tmp_path / "staged.tar"), target)
    with pytest.raises(wds.ObjectChanged) as info:
        for _ in it:
            time.sleep(0.001)
    assert "victim.tar" in str(info.value) and "version" in str(info.value)
    target.unlink()


def _newer_copy(src: Path, dst: Path) -> Path:
    shutil.copy(src, dst)
    later = time.time() + 5
    os.utime(dst, (later, later))
    return dst


def test_a_slow_consumer_stops_the_parts_within_the_budget(big: tuple[StoreProcess, Path]) -> None:
    store, _ = big
    limit = 8 * MiB  # room for 6 open streams' allowances: enough for parts to run beside the in-order read
    ds = wds.WebDataset(store.base_url + "shard-{000000..000001}.tar", part_bytes=PART, max_buffered_bytes=limit,
                        max_connections=6, deterministic=True)
    for n, _ in enumerate(ds, 1):
        if n % 20 == 0:
            time.sleep(0.02)
    stats = ds.stats()
    assert stats["parts"] > 0
    # the invariant of ByteBudget: the limit plus at most one chunk per request in flight
    assert stats["peak_buffered_bytes"] <= limit + 6 * MiB


def test_pipe_sources_are_never_split(big: tuple[StoreProcess, Path]) -> None:
    _, root = big
    ds = wds.WebDataset(f"pipe:cat {root / 'shard-000000.tar'}", part_bytes=PART, deterministic=True)
    assert sample_digest(ds)[0] > 100 and ds.stats()["parts"] == 0 and ds.stats()["requests"] == 1


def test_local_files_are_split_like_any_store(big: tuple[StoreProcess, Path]) -> None:
    _, root = big
    path = str(root / "shard-000000.tar")
    assert _same_as_one_stream(path).stats()["parts"] > 0


def test_a_server_that_ignores_range_is_read_in_one_stream(big: tuple[StoreProcess, Path]) -> None:
    store, _ = big
    url = store.base_url + "shard-000000.tar"
    ds = _same_as_one_stream(url + "?ignore_range=1")
    assert ds.stats()["parts"] == 0 and ds.stats()["requests"] == 1  # parts would each re-read from byte 0
