"""Local file I/O from the event loop: the executor path beside aiofiles, reads and writes.

    python -m benchmarks.file_io [--files 16] [--size-mib 32] [--concurrency 8] [--rounds 9] [--json]

What decides how ``backends/file.py``, cache fills and local writers do their blocking work (issue 12,
part 4: aiofiles unless it costs more than 5%). All on one uvloop, in this process, ``--concurrency``
readers (writers) taking files from one list as the engine's shard readers do, bytes counted and dropped:

* **read** of ``--files`` files of ``--size-mib`` MiB in ``--chunk-kib`` chunks, (a) ``cached``: the
  files in the page cache, (b) ``cold``: evicted before each round with
  ``posix_fadvise(POSIX_FADV_DONTNEED)`` (the fraction still resident after eviction is printed):

  - ``executor``: the file backend before aiofiles, kept here as the reference: ``open`` in the loop's
    executor, a chunk found in the page cache (``preadv(RWF_NOWAIT)`` probe) read on the loop, any
    other chunk by ``os.pread`` in the executor;
  - ``aiofiles``: ``aiofiles.open(path, "rb")``, one ``seek`` to the start, then ``read(chunk)`` per
    chunk: every read an executor hop;
  - ``backend``: ``FileBackend`` as shipped (``wds_async.backends.file``).

* **write** of the same amount in 1 MiB chunks to fresh files (into the page cache; deleted after each
  round): ``executor`` (``open`` and ``os.write`` by ``run_in_executor``) beside ``aiofiles``
  (``aiofiles.open(path, "wb")`` and ``write``);
* **commit**: the same, published as a cache fill is (temporary name, fsync, rename): ``executor`` by
  ``run_in_executor`` beside ``writer`` (``wds_async._aio.AsyncFileWriter``).

Variants run interleaved (the order rotated each round) so that all see the same machine noise; each
figure is the median over ``--rounds`` rounds: MB/s (wall), CPU s/GB (user+system of the process, all
threads) and user CPU s/GB (the Python side, where the variants differ). Ratios are to ``executor``, the
median of each round's ratio: MB/s ratio below 1 and CPU ratio above 1 mean a cost.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiofiles

from wds_async._aio import AsyncFileWriter
from wds_async._loop import new_event_loop
from wds_async.backends.file import FileBackend

_NOWAIT = getattr(os, "RWF_NOWAIT", None)
Job = Callable[[str], Awaitable[int]]
#: One round of one variant: MB/s, CPU s/GB (user+system), user CPU s/GB.
Sample = tuple[float, float, float]
_FIGURES = ("mb_s", "cpu_s_gb", "user_s_gb")


# -- read variants ------------------------------------------------------------------------------

def _cached(fd: int, pos: int, n: int) -> bool:
    if _NOWAIT is None:
        return False
    probe = bytearray(1)
    try:
        return os.preadv(fd, [probe], pos, _NOWAIT) == 1 and os.preadv(fd, [probe], pos + n - 1, _NOWAIT) == 1
    except OSError:
        return False


async def read_executor(path: str, chunk: int) -> int:
    """The pre-aiofiles file backend's read path (reference copy)."""
    loop = asyncio.get_running_loop()
    fh = await loop.run_in_executor(None, open, path, "rb")
    try:
        fd, pos = fh.fileno(), 0
        while True:
            if _cached(fd, pos, chunk):
                data = os.pread(fd, chunk, pos)
                await asyncio.sleep(0)
            else:
                data = await loop.run_in_executor(None, os.pread, fd, chunk, pos)
            if not data:
                return pos
            pos += len(data)
    finally:
        fh.close()


async def read_aiofiles(path: str, chunk: int) -> int:
    """aiofiles as a caller would use it: open, seek to the start, read chunk after chunk."""
    total = 0
    async with aiofiles.open(path, "rb") as f:
        await f.seek(0)
        while data := await f.read(chunk):
            total += len(data)
    return total


async def read_backend(backend: FileBackend, path: str) -> int:
    total = 0
    async with backend.open(path) as stream:
        async for data in stream:
            total += len(data)
    return total


# -- write variants -----------------------------------------------------------------------------

async def write_executor(path: str, block: bytes, count: int) -> int:
    loop = asyncio.get_running_loop()
    fh = await loop.run_in_executor(None, open, path, "wb", 0)
    try:
        for _ in range(count):
            view = memoryview(block)
            while view:
                view = view[await loop.run_in_executor(None, os.write, fh.fileno(), view):]
    finally:
        await loop.run_in_executor(None, fh.close)
    return len(block) * count


async def write_aiofiles(path: str, block: bytes, count: int) -> int:
    async with aiofiles.open(path, "wb") as f:
        for _ in range(count):
            await f.write(block)
    return len(block) * count


async def commit_executor(path: str, block: bytes, count: int) -> int:
    """A published file by hand: a temporary name, ``os.write`` chunks, fsync, close, rename."""
    loop = asyncio.get_running_loop()
    tmp = f"{path}.tmp"
    fh = await loop.run_in_executor(None, open, tmp, "xb", 0)
    try:
        for _ in range(count):
            view = memoryview(block)
            while view:
                view = view[await loop.run_in_executor(None, os.write, fh.fileno(), view):]
        await loop.run_in_executor(None, os.fsync, fh.fileno())
    finally:
        await loop.run_in_executor(None, fh.close)
    await loop.run_in_executor(None, os.replace, tmp, path)
    return len(block) * count


async def commit_writer(path: str, block: bytes, count: int) -> int:
    async with AsyncFileWriter(path) as out:
        for _ in range(count):
            await out.write(block)
        await out.commit()
    return len(block) * count


# -- harness ------------------------------------------------------------------------------------

async def _run_all(paths: Sequence[str], concurrency: int, job: Job) -> int:
    todo = iter(paths)

    async def worker() -> int:
        return sum([await job(path) for path in todo])

    return sum(await asyncio.gather(*(worker() for _ in range(min(concurrency, len(paths))))))


def _write_job(write: Callable[[str, bytes, int], Awaitable[int]], block: bytes, count: int, path: str
               ) -> Awaitable[int]:
    return write(path, block, count)


def _cpu() -> tuple[float, float]:
    """CPU seconds of the process (all threads): user+system, and user alone (where Python runs)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_utime


def _evict(paths: Sequence[str]) -> float:
    """Drop the files from the page cache; the fraction of sampled pages still resident afterwards."""
    hits = probes = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            size = os.fstat(fd).st_size
            for k in range(16):
                probes += 1
                hits += _cached(fd, size * k // 16, 1)
        finally:
            os.close(fd)
    return hits / probes if probes else 0.0


def _warm(paths: Sequence[str]) -> None:
    for path in paths:
        with open(path, "rb") as fh:
            while fh.read(8 << 20):
                pass


def _measure(loop: asyncio.AbstractEventLoop, paths: Sequence[str], concurrency: int, job: Job) -> Sample:
    gc.collect()
    (c0, u0), t0 = _cpu(), time.perf_counter()
    nbytes = loop.run_until_complete(_run_all(paths, concurrency, job))
    wall, (c1, u1) = time.perf_counter() - t0, _cpu()
    gb = nbytes / 1e9
    return nbytes / wall / 1e6, (c1 - c0) / gb, (u1 - u0) / gb


def _summary(samples: dict[str, list[Sample]]) -> dict[str, dict[str, float]]:
    """Medians per variant, and ratios to ``executor`` as the median of the per-round ratios (each round's
    variants ran back to back, so a ratio within a round cancels the machine's slower drifts)."""
    out: dict[str, dict[str, float]] = {}
    base = samples.get("executor")
    for name, rows in samples.items():
        row = out[name] = {key: statistics.median(r[i] for r in rows) for i, key in enumerate(_FIGURES)}
        if base:
            row["mb_s_ratio"] = statistics.median(r[0] / b[0] for r, b in zip(rows, base))
            row["cpu_ratio"] = statistics.median(r[1] / b[1] for r, b in zip(rows, base))
    return out


def _rounds(rounds: int, variants: dict[str, Job], before: Callable[[], None], measure: Callable[[Job], Sample]
            ) -> dict[str, list[Sample]]:
    names = list(variants)
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            before()
            samples[name].append(measure(variants[name]))
    return samples


def run(args: argparse.Namespace) -> dict[str, Any]:
    chunk = args.chunk_kib << 10
    root = tempfile.mkdtemp(prefix="wds-file-io-", dir=args.dir)
    loop = new_event_loop()
    backend = FileBackend(chunk_bytes=chunk)
    result: dict[str, Any] = {
        "config": {"files": args.files, "size_mib": args.size_mib, "concurrency": args.concurrency,
                   "chunk_kib": args.chunk_kib, "rounds": args.rounds, "loop": type(loop).__module__,
                   "cpus": os.cpu_count()},
    }
    try:
        block = os.urandom(1 << 20)
        paths = [os.path.join(root, f"f{i:03d}.bin") for i in range(args.files)]
        for path in paths:
            with open(path, "wb") as fh:
                for _ in range(args.size_mib):
                    fh.write(block)
                fh.flush()
                os.fsync(fh.fileno())  # clean pages: DONTNEED can drop them
        readers: dict[str, Job] = {
            "executor": lambda p: read_executor(p, chunk),
            "aiofiles": lambda p: read_aiofiles(p, chunk),
            "backend": lambda p: read_backend(backend, p),
        }

        def read_measure(job: Job) -> Sample:
            return _measure(loop, paths, args.concurrency, job)

        if "cached" in args.cases:
            _warm(paths)
            result["read_cached"] = _summary(_rounds(args.rounds, readers, lambda: None, read_measure))
        if "cold" in args.cases:
            resident: list[float] = []
            samples = _rounds(args.rounds, readers, lambda: resident.append(_evict(paths)), read_measure)
            result["read_cold"] = _summary(samples)
            result["read_cold_resident_after_evict"] = max(resident)
        out_dir = os.path.join(root, "w")
        os.mkdir(out_dir)
        targets = [os.path.join(out_dir, f"w{i:03d}.bin") for i in range(args.files)]

        def clear() -> None:
            for name in os.listdir(out_dir):
                os.unlink(os.path.join(out_dir, name))

        def write_measure(job: Job) -> Sample:
            return _measure(loop, targets, args.concurrency, job)

        def jobs(funcs: dict[str, Callable[[str, bytes, int], Awaitable[int]]]) -> dict[str, Job]:
            return {name: functools.partial(_write_job, f, block, args.size_mib) for name, f in funcs.items()}

        if "write" in args.cases:
            variants = jobs({"executor": write_executor, "aiofiles": write_aiofiles})
            result["write"] = _summary(_rounds(args.rounds, variants, clear, write_measure))
        if "commit" in args.cases:
            variants = jobs({"executor": commit_executor, "writer": commit_writer})
            result["commit"] = _summary(_rounds(args.rounds, variants, clear, write_measure))
    finally:
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()
        shutil.rmtree(root, ignore_errors=True)
    return result


def _table(result: dict[str, Any]) -> str:
    lines = [f"{'case':<12} {'variant':<9} {'MB/s':>8} {'CPU s/GB':>9} {'user s/GB':>9} {'MB/s ratio':>10} "
             f"{'CPU ratio':>9}"]
    for case in ("read_cached", "read_cold", "write", "commit"):
        for name, row in result.get(case, {}).items():
            lines.append(f"{case:<12} {name:<9} {row['mb_s']:>8.0f} {row['cpu_s_gb']:>9.3f} {row['user_s_gb']:>9.3f} "
                         f"{row.get('mb_s_ratio', 1):>10.3f} {row.get('cpu_ratio', 1):>9.3f}")
    if "read_cold_resident_after_evict" in result:
        lines.append(f"cold rounds: at most {result['read_cold_resident_after_evict']:.0%} of sampled pages "
                     "resident after eviction")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.file_io", description=__doc__.split("\n\n")[0])
    p.add_argument("--files", type=int, default=16)
    p.add_argument("--size-mib", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--chunk-kib", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--cases", default="cached,cold,write,commit",
                   help="comma-separated: cached, cold, write, commit")
    p.add_argument("--dir", default=None, help="where the files go (default: the system temp dir)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    args.cases = set(args.cases.split(","))
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else _table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
