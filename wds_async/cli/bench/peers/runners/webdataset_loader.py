"""Peer runner ``webdataset``: webdataset 1.0.2's ``WebDataset`` over the job's http(s) URLs, in a DataLoader.

Started as ``PYTHON webdataset_loader.py JOB.json`` (see ``_common.py`` for the job and the result). The
file is not called ``webdataset.py``: a script's folder comes first on ``sys.path``, so that name would
shadow the package it measures.

Modes:

* ``defaults``: ``WebDataset(http_urls, shardshuffle=False)`` in ``DataLoader(num_workers=0,
  batch_size=None)``: one shard at a time, one connection, parsed in this process.
* ``best``: webdataset's documented way to go faster: DataLoader workers, each reading its own shards
  (``split_by_worker``, WebDataset's default worker splitter), with the batching done inside the workers
  (``.batched(n, collation_fn=None)`` and ``batch_size=None``) so that samples cross the process boundary
  in lists rather than one by one. Workers = min(connections, shards, 8); each reads one shard at a time,
  so that is also the number of connections.

webdataset opens an http(s) URL by running ``curl --connect-timeout 30 --retry 30 --retry-delay 2 -f -s
-L URL`` (``webdataset.gopen.gopen_curl``) and reading its stdout. For an https store signed by the job's
own CA, ``CURL_CA_BUNDLE`` is set to ``ca_file`` here (curl, run by this process or by a worker, inherits
it); curl also honours ``SSL_CERT_FILE``, which the orchestrator sets.

Every sample is yielded whole (all its fields' bytes) through the DataLoader, as a training loop would get
it; the runner counts them and names each ``SHARD/KEY`` from webdataset's ``__url__`` and ``__key__``.
``bytes`` is the shards' total size (``expected.bytes`` when the job knows it, else one HEAD per shard
before the measured region): curl moves every byte of every shard.
"""

from __future__ import annotations

import os
import ssl
import urllib.request
from typing import Any

from _common import Timer, epoch_names, keys_digest, run, sample_name

MAX_WORKERS = 8
WORKER_BATCH = 32  # samples per list a worker sends to the main process in "best"


def _keep(batch: Any) -> Any:
    """A DataLoader ``collate_fn`` that passes samples (or a worker's list of them) through untouched."""
    return batch


def _shard_bytes(job: dict[str, Any], urls: list[str]) -> int:
    """The shards' total size: the job's ``expected.bytes``, else a HEAD of each URL."""
    expected = (job.get("expected") or {}).get("bytes")
    if expected:
        return int(expected)
    ca_file = job.get("ca_file")
    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    total = 0
    for url in urls:
        request = urllib.request.Request(url, method="HEAD")
        with urllib.request.urlopen(request, timeout=60, context=context) as response:
            total += int(response.headers["Content-Length"])
    return total


def measure(job: dict[str, Any]) -> dict[str, Any]:
    urls = list(job.get("http_urls") or [])
    if not urls:
        raise ValueError("the job has no http_urls: webdataset reads shards over http(s) (curl), "
                         "and this store does not serve them as plain URLs")
    mode = job.get("mode", "defaults")
    if mode not in ("defaults", "best"):
        raise ValueError(f"unknown mode {mode!r}")
    ca_file = job.get("ca_file")
    if ca_file:
        os.environ["CURL_CA_BUNDLE"] = ca_file  # before any curl (and any worker) starts

    import webdataset
    from torch.utils.data import DataLoader

    nbytes = _shard_bytes(job, urls)
    tls = f"; curl trusts the store's CA through CURL_CA_BUNDLE={os.path.basename(ca_file)}" if ca_file else ""
    if mode == "defaults":
        dataset = webdataset.WebDataset(urls, shardshuffle=False)
        workers = 0
        loader = DataLoader(dataset, batch_size=None, num_workers=0)
        batched = False
        settings = ("WebDataset(http_urls, shardshuffle=False) in DataLoader(num_workers=0, batch_size=None): "
                    "one curl at a time, parsed in the main process" + tls)
    else:
        workers = max(1, min(int(job.get("connections") or 1), len(urls), MAX_WORKERS))
        dataset = webdataset.WebDataset(urls, shardshuffle=False).batched(WORKER_BATCH, collation_fn=None)
        loader = DataLoader(dataset, batch_size=None, num_workers=workers, collate_fn=_keep)
        batched = True
        settings = (f"WebDataset(http_urls, shardshuffle=False).batched({WORKER_BATCH}, collation_fn=None) in "
                    f"DataLoader(num_workers={workers}, batch_size=None, prefetch_factor=2): "
                    f"workers = min(connections {job.get('connections')}, shards {len(urls)}, {MAX_WORKERS}), "
                    f"each its own shards (split_by_worker), one curl each, so {workers} connections; "
                    f"samples sent to the main process in lists of {WORKER_BATCH}" + tls)

    with Timer() as timer:
        names = epoch_names(loader, lambda item: [sample_name(s["__url__"], s["__key__"])
                                                  for s in (item if batched else (item,))])
    return {
        "samples": len(names),
        "bytes": nbytes,
        "seconds": timer.seconds,
        "cpu_s": timer.cpu_s,
        "keys_digest": keys_digest(names),
        "settings": settings,
        "connections": max(workers, 1),  # one curl per worker (per process without workers) at a time
    }


if __name__ == "__main__":  # guarded: a spawned DataLoader worker imports this file as __mp_main__
    run(measure)
