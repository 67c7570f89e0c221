"""The child side of ``wds-async bench``: one phase, run as ``python -m wds_async.cli.bench.phase``, in a
fresh interpreter so that its CPU time and peak memory are its own (see :mod:`wds_async.cli.bench.run`).

It prints one JSON line on stdout: the phase's figures, or, when a
:class:`~wds_async.errors.WdsError` ended it (a missing or damaged shard, a refused request), the error
pickled (``{"error": text, "error_pickle": base64}``, exit status 3), which the parent raises as it is.
With ``--progress-file`` it rewrites "bytes samples seconds" (since its timed region began) there at
most every :data:`REPORT_EVERY` seconds, for the parent's status line.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..._atomic import AtomicFile
from ..common import wds_error

__all__ = ["REPORT_EVERY", "main"]

REPORT_EVERY = 0.25  # seconds between a phase's progress writes (and the parent's reads)


class _Reporter:
    """A phase's side of the status line: rewrites "bytes samples seconds" in ``path`` when ``due()``."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._next = 0.0
        self._t0 = time.perf_counter()

    def start(self) -> None:
        """The timed region begins (imports and setup before it are not the phase's rate)."""
        self._t0 = time.perf_counter()

    def due(self) -> bool:
        if self.path is None:
            return False
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + REPORT_EVERY
        return True

    def write(self, nbytes: int | None, samples: int | None) -> None:
        if self.path is None:
            return
        with AtomicFile(self.path, durable=False) as out:  # the parent never reads half a line
            out.write(f"{-1 if nbytes is None else nbytes} {-1 if samples is None else samples} "
                      f"{time.perf_counter() - self._t0}\n".encode())
            out.commit()


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _finish(result: dict[str, Any], started: float, cpu0: float, baseline: int) -> dict[str, Any]:
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    from .peers.runners._common import own_peak_rss

    peak = own_peak_rss()  # not ru_maxrss, which Linux carries over from the parent across exec
    result.update(wall_s=wall, cpu_s=cpu, peak_above_baseline=max(0, peak - baseline), baseline_rss=baseline,
                  peak_rss=peak)
    seen = result.pop("_seen", None)
    if seen is not None:
        from .peers.runners._common import keys_digest, sample_name

        result["keys_digest"] = keys_digest(sample_name(url, key) for url, key in seen)
    return result


def _phase_raw(urls: list[str], connections: int, reporter: _Reporter) -> dict[str, Any]:
    from asyncio import TaskGroup

    from ..._loop import run_private
    from ...io import import_backends
    from ...io.rawread import drain, raw_backends

    # Before the clock, as the loader's phase constructs its dataset: timed, botocore's import made a short raw
    # pass of s3:// URLs run at 0.82-0.88x s5cmd's rate while the loader ran at 0.97-1.00x.
    import_backends(urls)
    baseline = _rss()
    total = 0
    started = cpu0 = 0.0
    first_s: float | None = None  # the first byte, from the timed region's start

    def count(n: int) -> None:
        nonlocal total, first_s
        if first_s is None:
            first_s = time.perf_counter() - started
        total += n
        if reporter.due():
            reporter.write(total, None)

    async def download_all() -> None:
        nonlocal started, cpu0
        shards = iter(urls)
        started, cpu0 = time.perf_counter(), time.process_time()
        reporter.start()
        async with raw_backends(connections) as backends:

            async def worker() -> None:
                for url in shards:
                    await drain(backends, url, on_chunk=count)

            async with TaskGroup() as group:
                for _ in range(min(connections, len(urls))):
                    group.create_task(worker())

    run_private(download_all)
    return _finish({"bytes": total, "samples": None, "first_s": first_s}, started, cpu0, baseline)


def _consume(ds: Any, reporter: _Reporter, nbytes: Callable[[], int | None]) -> tuple[dict[str, Any], float, float]:
    """Iterate ``ds`` to the end; count samples and distinct ``(url, key)`` pairs, and hash their names
    as the peers' runners do (``keys_digest``, in :func:`_finish`, after the clock stops), so a peer's
    samples can be checked against these."""
    seen: set[tuple[str, str]] = set()
    samples = 0
    first_s: float | None = None  # the first sample, from the timed region's start (iter() included)
    started, cpu0 = time.perf_counter(), time.process_time()
    reporter.start()
    for sample in ds:
        if first_s is None:
            first_s = time.perf_counter() - started
        samples += 1
        seen.add((sample["__url__"], sample["__key__"]))
        if samples % 64 == 0 and reporter.due():  # the clock is read once per 64 samples
            reporter.write(nbytes(), samples)
    return {"samples": samples, "unique": len(seen), "_seen": seen, "first_s": first_s}, started, cpu0


def _phase_loader(urls: list[str], connections: int | str, max_buffered_bytes: int | None,
                  reporter: _Reporter) -> dict[str, Any]:
    from ...data.dataset import WebDataset

    baseline = _rss()
    ds = WebDataset(urls, max_connections=connections, max_buffered_bytes=max_buffered_bytes,
                    nodesplitter=None, workersplitter=None)
    # Through a DataLoader loop, as a training job (and every peer loader in ``--peers``) consumes it; without
    # torch (wds-async installed without the torch extra), as the plain iterable it then is.
    from ...data._torch import HAVE_TORCH

    loader: Any = ds
    if HAVE_TORCH:
        from torch.utils.data import DataLoader

        loader = DataLoader(ds, batch_size=None, num_workers=0)
    result, started, cpu0 = _consume(loader, reporter, lambda: int(ds.stats()["bytes_read"]))
    result.update(_engine_figures(ds, processes=1))
    return _finish(result, started, cpu0, baseline)


def _engine_figures(ds: Any, processes: int) -> dict[str, Any]:
    """A loader phase's figures from ``ds.stats()`` (its DataLoader workers' summed, where it had them); ``limit``:
    the byte budgets of its ``processes`` engines together."""
    stats = ds.stats()
    return {"bytes": stats["bytes_read"], "peak_buffered": stats["peak_buffered_bytes"], "wait_s": stats["wait_s"],
            "limit": ds.config.max_buffered_bytes * processes, "retries": stats["retries"],
            "concurrency": stats["concurrency"], "concurrency_reason": stats["concurrency_reason"],
            "first_sample_s": stats["first_sample_s"]}


def _phase_workers(urls: list[str], connections: int, workers: int, tensors: bool, max_buffered_bytes: int | None,
                   reporter: _Reporter) -> dict[str, Any]:
    """The loader through ``DataLoader(ds, batch_size=None, num_workers=workers)``: each worker an engine over its
    share of the shards with ``ceil(connections / workers)`` connections (the same total as the other phases), its
    samples pickled to this process through the DataLoader's queue, or with ``tensors`` batches of 64 packed by
    :func:`~wds_async.pack_samples` (their bytes in shared memory; this process reads each sample's name). CPU adds
    the workers' (joined when the pass ends, so ``RUSAGE_CHILDREN`` holds them); memory is this process's peak plus
    ``workers`` times the largest worker's peak above this process's baseline, an upper bound (a forked worker
    shares pages with its parent)."""
    import resource

    from torch.utils.data import DataLoader

    from ...data.dataset import WebDataset
    from ...data.packed import pack_samples

    baseline = _rss()
    per_worker = -(-connections // workers)
    ds = WebDataset(urls, max_connections=per_worker, max_buffered_bytes=max_buffered_bytes, nodesplitter=None)
    loader: Any
    if tensors:
        batches = DataLoader(ds.batched(64, collation_fn=pack_samples), batch_size=None, num_workers=workers)
        loader = ({"__url__": url, "__key__": key} for packed in batches
                  for url, key in zip(packed.values("__url__"), packed.values("__key__"), strict=True))
    else:
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    result, started, cpu0 = _consume(loader, reporter, lambda: int(ds.stats()["bytes_read"]))
    del loader  # its workers were joined as the pass ended (and are counted in RUSAGE_CHILDREN from then)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    workers_cpu = (children.ru_utime - children0.ru_utime) + (children.ru_stime - children0.ru_stime)
    result.update(_engine_figures(ds, processes=workers), workers=workers, tensors=tensors)
    result = _finish(result, started, cpu0, baseline)
    result["cpu_s"] += workers_cpu
    result["workers_cpu_s"] = workers_cpu
    largest = children.ru_maxrss << 10  # KiB on Linux
    result["peak_above_baseline"] += workers * max(0, largest - baseline)
    return result


def _phase_webdataset(urls: list[str], reporter: _Reporter) -> dict[str, Any]:
    import warnings

    warnings.simplefilter("ignore")
    import webdataset

    baseline = _rss()
    result, started, cpu0 = _consume(webdataset.WebDataset(urls, shardshuffle=False), reporter, lambda: None)
    result["bytes"] = None
    return _finish(result, started, cpu0, baseline)

def _phase_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m wds_async.cli.bench.phase")
    parser.add_argument("--phase", choices=("raw", "loader", "loader-auto", "loader-workers", "webdataset"),
                        required=True)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2, help="loader-workers: the DataLoader's num_workers")
    parser.add_argument("--tensors", action="store_true", help="loader-workers: batches handed over as tensors")
    parser.add_argument("--max-buffered-bytes", type=int, default=None)
    parser.add_argument("--progress-file", default=None, help="rewrite 'bytes samples' here while running")
    parser.add_argument("urls", nargs="+")
    args = parser.parse_args(argv)
    reporter = _Reporter(args.progress_file)
    if args.phase == "raw":
        result = _phase_raw(args.urls, args.connections, reporter)
    elif args.phase == "loader":
        result = _phase_loader(args.urls, args.connections, args.max_buffered_bytes, reporter)
    elif args.phase == "loader-auto":
        result = _phase_loader(args.urls, "auto", args.max_buffered_bytes, reporter)
    elif args.phase == "loader-workers":
        result = _phase_workers(args.urls, args.connections, args.workers, args.tensors, args.max_buffered_bytes,
                                reporter)
    else:
        result = _phase_webdataset(args.urls, reporter)
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _phase_main(sys.argv[1:] if argv is None else argv)
    except BaseException as exc:
        error = wds_error(exc)
        if error is None:
            raise
        print(json.dumps({"error": str(error), "error_pickle": base64.b64encode(pickle.dumps(error)).decode()}))
        return 3


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
