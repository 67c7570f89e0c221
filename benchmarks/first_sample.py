"""Time to first sample against a raw GET's first byte, per store, each measurement in a fresh process.

    python -m benchmarks.first_sample                # every store below, 5 rounds, medians
    python -m benchmarks.first_sample --rounds 9 --only s3-emu s3-moto

Stores (all on 127.0.0.1): ``http`` and ``https`` (the emulated store, https with its throwaway CA), ``s3-emu``
(the emulated store's S3 face), ``s3-moto`` (moto server), ``gs-emu`` (the emulated store's GCS face) and ``az``
(Azurite). One 4 MiB shard of 16 KiB samples per store.

Each round runs three fresh interpreters per store, in turn (after one untimed read per store, which warms the
store, not the client). Every child imports wds_async, aiohttp, the dataset module (torch) and the scheme's
backend module (its SDK) *before* the clock starts: an import is paid once per process whatever reads first, and
the backend module's is reported apart (``import``, in the loader child).

* ``raw``: the backend signs the request (credentials, presigning) before the clock, and 1 s passes so that what it
  started in the background (s3: the SDK client's build) is over; then a plain aiohttp session GETs the signed URL:
  the clock stops at the first byte of the body. This is what the network costs.
* ``backend``: the clock starts, the scheme's backend is built (BackendSet, as the engine builds it) and opens the
  object; the clock stops at the first chunk. The backend's own start (SDK clients, credential chain) is inside.
* ``loader``: the clock starts, ``next(iter(WebDataset([url])))`` returns the first sample (construction
  included); ``stats`` is the ``first_sample_s`` that ``stats()`` says (from the iteration's start); ``next epoch``
  is ``first_sample_s`` of the two iterations that follow in the same process (each builds a new engine and
  backend set, as every epoch does).

Reported per store: the medians of each, and loader - raw (the issue's "above a raw GET's first byte"). The
machine may be shared with other work: medians over rounds, no assertions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.make_shards import make_shards
from emustore import StoreProcess
from emustore.emulators import MOTO_ENV, azurite, azurite_connection_string, moto_server

BUCKET = "bkt"

CHILD = r"""
import asyncio, importlib, json, sys, time
mode, url, options = json.loads(sys.argv[1])
import aiohttp
from wds_async.config import EngineConfig
from wds_async.data.dataset import WebDataset  # torch and the dataset classes: imported before the clock too
from wds_async.io import BackendSet, backend_key
from wds_async.io.registry import REGISTRY

target = REGISTRY.get(backend_key(url))
t = time.perf_counter()
if target:
    importlib.import_module(target[0].partition(":")[0])  # the SDK import is not what is timed
imported = time.perf_counter() - t
out = {"import_s": imported}

async def raw():
    backends = BackendSet(EngineConfig(), options=options)
    signed, headers = await backends.for_url(url).resolve(url, 0, None)
    await asyncio.sleep(1.0)  # what signing started in the background (s3: the SDK client's build) ends first
    started = time.perf_counter()
    async with aiohttp.ClientSession() as session:
        async with session.get(signed, headers=headers) as answer:
            answer.raise_for_status()
            await answer.content.readany()
            out["first_s"] = time.perf_counter() - started
    await backends.aclose()

async def backend():
    started = time.perf_counter()
    backends = BackendSet(EngineConfig(), options=options)
    async with backends.for_url(url).open(url) as stream:
        async for chunk in stream:
            out["first_s"] = time.perf_counter() - started
            break
    await backends.aclose()

if mode == "raw":
    asyncio.run(raw())
elif mode == "backend":
    asyncio.run(backend())
else:
    started = time.perf_counter()
    ds = WebDataset([url], backend_options=options, nodesplitter=None, workersplitter=None)
    samples = iter(ds)
    next(samples)
    out["first_s"] = time.perf_counter() - started
    out["first_sample_s"] = ds.stats()["first_sample_s"]
    samples.close()
    later = []
    for _ in range(2):  # the next epochs in the same process: a new iteration, a new engine and backend set
        samples = iter(ds)
        next(samples)
        later.append(ds.stats()["first_sample_s"])
        samples.close()
    out["later_s"] = later
print(json.dumps(out))
"""

MODES = ("raw", "backend", "loader")


def _child(mode: str, url: str, options: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps([mode, url, options])], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} child failed on {url}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


@contextlib.contextmanager
def _stores(root: Path, only: set[str]) -> Iterator[dict[str, tuple[str, dict[str, Any], dict[str, str]]]]:
    """name -> (url, backend_options, environment) of every store asked for, running for the block."""
    shard = "shard-000000.tar"
    data = (root / BUCKET / shard).read_bytes()
    found: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {}
    with contextlib.ExitStack() as stack:
        if only & {"http", "s3-emu", "gs-emu"}:
            store = stack.enter_context(StoreProcess(root))
            found["http"] = (store.url(f"{BUCKET}/{shard}"), {}, {})
            found["s3-emu"] = (f"s3://{BUCKET}/{shard}", {"s3": {"endpoint_url": store.s3_endpoint}}, MOTO_ENV)
            found["gs-emu"] = (f"gs://{BUCKET}/{shard}", {"gs": {"endpoint_url": store.gcs_endpoint,
                                                                 "anonymous": True}}, {})
        if "https" in only:
            secure = stack.enter_context(StoreProcess(root, https=True))
            found["https"] = (secure.url(f"{BUCKET}/{shard}"), {}, {"SSL_CERT_FILE": secure.ca_file})
        if "s3-moto" in only:
            import boto3
            from botocore.config import Config

            endpoint = stack.enter_context(moto_server())
            client = boto3.client("s3", endpoint_url=endpoint, config=Config(s3={"addressing_style": "path"}),
                                  aws_access_key_id="testing", aws_secret_access_key="testing",
                                  region_name="us-east-1")
            client.create_bucket(Bucket=BUCKET)
            client.put_object(Bucket=BUCKET, Key=shard, Body=data)
            found["s3-moto"] = (f"s3://{BUCKET}/{shard}", {"s3": {"endpoint_url": endpoint}}, MOTO_ENV)
        if "az" in only:
            from azure.storage.blob import BlobServiceClient

            endpoint = stack.enter_context(azurite())
            conn = azurite_connection_string(endpoint)
            service = BlobServiceClient.from_connection_string(conn)
            service.create_container(BUCKET)
            service.get_blob_client(BUCKET, shard).upload_blob(data)
            found["az"] = (f"az://{BUCKET}/{shard}", {}, {"AZURE_STORAGE_CONNECTION_STRING": conn})
        yield {name: found[name] for name in found if name in only}


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="+", default=["http", "https", "s3-emu", "s3-moto", "gs-emu", "az"])
    parser.add_argument("--json", default=None, help="also write the raw figures here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wds-first-") as scratch:
        root = Path(scratch)
        make_shards(root / BUCKET, n_shards=1, shard_bytes=4 << 20, sample_bytes=16 << 10, seed=3)
        results: dict[str, dict[str, list[Any]]] = {}
        with _stores(root, set(args.only)) as stores:
            for url, options, env in stores.values():  # the store's own first answer (Azurite's is slow)
                _child("backend", url, options, env)
            for _ in range(args.rounds):
                for name, (url, options, env) in stores.items():
                    for mode in MODES:
                        got = _child(mode, url, options, env)
                        row = results.setdefault(name, {})
                        row.setdefault(mode, []).append(got["first_s"])
                        if mode == "loader":
                            row.setdefault("first_sample_s", []).append(got["first_sample_s"])
                            row.setdefault("import_s", []).append(got["import_s"])
                            row.setdefault("later_s", []).extend(got["later_s"])
    med = statistics.median
    print(f"medians of {args.rounds} rounds, ms (fresh process each)")
    print(f"{'store':<9}{'raw':>7}{'backend':>9}{'loader':>8}{'stats':>7}{'loader-raw':>12}{'backend-raw':>13}"
          f"{'import':>8}{'next epoch':>12}")
    for name, row in results.items():
        raw, backend, loader = med(row["raw"]), med(row["backend"]), med(row["loader"])
        firsts = [f for f in row["first_sample_s"] if f is not None]
        print(f"{name:<9}{_ms(raw):>7}{_ms(backend):>9}{_ms(loader):>8}{_ms(med(firsts) if firsts else None):>7}"
              f"{_ms(loader - raw):>12}{_ms(backend - raw):>13}{_ms(med(row['import_s'])):>8}"
              f"{_ms(med(row['later_s'])):>12}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
