"""wds-async beside the tools users would pick instead, on one throttled emulated store, http and https.

    python -m benchmarks.peers [--scenarios a,b] [--protocols http,https] [--peers all] [-c 16]

Scenarios (issue 10's targets), each a fresh store process with these server-wide knobs, so every
client (ours and each peer's own) sees the same latency and the same per-connection bandwidth:

* **a**: 50 ms to first byte, 20 MB/s per connection, 16 MB shards;
* **b**: 200 ms to first byte, 10 MB/s per connection, 1 MB shards.

The shards live in the bucket ``bench`` of the store (the folder ``DIR/bench``) and are read as
``s3://bench/...`` by wds-async and the S3 peers, as ``gs://bench/...`` by gsutil, as path-style http
URLs by webdataset (``--gs``: wds-async's own rows read ``gs://bench/...`` too, the report gsutil users
compare with). For each scenario and protocol this runs ``wds-async bench --peers`` (see
:mod:`wds_async.cli.bench.run`) and writes ``OUT/peers-SCENARIO-PROTO.json`` and ``.png``, then prints every
table and the store's own CPU seconds per GB served (it shares the machine's cores with the client
being measured, so a store near a full core would be a bottleneck: the figure shows it is not).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.make_shards import make_shards, parse_size
from emustore import Knobs, StoreProcess
from wds_async.cli.bench.peers import peer_names
from wds_async.cli.bench.peers._report import add_ratios, format_peers_table, plot_peers
from wds_async.cli.bench.run import run_bench

ROOT = Path(__file__).resolve().parent.parent
BUCKET = "bench"

SCENARIOS: dict[str, dict[str, Any]] = {
    "a": {"ttfb": 0.05, "bw": 20e6, "shard_size": "16MiB", "shards": 64, "sample_size": "100KiB",
          "title": "(a) 50 ms, 20 MB/s per connection, 16 MB shards"},
    "b": {"ttfb": 0.2, "bw": 10e6, "shard_size": "1MiB", "shards": 256, "sample_size": "100KiB",
          "title": "(b) 200 ms, 10 MB/s per connection, 1 MB shards"},
}


def _shards(root: Path, name: str, spec: dict[str, Any], n_shards: int) -> list[str]:
    folder = root / BUCKET / f"peers-{name}"
    paths = make_shards(str(folder), n_shards=n_shards, shard_bytes=parse_size(spec["shard_size"]),
                        sample_bytes=parse_size(spec["sample_size"]))
    return [f"s3://{BUCKET}/peers-{name}/{Path(p).name}" for p in paths]


def run_one(root: Path, name: str, proto: str, peers: list[str], connections: int, n_shards: int,
            out: Path, timeout: float, gs: bool = False) -> tuple[list[dict[str, Any]], str]:
    spec = SCENARIOS[name]
    urls = _shards(root, name, spec, n_shards)
    with StoreProcess(root, Knobs(ttfb=spec["ttfb"], bw=spec["bw"]), https=proto == "https") as store:
        endpoint = store.base_url.rstrip("/")
        ca_file = store.ca_file if proto == "https" else None
        saved = dict(os.environ)
        os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "wds-async-bench")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "wds-async-bench")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        if ca_file:
            os.environ["SSL_CERT_FILE"] = ca_file
        if gs:  # our rows read the same objects through the GCS backend, on the store's GCS JSON face
            os.environ["STORAGE_EMULATOR_HOST"] = endpoint
        try:
            before = store.stats()
            if gs:
                own = run_bench([u.replace("s3://", "gs://", 1) for u in urls], connections=connections,
                                timeout=timeout)
                for row in own:
                    row["name"] = f"{row['name']} over gs://"
                rows = own + [r for r in run_bench(urls, connections=connections, peers=peers, endpoint=endpoint,
                                                   ca_file=ca_file, timeout=timeout, autotune=False)
                              if r.get("peer") not in ("wds-async", "raw")]
                add_ratios(rows)
            else:
                rows = run_bench(urls, connections=connections, peers=peers, endpoint=endpoint, ca_file=ca_file,
                                 timeout=timeout)
            after = store.stats()
        finally:
            os.environ.clear()
            os.environ.update(saved)
    served = after["bytes_sent"] - before["bytes_sent"]
    store_cpu = after.get("cpu_s", 0.0) - before.get("cpu_s", 0.0)
    title = f"{spec['title']}, {proto}, {len(urls)} shards, {connections} connections"
    table = format_peers_table(rows, connections)
    table += (f"\nemulated store: {store_cpu:.1f} CPU s for {served / 1e9:.2f} GB served "
              f"({store_cpu / max(served / 1e9, 1e-9):.2f} s/GB)")
    stem = out / f"peers-{name}-{proto}"
    stem.with_suffix(".json").write_text(json.dumps({"title": title, "rows": rows, "store_cpu_s": store_cpu,
                                                    "store_bytes": served}, indent=2, default=str))
    plot_peers(rows, str(stem.with_suffix(".png")), title)
    return rows, f"## {title}\n\n{table}\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=str(ROOT / ".bench" / "store"), help="the store's root folder")
    parser.add_argument("--scenarios", default="a,b")
    parser.add_argument("--protocols", default="http,https")
    parser.add_argument("--peers", default="all")
    parser.add_argument("-c", "--connections", type=int, default=16)
    parser.add_argument("--shards", type=int, default=None, help="override the scenario's shard count")
    parser.add_argument("--out", default=str(ROOT / ".bench" / "peers"), help="JSON and PNG files go here")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one phase or peer run may take")
    parser.add_argument("--gs", action="store_true",
                        help="wds-async's own rows read gs:// (the GCS backend on the store's GCS JSON face), in the same "
                             "store run as the peers (use with --peers gsutil --protocols https)")
    args = parser.parse_args(argv)
    peers = peer_names(args.peers)
    root, out = Path(args.dir), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reports = []
    for name in args.scenarios.split(","):
        for proto in args.protocols.split(","):
            n = args.shards or SCENARIOS[name]["shards"]
            _, text = run_one(root, name, proto, peers, args.connections, n, out, args.timeout, args.gs)
            print(text, flush=True)
            reports.append(text)
    (out / "peers.md").write_text("\n".join(reports))
    print(f"written: {out}/peers.md and peers-*.json/png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
