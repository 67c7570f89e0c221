"""Peer runner ``s3torchconnector``: Amazon's S3 Connector for PyTorch (1.5.0) over the tar shards.

Started as ``PYTHON s3torch.py JOB.json`` (see ``_common.py`` for the job and the result). The file is not
called ``s3torchconnector.py``: a script's folder comes first on ``sys.path``, so that name would shadow the
package it measures.

The pipeline is the one the connector documents for WebDataset shards (its "Getting started" notebook):
``S3IterableDataset.from_objects(urls, transform=shard_to_dict)`` yields one ``{"url", "stream"}`` per
shard, the stream being the connector's ``S3Reader``; webdataset's ``tar_file_expander`` streams each tar
(``tarfile`` mode ``r|``) and ``group_by_keys`` groups its members into samples, as ``WebDataset`` does.
(Its benchmark harness does the same with torchdata's ``load_from_tar``, which torchdata 0.11 no longer
has.) Every sample is yielded whole through a ``DataLoader``; the runner counts and names them.

Modes:

* ``defaults``: ``S3ClientConfig()`` (10 Gbps target, 8 MiB parts, 10 attempts), the default
  (sequential) reader, ``DataLoader(num_workers=0, batch_size=None)``: one shard at a time, each fetched by
  the CRT as ranged GETs of 8 MiB parts, the first alone (it learns the size), then the rest in parallel;
  a 16 MB shard is 2 parts, so one connection at a time.
* ``best``: the connector's documented tuning: DataLoader workers with ``enable_sharding=True`` (each
  worker its own shards), workers = min(connections, shards, 8), a ``batch_size`` so samples cross the
  process boundary in lists (``collate_fn`` keeps them as they are), and ``S3ClientConfig(part_size=5 MiB)``,
  the smallest it accepts, so a 16 MB shard is 4 parts, 3 of them in parallel (on 8 x 16 MB shards, 8 MiB
  parts measured about 75 MB/s, 5 MiB parts about 90-110 MB/s, at ttfb 0.05 s and 20 MB/s a connection).

Addressing: with an ``endpoint`` (the emulated store) the client is made with ``force_path_style=True`` in
both modes (``http(s)://HOST:PORT/BUCKET/KEY``; virtual-hosted names cannot resolve on 127.0.0.1). The CRT
talks plain http to such an endpoint. For https it has no CA setting in 1.5.0 (mountpoint-s3-client 0.14.1
has none; ``AWS_CA_BUNDLE`` is ignored), but its TLS stack reads ``SSL_CERT_FILE`` when a client is made,
so the job's ``ca_file`` is put there (the workers inherit it). It signs every request (SigV4) with the
credentials of the default chain: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (dummy ones are set here
for an endpoint when none are given: the store checks no signature); ``region`` is required, from
``AWS_REGION``/``AWS_DEFAULT_REGION``, else ``us-east-1``.

``bytes`` is the shards' total size (``expected.bytes`` when the job knows it, else a HEAD of each shard
through the connector's own client, before the measured region): the connector downloads every byte.
"""

from __future__ import annotations

import os
from typing import Any

import torch.utils.data
from _common import Timer, epoch_names, keys_digest, run, sample_name

MAX_WORKERS = 8
BEST_PART_SIZE = 5 << 20  # bytes: the smallest part the client accepts (5 MiB): more ranged GETs per shard
BEST_BATCH = 32  # samples per list a worker sends to the main process in "best"


def _keep(batch: Any) -> Any:
    """A DataLoader ``collate_fn`` that keeps a batch as the list of samples it is."""
    return batch


def shard_to_dict(reader: Any) -> dict[str, Any]:
    """The connector notebook's transform: an ``S3Reader`` as webdataset's ``{"url", "stream"}``."""
    return {"url": f"s3://{reader.bucket}/{reader.key}", "stream": reader}


class TarSamples(torch.utils.data.IterableDataset):  # type: ignore[type-arg]
    """Whole samples: each shard's tar streamed (``tarfile`` ``r|``) and grouped by key, by webdataset's code."""

    def __init__(self, shards: Any) -> None:
        self.shards = shards  # an S3IterableDataset: it splits the objects among DataLoader workers itself

    def __iter__(self) -> Any:
        from webdataset.tariterators import group_by_keys, tar_file_expander

        return group_by_keys(tar_file_expander(iter(self.shards)))


def _parse(url: str) -> tuple[str, str]:
    if not url.startswith("s3://") or "/" not in url[5:]:
        raise ValueError(f"not an s3://BUCKET/KEY URL: {url!r}")
    bucket, key = url[5:].split("/", 1)
    return bucket, key


def measure(job: dict[str, Any]) -> dict[str, Any]:
    urls = list(job.get("urls") or [])
    if not urls:
        raise ValueError("the job has no s3:// urls")
    mode = job.get("mode", "defaults")
    if mode not in ("defaults", "best"):
        raise ValueError(f"unknown mode {mode!r}")
    endpoint = job.get("endpoint") or None
    ca_file = job.get("ca_file")
    if endpoint and endpoint.startswith("https://") and ca_file:
        # No CA option in s3torchconnector 1.5.0; its CRT TLS context reads SSL_CERT_FILE when a client is made.
        os.environ["SSL_CERT_FILE"] = ca_file
    if endpoint:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "dummy")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "dummy")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"

    try:
        import webdataset  # noqa: F401 - the tar parsing the connector's notebook uses
        from s3torchconnector import S3ClientConfig, S3IterableDataset
    except ImportError as exc:
        raise ImportError(f"{exc}: pip install s3torchconnector==1.5.0 webdataset==1.0.2") from exc
    from torch.utils.data import DataLoader

    path_style = endpoint is not None
    if mode == "defaults":
        config = S3ClientConfig(force_path_style=path_style)
        workers, batch_size = 0, None
    else:
        config = S3ClientConfig(force_path_style=path_style, part_size=BEST_PART_SIZE)
        workers = max(1, min(int(job.get("connections") or 1), len(urls), MAX_WORKERS))
        batch_size = BEST_BATCH
    nbytes = _shard_bytes(job, urls, region, endpoint, config)
    parts = -(-max(nbytes // len(urls), 1) // config.part_size)  # ranged GETs per (average) shard

    shards = S3IterableDataset.from_objects(urls, region=region, endpoint=endpoint, transform=shard_to_dict,
                                            s3client_config=config, enable_sharding=workers > 1)
    dataset = TarSamples(shards)
    if batch_size is None:
        loader = DataLoader(dataset, batch_size=None, num_workers=0)
    else:
        loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=_keep)

    connections = max(workers, 1) * max(parts - 1, 1)
    where = f"path-style on {endpoint}" if endpoint else "virtual-hosted on AWS"
    tls = "; CA trusted via SSL_CERT_FILE (no CA option in 1.5.0)" if endpoint and ca_file else ""
    if mode == "defaults":
        settings = (f"S3IterableDataset.from_objects(urls, transform=shard_to_dict) -> webdataset "
                    f"tar_file_expander + group_by_keys, DataLoader(num_workers=0, batch_size=None); "
                    f"S3ClientConfig() defaults: {config.throughput_target_gbps:g} Gbps target, "
                    f"part_size {config.part_size >> 20} MiB ({parts} ranged GETs per shard: the first alone, "
                    f"then the rest in parallel; one shard at a time), max_attempts {config.max_attempts}, "
                    f"sequential reader; "
                    f"{where}{tls}")
    else:
        settings = (f"S3IterableDataset.from_objects(urls, transform=shard_to_dict, enable_sharding={workers > 1}) "
                    f"-> webdataset tar_file_expander + group_by_keys, DataLoader(num_workers={workers}, "
                    f"batch_size={batch_size}, collate keeps samples); workers = min(connections "
                    f"{job.get('connections')}, shards {len(urls)}, {MAX_WORKERS}), one CRT client each; "
                    f"S3ClientConfig(part_size={config.part_size >> 20} MiB, {config.throughput_target_gbps:g} Gbps "
                    f"target, max_attempts {config.max_attempts}): {parts} ranged GETs per shard (the first alone, "
                    f"then the rest in parallel), so up to {connections} connections; "
                    f"sequential reader; {where}{tls}")

    with Timer() as timer:
        names = epoch_names(loader, lambda item: [sample_name(s["__url__"], s["__key__"])
                                                  for s in (item if batch_size else (item,))])
    return {
        "samples": len(names),
        "bytes": nbytes,
        "seconds": timer.seconds,
        "cpu_s": timer.cpu_s,
        "keys_digest": keys_digest(names),
        "settings": settings,
        "connections": connections,  # at once, at most: more than the job's in "best"
    }


def _shard_bytes(job: dict[str, Any], urls: list[str], region: str, endpoint: str | None, config: Any) -> int:
    """The shards' total size: the job's ``expected.bytes``, else a HEAD of each shard."""
    expected = (job.get("expected") or {}).get("bytes")
    if expected:
        return int(expected)
    from s3torchconnector._s3client import S3Client

    client = S3Client(region, endpoint=endpoint, s3client_config=config)
    total = sum(int(client.head_object(*_parse(url)).size) for url in urls)
    del client  # released before the DataLoader forks its workers (the connector's fork handler, too)
    return total


if __name__ == "__main__":  # guarded: a spawned DataLoader worker imports this file as __mp_main__
    run(measure)
