"""Peak memory stays within max_buffered_bytes + 64 MB whatever the concurrency, ranged parts included, with a
consumer slower than the network. Each run is a fresh process that samples its anonymous resident memory
(see benchmarks/peakmem.py for why not ``ru_maxrss``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess

MiB = 1 << 20
BUDGET = 32 * MiB
CHILD = r"""
import json, sys, time
import wds_async as wds
[getattr(wds, name) for name in wds.__all__]  # load every export (torch too) before the baseline
from benchmarks.peakmem import PeakMemory
urls, connections, part, budget = json.loads(sys.argv[1])
mem = PeakMemory()
ds = wds.WebDataset(urls, max_connections=connections, max_buffered_bytes=budget, part_bytes=part,
                    nodesplitter=None, workersplitter=None)
n = 0
for _ in ds:
    n += 1
    time.sleep(0.001)  # ~100 MB/s of 100 KB samples: slower than the unthrottled store
above = mem.stop()
st = ds.stats()
print(json.dumps({"samples": n, "above": above, "concurrency": st["concurrency"], "reason": st["concurrency_reason"],
                  "parts": st["parts"], "peak_buffered": st["peak_buffered_bytes"]}))
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreProcess]:
    root = tmp_path_factory.mktemp("mem")
    make_shards(root / "many", n_shards=192, shard_bytes=MiB, sample_bytes=100 << 10, seed=31)
    make_shards(root / "one", n_shards=1, shard_bytes=64 * MiB, sample_bytes=100 << 10, seed=32)
    with StoreProcess(root, Knobs()) as server:
        yield server


def _run(urls: list[str], connections: int | str, part: int) -> dict:  # type: ignore[type-arg]
    args = json.dumps([urls, connections, part, BUDGET])
    out = subprocess.run([sys.executable, "-c", CHILD, args], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.parametrize("connections", [16, 256, "auto"])
def test_peak_rss_is_bounded_by_the_budget_at_any_concurrency(store: StoreProcess, connections: int | str) -> None:
    urls = [store.base_url + f"many/shard-{i:06d}.tar" for i in range(192)]
    r = _run(urls, connections, 0)
    assert r["samples"] > 1500
    assert r["above"] <= BUDGET + 64e6, r
    if connections == 256:  # more streams than the budget can hold transport buffers for: lowered, and said so
        assert r["concurrency"] < 256 and "lowered" in r["reason"], r


def test_peak_rss_is_bounded_with_ranged_parts(store: StoreProcess) -> None:
    r = _run([store.base_url + "one/shard-000000.tar"], 64, 2 * MiB)
    assert r["samples"] > 600 and r["parts"] > 0
    assert r["above"] <= BUDGET + 64e6, r
