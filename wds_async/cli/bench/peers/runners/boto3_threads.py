"""Peer runner: boto3 on C threads (C = the job's connections), each shard downloaded once.

(Not named ``boto3.py``: a script's folder comes first on ``sys.path``, so that file would be imported
in place of the boto3 package.)

Modes, over one shared ``boto3.client("s3")`` (thread-safe) and a pool of C threads, one object per task:

* ``defaults``: ``s3.download_file(BUCKET, KEY, FILE)`` with boto3's default ``TransferConfig`` (8 MiB
  threshold and parts, up to 10 part threads per object, so an object over 8 MiB is several ranged GETs
  at once and the connections exceed C) and botocore's default client ``Config`` (a pool of 10
  connections) — what a user writes first. Files go to the job's workdir.
* ``best``: ``s3.download_fileobj(BUCKET, KEY, SINK, Config=TransferConfig(max_concurrency=1,
  use_threads=False, multipart_threshold=LARGER_THAN_ANY_SHARD))`` into a null sink that counts bytes
  per object: one GET per object on its own thread, exactly C transfers at a time, a pool of C
  connections, no file writes.

Before the clock starts, ``list_objects_v2`` gives each object's size; afterwards every object must
have arrived whole, or the run is an error. With https the client verifies with ``verify=ca_file``.
"""

from __future__ import annotations

import os
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

try:  # run as a script (its folder is first on sys.path), or imported as part of the package
    from _common import Timer, filesystem, run
except ImportError:
    from ._common import Timer, filesystem, run

INSTALL = "pip install boto3"


def split(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or not parts.path.strip("/"):
        raise ValueError(f"not an s3://BUCKET/KEY URL: {url}")
    return parts.netloc, parts.path.lstrip("/")


def sizes(client: Any, urls: list[str]) -> dict[str, int]:
    """Every object's size, listed folder by folder (unmeasured); a missing object is an error."""
    wanted = set(urls)
    found: dict[str, int] = {}
    folders = sorted({split(url)[0] + "\0" + split(url)[1].rpartition("/")[0] for url in urls})
    for folder in folders:
        bucket, prefix = folder.split("\0")
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket,
                                                                  Prefix=prefix + "/" if prefix else "")
        for page in pages:
            for obj in page.get("Contents", []):
                url = f"s3://{bucket}/{obj['Key']}"
                if url in wanted:
                    found[url] = int(obj["Size"])
    missing = [u for u in urls if u not in found]
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(urls)} objects are not in the store, e.g. {missing[0]}")
    return found


class CountingSink:
    """A write-only file object that keeps nothing and counts what it was given."""

    def __init__(self) -> None:
        self.bytes = 0

    def write(self, data: bytes) -> int:
        n = len(data)
        self.bytes += n
        return n

    def seekable(self) -> bool:
        return False

    def flush(self) -> None:
        pass


def measure(job: dict[str, Any]) -> dict[str, Any]:
    try:
        import boto3
        import botocore
        from boto3.s3.transfer import TransferConfig
        from botocore.config import Config
    except ImportError as exc:
        raise RuntimeError(f"boto3 is not installed ({exc}): {INSTALL}") from None
    urls: list[str] = list(job["urls"])
    if len(set(urls)) != len(urls):
        raise ValueError("the job names a shard twice")
    mode = job.get("mode", "defaults")
    if mode not in ("defaults", "best"):
        raise ValueError(f"unknown mode {mode!r}")
    connections = int(job["connections"])
    ca_file = job.get("ca_file")
    endpoint = job.get("endpoint")
    os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")  # never probe 169.254.169.254
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "wds-async-bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "wds-async-bench")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"

    config = Config() if mode == "defaults" else Config(max_pool_connections=max(10, connections))
    client = boto3.client("s3", endpoint_url=endpoint or None, region_name=region,
                          verify=ca_file if ca_file else None, config=config)
    want = sizes(client, urls)
    work = Path(job["workdir"])

    got: dict[str, int] = {}
    lock = threading.Lock()
    if mode == "defaults":
        targets = {url: work / "data" / split(url)[0] / split(url)[1] for url in urls}
        for target in targets.values():
            target.parent.mkdir(parents=True, exist_ok=True)

        def one(url: str) -> None:
            bucket, key = split(url)
            client.download_file(bucket, key, str(targets[url]))

        transfer = TransferConfig()
    else:
        transfer = TransferConfig(max_concurrency=1, use_threads=False,
                                  multipart_threshold=max(want.values()) + 1)

        def one(url: str) -> None:
            bucket, key = split(url)
            sink = CountingSink()
            client.download_fileobj(bucket, key, sink, Config=transfer)
            with lock:
                got[url] = sink.bytes

    with ThreadPoolExecutor(max_workers=connections, thread_name_prefix="boto3-peer") as pool, Timer() as timer:
        for future in [pool.submit(one, url) for url in urls]:
            future.result()

    if mode == "defaults":
        for url, target in targets.items():
            got[url] = target.stat().st_size if target.exists() else -1
    for url in urls:
        if got.get(url, -1) != want[url]:
            raise RuntimeError(f"{url}: got {got.get(url, 'nothing')} bytes, the object has {want[url]}")
    total = sum(got.values())
    expected = (job.get("expected") or {}).get("bytes")
    if expected is not None and total != expected:
        raise RuntimeError(f"moved {total} bytes, the job expects {expected}")

    tls = "https, verify=ca_file" if ca_file else ("https" if str(endpoint or "https").startswith("https") else "http")
    versions = f"boto3 {boto3.__version__}/botocore {botocore.__version__}"
    if mode == "defaults":
        largest = max(want.values())
        parts = -(-largest // transfer.multipart_chunksize) if largest >= transfer.multipart_threshold else 1
        per_object = min(parts, transfer.max_request_concurrency)
        settings = (f"{versions}: download_file on {connections} threads, default TransferConfig "
                    f"({transfer.multipart_chunksize >> 20} MiB ranged parts, up to "
                    f"{transfer.max_request_concurrency} at once per object: up to "
                    f"{connections * per_object} connections here), default pool of 10 connections; {tls}; "
                    f"files to {filesystem(str(work))}")
    else:
        settings = (f"{versions}: download_fileobj on {connections} threads, TransferConfig(max_concurrency=1, "
                    f"use_threads=False, one GET per object), max_pool_connections={max(10, connections)}; "
                    f"{tls}; into a counting null sink (no files)")
    opened = connections * per_object if mode == "defaults" else connections
    return {"bytes": total, "samples": None, "seconds": timer.seconds, "cpu_s": timer.cpu_s,
            "settings": settings, "connections": opened}


if __name__ == "__main__":
    run(measure)
