"""Peer runner: MosaicML streaming (``mosaicml-streaming``) ``StreamingDataset`` over an MDS copy.

Run as ``PYTHON mosaic.py JOB.json`` with the ``loaders`` environment's interpreter (see ``_common``
for the job and the result). Two actions:

* ``prepare``: every sample of the tar shards in ``source_dir`` (WebDataset grouping: consecutive
  members sharing a key, the member name up to the first dot of its base name) becomes one MDS row:
  each field (``bin``, ``cls``, ``json``, ... by extension) as ``bytes``, plus the column ``__name__``
  (``SHARD/KEY``, a ``str``). ``MDSWriter`` writes shards of at most the tar shards' mean size, no
  compression (so the copy is about as many objects of about the same size as the tar shards), and
  uploads them itself (boto3, pointed at the store by ``S3_ENDPOINT_URL``); then the object
  ``DATASET/_wds_async_ready`` is put last.
* ``run``: one epoch of ``StreamingDataset(remote=DATASET, local=CACHE, shuffle=False)`` through a
  ``DataLoader``, counting samples and collecting ``__name__``; ``CACHE`` is a fresh folder in the
  job's workdir, so every run downloads the whole copy. ``mode`` ``defaults`` is the library's
  defaults with ``num_workers=0``; ``best`` is what its performance-tuning guide names (see
  :func:`_best`).

How it reaches the store: streaming's S3 downloader and uploader build a boto3 client with
``endpoint_url=os.environ.get("S3_ENDPOINT_URL")`` (``streaming/base/storage/download.py``,
``upload.py``), so the endpoint goes there; boto3 trusts ``AWS_CA_BUNDLE`` for https.
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

from _common import Timer, keys_digest, run, sample_name

NAME = "__name__"  # the column holding each sample's SHARD/KEY
MAX_WORKERS = 8
BATCH = 32  # samples per DataLoader batch, and StreamingDataset's batch_size (which it asks to match)
READY = "_wds_async_ready"


# -- shared with litdata_loader.py (each runner is one standalone script) ----------------------------

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


def stop_workers(iterator: Any) -> None:
    """Join a DataLoader iterator's workers now (their CPU is then counted), also after an error: ``run()``
    leaves with ``os._exit``, and a worker never told the iteration ended can hang the process group."""
    shutdown = getattr(iterator, "_shutdown_workers", None)  # absent without workers
    if shutdown is not None:
        shutdown()


def fresh_dir(job: dict[str, Any], name: str) -> str:
    path = os.path.join(job["workdir"], name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


# -- MosaicML streaming ---------------------------------------------------------------------------

def prepare(job: dict[str, Any]) -> dict[str, Any]:
    from streaming import MDSWriter

    paths = source_shards(job)
    exts = field_names(paths)
    size_limit = max(1 << 20, sum(os.path.getsize(p) for p in paths) // len(paths))
    local = fresh_dir(job, "mds")
    columns = {**{ext: "bytes" for ext in exts}, NAME: "str"}
    samples = 0
    with Timer() as t:
        with MDSWriter(out=(local, job["dataset"]), columns=columns, size_limit=size_limit,
                       keep_local=False, exist_ok=True,
                       max_workers=max(1, int(job.get("connections") or 8))) as writer:
            for path in paths:
                shard = os.path.basename(path)
                for key, fields in tar_samples(path):
                    row: dict[str, Any] = {ext: fields.get(ext, b"") for ext in exts}
                    row[NAME] = sample_name(shard, key)
                    writer.write(row)
                    samples += 1
        objects, bytes_up = _remote_objects(job)
        settings = (f"MDSWriter(columns={{{', '.join(exts)}: bytes, {NAME}: str}}, size_limit={size_limit} "
                    f"(the tar shards' mean size), compression=None) over {len(paths)} tar shards; "
                    f"{objects - 1} MDS shards and index.json, uploaded by streaming's S3Uploader (boto3)")
        put_ready(job, {"samples": samples, "bytes": bytes_up, "settings": settings})
    return {"bytes": bytes_up, "samples": samples, "seconds": t.seconds, "cpu_s": t.cpu_s, "settings": settings}


def _remote_objects(job: dict[str, Any]) -> tuple[int, int]:
    """How many objects the dataset has in the store, and their bytes."""
    bucket, prefix = split_s3(job["dataset"])
    count = total = 0
    for page in s3_client(job).get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for obj in page.get("Contents", []):
            if not obj["Key"].endswith("/" + READY):
                count, total = count + 1, total + int(obj["Size"])
    return count, total


def _index_bytes(cache: str) -> int:
    """Bytes of the copy's shard files, from the index.json the dataset fetched into ``cache``."""
    with open(os.path.join(cache, "index.json")) as fh:
        index = json.load(fh)
    total = 0
    for shard in index["shards"]:
        part = shard.get("zip_data") or shard["raw_data"]
        total += int(part["bytes"])
    return total


def _best(job: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The performance-tuning guide's lever for download throughput: more DataLoader workers ("increase
    the number of workers for your dataloader"), in its ``StreamingDataLoader``. Each worker downloads
    with its own thread, one shard at a time, so workers = min(connections, 8) is also the connections.
    ``predownload`` stays at its default (8 x batch_size samples per worker): with 8 workers that already
    reaches past this dataset's end, and raising it measured no faster (nor did 16 workers: this
    machine has 2 cores). Measured: 4 or 8 workers ~35 MB/s, 2 workers ~25 MB/s, 16 workers ~20 MB/s."""
    workers = max(1, min(int(job.get("connections") or MAX_WORKERS), MAX_WORKERS))
    settings = (f"StreamingDataset(remote, local, shuffle=False, batch_size={BATCH}, predownload default "
                f"{8 * BATCH}); StreamingDataLoader(batch_size={BATCH}, num_workers={workers} = min(connections "
                f"{job.get('connections')}, {MAX_WORKERS})); the index's boto3 client dropped before the "
                f"workers fork (else workers sharing its pooled connection stall for download_timeout)")
    return {}, {"num_workers": workers}, settings


def _unshare_clients(ds: Any) -> None:
    """Drop the boto3 client each stream's downloader kept from fetching ``index.json`` in this process.

    Forked DataLoader workers inherit it, pooled keep-alive connection included, and two workers
    reading responses off one socket stall until boto3's read timeout (``download_timeout``, 60 s by
    default), then retry: streaming 0.13 recreates the client only after pickling (spawn), not after a
    fork. Without a client each worker makes its own on its first download.
    """
    for stream in getattr(ds, "streams", []):
        downloader = getattr(stream, "_downloader", None)
        if downloader is not None:
            downloader.clean_up()


def measure(job: dict[str, Any]) -> dict[str, Any]:
    client_env(job)
    if job.get("action") == "prepare":
        return prepare(job)
    if not job.get("dataset"):
        raise ValueError("no dataset: run the prepare action first")
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()
    cache = fresh_dir(job, "cache")
    if job.get("mode", "defaults") == "defaults":
        ds = StreamingDataset(remote=job["dataset"], local=cache, shuffle=False, batch_size=BATCH)
        loader: Any = DataLoader(ds, batch_size=BATCH, num_workers=0)
        settings = (f"StreamingDataset(remote, local, shuffle=False, batch_size={BATCH}) with its defaults "
                    f"(predownload={8 * BATCH}); DataLoader(batch_size={BATCH}, num_workers=0)")
    else:
        ds_kw, dl_kw, settings = _best(job)
        ds = StreamingDataset(remote=job["dataset"], local=cache, shuffle=False, batch_size=BATCH, **ds_kw)
        _unshare_clients(ds)
        loader = StreamingDataLoader(ds, batch_size=BATCH, **dl_kw)
    names: list[str] = []
    with PeakConnections(job.get("endpoint")) as conns, Timer() as t:
        iterator = iter(loader)
        try:
            for batch in iterator:
                names.extend(batch[NAME])
        finally:
            stop_workers(iterator)
    return {"bytes": _index_bytes(cache), "samples": len(names), "seconds": t.seconds, "cpu_s": t.cpu_s,
            "keys_digest": keys_digest(names), "connections": conns.peak,
            "settings": f"{settings}; boto3 via S3_ENDPOINT_URL, one download_file (use_threads=False) at a time per "
                        f"process; at most {conns.peak} connections open at once"}


if __name__ == "__main__":
    run(measure)
