"""The store the plain-face modules of this folder share, one process per module: a root of two small shards and a
symlink out of it. test_store_s3.py and test_store_gcs.py define their own ``root`` and ``store``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.make_shards import make_shards
from emustore import StoreProcess
from tests.servers.plain import SECRET, SHARD


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    make_shards(root, n_shards=2, shard_bytes=1 << 20, sample_bytes=32 << 10)
    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_bytes(SECRET)
    (root / "escape.txt").symlink_to(outside)
    return root


@pytest.fixture(scope="module")
def store(root: Path) -> Iterator[StoreProcess]:
    with StoreProcess(root) as store:
        yield store
    assert store.stderr == "", store.stderr  # no tracebacks from drops, stalls or disconnects


@pytest.fixture(scope="module")
def data(root: Path) -> bytes:
    return (root / SHARD).read_bytes()
