"""The autotuner against the best fixed concurrency of a sweep, on the same emulated store, in one run.

    python -m benchmarks.autotune                       # scenarios a, b, c
    python -m benchmarks.autotune --scenarios c --json out.json
    python -m benchmarks.autotune --scenarios b --budget 512MiB   # the loader with another byte budget

Scenarios (issue 9):

a. 32 shards of 16 MB at 50 ms to first byte and 20 MB/s per connection, read 10 times in one pass
   (5 GB: at the ~900 MB/s that two loopback cores reach, 4 passes lasted 2-3 s, and the ramp's first
   second was most of the run);
b. 256 shards of 1 MB at 200 ms and 10 MB/s per connection (read twice with one dataset object, so
   the second epoch shows where the tuner starts once it has learned the store);
c. a store that answers 503 SlowDown above 24 concurrent requests, 16 MB shards at 10 MB/s per
   connection, read for long enough to count the rejections after the first 5 s.

For every level of the sweep, the URLs are first downloaded raw (the loader's backends, bytes thrown away:
the ``gsutil -m`` analog); then for every fixed level and for ``max_connections="auto"``, one ``WebDataset``
is iterated in this process; reported: MB/s, the ratios of auto to the best fixed level and to the best raw
level, auto's final concurrency and
the reason it gives, and for (c) the share of requests rejected after the first 5 s. Nothing here asserts:
the figures go to the README and the issue notes.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.make_shards import make_shards, parse_size
from emustore import Knobs, StoreProcess

MB = 1e6


@dataclass(frozen=True)
class Scenario:
    name: str
    text: str
    shards: int
    shard_bytes: int
    knobs: Knobs
    levels: tuple[int, ...]
    repeat: int = 1          # the URL list repeated, for runs long enough to judge
    epochs: int = 1


SCENARIOS = {
    "a": Scenario("a", "32 x 16 MB, 50 ms, 20 MB/s per connection", 32, 16 << 20,
                  Knobs(ttfb=0.05, bw=20e6), (16, 32, 64, 128), repeat=10),
    "b": Scenario("b", "256 x 1 MB, 200 ms, 10 MB/s per connection", 256, 1 << 20,
                  Knobs(ttfb=0.2, bw=10e6), (32, 64, 128, 256), epochs=2),
    "c": Scenario("c", "503 above 24 concurrent requests, 16 MB shards at 10 MB/s per connection", 16, 16 << 20,
                  Knobs(bw=10e6, max_concurrent=24), (8, 16, 24, 32), repeat=6),
}


def _poll_stats(ds: Any, done: threading.Event, timeline: list[tuple[float, int, int]], started: float) -> None:
    """Every 0.25 s until ``done``: (seconds since ``started``, requests, throttled) appended to ``timeline``."""
    while not done.wait(0.25):
        s = ds.stats()
        timeline.append((time.perf_counter() - started, s["requests"], s["throttled"]))


def _run(urls: list[str], connections: int | str, epochs: int, budget: int | None = None) -> list[dict[str, Any]]:
    import wds_async as wds

    # Patient retries for every run: a fixed level above the store's limit must finish (with rejections)
    # for the sweep to have a value there.
    retry = wds.RetryPolicy(attempts=1000, base_delay=0.05, max_delay=1.0, deadline=600)
    options: dict[str, Any] = {} if budget is None else {"max_buffered_bytes": budget}
    ds = wds.WebDataset(urls, max_connections=connections, nodesplitter=None, workersplitter=None, shardshuffle=False,
                        retry=retry, **options)
    results = []
    for _ in range(epochs):
        timeline: list[tuple[float, int, int]] = []
        done = threading.Event()
        started = time.perf_counter()
        sampler = threading.Thread(target=_poll_stats, args=(ds, done, timeline, started), daemon=True)
        sampler.start()
        n = 0
        for _sample in ds:
            n += 1
        wall = time.perf_counter() - started
        done.set()
        sampler.join()
        s = ds.stats()
        after = [(r, t) for when, r, t in timeline if when >= 5.0]
        late_requests = s["requests"] - after[0][0] if after else 0
        late_throttled = s["throttled"] - after[0][1] if after else 0
        results.append({"connections": connections, "samples": n, "wall_s": wall,
                        "mb_per_s": s["bytes_read"] / wall / MB, "requests": s["requests"],
                        "throttled": s["throttled"], "late_requests": late_requests,
                        "late_throttled": late_throttled, "concurrency": s["concurrency"],
                        "reason": s["concurrency_reason"]})
    return results


def _raw(urls: list[str], connections: int) -> dict[str, Any]:
    """The same URLs downloaded raw (``wds-async bench``'s raw phase: the loader's backends, no parsing, bytes
    thrown away) by ``connections`` concurrent workers: the ``gsutil -m`` analog at that level."""
    import asyncio

    import wds_async as wds
    from wds_async.io.rawread import drain, raw_backends

    async def download() -> int:
        todo = iter(urls)
        total = 0
        async with raw_backends(connections) as backends:

            async def worker() -> None:
                nonlocal total
                for url in todo:
                    got = await drain(backends, url)  # not ``total += await ...``: it would read total first
                    total += got

            async with asyncio.TaskGroup() as group:
                for _ in range(min(connections, len(urls))):
                    group.create_task(worker())
        return total

    started = time.perf_counter()
    try:
        total = asyncio.run(download())
    except ExceptionGroup as group:  # raw reads do not retry: above a throttling store's limit they fail
        throttled, rest = group.split(wds.Throttled)
        if rest is not None or throttled is None:
            raise
        return {"connections": connections, "wall_s": time.perf_counter() - started, "mb_per_s": 0.0,
                "error": f"{len(throttled.exceptions)} requests throttled (raw reads do not retry)"}
    wall = time.perf_counter() - started
    return {"connections": connections, "wall_s": wall, "mb_per_s": total / wall / MB}


def run_scenario(sc: Scenario, root: Path, budget: int | None = None) -> dict[str, Any]:
    folder = root / f"{sc.shards}x{sc.shard_bytes}"
    make_shards(folder, n_shards=sc.shards, shard_bytes=sc.shard_bytes, sample_bytes=min(100 << 10, sc.shard_bytes // 8))
    with StoreProcess(folder, sc.knobs) as store:
        urls = [store.base_url + f"shard-{i:06d}.tar" for i in range(sc.shards)] * sc.repeat
        raw = {}
        for level in sc.levels:
            raw[level] = _raw(urls, level)
            print(f"  [{sc.name}] raw   {level:4d}: {raw[level]['mb_per_s']:7.1f} MB/s {raw[level].get('error', '')}",
                  file=sys.stderr, flush=True)
        fixed = {}
        for level in sc.levels:
            fixed[level] = _run(urls, level, 1, budget)[0]
            print(f"  [{sc.name}] fixed {level:4d}: {fixed[level]['mb_per_s']:7.1f} MB/s "
                  f"(throttled {fixed[level]['throttled']})", file=sys.stderr, flush=True)
        auto = _run(urls, "auto", sc.epochs, budget)
        for i, r in enumerate(auto):
            print(f"  [{sc.name}] auto epoch {i + 1}: {r['mb_per_s']:7.1f} MB/s at {r['concurrency']} "
                  f"({r['reason']})", file=sys.stderr, flush=True)
    best_level = max(fixed, key=lambda k: fixed[k]["mb_per_s"])
    best = fixed[best_level]["mb_per_s"]
    best_raw_level = max(raw, key=lambda k: raw[k]["mb_per_s"])
    best_raw = raw[best_raw_level]["mb_per_s"]
    return {"scenario": sc.name, "text": sc.text, "raw": raw, "best_raw": best_raw_level, "fixed": fixed, "auto": auto,
            "best_fixed": best_level, "ratios": [r["mb_per_s"] / best for r in auto],
            "raw_ratios": [r["mb_per_s"] / best_raw for r in auto]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default="a,b,c")
    parser.add_argument("--root", default="/tmp/wds-autotune-shards")
    parser.add_argument("--json", help="write every measurement here")
    parser.add_argument("--budget", type=parse_size, help="the loader's max_buffered_bytes (default: the library's)")
    args = parser.parse_args(argv)
    out = []
    for name in args.scenarios.split(","):
        out.append(run_scenario(SCENARIOS[name.strip()], Path(args.root), args.budget))
    print(f"{'scenario':<64} {'best raw':>14} {'best fixed':>14} {'auto MB/s':>10} {'auto/best':>9} {'auto/raw':>8}  "
          f"{'auto ends at'}")
    for r in out:
        best = r["fixed"][r["best_fixed"]]["mb_per_s"]
        best_raw = r["raw"][r["best_raw"]]["mb_per_s"]
        for i, (a, ratio, raw_ratio) in enumerate(zip(r["auto"], r["ratios"], r["raw_ratios"])):
            label = f"({r['scenario']}) {r['text']}" + (f" [epoch {i + 1}]" if len(r["auto"]) > 1 else "")
            late = ""
            if a["late_requests"]:
                late = f"; {a['late_throttled']}/{a['late_requests']} rejected after 5 s"
            print(f"{label:<64} {best_raw:8.1f} @{r['best_raw']:<4} {best:8.1f} @{r['best_fixed']:<4} "
                  f"{a['mb_per_s']:10.1f} {ratio:9.2f} {raw_ratio:8.2f}  "
                  f"{a['concurrency']} ({a['reason']}){late}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
