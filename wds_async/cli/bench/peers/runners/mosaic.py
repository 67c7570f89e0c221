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
from typing import Any

from _common import Timer, epoch_names, keys_digest, run, sample_name
from _convert import (
    NAME,
    READY,
    PeakConnections,
    client_env,
    field_names,
    fresh_dir,
    put_ready,
    s3_client,
    source_shards,
    split_s3,
    tar_samples,
)

MAX_WORKERS = 8
BATCH = 32  # samples per DataLoader batch, and StreamingDataset's batch_size (which it asks to match)


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
    with PeakConnections(job.get("endpoint")) as conns, Timer() as t:
        names = epoch_names(loader, lambda batch: batch[NAME])
    return {"bytes": _index_bytes(cache), "samples": len(names), "seconds": t.seconds, "cpu_s": t.cpu_s,
            "keys_digest": keys_digest(names), "connections": conns.peak,
            "settings": f"{settings}; boto3 via S3_ENDPOINT_URL, one download_file (use_threads=False) at a time per "
                        f"process; at most {conns.peak} connections open at once"}


if __name__ == "__main__":
    run(measure)
