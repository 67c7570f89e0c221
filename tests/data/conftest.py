"""Fixtures of the mix tests (``test_mix.py``, ``test_mix_errors.py``, ``test_mix_state.py``): five small datasets a..e on the emulated
store, one store per module; the helpers that go with them are in :mod:`tests.data.mixes`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.data.mixes import N_SHARDS, NAMES


@pytest.fixture(scope="module")
def mix_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five datasets a..e (``a/a-000000.tar`` ...), 4 shards of ~40 KiB with ~2 KiB samples each, other bytes
    in each (the keys repeat across datasets: a sample is told by its shard's name and its key)."""
    root = tmp_path_factory.mktemp("mix")
    for i, name in enumerate(NAMES):
        make_shards(root / name, n_shards=N_SHARDS, shard_bytes=40 << 10, sample_bytes=2 << 10, seed=20 + i,
                    prefix=name)
    return root


@pytest.fixture(scope="module")
def mix_store(mix_data: Path) -> Iterator[StoreProcess]:
    with StoreProcess(mix_data, Knobs(seed=11)) as store:
        yield store
