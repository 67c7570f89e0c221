"""Random access against streaming and against wids, on one emulated store.

    python -m benchmarks.random_access            # 16 shards x 250 samples of 64 KiB, 50 ms ttfb, 20 MB/s/conn
    python -m benchmarks.random_access --wids 0   # skip wids (it takes minutes)

Each run is a fresh subprocess reading the same shards through ``DataLoader(batch_size=64, num_workers=2)``:

* ``stream``: ``WebDataset(urls)`` in shard order (the workers split the shards);
* ``indexed``: ``IndexedWebDataset(urls, index=...)`` with ``RandomSampler`` (one seeded permutation); forked
  workers read ahead along it (:mod:`wds_async.data.inherited`);
* ``unseeded``: the same with ``RandomSampler(ds)``, drawn from torch's global generator, as users write it;
* ``oneatatime``: ``indexed`` with ``readahead=0``: each worker reads one batch at a time, as it does where it
  inherits nothing of the sampler (``spawn`` workers; a persistent worker after its first epoch of an order drawn
  from the global generators), and as ``indexed`` did before forked workers read ahead;
* ``ahead``: the same with ``BlockShuffleSampler(ds, block_size=1)``, a uniform shuffle the dataset follows: each
  worker keeps its next batches in flight (``readahead``, default 2) while the DataLoader uses the current one;
* ``block``: ``BlockShuffleSampler(block_size=16)`` (read ahead too);
* ``raw``: what any client gets reading one batch at a time per worker: a map-style dataset whose ``__getitems__``
  sends the batch's ranged GETs itself, one per sample, all at once, through one aiohttp session per DataLoader
  worker on a long-lived event loop (uvloop where installed), and returns the bytes (no tar parsing, no checks), in
  the same order as ``indexed``;
* ``rawh1``: the same floor through the library's own HTTP/1.1 client (``backends/_h1.py``: one keep-alive pool
  per worker) instead of aiohttp, to see where the fastest client we have puts it;
* ``wids``: wids' ``ShardListDataset`` (the ``wids`` package that webdataset 1.0.2 points to) in the same random
  order as ``indexed``, over the same http store (it downloads whole shards into its cache with curl);
* ``cached``: ``IndexedWebDataset(..., cache_dir=...)``, two epochs in random order: the store bytes each epoch
  took (the store's ``/_stats``) and its samples/s.

Reported: samples/s, CPU seconds per sample (this process and its children: the DataLoader workers), the store's
own CPU per sample in brackets (its process, over the same run: on two cores the loader and the store share them), and
the ratios to streaming, raw and wids (of the median rate, for a mode listed more than once in ``--modes``, as in
``--modes stream,indexed,raw,indexed,raw``). No assertions: figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import psutil

from emustore import Knobs, StoreProcess

CHILD = r"""
import asyncio, json, os, resource, sys, time
import torch
from torch.utils.data import DataLoader, RandomSampler
import wds_async as wds

mode, urls, index, extra = json.loads(sys.argv[1])


class RawRanges(torch.utils.data.Dataset):
    # one ranged GET per sample through plain aiohttp, a batch at a time, all of it in flight at once

    def __init__(self, ranges):
        import aiohttp  # imported before the DataLoader forks its workers, as a module-level import would be
        self.ranges = ranges  # (url, start, end) per sample, in index order
        self.loop = self.session = None

    def __len__(self):
        return len(self.ranges)

    async def _get(self, url, start, end):
        async with self.session.get(url, headers={"Range": f"bytes={start}-{end - 1}"}) as answer:
            answer.raise_for_status()
            return await answer.read()

    async def _batch(self, indices):
        if self.session is None:
            import aiohttp
            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return await asyncio.gather(*(self._get(*self.ranges[i]) for i in indices))

    def __getitems__(self, indices):
        if self.loop is None:  # one loop per DataLoader worker, kept across batches as the loader keeps its engine
            try:
                import uvloop
                self.loop = uvloop.new_event_loop()
            except ImportError:
                self.loop = asyncio.new_event_loop()
        return self.loop.run_until_complete(self._batch(indices))

    def __getitem__(self, i):
        return self.__getitems__([i])[0]


class RawH1(RawRanges):
    # the same batches through the library's own HTTP/1.1 client (no aiohttp on the GETs)

    async def _get(self, url, start, end):
        answer = await self.session.get(url, {"Range": f"bytes={start}-{end - 1}"})
        try:
            if answer.status != 206:
                raise RuntimeError(f"{url}: HTTP {answer.status}")
            return await answer.read()
        finally:
            answer.release()

    async def _batch(self, indices):
        if self.session is None:
            import ssl
            from wds_async.backends._h1 import H1Pool
            from wds_async.backends.http import DEFAULT_HEADERS
            self.session = H1Pool(limit=0, tls=ssl.create_default_context, connect_timeout=30, read_timeout=60,
                                  headers=DEFAULT_HEADERS)
        return await asyncio.gather(*(self._get(*self.ranges[i]) for i in indices))


def count(batch):
    return len(batch)

def cpu():
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime

def order(n):
    return RandomSampler(range(n), generator=torch.Generator().manual_seed(1234))

def run(ds, sampler, epochs=1):
    out = []
    for _ in range(epochs):
        loader = DataLoader(ds, batch_size=64, sampler=sampler, num_workers=2, collate_fn=count,
                            persistent_workers=False)
        c0, t0 = cpu(), time.perf_counter()
        n = sum(loader)
        wall = time.perf_counter() - t0
        out.append({"samples": n, "wall_s": wall, "cpu_s": cpu() - c0})
    return out

if mode == "stream":
    ds = wds.WebDataset(urls)
    result = run(ds, None)
elif mode in ("indexed", "unseeded", "oneatatime", "block", "ahead"):
    ds = wds.IndexedWebDataset(urls, index=index, readahead=0 if mode == "oneatatime" else 2)
    if mode in ("indexed", "oneatatime"):
        sampler = order(len(ds))
    elif mode == "unseeded":
        sampler = RandomSampler(ds)
    else:  # the sampler registers with the dataset, whose workers then read ahead along its order
        sampler = wds.BlockShuffleSampler(ds, block_size=16 if mode == "block" else 1, seed=1)
    result = run(ds, sampler)
elif mode in ("raw", "rawh1"):
    table = wds.ShardIndex.load(index)
    ds = (RawRanges if mode == "raw" else RawH1)([(e.url, a, b) for e in table.shards for a, b in zip(e.offsets, e.ends)])
    result = run(ds, order(len(ds)))
elif mode == "cached":
    ds = wds.IndexedWebDataset(urls, index=index, cache_dir=extra)
    result = run(ds, order(len(ds)), epochs=1)
    print(json.dumps(result[0]), flush=True)
    sys.stdin.readline()  # the parent reads the store's counters between the epochs
    result = run(ds, order(len(ds)), epochs=1)
elif mode == "wids":
    import wids
    shards = [{"url": u, "nsamples": n} for u, n in zip(urls, extra["nsamples"])]
    ds = wids.ShardListDataset(shards, cache_dir=extra["dir"], transformations=[], lru_size=extra["lru"])
    result = run(ds, order(len(ds)))
print(json.dumps(result[-1]), flush=True)
"""


def _store_cpu(store: StoreProcess) -> float:
    """CPU seconds the store's process has used so far (user and system)."""
    return float(sum(psutil.Process(store.pid).cpu_times()[:2]))


def _child(store: StoreProcess, mode: str, urls: list[str], index: str, extra: object = None) -> dict[str, float]:
    """One mode in a fresh process; with the store's CPU over the run (the two share the cores)."""
    before = _store_cpu(store)
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([mode, urls, index, extra])], capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parents[1])
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    result["store_cpu_s"] = _store_cpu(store) - before
    return result


def _store_bytes(store: StoreProcess) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{store.port}/_stats") as answer:
        return int(json.load(answer)["bytes_sent"])


def _cached(store: StoreProcess, urls: list[str], index: str, cache: str) -> tuple[dict[str, float], ...]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, json.dumps(["cached", urls, index, cache])],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parents[1])
    assert proc.stdin is not None and proc.stdout is not None
    before = _store_bytes(store)
    first = json.loads(proc.stdout.readline())
    first["store_mb"] = (_store_bytes(store) - before) / 1e6
    before = _store_bytes(store)
    proc.stdin.write("\n")
    proc.stdin.flush()
    second = json.loads(proc.stdout.readline())
    second["store_mb"] = (_store_bytes(store) - before) / 1e6
    proc.wait()
    return first, second


def make_data(root: Path, shards: int, samples: int, sample_bytes: int) -> tuple[list[str], str]:
    """Shards of ``samples`` samples (a ``.bin`` of ``sample_bytes`` random bytes and a ``.cls``) and their index."""
    import wds_async as wds

    index = root / "index.jsonl"
    if not index.exists():
        rng = os.urandom
        with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=samples, index=str(index), verbose=0) as out:
            for i in range(shards * samples):
                out.write({"__key__": f"s{i:07d}", "bin": rng(sample_bytes), "cls": str(i % 10).encode()})
    names = sorted(p.name for p in root.glob("shard-*.tar"))
    return names, str(index)


def _line(name: str, r: dict[str, float]) -> str:
    rate = r["samples"] / r["wall_s"]
    return (f"{name:10s} {r['samples']:6.0f} samples {r['wall_s']:7.2f} s {rate:8.0f} samples/s "
            f"{1e6 * r['cpu_s'] / r['samples']:7.0f} us CPU/sample" + (
                f" (store {1e6 * r['store_cpu_s'] / r['samples']:4.0f})" if "store_cpu_s" in r else "") + (
                f"  store {r['store_mb']:.1f} MB" if "store_mb" in r else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--samples", type=int, default=250)
    parser.add_argument("--sample-kib", type=int, default=64)
    parser.add_argument("--ttfb", type=float, default=0.05)
    parser.add_argument("--bw", type=float, default=20e6)
    parser.add_argument("--wids", type=int, default=1, help="run wids (1) or not (0)")
    parser.add_argument("--wids-lru", type=int, default=10, help="wids' lru_size (its default: 10)")
    parser.add_argument("--modes", default="stream,indexed,unseeded,oneatatime,ahead,block,raw",
                        help="which of stream, indexed, unseeded, oneatatime, ahead, block, raw, rawh1 to run")
    parser.add_argument("--cached", type=int, default=1, help="run the two cached epochs (1) or not (0)")
    parser.add_argument("--dir", default=None, help="where the shards live (default: a temporary folder)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.dir or tmp) / "shards"
        root.mkdir(parents=True, exist_ok=True)
        names, local_index = make_data(root, args.shards, args.samples, args.sample_kib << 10)
        with StoreProcess(root, Knobs(ttfb=args.ttfb, bw=args.bw)) as store:
            urls = [f"{store.base_url}{name}" for name in names]
            import wds_async as wds

            index = wds.ShardIndex.load(local_index)
            # the index lists local paths: the store's http URLs carry the same identity (size), so re-key it
            remote = wds.ShardIndex([type(e)(**{**e.__dict__, "url": u}) for e, u in zip(index.shards, urls)])
            remote_index = str(Path(tmp) / "remote-index.jsonl")
            remote.save(remote_index)
            print(f"store: {args.shards} shards x {args.samples} samples of {args.sample_kib} KiB, "
                  f"ttfb {args.ttfb * 1e3:.0f} ms, {args.bw / 1e6:.0f} MB/s per connection; DataLoader(batch_size=64, "
                  "num_workers=2)")
            results: dict[str, list[dict[str, float]]] = {}
            for mode in args.modes.split(","):  # a mode listed twice runs twice: its ratios use the median rate
                results.setdefault(mode, []).append(_child(store, mode, urls, remote_index))
                print(_line(mode, results[mode][-1]), flush=True)
            if args.cached:
                first, second = _cached(store, urls, remote_index, str(Path(tmp) / "cache"))
                print(_line("cached1", first))
                print(_line("cached2", second), flush=True)
            if args.wids:
                extra = {"dir": str(Path(tmp) / "wids"), "nsamples": [e.nsamples for e in index.shards],
                         "lru": args.wids_lru}
                results["wids"] = [_child(store, "wids", urls, remote_index, extra)]
                print(_line("wids", results["wids"][0]), flush=True)

            def rate(mode: str) -> float:
                return statistics.median(r["samples"] / r["wall_s"] for r in results[mode])

            ratios = [f"{mode}/stream {rate(mode) / rate('stream'):.2f}x" for mode in ("indexed", "unseeded", "oneatatime", "ahead", "block", "raw", "rawh1")
                      if mode in results and "stream" in results]
            for floor in ("raw", "rawh1"):
                if floor in results and "indexed" in results:
                    ratios.append(f"indexed/{floor} {rate('indexed') / rate(floor):.2f}x")
            for mode in ("indexed", "unseeded", "oneatatime", "ahead"):
                if "wids" in results and mode in results:
                    ratios.append(f"{mode}/wids {rate(mode) / rate('wids'):.1f}x")
            print("   ".join(ratios))


if __name__ == "__main__":
    main()
