"""webdataset's order (the default) against interleaving shards as they arrive, on the same emulated store.

    python -m benchmarks.order                  # the three stores below, each mode in a fresh process
    python -m benchmarks.order --rounds 3       # alternate the modes three times, report the medians

The default delivers samples shard by shard in shard-list order, as webdataset does, while downloads still run
in parallel: the shards after the one being delivered fill the byte budget and wait. ``deterministic=False``
delivers whatever is ready. The cost of the default is the time the consumer waits for the shard at the head
while later shards are ready, which matters most when one shard is much slower than the others:

* ``a``: 16 x 16 MiB shards, 50 ms to first byte, 20 MB/s per connection (large shards, long streams);
* ``b``: 256 x 1 MiB shards, 200 ms to first byte, 10 MB/s per connection (many small, high-latency shards);
* ``c``: 64 x 4 MiB shards, 50 ms and 20 MB/s, but one shard in ten served at 2 MB/s (10x slower);
* ``d``: the demo's store, 32 x 16 MiB at 50 ms and 20 MB/s: twice the default 256 MiB byte budget.

Each run is a fresh subprocess iterating ``WebDataset(urls)`` with default settings (autotuned connections,
256 MiB budget), once with the default order and once with ``deterministic=False``, alternating. Reported per
store: wall seconds, MB/s and consumer wait of each, and the ratio default/interleaved of the wall time
(> 1: the default is slower). No assertions: figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess

CHILD = r"""
import json, sys, time
import wds_async as wds
urls, options = json.loads(sys.argv[1])
ds = wds.WebDataset(urls, nodesplitter=None, workersplitter=None, **options)
started = time.perf_counter()
keys = [s["__key__"] for s in ds]
wall = time.perf_counter() - started
st = ds.stats()
print(json.dumps({"samples": len(keys), "wall_s": wall, "mb_s": st["bytes_read"] / wall / 1e6,
                  "wait_s": st["wait_s"], "in_order": keys == sorted(keys)}))
"""

#: name -> (shards, shard MiB, sample KiB, ttfb s, bytes/s per connection, every how many shards one is slow)
STORES: dict[str, tuple[int, int, int, float, float, int | None]] = {
    "a": (16, 16, 100, 0.05, 20e6, None),
    "b": (256, 1, 100, 0.2, 10e6, None),
    "c": (64, 4, 100, 0.05, 20e6, 10),
    "d": (32, 16, 100, 0.05, 20e6, None),
}


def _run(urls: list[str], options: dict[str, object]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([urls, options])], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).resolve().parents[1])
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _urls(store: StoreProcess, n: int, slow_every: int | None, bw: float) -> list[str]:
    urls = []
    for i in range(n):
        name = f"shard-{i:06d}.tar"
        slow = slow_every is not None and i % slow_every == slow_every // 2
        urls.append(store.url(name, bw=bw / 10) if slow else store.url(name))
    return urls


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stores", default="a,b,c,d", help="which of a, b, c, d (comma-separated)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each mode per store (medians reported)")
    p.add_argument("--root", default=".bench/order", help="where the synthetic shards are kept")
    args = p.parse_args(argv)
    rows = []
    for name in args.stores.split(","):
        n, mib, kib, ttfb, bw, slow_every = STORES[name]
        root = Path(args.root) / name
        make_shards(root, n_shards=n, shard_bytes=mib << 20, sample_bytes=kib << 10, seed=11)
        with StoreProcess(root, Knobs(ttfb=ttfb, bw=bw)) as store:
            urls = _urls(store, n, slow_every, bw)
            runs: dict[str, list[dict[str, float]]] = {"default": [], "interleaved": []}
            for _ in range(args.rounds):
                runs["default"].append(_run(urls, {}))
                runs["interleaved"].append(_run(urls, {"deterministic": False}))
        med = {mode: {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "mb_s", "wait_s")}
               for mode, rs in runs.items()}
        ordered = all(r["in_order"] for r in runs["default"])
        rows.append((name, n, mib, ttfb, bw, slow_every, med, ordered))
    print("store                                         mode          wall s    MB/s  wait s  default/interleaved")
    for name, n, mib, ttfb, bw, slow_every, med, ordered in rows:
        what = f"{name}: {n} x {mib} MiB, {ttfb * 1000:.0f} ms, {bw / 1e6:.0f} MB/s" + (
            f", 1 in {slow_every} at {bw / 10e6:.0f} MB/s" if slow_every else "")
        ratio = med["default"]["wall_s"] / med["interleaved"]["wall_s"]
        for mode in ("default", "interleaved"):
            m = med[mode]
            tail = f"{ratio:>8.2f}" if mode == "default" else ""
            print(f"{what:<45} {mode:<12} {m['wall_s']:>7.2f} {m['mb_s']:>7.1f} {m['wait_s']:>7.2f}  {tail}")
            what = ""
        if not ordered:
            print(f"  ({name}: the default run did NOT deliver in shard order)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
