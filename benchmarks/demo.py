"""The main job on an embedded default: synthetic shards, the emulated store, ``wds-async bench``.

    python -m benchmarks.demo [--shards 32] [--shard-size 16MB] [--ttfb 0.05] [--bw 20e6] [-c 16]

Generates (or reuses) shards under ``.bench/shards``, serves them on 127.0.0.1 with 50 ms to first
byte and 20 MB/s per connection (a cloud bucket seen from one VM, scaled down), runs the benchmark
(raw parallel download, wds-async, and webdataset when installed) and stops the server. The server's
own CPU time is printed too: on a 2-core machine it competes with the loader being measured.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import psutil

from benchmarks.make_shards import make_shards, parse_size
from emustore import Knobs, StoreProcess
from wds_async.cli.bench.run import format_table, run_bench
from wds_async.urls import expand_urls

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=str(ROOT / ".bench" / "shards"), help="where shards are generated")
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--shard-size", default="16MiB")
    parser.add_argument("--sample-size", default="100KiB")
    parser.add_argument("--ttfb", type=float, default=0.05, help="seconds to first byte per request")
    parser.add_argument("--bw", type=float, default=20e6, help="bytes/s per connection")
    parser.add_argument("-c", "--connections", type=int, default=16)
    parser.add_argument("--no-webdataset", action="store_true", help="skip the webdataset comparison")
    parser.add_argument("--faults", default="drop_rate=0.05&fail_rate=0.05",
                        help="store knobs for the extra loader run under faults ('' to skip)")
    parser.add_argument("--json", help="write the rows as JSON here")
    args = parser.parse_args(argv)

    paths = make_shards(args.dir, n_shards=args.shards, shard_bytes=parse_size(args.shard_size),
                        sample_bytes=parse_size(args.sample_size))
    print(f"shards: {len(paths)} x {args.shard_size} in {args.dir}")
    with StoreProcess(args.dir, Knobs(ttfb=args.ttfb, bw=args.bw)) as store:
        server = psutil.Process(store.pid)
        cpu0 = sum(server.cpu_times()[:2])
        pattern = store.base_url + f"shard-{{000000..{args.shards - 1:06d}}}.tar"
        print(f"store: {store.base_url} ttfb={args.ttfb}s bw={args.bw / 1e6:.0f} MB/s per connection")
        print(f"bench: wds-async bench '{pattern}' -c {args.connections}"
              f"{'' if args.no_webdataset else ' --vs-webdataset'}", flush=True)
        rows = run_bench(expand_urls(pattern), connections=args.connections,
                         vs_webdataset=not args.no_webdataset, faults=args.faults or None)
        server_cpu = sum(server.cpu_times()[:2]) - cpu0
        counters = store.stats()
    print()
    print(format_table(rows))
    total_gb = sum(r["bytes"] for r in rows) / 1e9
    print(f"emulated store: {server_cpu:.1f} CPU s for {total_gb:.2f} GB served "
          f"({server_cpu / max(total_gb, 1e-9):.2f} s/GB), sharing the same 2 cores")
    if args.faults:
        # Each request draws its faults (with the defaults 5% a 503 and 5% a cut body), so a run may meet none (over
        # 32 shards about 1 run in 27) and "0 retries" would look like a loader that ignores them: say what was sent.
        print(f"faults the store injected: {counters.get('failed', 0)} answers 503, {counters.get('dropped', 0)} "
              "bodies cut short (all phases together; only the run under faults asks for them)")
    if args.json:
        import json

        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
