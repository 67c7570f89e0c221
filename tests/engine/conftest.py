"""Fixtures of the engine tests: ``served``, a private emulated store for the shard cache tests
(``test_cache.py``, ``test_cache_processes.py``, ``test_cache_damaged.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.engine.cache_common import N


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[StoreProcess, Path]]:
    """A private store over its own folder, so a test may rewrite an object."""
    root = tmp_path / "store"
    make_shards(root, n_shards=N, shard_bytes=192 << 10, sample_bytes=6 << 10, seed=3)
    with StoreProcess(root, Knobs(seed=1)) as server:
        yield server, root
