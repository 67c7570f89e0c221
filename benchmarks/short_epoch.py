"""A short first epoch of many small, high-latency shards, through the settings a user can choose, beside raw.

    python -m benchmarks.short_epoch                  # 2 rounds, best of each
    python -m benchmarks.short_epoch --rounds 3 --only default "start 128"

The store and the shards of the autotuner's scenario (b) (``benchmarks.autotune``): 256 shards of 1 MiB, 200 ms to
first byte and 10 MB/s per connection, one pass in shard-list order, as an evaluation pass or a small fine-tuning
set reads them, and as the first seconds of every job look. Every phase is a fresh interpreter (a process's first
epoch: a fresh engine, and memory the process has not touched yet), its imports made before the clock:

* ``raw 256``: 256 concurrent streaming GETs through the loader's own backend, bytes thrown away (the ``gsutil -m``
  analog at its best level for this store, one request per shard);
* ``default``: ``WebDataset(urls)`` with the library's defaults (autotuned, starting at 32, webdataset's order,
  a 256 MiB byte budget);
* ``start 128``: ``config=EngineConfig(start_connections=128)``: the first wave is half the list;
* ``arrival order, start 128``: the same with ``deterministic=False`` (samples as they arrive);
* ``512 MiB, start 256``: ``max_buffered_bytes=512 MiB`` and ``start_connections=256``: the whole list in one wave
  (a 256 MiB budget holds at most 204 open streams, and in shard-list order every shard but the first waits whole in
  the budget until the consumer reaches it);
* ``fixed 128``: ``max_connections=128``.
* ``N workers``: ``DataLoader(WebDataset(urls), batch_size=None, num_workers=N)`` with the library's defaults: N
  processes, each an engine (autotuned from 32) over its share of the shards, each with a loop thread parsing its own
  bytes, where a machine has the cores for them. The phase's wall time includes starting the workers; its CPU adds
  theirs (reaped before it is read); its bytes are the shards' size, and its samples are checked against the list's.
* ``N workers, tensors``: the same over ``.batched(16, collation_fn=wds.pack_samples)``, each batch's member bytes
  in one shared-memory tensor (``benchmarks.cpu``'s ``dlt`` hand-over): what crosses to the main process is a file
  descriptor and the small values, as for a pipeline that decodes to tensors in its workers.

Then, as the second table, epochs through ``DataLoader(ds, batch_size=None, num_workers=2)`` over a list of 512 shards of
64 KiB on the same store (each worker reads 256 requests that mostly wait for their first byte), four epochs per
phase, with the DataLoader's default non-persistent workers (new processes every epoch) and with
``persistent_workers=True``: where the workers of epoch 2 on start (the level the last epoch settled at) shows in
the seconds per epoch. ``--tree DIR`` runs every loader phase of both tables with another checkout of ``wds_async``
first on the path too, interleaved with this one's in each round, for a before/after in one run (the first table's
rows for it are labelled ``@ DIR``; raw download runs once per round, through this checkout). ``--no-epochs`` leaves
the second table out.

Reported per setting: the wall time of each round, the best MB/s and its ratio to the best raw round, the CPU
seconds of that round's process (user and system, all its threads; the store's are its own), where the concurrency
ended, the most bytes the budget held and the peak RSS. No assertions: figures (see docs/tuning.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess

SHARDS, SHARD_BYTES, SAMPLE_BYTES = 256, 1 << 20, 100 << 10  # the shards of benchmarks.autotune (b)
KNOBS = Knobs(ttfb=0.2, bw=10e6)
RAW_LEVEL = 256
#: The DataLoader table's list: many small requests per worker, each mostly waiting for its first byte.
EPOCH_SHARDS, EPOCH_SHARD_BYTES = 512, 64 << 10

#: setting -> the options of its phase: WebDataset keywords, and EngineConfig fields under "config"
SETTINGS: dict[str, dict[str, Any]] = {
    "raw 256": {"raw": RAW_LEVEL},
    "default": {},
    "start 128": {"config": {"start_connections": 128}},
    "arrival order, start 128": {"deterministic": False, "config": {"start_connections": 128}},
    "512 MiB, start 256": {"max_buffered_bytes": 512 << 20, "config": {"start_connections": 256}},
    "fixed 128": {"max_connections": 128},
    "2 workers": {"workers": 2},
    "4 workers": {"workers": 4},
    "8 workers": {"workers": 8},
    "4 workers, tensors": {"workers": 4, "tensors": True},
    "8 workers, tensors": {"workers": 8, "tensors": True},
}


def _phase(urls: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """One setting in this (fresh) process: the imports first, then the clock around one pass."""
    import asyncio
    import resource
    import time

    import wds_async as wds
    from wds_async.io.rawread import drain, raw_backends
    from wds_async.io.registry import BackendSet

    BackendSet(wds.EngineConfig()).for_url(urls[0])  # the http backend's modules, imported as WebDataset does
    _ = wds.WebDataset  # resolved lazily (its module imports torch): not in the clock
    level = options.pop("raw", None)
    if level is not None:
        async def download() -> int:
            todo, total = iter(urls), 0
            async with raw_backends(level) as backends:

                async def worker() -> None:
                    nonlocal total
                    for url in todo:
                        got = await drain(backends, url)
                        total += got

                async with asyncio.TaskGroup() as group:
                    for _ in range(min(level, len(urls))):
                        group.create_task(worker())
            return total

        started, cpu0 = time.perf_counter(), time.process_time()
        total = asyncio.run(download())
        return {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu0, "bytes": total}
    workers = options.pop("workers", None)
    if workers is not None:
        return _workers_phase(urls, workers, options.pop("tensors", False))
    config = wds.EngineConfig(**options.pop("config", {}))
    ds = wds.WebDataset(urls, nodesplitter=None, workersplitter=None, config=config, **options)
    started, cpu0 = time.perf_counter(), time.process_time()
    samples = sum(1 for _ in ds)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu0
    s = ds.stats()
    return {"wall_s": wall, "cpu_s": cpu, "bytes": s["bytes_read"], "samples": samples, "concurrency": s["concurrency"],
            "peak_buffered": s["peak_buffered_bytes"],
            "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10,
            "library": str(Path(wds.__file__).resolve().parent.parent)}


def _workers_phase(urls: list[str], workers: int, tensors: bool) -> dict[str, Any]:
    """One pass through a DataLoader with ``workers`` workers, the library's defaults in each (``tensors``: batches
    of 16 handed over as shared-memory tensors)."""
    import gc
    import resource
    import time

    from torch.utils.data import DataLoader

    import wds_async as wds

    ds = wds.WebDataset(urls, nodesplitter=None)
    if tensors:
        loader = DataLoader(ds.batched(16, collation_fn=wds.pack_samples), batch_size=None, num_workers=workers)
    else:
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
    own0, children0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    samples = sum(len(batch) for batch in loader) if tensors else sum(1 for _ in loader)
    wall = time.perf_counter() - started
    del loader
    gc.collect()  # the workers are joined when their iterator goes, so that RUSAGE_CHILDREN counts them
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(b, f) - getattr(a, f) for a, b in ((own0, own), (children0, children))
              for f in ("ru_utime", "ru_stime"))
    return {"wall_s": wall, "cpu_s": cpu, "bytes": None, "samples": samples,
            "library": str(Path(wds.__file__).resolve().parent.parent)}


def _epochs(urls: list[str], persistent: bool, epochs: int = 4) -> dict[str, Any]:
    """``epochs`` passes through a DataLoader with two workers, in this (fresh) process."""
    import time

    from torch.utils.data import DataLoader

    import wds_async as wds

    ds = wds.WebDataset(urls, shardshuffle=False)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
    walls = []
    for _ in range(epochs):
        started = time.perf_counter()
        samples = sum(1 for _ in loader)
        walls.append(time.perf_counter() - started)
    return {"walls": walls, "samples": samples, "library": str(Path(wds.__file__).resolve().parent.parent)}


def _run(urls: list[str], options: dict[str, Any], tree: str | None = None) -> dict[str, Any]:
    # Run by path, not with -m: the working directory would then come first on sys.path, before ``tree``.
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [tree, str(root), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", json.dumps([urls, options])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=str(root), timeout=300, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"phase {options} failed:\n{proc.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if tree is not None and row.get("library") != str(Path(tree).resolve()):  # the tree's package, not this one's
        raise RuntimeError(f"the phase for {tree} imported wds_async from {row.get('library')}")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="*", help="settings to run besides raw (default: all)")
    parser.add_argument("--root", default="/tmp/wds-autotune-shards", help="where the shards are made (reused)")
    parser.add_argument("--tree", action="append", default=[],
                        help="another checkout of wds_async to run every loader phase with too (repeatable; this one "
                             "always runs)")
    parser.add_argument("--no-epochs", action="store_true", help="leave out the DataLoader table")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phase:
        urls, options = json.loads(args.phase)
        if "persistent" in options:
            print(json.dumps(_epochs(urls, options["persistent"])))
        else:
            print(json.dumps(_phase(urls, options)))
        return 0
    unknown = set(args.only or ()) - set(SETTINGS)
    if unknown:
        parser.error(f"unknown settings {sorted(unknown)}; choose from {list(SETTINGS)}")
    chosen = {k: v for k, v in SETTINGS.items() if k == "raw 256" or not args.only or k in args.only}
    folder = Path(args.root) / f"{SHARDS}x{SHARD_BYTES}"
    paths = make_shards(folder, n_shards=SHARDS, shard_bytes=SHARD_BYTES, sample_bytes=SAMPLE_BYTES)
    trees: list[str | None] = [None, *(str(Path(t).resolve()) for t in args.tree)]
    runs_of = [(name, options, tree) for name, options in chosen.items()
               for tree in (trees if name != "raw 256" else [None])]
    label = {(name, tree): name if tree is None else f"{name} @ {tree}" for name, _, tree in runs_of}
    rows: dict[str, list[dict[str, Any]]] = {label[name, tree]: [] for name, _, tree in runs_of}
    total = sum(path.stat().st_size for path in paths)
    with StoreProcess(folder, KNOBS) as store:
        urls = [store.base_url + f"shard-{i:06d}.tar" for i in range(SHARDS)]
        print(f"{SHARDS} shards x {SHARD_BYTES >> 20} MiB, {KNOBS.ttfb * 1e3:.0f} ms to first byte, "
              f"{KNOBS.bw / 1e6:.0f} MB/s per connection; one pass, each phase a fresh process", flush=True)
        for _ in range(args.rounds):  # settings interleaved, so that a busy moment of the machine hits all of them
            for name, options, tree in runs_of:
                row = _run(urls, json.loads(json.dumps(options)), tree)
                if row["bytes"] is None:  # a DataLoader phase: the shards' bytes, every sample checked below
                    row["bytes"] = total
                rows[label[name, tree]].append(row)
    raw_best = min(r["wall_s"] for r in rows["raw 256"])
    counts = {r["samples"] for runs in rows.values() for r in runs if "samples" in r}
    if len(counts) > 1:
        raise RuntimeError(f"the settings delivered different numbers of samples: {sorted(counts)}")
    width = max(26, *(len(k) + 2 for k in rows))
    print(f"{'setting':<{width}}{'seconds per round':>22}{'best MB/s':>11}{'/ raw':>7}{'CPU s':>7}{'ends at':>9}"
          f"{'peak buffered':>15}{'peak RSS':>10}")
    for name, runs in rows.items():
        walls = [r["wall_s"] for r in runs]
        best = min(runs, key=lambda r: r["wall_s"])
        extra = ""
        if "concurrency" in best:
            extra = (f"{best['concurrency']:>9}{max(r['peak_buffered'] for r in runs) / 2**20:>11.0f} MiB"
                     f"{max(r['peak_rss'] for r in runs) / 1e6:>7.0f} MB")
        print(f"{name:<{width}}{' '.join(f'{w:.3f}' for w in walls):>22}{best['bytes'] / best['wall_s'] / 1e6:>11.0f}"
              f"{raw_best / best['wall_s']:>7.2f}{best['cpu_s']:>7.2f}{extra}")
    if not args.no_epochs:
        _dataloader_table(Path(args.root), args.rounds, trees)
    return 0


def _dataloader_table(root: Path, rounds: int, trees: list[str | None]) -> None:
    folder = root / f"{EPOCH_SHARDS}x{EPOCH_SHARD_BYTES}"
    make_shards(folder, n_shards=EPOCH_SHARDS, shard_bytes=EPOCH_SHARD_BYTES, sample_bytes=EPOCH_SHARD_BYTES // 4)
    rows: dict[tuple[str | None, bool], list[dict[str, Any]]] = {}
    with StoreProcess(folder, KNOBS) as store:
        urls = [store.base_url + f"shard-{i:06d}.tar" for i in range(EPOCH_SHARDS)]
        print(f"\nDataLoader(batch_size=None, num_workers=2), 4 epochs of {EPOCH_SHARDS} shards x "
              f"{EPOCH_SHARD_BYTES >> 10} KiB on the same store, each phase a fresh process", flush=True)
        for _ in range(rounds):
            for tree in trees:
                for persistent in (False, True):
                    rows.setdefault((tree, persistent), []).append(_run(urls, {"persistent": persistent}, tree))
    print(f"{'library':<34}{'workers':<16}seconds per epoch (epoch 1, 2, 3, 4), each round")
    for (_tree, persistent), runs in rows.items():
        for r in runs:
            print(f"{r['library'][-33:]:<34}{'persistent' if persistent else 'new each epoch':<16}"
                  + " ".join(f"{w:.3f}" for w in r["walls"]))


if __name__ == "__main__":
    sys.exit(main())
