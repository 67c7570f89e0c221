"""``wds-async bench``: the loader beside raw parallel download of the same shards, in one run.

Each phase runs in a fresh subprocess so that its CPU time and peak memory are its own:

* **raw**: ``connections`` concurrent streaming GETs of the shards, bytes thrown away (the analog of
  ``gsutil -m cp`` to /dev/null), over the same backends the loader uses;
* **wds-async**: ``WebDataset(urls, max_connections=connections)`` iterated in one process, counting
  samples and checking every ``(url, key)`` arrives exactly once;
* **webdataset** (``--vs-webdataset``, when the package is installed): ``webdataset.WebDataset(urls)``
  iterated in one process, its default way of reading.

Reported per phase: MB/s (10**6 bytes of shard data per second), samples/s, the ratio to raw, CPU
seconds per GB (user+system of the phase's process), and peak RSS above the process's post-import
baseline. Nothing here is a pass/fail assertion: the figures go to the README and issue notes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

__all__ = ["main", "run_bench"]


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def _finish(result: dict[str, Any], started: float, cpu0: float, baseline: int) -> dict[str, Any]:
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result.update(wall_s=wall, cpu_s=cpu, peak_above_baseline=max(0, peak - baseline), baseline_rss=baseline)
    return result


def _phase_raw(urls: list[str], connections: int) -> dict[str, Any]:
    from ._compat import TaskGroup
    from .bridge import new_event_loop
    from .config import EngineConfig
    from .engine import BackendSet

    baseline = _rss()
    config = EngineConfig(max_connections=connections)
    total = 0

    async def download_all() -> None:
        nonlocal total
        backends = BackendSet(config)
        shards = iter(urls)

        async def worker() -> None:
            nonlocal total
            for url in shards:
                async with backends.for_url(url).open(url) as stream:
                    async for chunk in stream:
                        total += len(chunk)

        try:
            async with TaskGroup() as group:
                for _ in range(min(connections, len(urls))):
                    group.create_task(worker())
        finally:
            await backends.aclose()

    loop = new_event_loop()
    started, cpu0 = time.perf_counter(), time.process_time()
    try:
        loop.run_until_complete(download_all())
    finally:
        loop.close()
    return _finish({"bytes": total, "samples": None}, started, cpu0, baseline)


def _consume(ds: Any) -> tuple[dict[str, Any], float, float]:
    """Iterate ``ds`` to the end; count samples and distinct ``(url, key)`` pairs."""
    seen: set[tuple[str, str]] = set()
    samples = 0
    started, cpu0 = time.perf_counter(), time.process_time()
    for sample in ds:
        samples += 1
        seen.add((sample["__url__"], sample["__key__"]))
    return {"samples": samples, "unique": len(seen)}, started, cpu0


def _phase_loader(urls: list[str], connections: int, max_buffered_bytes: int | None) -> dict[str, Any]:
    from .dataset import WebDataset

    baseline = _rss()
    ds = WebDataset(urls, max_connections=connections, max_buffered_bytes=max_buffered_bytes,
                    nodesplitter=None, workersplitter=None)
    result, started, cpu0 = _consume(ds)
    stats = ds.stats()
    result.update(bytes=stats["bytes_read"], peak_buffered=stats["peak_buffered_bytes"], wait_s=stats["wait_s"],
                  limit=ds.config.max_buffered_bytes, retries=stats["retries"])
    return _finish(result, started, cpu0, baseline)


def _phase_webdataset(urls: list[str]) -> dict[str, Any]:
    import warnings

    warnings.simplefilter("ignore")
    import webdataset

    baseline = _rss()
    result, started, cpu0 = _consume(webdataset.WebDataset(urls, shardshuffle=False))
    result["bytes"] = None
    return _finish(result, started, cpu0, baseline)


def _run_phase(phase: str, urls: list[str], connections: int, max_buffered_bytes: int | None,
               timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "wds_async.bench", "--phase", phase, "--connections", str(connections)]
    if max_buffered_bytes:
        cmd += ["--max-buffered-bytes", str(max_buffered_bytes)]
    proc = subprocess.run(cmd + ["--", *urls], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"bench phase {phase!r} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_bench(urls: list[str], *, connections: int = 16, vs_webdataset: bool = False,
              max_buffered_bytes: int | None = None, faults: str | None = None,
              timeout: float = 1800) -> list[dict[str, Any]]:
    """Run the phases and return one row per phase, with derived rates and ratios.

    ``faults`` is a query string appended to every URL for an extra loader phase (the emulated store
    reads fault knobs from the query, e.g. ``drop_rate=0.05&fail_rate=0.05``); its row reports the
    throughput as a ratio to the clean loader run (``vs_clean``).
    """
    rows: list[dict[str, Any]] = []
    raw = _run_phase("raw", urls, connections, None, timeout)
    raw["name"] = f"raw download ({connections} conns)"
    rows.append(raw)
    loader = _run_phase("loader", urls, connections, max_buffered_bytes, timeout)
    loader["name"] = f"wds-async ({connections} conns)"
    rows.append(loader)
    if faults:
        faulty_urls = [u + ("&" if "?" in u else "?") + faults for u in urls]
        faulty = _run_phase("loader", faulty_urls, connections, max_buffered_bytes, timeout)
        faulty["name"] = "wds-async under faults"
        faulty["faults"] = faults
        rows.append(faulty)
    if vs_webdataset:
        try:
            import webdataset  # noqa: F401
        except ImportError:
            print("webdataset is not installed: pip install webdataset (skipping --vs-webdataset)", file=sys.stderr)
        else:
            wds_row = _run_phase("webdataset", urls, connections, None, timeout)
            wds_row["name"] = "webdataset 1 process"
            wds_row["bytes"] = raw["bytes"]  # the same shards: their bytes
            rows.append(wds_row)
    for row in rows:
        row["mb_s"] = row["bytes"] / row["wall_s"] / 1e6
        row["samples_s"] = row["samples"] / row["wall_s"] if row.get("samples") is not None else None
        row["vs_raw"] = row["mb_s"] / raw["mb_s"]
        row["cpu_s_per_gb"] = row["cpu_s"] / (row["bytes"] / 1e9) if row["bytes"] else None
    for row in rows:
        if row.get("faults"):
            row["vs_clean"] = row["mb_s"] / loader["mb_s"]
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    header = f"{'phase':<26}{'MB/s':>9}{'samples/s':>11}{'vs raw':>8}{'CPU s/GB':>10}{'peak MB':>9}{'samples':>9}  exactly once"
    lines = [header, "-" * len(header)]
    expected = next((r["samples"] for r in rows if r["name"].startswith("wds-async")), None)
    for r in rows:
        sps = f"{r['samples_s']:.0f}" if r["samples_s"] is not None else "-"
        samples = str(r["samples"]) if r["samples"] is not None else "-"
        once = "-"
        if r.get("unique") is not None:
            once = "yes" if r["unique"] == r["samples"] else f"NO ({r['samples'] - r['unique']} duplicates)"
            if expected is not None and r["samples"] != expected:
                once += f" (count differs: {r['samples']} vs {expected})"
        lines.append(f"{r['name']:<26}{r['mb_s']:>9.1f}{sps:>11}{r['vs_raw']:>8.2f}{r['cpu_s_per_gb']:>10.2f}"
                     f"{r['peak_above_baseline'] / 1e6:>9.0f}{samples:>9}  {once}")
    loader = next((r for r in rows if r["name"].startswith("wds-async")), None)
    other = next((r for r in rows if r["name"].startswith("webdataset")), None)
    faulty = next((r for r in rows if r.get("faults")), None)
    if loader is not None:
        lines.append("")
        lines.append(f"wds-async / raw = {loader['vs_raw']:.2f}x; peak buffered {loader['peak_buffered'] / 1e6:.0f} MB "
                     f"of a {loader['limit'] / 1e6:.0f} MB budget; consumer waited {loader['wait_s']:.2f} s")
        if other is not None:
            lines.append(f"wds-async / webdataset = {loader['mb_s'] / other['mb_s']:.1f}x")
        if faulty is not None:
            lines.append(f"under faults ({faulty['faults']}): {faulty['vs_clean']:.2f}x the clean loader run, "
                         f"{faulty['retries']} retries, samples {'identical count' if faulty['samples'] == loader['samples'] else 'DIFFER'}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("urls", nargs="+", help="shard URLs or brace patterns")
    parser.add_argument("-c", "--connections", type=int, default=16, help="concurrent downloads (both phases)")
    parser.add_argument("--vs-webdataset", action="store_true", help="add the webdataset package's numbers")
    parser.add_argument("--max-buffered-bytes", type=int, default=None, help="loader byte budget")
    parser.add_argument("--faults", metavar="QUERY", help="extra loader run with this query appended to every URL "
                        "(emulated store knobs, e.g. 'drop_rate=0.05&fail_rate=0.05')")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")


def command(args: argparse.Namespace) -> int:
    from .urls import expand_urls

    urls = expand_urls(args.urls)
    print(f"bench: {len(urls)} shards, {args.connections} connections", flush=True)
    rows = run_bench(urls, connections=args.connections, vs_webdataset=args.vs_webdataset,
                     max_buffered_bytes=args.max_buffered_bytes, faults=args.faults)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


def _phase_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m wds_async.bench")
    parser.add_argument("--phase", choices=("raw", "loader", "webdataset"), required=True)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--max-buffered-bytes", type=int, default=None)
    parser.add_argument("urls", nargs="+")
    args = parser.parse_args(argv)
    if args.phase == "raw":
        result = _phase_raw(args.urls, args.connections)
    elif args.phase == "loader":
        result = _phase_loader(args.urls, args.connections, args.max_buffered_bytes)
    else:
        result = _phase_webdataset(args.urls)
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return _phase_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
