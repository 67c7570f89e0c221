"""Helpers shared by the shard cache tests (``test_cache.py``, ``test_cache_processes.py``,
``test_cache_damaged.py``): the number of shards the ``served`` store (conftest.py) holds, their URLs, and one
epoch read through a cache directory (its digest and stats)."""

from __future__ import annotations

from pathlib import Path

import wds_async as wds
from emustore import StoreProcess
from tests.conftest import sample_digest

N = 4


def shard_urls(server: StoreProcess) -> list[str]:
    return [server.base_url + f"shard-{i:06d}.tar" for i in range(N)]


def read_epoch(urls: list[str], cache: Path | None,
               **kw: object) -> tuple[tuple[int, str], dict]:  # type: ignore[type-arg]
    ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True, **kw)  # type: ignore[arg-type]
    digest = sample_digest(ds)
    return digest, ds.stats()
