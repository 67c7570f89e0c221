"""Peak RSS against concurrency, with a consumer slower than the network.

    python -m benchmarks.memory --levels 16,32,64,128,256 --budget 64MiB

Each level runs in a fresh subprocess: ``WebDataset(urls, max_connections=level,
max_buffered_bytes=budget)`` over the emulated store (no bandwidth cap, so the network is faster than the
consumer), consumed by a loop that sleeps ``--sleep`` seconds per sample. Reported per level: the peak of
anonymous resident memory (RSS less file-backed pages, sampled every 5 ms) above the post-import baseline,
the engine's peak buffered bytes, and the difference (memory outside the byte budget). Also a large-shard run read as ranged parts. No assertions: figures.
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
import json, resource, sys, time
import wds_async as wds
[getattr(wds, name) for name in wds.__all__]  # load every export (torch too) before the baseline
from benchmarks.peakmem import PeakMemory
urls, level, budget, sleep, part = json.loads(sys.argv[1])
mem = PeakMemory()
rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
ds = wds.WebDataset(urls, max_connections=level, max_buffered_bytes=budget, part_bytes=part,
                    nodesplitter=None, workersplitter=None)
n = 0
started = time.perf_counter()
for s in ds:
    n += 1
    time.sleep(sleep)
above = mem.stop()
st = ds.stats()
print(json.dumps({"level": level, "samples": n, "wall_s": time.perf_counter() - started,
                  "peak_rss_above_baseline": above, "concurrency": st["concurrency"],
                  "maxrss_above": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss0,
                  "peak_buffered": st["peak_buffered_bytes"],
                  "budget": budget, "requests": st["requests"], "parts": st["parts"]}))
"""

def run(urls: list[str], level: int, budget: int, sleep: float, part: int) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([urls, level, budget, sleep, part])],
                         capture_output=True, text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    from wds_async.node import parse_bytes

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--levels", default="16,32,64,128,256")
    p.add_argument("--budget", default="64MiB")
    p.add_argument("--sleep", type=float, default=0.002, help="consumer seconds per 100 KB sample")
    p.add_argument("--root", default="/tmp/wds-memory-shards")
    p.add_argument("--json")
    args = p.parse_args(argv)
    budget = parse_bytes(args.budget)
    root = Path(args.root)
    make_shards(root / "small", n_shards=256, shard_bytes=4 << 20, sample_bytes=100 << 10, seed=21)
    make_shards(root / "large", n_shards=1, shard_bytes=512 << 20, sample_bytes=100 << 10, seed=22)
    rows = []
    with StoreProcess(root, Knobs()) as store:
        small = [store.base_url + f"small/shard-{i:06d}.tar" for i in range(256)]
        for level in (int(x) for x in args.levels.split(",")):
            rows.append({"case": f"256 x 4 MB, {level} connections", **run(small, level, budget, args.sleep, 0)})
            print(rows[-1], file=sys.stderr, flush=True)
        large = [store.base_url + "large/shard-000000.tar"]
        rows.append({"case": "1 x 512 MB as 8 MiB parts, 64 connections",
                     **run(large, 64, budget, args.sleep, 8 << 20)})
    print(f"{'case':<44} {'in flight':>9} {'budget MB':>9} {'peak buffered MB':>16} {'peak anon above base MB':>23} "
          f"{'over budget MB':>14}")
    for r in rows:
        print(f"{r['case']:<44} {r['concurrency']:>9} {r['budget'] / 1e6:9.0f} {r['peak_buffered'] / 1e6:16.1f} "
              f"{r['peak_rss_above_baseline'] / 1e6:23.1f} {(r['peak_rss_above_baseline'] - r['budget']) / 1e6:14.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
