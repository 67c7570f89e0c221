"""The roots and store processes the store's tests serve: a fresh root whose bucket ``data`` holds small generated
shards (the S3 and GCS faces' modules), and a store over a root that must end without printing a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from benchmarks.make_shards import make_shards
from emustore import StoreProcess

__all__ = ["DATA", "SHARD", "bucket_root", "checked_store"]

DATA = "data"  # the bucket that holds the generated shards
SHARD = "shard-000000.tar"


def bucket_root(factory: pytest.TempPathFactory, name: str, n_shards: int) -> Path:
    """A new root whose bucket :data:`DATA` holds ``n_shards`` shards of 1 MiB (samples of 32 KiB)."""
    root = factory.mktemp(name)
    make_shards(root / DATA, n_shards=n_shards, shard_bytes=1 << 20, sample_bytes=32 << 10)
    return root


@contextmanager
def checked_store(root: Path) -> Iterator[StoreProcess]:
    """A store over ``root`` for the block; afterwards its stderr must be empty (no tracebacks from drops, stalls,
    disconnects or refused handshakes)."""
    with StoreProcess(root) as store:
        yield store
    assert store.stderr == "", store.stderr
