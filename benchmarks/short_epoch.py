"""A short first epoch of many small, high-latency shards, through the settings a user can choose, beside raw.

    python -m benchmarks.short_epoch                  # 2 rounds, best of each
    python -m benchmarks.short_epoch --rounds 3 --only default "start 128"

The store and the shards of the autotuner's scenario (b) (``benchmarks.autotune``): 256 shards of 1 MiB, 200 ms to
first byte and 10 MB/s per connection, one pass in shard-list order, as an evaluation pass or a small fine-tuning
set reads them, and as the first seconds of every job look. Every phase is a fresh interpreter (a process's first
epoch: a fresh engine, and memory the process has not touched yet), its imports made before the clock:

* ``raw 256``: 256 concurrent streaming GETs through the loader's own backend, bytes thrown away (the ``gsutil -m``
  analog at its best level for this store, one request per shard);
* ``default``: ``WebDataset(urls)`` with the library's defaults (autotuned, starting at 32, webdataset's order,
  a 256 MiB byte budget);
* ``start 128``: ``config=EngineConfig(start_connections=128)``: the first wave is half the list;
* ``arrival order, start 128``: the same with ``deterministic=False`` (samples as they arrive);
* ``512 MiB, start 256``: ``max_buffered_bytes=512 MiB`` and ``start_connections=256``: the whole list in one wave
  (a 256 MiB budget holds at most 204 open streams, and in shard-list order every shard but the first waits whole in
  the budget until the consumer reaches it);
* ``fixed 128``: ``max_connections=128``.

Reported per setting: the wall time of each round, the best MB/s and its ratio to the best raw round, the CPU
seconds of that round's process (user and system, all its threads; the store's are its own), where the concurrency
ended, the most bytes the budget held and the peak RSS. No assertions: figures (see docs/tuning.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess

SHARDS, SHARD_BYTES, SAMPLE_BYTES = 256, 1 << 20, 100 << 10  # the shards of benchmarks.autotune (b)
KNOBS = Knobs(ttfb=0.2, bw=10e6)
RAW_LEVEL = 256

#: setting -> the options of its phase: WebDataset keywords, and EngineConfig fields under "config"
SETTINGS: dict[str, dict[str, Any]] = {
    "raw 256": {"raw": RAW_LEVEL},
    "default": {},
    "start 128": {"config": {"start_connections": 128}},
    "arrival order, start 128": {"deterministic": False, "config": {"start_connections": 128}},
    "512 MiB, start 256": {"max_buffered_bytes": 512 << 20, "config": {"start_connections": 256}},
    "fixed 128": {"max_connections": 128},
}


def _phase(urls: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """One setting in this (fresh) process: the imports first, then the clock around one pass."""
    import asyncio
    import resource
    import time

    import wds_async as wds
    from wds_async.io.rawread import drain, raw_backends
    from wds_async.io.registry import BackendSet

    BackendSet(wds.EngineConfig()).for_url(urls[0])  # the http backend's modules, imported as WebDataset does
    _ = wds.WebDataset  # resolved lazily (its module imports torch): not in the clock
    level = options.pop("raw", None)
    if level is not None:
        async def download() -> int:
            todo, total = iter(urls), 0
            async with raw_backends(level) as backends:

                async def worker() -> None:
                    nonlocal total
                    for url in todo:
                        got = await drain(backends, url)
                        total += got

                async with asyncio.TaskGroup() as group:
                    for _ in range(min(level, len(urls))):
                        group.create_task(worker())
            return total

        started, cpu0 = time.perf_counter(), time.process_time()
        total = asyncio.run(download())
        return {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu0, "bytes": total}
    config = wds.EngineConfig(**options.pop("config", {}))
    ds = wds.WebDataset(urls, nodesplitter=None, workersplitter=None, config=config, **options)
    started, cpu0 = time.perf_counter(), time.process_time()
    samples = sum(1 for _ in ds)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    s = ds.stats()
    return {"wall_s": wall, "cpu_s": cpu, "bytes": s["bytes_read"], "samples": samples, "concurrency": s["concurrency"],
            "peak_buffered": s["peak_buffered_bytes"],
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10}


def _run(urls: list[str], options: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.short_epoch", "--phase", json.dumps([urls, options])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(Path(__file__).resolve().parent.parent),
                          timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"phase {options} failed:\n{proc.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="settings to run besides raw (default: all)")
    parser.add_argument("--root", default="/tmp/wds-autotune-shards", help="where the shards are made (reused)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        urls, options = json.loads(args.phase)
        print(json.dumps(_phase(urls, options)))
        return 0
    unknown = set(args.only or ()) - set(SETTINGS)
    if unknown:
        parser.error(f"unknown settings {sorted(unknown)}; choose from {list(SETTINGS)}")
    chosen = {k: v for k, v in SETTINGS.items() if k == "raw 256" or not args.only or k in args.only}
    folder = Path(args.root) / f"{SHARDS}x{SHARD_BYTES}"
    make_shards(folder, n_shards=SHARDS, shard_bytes=SHARD_BYTES, sample_bytes=SAMPLE_BYTES)
    rows: dict[str, list[dict[str, Any]]] = {k: [] for k in chosen}
    with StoreProcess(folder, KNOBS) as store:
        urls = [store.base_url + f"shard-{i:06d}.tar" for i in range(SHARDS)]
        print(f"{SHARDS} shards x {SHARD_BYTES >> 20} MiB, {KNOBS.ttfb * 1e3:.0f} ms to first byte, "
              f"{KNOBS.bw / 1e6:.0f} MB/s per connection; one pass, each phase a fresh process", flush=True)
        for _ in range(args.rounds):  # settings interleaved, so that a busy moment of the machine hits all of them
            for name, options in chosen.items():
                rows[name].append(_run(urls, json.loads(json.dumps(options))))
    raw_best = min(r["wall_s"] for r in rows["raw 256"])
    print(f"{'setting':<26}{'seconds per round':>22}{'best MB/s':>11}{'/ raw':>7}{'CPU s':>7}{'ends at':>9}"
          f"{'peak buffered':>15}{'peak RSS':>10}")
    for name, runs in rows.items():
        walls = [r["wall_s"] for r in runs]
        best = min(runs, key=lambda r: r["wall_s"])
        extra = ""
        if "concurrency" in best:
            extra = (f"{best['concurrency']:>9}{max(r['peak_buffered'] for r in runs) / 2**20:>11.0f} MiB"
                     f"{max(r['peak_rss'] for r in runs) / 1e6:>7.0f} MB")
        print(f"{name:<26}{' '.join(f'{w:.3f}' for w in walls):>22}{best['bytes'] / best['wall_s'] / 1e6:>11.0f}"
              f"{raw_best / best['wall_s']:>7.2f}{best['cpu_s']:>7.2f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
