"""What the runners of loaders that read a converted copy share (``mosaic.py``, ``litdata_loader.py``):
pointing S3 clients at the store, reading the tar shards sample by sample for the conversion, marking
the copy ready, counting the connections a loader really holds, and stopping DataLoader workers.

Like ``_common``, a standalone module imported by path from the runners' folder; it never imports
``wds_async``.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any, Self

NAME = "__name__"  # the column holding each sample's SHARD/KEY
READY = "_wds_async_ready"


def client_env(job: dict[str, Any]) -> None:
    """Point every S3 client this process and its workers make at the job's store, trusting its CA."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "wds-async-bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "wds-async-bench")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    endpoint = job.get("endpoint")
    if endpoint:
        os.environ["S3_ENDPOINT_URL"] = endpoint  # what streaming reads
        os.environ["AWS_ENDPOINT_URL_S3"] = os.environ["AWS_ENDPOINT_URL"] = endpoint  # boto3's own
    ca = job.get("ca_file")
    if ca:
        for name in ("AWS_CA_BUNDLE", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
            os.environ[name] = ca


def split_s3(url: str) -> tuple[str, str]:
    """``s3://BUCKET/PREFIX`` -> (BUCKET, PREFIX without slashes at its ends)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ValueError(f"expected an s3://BUCKET/PREFIX dataset URL, got {url!r}")
    return parts.netloc, parts.path.strip("/")


def s3_client(job: dict[str, Any]) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=job.get("endpoint") or None, verify=job.get("ca_file") or None)


def source_shards(job: dict[str, Any]) -> list[str]:
    """The local tar shards to convert, in the order of the job's URLs."""
    folder = job["source_dir"]
    names = [u.rstrip("/").rsplit("/", 1)[-1] for u in job.get("urls") or []]
    if not names:
        names = sorted(n for n in os.listdir(folder) if n.endswith((".tar", ".tar.gz", ".tgz")))
    paths = [os.path.join(folder, n) for n in names]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing or not paths:
        raise FileNotFoundError(f"source shards missing in {folder}: {missing[:3] or '(none given)'}")
    return paths


def tar_samples(path: str) -> Iterator[tuple[str, dict[str, bytes]]]:
    """(KEY, {EXT: bytes}) per sample: consecutive regular members sharing a WebDataset key."""
    key: str | None = None
    fields: dict[str, bytes] = {}
    with tarfile.open(path, "r|*") as tar:
        for member in tar:
            if not member.isfile():
                continue
            folder, _, base = member.name.rpartition("/")
            stem, dot, ext = base.partition(".")
            if not dot:
                continue  # no extension: not part of any sample (WebDataset skips these too)
            this = f"{folder}/{stem}" if folder else stem
            if this != key:
                if key is not None:
                    yield key, fields
                key, fields = this, {}
            handle = tar.extractfile(member)
            fields[ext] = handle.read() if handle is not None else b""
    if key is not None:
        yield key, fields


def field_names(paths: list[str]) -> list[str]:
    """Every extension in the shards (a sample lacking one gets ``b""`` there), from the headers only."""
    exts: set[str] = set()
    for path in paths:
        with tarfile.open(path, "r|*") as tar:
            for member in tar:
                base = member.name.rpartition("/")[2]
                if member.isfile() and "." in base:
                    exts.add(base.partition(".")[2])
    if NAME in exts:
        raise ValueError(f"the shards have a field named {NAME!r}, the column this runner keeps names in")
    return sorted(exts)


def put_ready(job: dict[str, Any], detail: dict[str, Any]) -> None:
    bucket, prefix = split_s3(job["dataset"])
    s3_client(job).put_object(Bucket=bucket, Key=f"{prefix}/{READY}", Body=json.dumps(detail).encode())


class PeakConnections:
    """The most TCP connections open to the store at once on this host during a ``with`` block.

    Sampled every 20 ms from ``/proc/net/tcp`` and ``tcp6``: established sockets whose remote port is the
    endpoint's (the store runs on this host; idle pooled connections count too). ``peak`` stays ``None``
    without an endpoint or ``/proc``.
    """

    def __init__(self, endpoint: str | None) -> None:
        self.port = urllib.parse.urlsplit(endpoint).port if endpoint else None
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-connections", daemon=True)

    def __enter__(self) -> Self:
        if self.port is not None and os.path.exists("/proc/net/tcp"):
            self.peak = 0
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _count(self) -> int:
        port = f":{self.port:04X}"
        n = 0
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                with open(table) as fh:
                    next(fh)
                    for line in fh:
                        cols = line.split()
                        n += cols[2].endswith(port) and cols[3] == "01"  # remote port, ESTABLISHED
            except OSError:
                pass
        return n

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak or 0, self._count())
            if self._stop.wait(0.02):
                return


def fresh_dir(job: dict[str, Any], name: str) -> str:
    path = os.path.join(job["workdir"], name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path
