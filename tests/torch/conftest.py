"""The torch tests' children: the warm launcher they are forked from lives for one module (see children.py); the
shards and store of the mix resume tests (``mix_data``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.torch.children import close_warm_launcher
from tests.torch.mix_jobs import BIG, SMALL


@pytest.fixture(scope="module", autouse=True)
def _warm_launcher_per_module() -> Iterator[None]:
    yield
    close_warm_launcher()


@pytest.fixture(scope="module")
def mix_data(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Both sets of three sources (``mix_jobs.SMALL``, ``BIG``) on one store: per source its URL pattern, its index,
    and its keys per shard."""
    root = tmp_path_factory.mktemp("mix")
    for n, (name, shards, size) in enumerate(SMALL + BIG):
        make_shards(root / name, n_shards=shards, shard_bytes=size, sample_bytes=256, seed=40 + n)
    with StoreProcess(root, Knobs(seed=3)) as store:
        sources: dict[str, Any] = {}
        for name, shards, _ in SMALL + BIG:
            manifest = json.loads((root / name / "manifest.json").read_text())
            pattern = store.base_url + f"{name}/shard-{{000000..{shards - 1:06d}}}.tar"
            index = root / f"{name}.index"
            wds.build_index(pattern).save(index)
            keys = [[f"{name}/{s['name']}/s{shard:06d}_{i:06d}" for i in range(s["samples"])]
                    for shard, s in enumerate(manifest["shards"])]
            sources[name] = {"urls": pattern, "index": str(index), "keys": keys}
        yield sources
