"""CPU per byte: the loader beside raw download and beside the webdataset package, case by case.

    python benchmarks/cpu.py [--cases http,small,large] [--repeat 3] [--tree DIR ...]
    python -m benchmarks.cpu --cases http --client builtin --client aiohttp     # the two http clients, in turn
    python -m benchmarks.cpu --cases http --passes 8      # each phase reads the list 8 times: the long-run cost
    python -m benchmarks.cpu --cases http --workers 2,4,8 # and through DataLoader workers, beside raw

Three cases, each measured side by side in one run, every phase in a fresh subprocess so that its
wall time, CPU time (user+system of the whole process, all threads) and byte count are its own:

* ``http``: unthrottled loopback http (the emulated store with no TTFB and no bandwidth cap):
  ``raw`` (``--connections`` concurrent streaming GETs through the loader's own backend, bytes thrown
  away) beside ``wds-async`` (``WebDataset(urls, max_connections=...)`` iterated in one process);
* ``small``: local files in the page cache, 1 KB samples: ``wds_async.WebDataset(paths)`` beside
  ``webdataset.WebDataset(paths)``, both iterated in one process;
* ``large``: the same with 1 MB samples.

Besides MB/s and CPU s/GB, each row splits the CPU into user and system seconds per GB and counts the minor page
faults per GB (``getrusage`` of the phase's process around the phase): the kernel's share is the socket copies and
the first touch of memory the buffers grow into, which a short pass pays in full (the byte budget fills once per
process). ``--passes N`` reads the list N times in each phase (``urls * N``), so the one-off costs of a pass (the
ramp, the buffer's first fill) weigh 1/N as much.

Phases are interleaved across ``--repeat`` rounds (and across ``--tree`` library trees, for an A/B of
two checkouts of wds_async: each tree is put first on ``PYTHONPATH`` of its phases) and the best round
of each phase is reported: highest MB/s, lowest CPU s/GB. Shards are generated once under ``--dir``.
``--client`` (repeatable) runs the http case's phases with that http client (``backend_options={"client": ...}``:
``builtin`` or ``aiohttp``), interleaved like trees; without it the backend's default is used.

``--workers N,...`` adds to the http case one phase per N: ``DataLoader(ds.batched(64, collation_fn=None),
batch_size=None, num_workers=N)``, the connections shared out (``ceil(connections / N)`` per worker, each worker an
engine of its own), so that N loop threads parse in N processes. Batches of 64 samples cross from each worker to
the main process pickled through the DataLoader's queue, as a pipeline that batches before the hand-over would.
The phase's CPU is its own process's plus its workers' (reaped before it is read); its bytes are the shards' size,
and its samples are counted in the main process, so a row whose samples differ from the loader's shows a loss.
``--tensors`` adds, per N, ``dlt N``: the same, but each batch is ``wds.pack_samples``: its member bytes in one
``uint8`` tensor in shared memory (one copy, as torch's ``default_collate`` stacks a batch of tensors in a worker),
so that only a file descriptor and the small values cross the queue: the hand-over of a pipeline that decodes to
tensors in its workers.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: case -> (number of shards, bytes per shard, mean .bin size, phases)
CASES: dict[str, tuple[int, int, int, tuple[str, ...]]] = {
    "http": (32, 16 << 20, 100 << 10, ("raw", "wds-async")),
    "small": (32, 4 << 20, 1 << 10, ("wds-async", "webdataset")),
    "large": (16, 32 << 20, 1 << 20, ("wds-async", "webdataset")),
}


# -- phases (run in the child process) -----------------------------------------------------------

def _phase_raw(urls: list[str], connections: int, options: dict[str, Any]) -> dict[str, Any]:
    import asyncio

    from wds_async._loop import run_private
    from wds_async.io.rawread import drain, raw_backends

    async def download_all() -> int:
        async with raw_backends(connections, options) as backends:
            shards = iter(urls)

            async def worker() -> int:
                return sum([await drain(backends, url) for url in shards])

            return sum(await asyncio.gather(*(worker() for _ in range(min(connections, len(urls))))))

    return {"bytes": run_private(download_all), "samples": None}


def _phase_loader(urls: list[str], connections: int, options: dict[str, Any]) -> dict[str, Any]:
    import wds_async

    ds = wds_async.WebDataset(urls, nodesplitter=None, workersplitter=None, max_connections=connections or None,
                              backend_options=options or None)
    samples = 0
    for _ in ds:
        samples += 1
    return {"bytes": ds.stats()["bytes_read"], "samples": samples}


def _keep(batch: Any) -> Any:
    return batch  # the DataLoader's collate_fn: the batch as the pipeline made it (no conversion walk)


def _phase_dataloader(urls: list[str], connections: int, workers: int, tensors: bool,
                      options: dict[str, Any]) -> dict[str, Any]:
    import gc

    from torch.utils.data import DataLoader

    import wds_async

    per_worker = -(-connections // workers)
    ds = wds_async.WebDataset(urls, nodesplitter=None, max_connections=per_worker, backend_options=options or None)
    batches = ds.batched(64, collation_fn=wds_async.pack_samples if tensors else None)
    loader = DataLoader(batches, batch_size=None, num_workers=workers, collate_fn=_keep)
    samples = sum(len(batch) for batch in loader)  # no batch outlives the pass
    del loader
    gc.collect()  # the iterator's workers are joined when it goes, so that RUSAGE_CHILDREN counts them
    return {"bytes": None, "samples": samples}


def _phase_webdataset(urls: list[str]) -> dict[str, Any]:
    import warnings

    warnings.simplefilter("ignore")
    import webdataset  # type: ignore[import-untyped]

    samples = 0
    for _ in webdataset.WebDataset(urls, shardshuffle=False):
        samples += 1
    return {"bytes": sum(os.path.getsize(u) for u in urls), "samples": samples}


def phase_main(phase: str, urls: list[str], connections: int, client: str | None = None) -> dict[str, Any]:
    """Run one phase in this process; wall and CPU seconds are measured around it. Imports are not: they
    are a one-off per process (aiohttp alone is ~0.2 CPU s, which would be ~0.4 s/GB of a 0.5 GB case)."""
    with contextlib.suppress(ImportError):
        import uvloop  # noqa: F401
    for module in ("wds_async", "wds_async.backends.file", "wds_async.backends.http"):
        importlib.import_module(module)
    # wds_async.WebDataset is resolved lazily, and its module imports torch where torch is installed (1.5 to 2 CPU s
    # with a CUDA build): resolve it here, or that import lands in the loader's clock.
    _ = importlib.import_module("wds_async").WebDataset

    if phase == "webdataset":
        import webdataset  # type: ignore[import-untyped]  # noqa: F401
    if phase.startswith("dl"):
        import torch.utils.data  # noqa: F401
    import resource

    usage0 = resource.getrusage(resource.RUSAGE_SELF)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    options = {"client": client} if client else {}
    if phase == "raw":
        result = _phase_raw(urls, connections, options)
    elif phase == "wds-async":
        result = _phase_loader(urls, connections, options)
    elif phase.startswith(("dl ", "dlt ")):
        kind, n = phase.split()
        result = _phase_dataloader(urls, connections, int(n), kind == "dlt", options)
    else:
        result = _phase_webdataset(urls)
    wall = time.perf_counter() - started
    usage, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    user = usage.ru_utime - usage0.ru_utime + children.ru_utime - children0.ru_utime
    system = usage.ru_stime - usage0.ru_stime + children.ru_stime - children0.ru_stime
    result.update(wall_s=wall, cpu_s=user + system, user_s=user, sys_s=system,
                  minflt=usage.ru_minflt - usage0.ru_minflt + children.ru_minflt - children0.ru_minflt)
    return result


# -- driver -------------------------------------------------------------------------------------

#: A library tree and the http client its phases use (None: the backend's default).
Variant = tuple[Path, str | None]


def _label(variant: Variant) -> str:
    tree, client = variant
    return str(tree)[-22:] if client is None else f"{str(tree)[-13:]}:{client}"[-22:]


def _run(variant: Variant, phase: str, urls: list[str], connections: int, total: int | None = None) -> dict[str, Any]:
    tree, client = variant
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", phase, "--connections", str(connections),
           *(["--client", client] if client else []), "--", *urls]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(tree), timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"phase {phase} ({tree}) failed:\n{proc.stderr[-3000:]}")
    row: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    if row["bytes"] is None:  # a DataLoader phase: the shards' bytes (its samples are checked against the loader's)
        row["bytes"] = total
    row["mb_s"] = row["bytes"] / row["wall_s"] / 1e6
    gb = row["bytes"] / 1e9
    row["cpu_s_gb"] = row["cpu_s"] / gb
    row["user_s_gb"], row["sys_s_gb"], row["kflt_gb"] = row["user_s"] / gb, row["sys_s"] / gb, row["minflt"] / gb / 1e3
    row["samples_s"] = row["samples"] / row["wall_s"] if row["samples"] else None
    return row


def _shards(base: Path, case: str) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from benchmarks.make_shards import make_shards

    n, shard_bytes, sample_bytes, _ = CASES[case]
    return [str(p) for p in make_shards(base / case, n_shards=n, shard_bytes=shard_bytes, sample_bytes=sample_bytes)]


def _measure(case: str, urls: list[str], variants: list[Variant], repeat: int, connections: int,
             phases: Sequence[str], total: int | None = None) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """Every phase of every variant, ``repeat`` rounds, interleaved (``urls``: the list already repeated;
    ``total``: its bytes, for the phases that cannot count them)."""
    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(repeat):
        for variant in variants:
            for phase in phases:
                # The local cases use the loader's defaults, as a user would; http names the connections.
                conns = connections if case == "http" else 0
                rows.setdefault((_label(variant), phase), []).append(_run(variant, phase, urls, conns, total))
    return rows


def _report(case: str, rows: dict[tuple[str, str], list[dict[str, Any]]], variants: list[Variant],
            phases: Sequence[str], passes: int = 1) -> None:
    n, shard_bytes, sample_bytes, _ = CASES[case]
    times = f", the list read {passes} times" if passes > 1 else ""
    print(f"\n[{case}] {n} shards x {shard_bytes >> 20} MiB, {sample_bytes >> 10} KiB samples{times} "
          f"(best of {len(next(iter(rows.values())))}; user, sys and faults from the round of the best CPU)")
    print(f"{'tree':<22}{'phase':<12}{'MB/s':>9}{'samples/s':>11}{'CPU s/GB':>10}{'user':>6}{'sys':>6}"
          f"{'kflt/GB':>8}{'samples':>9}")
    for variant in variants:
        best: dict[str, dict[str, Any]] = {}
        for phase in phases:
            runs = rows[(_label(variant), phase)]
            cheapest = min(runs, key=lambda r: r["cpu_s_gb"])
            b = {"mb_s": max(r["mb_s"] for r in runs), "cpu_s_gb": cheapest["cpu_s_gb"],
                 "samples_s": max((r["samples_s"] or 0) for r in runs), "samples": runs[0]["samples"]}
            best[phase] = b
            sps = f"{b['samples_s']:.0f}" if b["samples_s"] else "-"
            print(f"{_label(variant):<22}{phase:<12}{b['mb_s']:>9.1f}{sps:>11}{b['cpu_s_gb']:>10.2f}"
                  f"{cheapest['user_s_gb']:>6.2f}{cheapest['sys_s_gb']:>6.2f}{cheapest['kflt_gb']:>8.1f}"
                  f"{b['samples'] if b['samples'] is not None else '-':>9}")
        other = next(phase for phase in phases if phase != "wds-async")
        theirs = best[other]
        for phase in phases:
            if phase == other:
                continue
            ours = best[phase]
            print(f"{'':<22}{phase} / {other}: {ours['mb_s'] / theirs['mb_s']:.2f}x MB/s (and samples/s), "
                  f"{ours['cpu_s_gb'] / theirs['cpu_s_gb']:.2f}x CPU s/GB")
            if ours["samples"] != best["wds-async"]["samples"]:
                print(f"{'':<22}{phase}: {ours['samples']} samples, the loader {best['wds-async']['samples']}: LOST")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python benchmarks/cpu.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="http,small,large")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--tree", action="append", type=Path, help="wds_async checkout(s) to compare (default: this one)")
    p.add_argument("--dir", type=Path, default=ROOT / ".bench" / "cpu", help="where shards are generated")
    p.add_argument("-c", "--connections", type=int, default=16, help="connections of the http case")
    p.add_argument("--passes", type=int, default=1, help="each phase reads the list this many times (default 1)")
    p.add_argument("--client", action="append", choices=("builtin", "aiohttp"),
                   help="the http case's http client (repeatable; default: the backend's own default)")
    p.add_argument("--workers", default="", help="the http case also through DataLoader workers: N[,N...]")
    p.add_argument("--tensors", action="store_true", help="with --workers: also hand batches over as shared tensors")
    p.add_argument("--phase", help=argparse.SUPPRESS)
    p.add_argument("urls", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.passes < 1:
        p.error("--passes: at least 1")
    try:
        workers = [int(n) for n in args.workers.split(",") if n.strip()]
    except ValueError:
        p.error(f"--workers: numbers separated by commas, not {args.workers!r}")
    if any(n < 1 for n in workers):
        p.error("--workers: each at least 1 (0 workers is the loader's own row)")
    if args.phase:
        print(json.dumps(phase_main(args.phase, args.urls, args.connections, (args.client or [None])[0])))
        return 0
    trees = [t.resolve() for t in (args.tree or [ROOT])]
    clients: list[str | None] = list(args.client or [None])
    for case in args.cases.split(","):
        paths = _shards(args.dir, case)
        phases = list(CASES[case][3])
        if case == "http":
            from emustore import Knobs, StoreProcess

            phases += [f"{kind} {n}" for n in workers for kind in ("dl", "dlt")[:1 + args.tensors]]
            total = sum(os.path.getsize(path) for path in paths) * args.passes
            with StoreProcess(args.dir / case, Knobs()) as store:
                urls = [store.url(Path(path).name) for path in paths]
                variants = [(tree, client) for tree in trees for client in clients]
                rows = _measure(case, urls * args.passes, variants, args.repeat, args.connections, phases, total)
        else:
            variants = [(tree, None) for tree in trees]
            rows = _measure(case, paths * args.passes, variants, args.repeat, args.connections, phases)
        _report(case, rows, variants, phases, args.passes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
