"""The stores the modules of this folder share, one process per module. The plain face's (``root``, ``store``,
``data``): a root of two small shards and a symlink out of it. The S3 face's, for test_store_s3.py and
test_store_s3_transfers.py (``s3_root``, ``s3_store``, ``s3``, ``bucket``): a root whose bucket ``data`` holds two
small shards, a boto3 client and a new bucket per test. test_store_gcs.py defines its own ``root``, ``store`` and
``bucket``."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks.make_shards import make_shards
from emustore import StoreProcess
from tests.servers.plain import SECRET, SHARD
from tests.servers.roots import bucket_root, checked_store
from tests.servers.s3_common import s3_client

_names = itertools.count()


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
    with checked_store(root) as store:
        yield store


@pytest.fixture(scope="module")
def data(root: Path) -> bytes:
    return (root / SHARD).read_bytes()


@pytest.fixture(scope="module")
def s3_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bucket_root(tmp_path_factory, "s3root", 2)


@pytest.fixture(scope="module")
def s3_store(s3_root: Path) -> Iterator[StoreProcess]:
    with checked_store(s3_root) as store:
        yield store


@pytest.fixture(scope="module")
def s3(s3_store: StoreProcess) -> Iterator[Any]:
    client = s3_client(s3_store.s3_endpoint)
    yield client
    client.close()


@pytest.fixture
def bucket(s3: Any) -> str:
    """A new, empty bucket for one test."""
    name = f"bucket-{next(_names)}"
    s3.create_bucket(Bucket=name)
    return name
