"""One large shard: ranged parts against one connection, on the same emulated store, in one run.

    python -m benchmarks.parts                 # 256 MB shard, 20 MB/s and 50 ms per connection

Each run is a fresh subprocess iterating ``WebDataset(url, ...)``: once with ``part_bytes=0,
max_connections=1`` (one stream, what every loader without ranged parts gets from one shard), once with the
defaults (autotuned, 16 MiB parts). Reported: MB/s, the ratio, requests and parts, and peak anonymous
memory above the post-import baseline against ``max_buffered_bytes`` (issue 9's target: >= 8x one
connection, memory <= budget + 64 MB). No assertions: figures.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess

CHILD = r"""
import json, sys, time
import wds_async as wds
[getattr(wds, name) for name in wds.__all__]  # load every export (torch too) before the baseline
from benchmarks.peakmem import PeakMemory
url, options = json.loads(sys.argv[1])
mem = PeakMemory()
ds = wds.WebDataset(url, nodesplitter=None, workersplitter=None, **options)
started = time.perf_counter()
n = sum(1 for _ in ds)
wall = time.perf_counter() - started
above = mem.stop()
st = ds.stats()
print(json.dumps({"samples": n, "wall_s": wall, "mb_s": st["bytes_read"] / wall / 1e6, "requests": st["requests"],
                  "parts": st["parts"], "concurrency": st["concurrency"], "peak_above": above,
                  "budget": ds.config.max_buffered_bytes}))
"""

def run(url: str, options: dict) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([url, options])], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=256, help="shard size in MB (2**20 bytes)")
    p.add_argument("--bw", type=float, default=20e6)
    p.add_argument("--ttfb", type=float, default=0.05)
    p.add_argument("--root", default="/tmp/wds-parts-shards")
    args = p.parse_args(argv)
    root = Path(args.root) / str(args.mb)
    make_shards(root, n_shards=1, shard_bytes=args.mb << 20, sample_bytes=1 << 20, seed=5)
    with StoreProcess(root, Knobs(ttfb=args.ttfb, bw=args.bw)) as store:
        url = store.base_url + "shard-000000.tar"
        one = run(url, {"part_bytes": 0, "max_connections": 1})
        parts = run(url, {})
    print(f"one {args.mb} MiB shard, {args.ttfb * 1000:.0f} ms to first byte, {args.bw / 1e6:.0f} MB/s per connection")
    print(f"{'read':<34} {'MB/s':>8} {'vs one':>7} {'requests':>9} {'peak MB above base':>19} {'budget MB':>10}")
    for name, r in (("one connection", one), ("ranged parts (defaults)", parts)):
        print(f"{name:<34} {r['mb_s']:8.1f} {r['mb_s'] / one['mb_s']:7.2f} {r['requests']:9d} "
              f"{r['peak_above'] / 1e6:19.1f} {r['budget'] / 1e6:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
