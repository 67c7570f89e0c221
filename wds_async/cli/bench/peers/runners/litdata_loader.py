"""Peer runner: litdata's ``StreamingDataset`` over an ``optimize()``d copy of the shards.

Run as ``PYTHON litdata_loader.py JOB.json`` with the ``loaders`` environment's interpreter (see
``_common`` for the job and the result). Not ``litdata.py``: this script's folder comes first on
``sys.path`` and that name would shadow the package. Two actions:

* ``prepare``: ``optimize()`` turns every sample of the tar shards in ``source_dir`` (grouped as in
  WebDataset, see ``mosaic.tar_samples``) into one item ``{EXT: bytes, ..., "__name__": "SHARD/KEY"}``,
  in chunks of at most the tar shards' mean size (``chunk_bytes``; litdata's default is 64 MB), so about
  as many objects of about the same size as the tar shards, uncompressed, and uploads them itself to
  ``dataset``; then ``DATASET/_wds_async_ready`` is put last.
* ``run``: one epoch of ``StreamingDataset(DATASET, cache_dir=CACHE)`` through a DataLoader, counting
  items and collecting ``__name__``; ``CACHE`` is a fresh folder in the job's workdir, so every run
  downloads the whole copy. ``defaults``: the library's defaults and ``DataLoader(num_workers=0)``;
  ``best``: what its README names for throughput (see :func:`_best`).

How it reaches the store: litdata documents ``storage_options={"endpoint_url": ...}`` for S3-compatible
stores; its boto3 client (``index.json``, and chunks where obstore is not usable) takes it, and the obstore
``S3Store`` it prefers for chunk GETs and uploads is built from that client's endpoint (path-style).
boto3 trusts ``AWS_CA_BUNDLE`` for https; obstore (Rust: reqwest + rustls) trusts ``SSL_CERT_FILE``.
Over plain http obstore fails ("HTTP error: builder error": object_store allows http only with the
client option ``allow_http``, which litdata neither sets nor exposes, and obstore reads no environment
variable for it), so for an http endpoint this runner adds ``allow_http`` to litdata's obstore client
options, and says so in ``settings``. Which client fetched the chunks is found out (a marker file from
each process where litdata starts obstore) and said there too, with the most connections open at once.

Bytes fields come back from litdata as ``memoryview``s, which neither ``default_collate`` nor a worker's
pickling can take: both modes collate with :func:`collate`.
"""

from __future__ import annotations

import functools
import glob
import json
import os
from typing import Any

from _common import Timer, epoch_names, keys_digest, run, sample_name
from _convert import (
    NAME,
    PeakConnections,
    client_env,
    field_names,
    fresh_dir,
    put_ready,
    source_shards,
    tar_samples,
)

_HTTP_NOTE = " (+ allow_http added to litdata's obstore client options: it exposes none for plain http)"
BATCH = 32  # items per DataLoader batch (the same as the mosaic runner's)
os.environ.setdefault("LITDATA_DISABLE_VERSION_CHECK", "1")  # it would ask PyPI for a newer release


def _env(job: dict[str, Any]) -> dict[str, Any]:
    """Point boto3 and obstore at the store; litdata's ``storage_options`` for it."""
    client_env(job)
    for name in ("DATA_OPTIMIZER_CACHE_FOLDER", "DATA_OPTIMIZER_DATA_CACHE_FOLDER"):  # else /tmp/chunks...
        os.environ[name] = os.path.join(job["workdir"], name.lower())
    endpoint = job.get("endpoint")
    if not endpoint:
        return {}
    if endpoint.startswith("http://"):
        # object_store refuses plain http unless the client option allow_http is set; litdata builds its
        # S3Store with fixed client options (and obstore reads no AWS_ALLOW_HTTP for those), so add it there.
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS["allow_http"] = True
    return {"endpoint_url": endpoint}


def _convert(path: str, exts: tuple[str, ...]) -> Any:
    """``optimize``'s function (given ``exts`` by ``functools.partial``): one shard's samples as items."""
    shard = os.path.basename(path)
    for key, fields in tar_samples(path):
        item: dict[str, Any] = {ext: fields.get(ext, b"") for ext in exts}
        item[NAME] = sample_name(shard, key)
        yield item


def prepare(job: dict[str, Any]) -> dict[str, Any]:
    from litdata import optimize

    storage_options = _env(job)
    paths = source_shards(job)
    convert = functools.partial(_convert, exts=tuple(field_names(paths)))  # pickled to optimize's workers
    chunk_bytes = max(1 << 20, sum(os.path.getsize(p) for p in paths) // len(paths))
    with Timer() as t:
        optimize(fn=convert, inputs=paths, output_dir=job["dataset"], chunk_bytes=chunk_bytes,
                 storage_options=storage_options, mode="overwrite")
        info = _remote_index(job)
        settings = (f"optimize(chunk_bytes={chunk_bytes} (the tar shards' mean size), compression=None, "
                    f"num_workers=its default, mode='overwrite') over "
                    f"{len(paths)} tar shards; {info['chunks']} chunks, uploaded by litdata itself (obstore)"
                    f"{_HTTP_NOTE if str(job.get('endpoint')).startswith('http://') else ''}")
        put_ready(job, {"samples": info["samples"], "bytes": info["bytes"], "settings": settings})
    return {"bytes": info["bytes"], "samples": info["samples"], "seconds": t.seconds, "cpu_s": t.cpu_s,
            "settings": settings}


def _remote_index(job: dict[str, Any]) -> dict[str, int]:
    from mosaic import s3_client, split_s3

    bucket, prefix = split_s3(job["dataset"])
    body = s3_client(job).get_object(Bucket=bucket, Key=f"{prefix}/index.json")["Body"].read()
    return _index_totals(json.loads(body))


def _index_totals(index: dict[str, Any]) -> dict[str, int]:
    chunks = index["chunks"]
    return {"chunks": len(chunks), "samples": sum(int(c["chunk_size"]) for c in chunks),
            "bytes": sum(int(c["chunk_bytes"]) for c in chunks)}


def collate(items: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """A batch as ``{field: [values]}``, each ``bytes`` field as ``bytes``.

    litdata hands ``bytes`` fields back as ``memoryview``s of the chunk, which ``default_collate``
    cannot batch ("each element in list of batch should be of equal size") and worker processes cannot
    pickle back ("cannot pickle memoryview objects", after which the loader hangs): every user of
    bytes fields needs this, in both modes.
    """
    return {k: [bytes(it[k]) if isinstance(it[k], memoryview) else it[k] for it in items] for k in items[0]}


def _best(job: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The README's throughput levers: ``StreamingDataLoader(num_workers=os.cpu_count())`` (its example)
    and a larger ``max_pre_download`` ("raise for throughput"). Measured here (2 cores, 8 x 16 MB): 1 or 2
    workers ~70 MB/s, 4 ~55, 8 ~39; with no workers (its default) ~87 MB/s, since one process already
    fetches chunks over several obstore connections and a worker costs more CPU than it gives back."""
    workers = max(1, min(os.cpu_count() or 1, int(job.get("connections") or 1)))
    pre = 4
    settings = (f"StreamingDataset(url, cache_dir, max_pre_download={pre}); StreamingDataLoader(batch_size="
                f"{BATCH}, num_workers={workers} = os.cpu_count(), collate_fn=bytes lists)")
    return {"max_pre_download": pre}, {"num_workers": workers}, settings


def _mark_obstore(folder: str) -> None:
    """Leave a file in ``folder`` from every process in which litdata starts obstore (forked workers too)."""
    from litdata.streaming import downloader

    original = getattr(downloader, "_note_obstore_init", None)
    if original is None:  # another litdata: the settings then say obstore was not seen
        return

    def note() -> None:
        open(os.path.join(folder, f"obstore-{os.getpid()}"), "w").close()
        original()

    downloader._note_obstore_init = note


def measure(job: dict[str, Any]) -> dict[str, Any]:
    if job.get("action") == "prepare":
        return prepare(job)
    if not job.get("dataset"):
        raise ValueError("no dataset: run the prepare action first")
    storage_options = _env(job)
    import litdata
    from litdata import StreamingDataLoader, StreamingDataset
    from torch.utils.data import DataLoader

    cache = fresh_dir(job, "cache")
    marks = fresh_dir(job, "marks")
    _mark_obstore(marks)
    if job.get("mode", "defaults") == "defaults":
        ds = StreamingDataset(job["dataset"], cache_dir=cache, storage_options=storage_options)
        loader: Any = DataLoader(ds, batch_size=BATCH, num_workers=0, collate_fn=collate)
        settings = (f"StreamingDataset(url, cache_dir) with its defaults (max_pre_download=2, max_cache_size="
                    f"75% of free disk); DataLoader(batch_size={BATCH}, num_workers=0, collate_fn=bytes lists)")
    else:
        ds_kw, dl_kw, settings = _best(job)
        ds = StreamingDataset(job["dataset"], cache_dir=cache, storage_options=storage_options, **ds_kw)
        loader = StreamingDataLoader(ds, batch_size=BATCH, collate_fn=collate, **dl_kw)
    with PeakConnections(job.get("endpoint")) as conns, Timer() as t:
        names = epoch_names(loader, lambda batch: batch[NAME])
    index = glob.glob(os.path.join(cache, "**", "index.json"), recursive=True)  # in CACHE/HASH/VERSION/
    if len(index) != 1:
        raise RuntimeError(f"expected one index.json under the cache {cache}, found {index}")
    with open(index[0]) as fh:
        totals = _index_totals(json.load(fh))
    obstore = len(glob.glob(os.path.join(marks, "obstore-*")))
    client = (f"chunk GETs by obstore (in {obstore} process(es)), index.json by boto3" if obstore
              else "chunk GETs and index.json by boto3 (obstore not seen starting)")
    return {"bytes": totals["bytes"], "samples": len(names), "seconds": t.seconds, "cpu_s": t.cpu_s,
            "keys_digest": keys_digest(names), "connections": conns.peak,
            "settings": f"litdata {litdata.__version__}: {settings}; storage_options endpoint_url"
                        f"{_HTTP_NOTE if str(job.get('endpoint')).startswith('http://') else ''}; {client}; "
                        f"at most {conns.peak} connections open at once"}


if __name__ == "__main__":
    run(measure)
