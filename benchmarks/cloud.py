"""The loader beside each store's own SDK (and s5cmd for S3), on local emulators or real endpoints.

    python -m benchmarks.cloud [--stores s3,gs,az] [--shards 8] [--shard-size 8MB] [-c 8]

For each store: upload the same synthetic shards, then in one run measure
* **wds-async**: ``WebDataset(urls, max_connections=c)`` iterated in this process;
* **SDK**: ``c`` threads each downloading whole objects with the store's SDK (boto3 ``get_object``,
  google-cloud-storage ``download_as_bytes``, azure-storage-blob ``download_blob``), the usual way to
  parallelise an SDK;
* **s5cmd** (S3, when the binary is installed): ``s5cmd --numworkers c cp`` of the same objects.

Endpoints come from the environment when set (``AWS_ENDPOINT_URL_S3``, ``STORAGE_EMULATOR_HOST``,
``AZURE_STORAGE_CONNECTION_STRING``: this is how docker/compose.yaml runs it against MinIO,
fake-gcs-server and Azurite); otherwise the local emulators are started on 127.0.0.1 (moto server,
gcp-storage-emulator, Azurite) and their process CPU is reported, which tells which side is the
bottleneck: these emulators are single-threaded Python or Node servers.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from benchmarks.make_shards import make_shards, parse_size
from emustore import emulators

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def _store_env(store: str) -> Iterator[str | None]:
    """Yield the emulator URL we started (None when the environment names a real endpoint)."""
    configured = {"s3": "AWS_ENDPOINT_URL_S3", "gs": "STORAGE_EMULATOR_HOST", "az": "AZURE_STORAGE_CONNECTION_STRING"}
    if os.environ.get(configured[store]):
        yield None
        return
    start = {"s3": emulators.moto_server, "gs": emulators.gcs_emulator, "az": emulators.azurite}[store]
    with start() as url:
        saved = dict(os.environ)
        if store == "s3":
            os.environ.update({**emulators.MOTO_ENV, "AWS_ENDPOINT_URL_S3": url})
        elif store == "gs":
            os.environ["STORAGE_EMULATOR_HOST"] = url
        else:
            os.environ["AZURE_STORAGE_CONNECTION_STRING"] = emulators.azurite_connection_string(url)
        try:
            yield url
        finally:
            os.environ.clear()
            os.environ.update(saved)


Setup = tuple[list[str], Callable[[], Callable[[str], bytes]], str]


def _s3(paths: list[Path]) -> Setup:
    import boto3

    client = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"])
    bucket = f"wds-bench-{uuid.uuid4().hex[:8]}"
    client.create_bucket(Bucket=bucket)
    for p in paths:
        client.upload_file(str(p), bucket, p.name)

    def downloader() -> Callable[[str], bytes]:  # a fresh client, built inside the timed phase
        reader = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL_S3"])
        return lambda name: reader.get_object(Bucket=bucket, Key=name)["Body"].read()

    return [f"s3://{bucket}/{p.name}" for p in paths], downloader, bucket


def _gs(paths: list[Path]) -> Setup:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="bench", credentials=AnonymousCredentials())
    bucket = client.create_bucket(f"wds-bench-{uuid.uuid4().hex[:8]}")
    for p in paths:
        bucket.blob(p.name).upload_from_filename(str(p))
    def downloader() -> Callable[[str], bytes]:
        reader = storage.Client(project="bench", credentials=AnonymousCredentials()).bucket(bucket.name)
        return lambda name: reader.blob(name).download_as_bytes()

    return [f"gs://{bucket.name}/{p.name}" for p in paths], downloader, bucket.name


def _az(paths: list[Path]) -> Setup:
    from azure.storage.blob import BlobServiceClient

    service = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
    container = service.create_container(f"wds-bench-{uuid.uuid4().hex[:8]}")
    for p in paths:
        with open(p, "rb") as fh:
            container.upload_blob(p.name, fh, overwrite=True)
    def downloader() -> Callable[[str], bytes]:
        reader = BlobServiceClient.from_connection_string(os.environ["AZURE_STORAGE_CONNECTION_STRING"])
        box = reader.get_container_client(container.container_name)
        return lambda name: box.download_blob(name, max_concurrency=1).readall()

    return [f"az://{container.container_name}/{p.name}" for p in paths], downloader, container.container_name


def _measure(fn: Callable[[], int], server_pid: int | None) -> dict[str, Any]:
    server = psutil.Process(server_pid) if server_pid else None
    s0 = sum(server.cpu_times()[:2]) if server else 0.0
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    c0, t0 = time.process_time(), time.perf_counter()
    nbytes = fn()
    wall = time.perf_counter() - t0
    children1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = time.process_time() - c0 + (children1.ru_utime - children0.ru_utime) + (children1.ru_stime - children0.ru_stime)
    row: dict[str, Any] = {"bytes": nbytes, "wall": wall, "mb_s": nbytes / wall / 1e6, "client_cpu": client}
    row["server_cpu"] = sum(server.cpu_times()[:2]) - s0 if server else None
    return row


def _bottleneck(row: dict[str, Any]) -> str:
    """The emulators are single-threaded; the loader's hot path is one event-loop thread and Python
    threads share one GIL, so ~one core busy on either side is saturation."""
    server = (row["server_cpu"] or 0.0) / row["wall"]
    client = row["client_cpu"] / row["wall"]
    if row["server_cpu"] is not None and server >= 0.8 and server >= client:
        return f"server: {100 * server:.0f}% of a core"
    if client >= 0.85:
        return f"client CPU: {100 * client:.0f}% of a core (server {100 * server:.0f}%)"
    return f"neither side's CPU (server {100 * server:.0f}%, client {100 * client:.0f}%): request latency"


def bench_store(store: str, paths: list[Path], connections: int) -> list[dict[str, Any]]:
    import wds_async as wds

    rows: list[dict[str, Any]] = []
    with _store_env(store) as emulator_url:
        pid = emulators.PIDS.get(emulator_url) if emulator_url else None
        urls, make_downloader, bucket = {"s3": _s3, "gs": _gs, "az": _az}[store](paths)

        def loader() -> int:
            ds = wds.WebDataset(urls, max_connections=connections, nodesplitter=None, workersplitter=None)
            if sum(1 for _ in ds) == 0:
                raise RuntimeError(f"no samples read from {store}")
            return int(ds.stats()["bytes_read"])

        def sdk() -> int:
            sdk_get = make_downloader()  # client creation counts, as it does for the loader
            with ThreadPoolExecutor(connections) as pool:
                return sum(len(b) for b in pool.map(sdk_get, [p.name for p in paths]))

        rows.append({"store": store, "client": f"wds-async ({connections} conns)", **_measure(loader, pid)})
        rows.append({"store": store, "client": f"SDK ({connections} threads)", **_measure(sdk, pid)})
        s5cmd = shutil.which("s5cmd") or str(Path(sys.executable).parent / "s5cmd")
        if store == "s3" and os.path.exists(s5cmd):
            def s5() -> int:
                with tempfile.TemporaryDirectory() as out:
                    subprocess.run([s5cmd, "--endpoint-url", os.environ["AWS_ENDPOINT_URL_S3"], "--numworkers",
                                    str(connections), "cp", f"s3://{bucket}/*", out + "/"], check=True,
                                   stdout=subprocess.DEVNULL)
                    return sum(f.stat().st_size for f in Path(out).iterdir())

            rows.append({"store": store, "client": f"s5cmd cp ({connections} workers)", **_measure(s5, pid)})
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = f"{'store':<6}{'client':<28}{'MB/s':>8}{'client CPU s/GB':>17}{'server CPU s/GB':>17}  bottleneck"
    lines = [head, "-" * (len(head) + 20)]
    for r in rows:
        gb = r["bytes"] / 1e9
        server = f"{r['server_cpu'] / gb:.1f}" if r["server_cpu"] is not None else "-"
        lines.append(f"{r['store']:<6}{r['client']:<28}{r['mb_s']:>8.1f}{r['client_cpu'] / gb:>17.1f}{server:>17}  "
                     f"{_bottleneck(r)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cloud", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="s3,gs,az")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--shard-size", default="8MiB")
    parser.add_argument("-c", "--connections", type=int, default=8)
    parser.add_argument("--dir", default=str(ROOT / ".bench" / "cloud-shards"))
    args = parser.parse_args(argv)
    paths = make_shards(args.dir, n_shards=args.shards, shard_bytes=parse_size(args.shard_size), sample_bytes=100 << 10)
    rows: list[dict[str, Any]] = []
    for store in args.stores.split(","):
        print(f"{store}: uploading {len(paths)} shards and measuring ...", flush=True)
        rows.extend(bench_store(store.strip(), paths, args.connections))
    print()
    print(format_rows(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
