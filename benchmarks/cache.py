"""The shard cache, measured: epoch 1 (download and fill), epoch 2 (read the copies), local files.

    python -m benchmarks.cache [--shards 32] [--shard-size 16MiB] [--ttfb 0.05] [--bw 20e6] [-c 16] [--rounds 3]

Serves the shards on 127.0.0.1 with ``ttfb`` to first byte and ``bw`` bytes/s per connection (the demo's
store), then in one process:

1. **epoch 1**: ``WebDataset(urls, cache_dir=EMPTY)``: every shard streams from the store into the loader
   and into the cache;
2. **epoch 2** (``rounds`` times): the same dataset again, every shard a copy (one 1-byte request per shard
   asks the store whether the object changed), and **epoch 2, no validation** (``cache_validate=False``);
3. **local files** (``rounds`` times, alternating with 2): ``WebDataset`` over the shard files themselves,
   the speed a copy on local disk can reach at best.

Each epoch consumes every sample (no decoding). Medians over the rounds; ratios from this one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

import wds_async as wds
from benchmarks.make_shards import make_shards, parse_size
from emustore import Knobs, StoreProcess

ROOT = Path(__file__).resolve().parent.parent


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _epoch(urls: list[str], server: psutil.Process, **kw: Any) -> dict[str, Any]:
    ds = wds.WebDataset(urls, **kw)
    me = psutil.Process()
    start, cpu, server_cpu = time.perf_counter(), _cpu(me), _cpu(server)
    n = 0
    for _ in ds:
        n += 1
    seconds = time.perf_counter() - start
    stats = ds.stats()
    return {"seconds": seconds, "samples": n, "mb_per_s": stats["bytes_read"] / seconds / 1e6,
            "cache_hits": stats["cache_hits"], "cache_fills": stats["cache_fills"], "requests": stats["requests"],
            "loader_cpu_s": _cpu(me) - cpu, "store_cpu_s": _cpu(server) - server_cpu}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cache", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=str(ROOT / ".bench" / "shards"), help="where shards are generated")
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--shard-size", default="16MiB")
    parser.add_argument("--sample-size", default="100KiB")
    parser.add_argument("--ttfb", type=float, default=0.05)
    parser.add_argument("--bw", type=float, default=20e6)
    parser.add_argument("-c", "--connections", default="16", help="max_connections for every epoch (int or auto)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    connections: int | str = args.connections if args.connections == "auto" else int(args.connections)

    paths = make_shards(args.dir, n_shards=args.shards, shard_bytes=parse_size(args.shard_size),
                        sample_bytes=parse_size(args.sample_size))
    total = sum(Path(p).stat().st_size for p in paths)
    print(f"shards: {len(paths)} x {args.shard_size} ({total / 1e6:.0f} MB) in {args.dir}; "
          f"max_connections={connections}")
    cache_dir = Path(tempfile.mkdtemp(prefix="wds-cache-bench-"))
    rows: dict[str, list[dict[str, Any]]] = {"epoch 1 (fill)": [], "epoch 2 (copies)": [],
                                             "epoch 2, cache_validate=False": [], "local files": []}
    try:
        with StoreProcess(args.dir, Knobs(ttfb=args.ttfb, bw=args.bw)) as store:
            urls = [store.base_url + Path(p).name for p in paths]
            print(f"store: {store.base_url} ttfb={args.ttfb}s bw={args.bw / 1e6:.0f} MB/s per connection")
            kw: dict[str, Any] = {"max_connections": connections, "cache_dir": cache_dir}
            server = psutil.Process(store.pid)
            rows["epoch 1 (fill)"].append(_epoch(urls, server, **kw))
            for _ in range(args.rounds):
                rows["epoch 2 (copies)"].append(_epoch(urls, server, **kw))
                rows["local files"].append(_epoch([str(p) for p in paths], server, max_connections=connections))
                rows["epoch 2, cache_validate=False"].append(_epoch(urls, server, cache_validate=False, **kw))
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    summary = {name: {"seconds": statistics.median(r["seconds"] for r in runs),
                      "mb_per_s": statistics.median(r["mb_per_s"] for r in runs),
                      "loader_cpu_s": statistics.median(r["loader_cpu_s"] for r in runs),
                      "store_cpu_s": statistics.median(r["store_cpu_s"] for r in runs),
                      "cache_hits": runs[-1]["cache_hits"], "cache_fills": runs[-1]["cache_fills"],
                      "requests": runs[-1]["requests"], "runs": len(runs)} for name, runs in rows.items()}
    print(f"\n{'epoch':<32}{'seconds':>9}{'MB/s':>9}{'hits':>6}{'fills':>6}{'requests':>9}{'loader CPU s':>14}"
          f"{'store CPU s':>13}")
    for name, s in summary.items():
        print(f"{name:<32}{s['seconds']:>9.2f}{s['mb_per_s']:>9.0f}{s['cache_hits']:>6}{s['cache_fills']:>6}"
              f"{s['requests']:>9}{s['loader_cpu_s']:>14.2f}{s['store_cpu_s']:>13.2f}")
    e1, e2 = summary["epoch 1 (fill)"]["seconds"], summary["epoch 2 (copies)"]["seconds"]
    e2n, local = summary["epoch 2, cache_validate=False"]["seconds"], summary["local files"]["seconds"]
    ratios = {"epoch1_over_epoch2": e1 / e2, "epoch2_over_local": e2 / local,
              "epoch2_unvalidated_over_local": e2n / local}
    print(f"\nepoch 2 is {ratios['epoch1_over_epoch2']:.1f}x faster than epoch 1 (target >= 10x); "
          f"{ratios['epoch2_over_local']:.2f}x the local-files time (target <= 1.2x; "
          f"{ratios['epoch2_unvalidated_over_local']:.2f}x without validation)")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary, "ratios": ratios,
                                               "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
