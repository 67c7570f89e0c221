"""``wds-async bench``: the loader beside raw parallel download of the same shards, in one run.

Each phase runs in a fresh subprocess (:mod:`wds_async.cli.bench.phase`) so that its CPU time and peak
memory are its own:

* **raw**: ``connections`` concurrent streaming GETs of the shards, bytes thrown away (the analog of
  ``gsutil -m cp`` to /dev/null), over the same backends the loader uses;
* **wds-async**: ``WebDataset(urls, max_connections=connections)`` iterated in one process through
  ``DataLoader(ds, batch_size=None, num_workers=0)``, counting
  samples and checking every ``(url, key)`` arrives exactly once;
* **wds-async, N workers** (``--workers N``): the same through ``DataLoader(ds, batch_size=None, num_workers=N)``,
  each worker an engine over its share of the shards with ``ceil(connections / N)`` connections, every sample
  pickled to the main process; CPU counts the workers too, memory adds N times the largest worker's peak; and
  **wds-async, N workers, tensors**: the same over batches of 64 that each worker packs into a shared-memory
  tensor (:func:`~wds_async.pack_samples`), the hand-over of a pipeline that decodes in its workers;
* **webdataset** (``--vs-webdataset``, when the package is installed): ``webdataset.WebDataset(urls)``
  iterated in one process, its default way of reading.

Reported per phase: MB/s (10**6 bytes of shard data per second), samples/s, the ratio to raw, CPU
seconds per GB (user+system of the phase's process), and peak RSS above the process's post-import
baseline. Nothing here is a pass/fail assertion: the figures go to the README and issue notes.

Bad input never gets as far as a traceback: every URL's shape is checked before the first phase starts,
and a :class:`~wds_async.errors.WdsError` that ends a phase (a missing or damaged shard) comes back from
the child and is raised here as it was raised there. The command itself is :mod:`wds_async.cli.bench.command`.

On a terminal (or with ``--progress``) a one-line status shows the running phase, its elapsed time and
its MB/s so far: the phase rewrites "bytes samples seconds" (since its timed region began) in a small
file at most every 0.25 s, which the parent reads as it waits (a file, so that a slow reader can never
block the phase being measured).
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from .phase import REPORT_EVERY

__all__ = ["format_table", "run_bench"]

#: ``status(phase, elapsed_s, mb_s_so_far, samples_so_far)``; either figure may be None (unknown yet).
Status = Callable[[str, float, "float | None", "int | None"], None]


def _read_progress(path: str) -> tuple[float | None, int | None]:
    """(MB/s, samples) so far from a phase's progress file; None for what is not known yet."""
    try:
        with open(path) as fh:
            nbytes, samples, seconds = fh.read().split()
        rate = int(nbytes) / 1e6 / max(float(seconds), 1e-9) if int(nbytes) >= 0 else None
        return rate, (int(samples) if int(samples) >= 0 else None)
    except (OSError, ValueError):
        return None, None

def _run_phase(phase: str, urls: list[str], connections: int, max_buffered_bytes: int | None,
               timeout: float, name: str, status: Status | None = None, workers: int = 0,
               tensors: bool = False) -> dict[str, Any]:
    """Run one phase in a fresh interpreter; feed ``status`` as it starts and every 0.25 s while it runs."""
    cmd = [sys.executable, "-m", "wds_async.cli.bench.phase", "--phase", phase, "--connections", str(connections)]
    if workers:
        cmd += ["--workers", str(workers), *(["--tensors"] if tensors else [])]
    if max_buffered_bytes:
        cmd += ["--max-buffered-bytes", str(max_buffered_bytes)]
    with tempfile.TemporaryDirectory(prefix="wds-bench-") as scratch:
        progress_file = os.path.join(scratch, "progress")
        if status is not None:
            cmd += ["--progress-file", progress_file]
        started = time.monotonic()
        if status is not None:  # every phase shows, even one that ends before the first poll
            status(name, 0.0, None, None)
        with subprocess.Popen([*cmd, "--", *urls], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as proc:
            while True:
                left = started + timeout - time.monotonic()
                try:
                    out, err = proc.communicate(timeout=max(0.0, min(left, REPORT_EVERY) if status else left))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - started >= timeout:
                        proc.kill()
                        proc.communicate()
                        raise
                    if status is not None:
                        status(name, time.monotonic() - started, *_read_progress(progress_file))
    last = out.strip().splitlines()[-1] if out.strip() else "{}"
    if proc.returncode != 0:
        _raise_phase_error(last)
        raise RuntimeError(f"bench phase {phase!r} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return json.loads(last)  # type: ignore[no-any-return]


def _raise_phase_error(line: str) -> None:
    """Raise the WdsError a phase reported on its last line (its own child, so its pickle), if any."""
    from ...errors import WdsError

    try:
        error = pickle.loads(base64.b64decode(json.loads(line)["error_pickle"]))
    except (ValueError, KeyError, TypeError, pickle.UnpicklingError):
        return
    if isinstance(error, WdsError):
        raise error


def run_bench(urls: list[str], *, connections: int = 16, vs_webdataset: bool = False,
              max_buffered_bytes: int | None = None, faults: str | None = None,
              timeout: float = 1800, status: Status | None = None, autotune: bool = True,
              peers: Sequence[str] = (), endpoint: str | None = None, ca_file: str | None = None,
              peer_status: Callable[[str, float], None] | None = None, workers: int = 0) -> list[dict[str, Any]]:
    """Run the phases and return one row per phase, with derived rates and ratios.

    ``autotune`` adds a loader phase with ``max_connections="auto"`` (its row names the concurrency the
    autotuner ended at; ``connections`` is then only the raw phase's and the fixed loader's).
    ``workers`` adds two loader phases through a DataLoader with that many worker processes (needs torch): samples
    handed over pickled, and batches handed over as shared-memory tensors.
    ``faults`` is a query string appended to every URL for an extra loader phase (the emulated store
    reads fault knobs from the query, e.g. ``drop_rate=0.05&fail_rate=0.05``); its row reports the
    throughput as a ratio to the clean loader run (``vs_clean``). ``status``, when given, is called
    about every 0.25 s while a phase runs, with its name, elapsed seconds and progress so far.

    ``peers`` (names from :data:`wds_async.cli.bench.peers.PEERS`) adds each peer's rows after ours, measured by
    its own client on the same shards (``urls`` must then be ``s3://``; ``endpoint`` is the store's base
    URL, ``ca_file`` the CA it must trust); every row then carries ``kind``, ``peer`` and, from
    :func:`wds_async.cli.bench.peers._report.add_ratios`, ``vs_fastest_raw``.

    Raises :class:`~wds_async.errors.UrlError` before any phase for a URL of unknown scheme or shape, and
    the phase's own :class:`~wds_async.errors.WdsError` when one ends a phase (a missing or damaged shard).
    """
    from ...io import validate_url

    for url in urls:  # before any phase starts: an unknown scheme is one line of error, not a phase's traceback
        validate_url(url)
    rows: list[dict[str, Any]] = []
    name = f"raw download ({connections} conns)"
    raw = _run_phase("raw", urls, connections, None, timeout, name, status)
    raw["name"] = name
    rows.append(raw)
    name = f"wds-async ({connections} conns)"
    loader = _run_phase("loader", urls, connections, max_buffered_bytes, timeout, name, status)
    loader["name"] = name
    rows.append(loader)
    if autotune:
        auto = _run_phase("loader-auto", urls, connections, max_buffered_bytes, timeout, "wds-async (auto)", status)
        auto["name"] = f"wds-async (auto: {auto['concurrency']})"
        rows.append(auto)
    for tensors in (False, True) if workers else ():
        name = f"wds-async, {workers} workers" + (", tensors" if tensors else "")
        row = _run_phase("loader-workers", urls, connections, max_buffered_bytes, timeout, name, status, workers,
                         tensors)
        row["name"] = name
        rows.append(row)
    if faults:
        faulty_urls = [u + ("&" if "?" in u else "?") + faults for u in urls]
        faulty = _run_phase("loader", faulty_urls, connections, max_buffered_bytes, timeout,
                            "wds-async under faults", status)
        faulty["name"] = "wds-async under faults"
        faulty["faults"] = faults
        rows.append(faulty)
    if vs_webdataset:
        try:
            import webdataset  # noqa: F401
        except ImportError:
            print("webdataset is not installed: pip install webdataset (skipping --vs-webdataset)", file=sys.stderr)
        else:
            wds_row = _run_phase("webdataset", urls, connections, None, timeout, "webdataset 1 process", status)
            wds_row["name"] = "webdataset 1 process"
            wds_row["bytes"] = raw["bytes"]  # the same shards: their bytes
            rows.append(wds_row)
    raw = _best_raw(raw, _run_phase("raw", urls, connections, None, timeout, f"{raw['name']} (again)", status))
    rows[0] = raw
    for row in rows:
        row["mb_s"] = row["bytes"] / row["wall_s"] / 1e6
        row["samples_s"] = row["samples"] / row["wall_s"] if row.get("samples") is not None else None
        row["vs_raw"] = row["mb_s"] / raw["mb_s"]
        row["cpu_s_per_gb"] = row["cpu_s"] / (row["bytes"] / 1e9) if row["bytes"] else None
    for row in rows:
        if row.get("faults"):
            row["vs_clean"] = row["mb_s"] / loader["mb_s"]
        row["kind"] = "raw" if row is raw else "loader"
        row["connections"] = connections if row is raw else row.get("concurrency", connections)
        if row.get("unique") is not None:
            row["exactly_once"] = "yes" if row["unique"] == row["samples"] else \
                f"NO ({row['samples'] - row['unique']} duplicates)"
        row["peer"] = "wds-async" if row["name"].startswith("wds-async") else row["name"].split()[0]
    if peers:
        from .peers._report import add_ratios
        from .peers._run import run_peers

        exact = loader["unique"] == loader["samples"]
        rows += run_peers(list(urls), list(peers), connections=connections, endpoint=endpoint, ca_file=ca_file,
                          expected_samples=loader["samples"] if exact else None,
                          expected_digest=loader.get("keys_digest") if exact else None, timeout=timeout,
                          status=peer_status)
        add_ratios(rows)
    return rows


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _best_raw(first: dict[str, Any], again: dict[str, Any]) -> dict[str, Any]:
    """The raw baseline: the faster of the raw phase run first and run again after the loader's phases, so that a
    slow first pass (a store, cache or machine still warming up) cannot flatter every ratio against it. Both
    rates stay in the row (``runs_mb_s``)."""
    rates = [run["bytes"] / run["wall_s"] / 1e6 for run in (first, again)]
    best = dict(again if rates[1] > rates[0] else first, name=first["name"])
    best["runs_mb_s"] = rates
    return best


def format_table(rows: list[dict[str, Any]]) -> str:
    width = max(26, *(len(r["name"]) + 1 for r in rows))
    header = (f"{'phase':<{width}}{'MB/s':>9}{'samples/s':>11}{'vs raw':>8}{'CPU s/GB':>10}{'peak MB':>9}{'samples':>9}"
              f"{'first ms':>10}  exactly once")
    lines = [header, "-" * len(header)]
    expected = next((r["samples"] for r in rows if r["name"].startswith("wds-async")), None)
    for r in rows:
        sps = f"{r['samples_s']:.0f}" if r["samples_s"] is not None else "-"
        samples = str(r["samples"]) if r["samples"] is not None else "-"
        first = f"{r['first_s'] * 1000:.0f}" if r.get("first_s") is not None else "-"
        once = "-"
        if r.get("unique") is not None:
            once = "yes" if r["unique"] == r["samples"] else f"NO ({r['samples'] - r['unique']} duplicates)"
            if expected is not None and r["samples"] != expected:
                once += f" (count differs: {r['samples']} vs {expected})"
        lines.append(f"{r['name']:<{width}}{r['mb_s']:>9.1f}{sps:>11}{r['vs_raw']:>8.2f}{r['cpu_s_per_gb']:>10.2f}"
                     f"{r['peak_above_baseline'] / 1e6:>9.0f}{samples:>9}{first:>10}  {once}")
    loader = next((r for r in rows if r["name"].startswith("wds-async")), None)
    raw = next((r for r in rows if r["name"].startswith("raw download")), {})
    other = next((r for r in rows if r["name"].startswith("webdataset")), None)
    faulty = next((r for r in rows if r.get("faults")), None)
    if loader is not None:
        lines.append("")
        if raw.get("runs_mb_s"):
            lines.append("raw: the faster of two passes, one before the loader's phases and one after ("
                         + " and ".join(f"{rate:.1f}" for rate in raw["runs_mb_s"]) + " MB/s)")
        lines.append(f"wds-async / raw = {loader['vs_raw']:.2f}x; peak buffered {loader['peak_buffered'] / 1e6:.0f} MB "
                     f"of a {loader['limit'] / 1e6:.0f} MB budget; consumer waited {loader['wait_s']:.2f} s")
        if loader.get("first_s") is not None and raw.get("first_s") is not None:
            lines.append(f"first sample {loader['first_s'] * 1000:.0f} ms after the loop began (the engine's "
                         f"first_sample_s: {_ms(loader.get('first_sample_s'))}), the raw read's first byte "
                         f"{raw['first_s'] * 1000:.0f} ms: {1000 * (loader['first_s'] - raw['first_s']):+.0f} ms")
        if other is not None:
            lines.append(f"wds-async / webdataset = {loader['mb_s'] / other['mb_s']:.1f}x")
        for pool in (r for r in rows if r.get("workers")):
            how = "batches cross as shared-memory tensors" if pool["tensors"] else "samples cross pickled"
            lines.append(f"{pool['workers']} DataLoader workers: {pool['mb_s'] / loader['mb_s']:.2f}x the one process "
                         f"({how}; CPU and memory count the workers)")
        auto = next((r for r in rows if r["name"].startswith("wds-async (auto")), None)
        if auto is not None:
            lines.append(f"autotuned: {auto['mb_s'] / loader['mb_s']:.2f}x the fixed loader, ended at "
                         f"{auto['concurrency']} connections ({auto['concurrency_reason']})")
        if faulty is not None:
            lines.append(f"under faults ({faulty['faults']}): {faulty['vs_clean']:.2f}x the clean loader run, "
                         f"{faulty['retries']} retries, samples {'identical count' if faulty['samples'] == loader['samples'] else 'DIFFER'}")
    return "\n".join(lines)

