"""``wds-async bench``: the loader beside raw parallel download of the same shards, in one run.

Each phase runs in a fresh subprocess so that its CPU time and peak memory are its own:

* **raw**: ``connections`` concurrent streaming GETs of the shards, bytes thrown away (the analog of
  ``gsutil -m cp`` to /dev/null), over the same backends the loader uses;
* **wds-async**: ``WebDataset(urls, max_connections=connections)`` iterated in one process through
  ``DataLoader(ds, batch_size=None, num_workers=0)``, counting
  samples and checking every ``(url, key)`` arrives exactly once;
* **webdataset** (``--vs-webdataset``, when the package is installed): ``webdataset.WebDataset(urls)``
  iterated in one process, its default way of reading.

Reported per phase: MB/s (10**6 bytes of shard data per second), samples/s, the ratio to raw, CPU
seconds per GB (user+system of the phase's process), and peak RSS above the process's post-import
baseline. Nothing here is a pass/fail assertion: the figures go to the README and issue notes.

On a terminal (or with ``--progress``) a one-line status shows the running phase, its elapsed time and
its MB/s so far: the phase rewrites "bytes samples seconds" (since its timed region began) in a small
file at most every 0.25 s, which the parent reads as it waits (a file, so that a slow reader can never
block the phase being measured).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["main", "run_bench"]

#: ``status(phase, elapsed_s, mb_s_so_far, samples_so_far)``; either figure may be None (unknown yet).
Status = Callable[[str, float, "float | None", "int | None"], None]

_REPORT_EVERY = 0.25  # seconds between a phase's progress writes and the parent's reads


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
        self._next = now + _REPORT_EVERY
        return True

    def write(self, nbytes: int | None, samples: int | None) -> None:
        if self.path is None:
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{-1 if nbytes is None else nbytes} {-1 if samples is None else samples} "
                     f"{time.perf_counter() - self._t0}\n")
        os.replace(tmp, self.path)  # the parent never reads half a line


def _read_progress(path: str) -> tuple[float | None, int | None]:
    """(MB/s, samples) so far from a phase's progress file; None for what is not known yet."""
    try:
        with open(path) as fh:
            nbytes, samples, seconds = fh.read().split()
        rate = int(nbytes) / 1e6 / max(float(seconds), 1e-9) if int(nbytes) >= 0 else None
        return rate, (int(samples) if int(samples) >= 0 else None)
    except (OSError, ValueError):
        return None, None


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
    from ._compat import TaskGroup
    from ._rawread import drain, raw_backends
    from .bridge import new_event_loop

    baseline = _rss()
    total = 0

    def count(n: int) -> None:
        nonlocal total
        total += n
        if reporter.due():
            reporter.write(total, None)

    async def download_all() -> None:
        shards = iter(urls)
        async with raw_backends(connections) as backends:

            async def worker() -> None:
                for url in shards:
                    await drain(backends, url, on_chunk=count)

            async with TaskGroup() as group:
                for _ in range(min(connections, len(urls))):
                    group.create_task(worker())

    loop = new_event_loop()
    started, cpu0 = time.perf_counter(), time.process_time()
    reporter.start()
    try:
        loop.run_until_complete(download_all())
    finally:
        loop.close()
    return _finish({"bytes": total, "samples": None}, started, cpu0, baseline)


def _consume(ds: Any, reporter: _Reporter, nbytes: Callable[[], int | None]) -> tuple[dict[str, Any], float, float]:
    """Iterate ``ds`` to the end; count samples and distinct ``(url, key)`` pairs, and hash their names
    as the peers' runners do (``keys_digest``, in :func:`_finish`, after the clock stops), so a peer's
    samples can be checked against these."""
    seen: set[tuple[str, str]] = set()
    samples = 0
    started, cpu0 = time.perf_counter(), time.process_time()
    reporter.start()
    for sample in ds:
        samples += 1
        seen.add((sample["__url__"], sample["__key__"]))
        if samples % 64 == 0 and reporter.due():  # the clock is read once per 64 samples
            reporter.write(nbytes(), samples)
    return {"samples": samples, "unique": len(seen), "_seen": seen}, started, cpu0


def _phase_loader(urls: list[str], connections: int | str, max_buffered_bytes: int | None,
                  reporter: _Reporter) -> dict[str, Any]:
    from .dataset import WebDataset

    baseline = _rss()
    ds = WebDataset(urls, max_connections=connections, max_buffered_bytes=max_buffered_bytes,
                    nodesplitter=None, workersplitter=None)
    # Through a DataLoader loop, as a training job (and every peer loader in ``--peers``) consumes it.
    from torch.utils.data import DataLoader

    loader = DataLoader(ds, batch_size=None, num_workers=0)
    result, started, cpu0 = _consume(loader, reporter, lambda: int(ds.stats()["bytes_read"]))
    stats = ds.stats()
    result.update(bytes=stats["bytes_read"], peak_buffered=stats["peak_buffered_bytes"], wait_s=stats["wait_s"],
                  limit=ds.config.max_buffered_bytes, retries=stats["retries"], concurrency=stats["concurrency"],
                  concurrency_reason=stats["concurrency_reason"])
    return _finish(result, started, cpu0, baseline)


def _phase_webdataset(urls: list[str], reporter: _Reporter) -> dict[str, Any]:
    import warnings

    warnings.simplefilter("ignore")
    import webdataset

    baseline = _rss()
    result, started, cpu0 = _consume(webdataset.WebDataset(urls, shardshuffle=False), reporter, lambda: None)
    result["bytes"] = None
    return _finish(result, started, cpu0, baseline)


def _run_phase(phase: str, urls: list[str], connections: int, max_buffered_bytes: int | None,
               timeout: float, name: str, status: Status | None = None) -> dict[str, Any]:
    """Run one phase in a fresh interpreter; while it runs, feed ``status`` every 0.25 s."""
    cmd = [sys.executable, "-m", "wds_async.bench", "--phase", phase, "--connections", str(connections)]
    if max_buffered_bytes:
        cmd += ["--max-buffered-bytes", str(max_buffered_bytes)]
    with tempfile.TemporaryDirectory(prefix="wds-bench-") as scratch:
        progress_file = os.path.join(scratch, "progress")
        if status is not None:
            cmd += ["--progress-file", progress_file]
        started = time.monotonic()
        with subprocess.Popen(cmd + ["--", *urls], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) as proc:
            while True:
                left = started + timeout - time.monotonic()
                try:
                    out, err = proc.communicate(timeout=max(0.0, min(left, _REPORT_EVERY) if status else left))
                    break
                except subprocess.TimeoutExpired:
                    if time.monotonic() - started >= timeout:
                        proc.kill()
                        proc.communicate()
                        raise
                    if status is not None:
                        status(name, time.monotonic() - started, *_read_progress(progress_file))
    if proc.returncode != 0:
        raise RuntimeError(f"bench phase {phase!r} failed (exit {proc.returncode}):\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])  # type: ignore[no-any-return]


def run_bench(urls: list[str], *, connections: int = 16, vs_webdataset: bool = False,
              max_buffered_bytes: int | None = None, faults: str | None = None,
              timeout: float = 1800, status: Status | None = None, autotune: bool = True,
              peers: Sequence[str] = (), endpoint: str | None = None, ca_file: str | None = None,
              peer_status: Callable[[str, float], None] | None = None) -> list[dict[str, Any]]:
    """Run the phases and return one row per phase, with derived rates and ratios.

    ``autotune`` adds a loader phase with ``max_connections="auto"`` (its row names the concurrency the
    autotuner ended at; ``connections`` is then only the raw phase's and the fixed loader's).
    ``faults`` is a query string appended to every URL for an extra loader phase (the emulated store
    reads fault knobs from the query, e.g. ``drop_rate=0.05&fail_rate=0.05``); its row reports the
    throughput as a ratio to the clean loader run (``vs_clean``). ``status``, when given, is called
    about every 0.25 s while a phase runs, with its name, elapsed seconds and progress so far.

    ``peers`` (names from :data:`wds_async.peers.PEERS`) adds each peer's rows after ours, measured by
    its own client on the same shards (``urls`` must then be ``s3://``; ``endpoint`` is the store's base
    URL, ``ca_file`` the CA it must trust); every row then carries ``kind``, ``peer`` and, from
    :func:`wds_async.peers._report.add_ratios`, ``vs_fastest_raw``.
    """
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
        auto = next((r for r in rows if r["name"].startswith("wds-async (auto")), None)
        if auto is not None:
            lines.append(f"autotuned: {auto['mb_s'] / loader['mb_s']:.2f}x the fixed loader, ended at "
                         f"{auto['concurrency']} connections ({auto['concurrency_reason']})")
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
    parser.add_argument("--no-auto", dest="autotune", action="store_false",
                        help="skip the loader phase with max_connections='auto'")
    parser.add_argument("--peers", metavar="NAMES", help="also run these tools on the same shards, each with "
                        "its own client: any of s5cmd,gsutil,boto3,webdataset,s3torchconnector,mosaic,litdata "
                        "(or 'all'); the shard URLs must then be s3://")
    parser.add_argument("--endpoint", metavar="URL", help="the S3-compatible store's base URL (sets "
                        "AWS_ENDPOINT_URL_S3 for every phase; the emulated store also serves GCS there)")
    parser.add_argument("--ca-file", metavar="PEM", help="the CA certificate an https endpoint is signed with "
                        "(every client is told to trust it)")
    parser.add_argument("--plot", metavar="FILE.png", help="with --peers: a bar chart of the table")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--progress", action="store_true", help="show the live status line even when stderr "
                        "is not a terminal")


def command(args: argparse.Namespace) -> int:
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from ._console import progress_console
    from .urls import expand_urls

    urls = expand_urls(args.urls)
    peers: list[str] = []
    if args.peers:
        from .peers import peer_names
        from .peers._run import store_urls

        try:
            peers = peer_names(args.peers)
            store_urls(urls, args.endpoint)  # checks the URLs before any phase starts
        except ValueError as exc:
            print(f"wds-async bench: error: {exc}", file=sys.stderr)
            return 2
    if args.endpoint:
        os.environ["AWS_ENDPOINT_URL_S3"] = args.endpoint  # our phases' subprocesses inherit it
    if args.ca_file:
        os.environ["SSL_CERT_FILE"] = os.path.abspath(args.ca_file)
    print(f"bench: {len(urls)} shards, {args.connections} connections", flush=True)
    console, shown = progress_console(args.progress)
    line = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    TextColumn("{task.fields[so_far]}"), console=console, transient=True, disable=not shown)
    task = line.add_task("starting", so_far="")
    current = ""

    def status(name: str, elapsed: float, mb_s: float | None, samples: int | None) -> None:
        nonlocal current
        if name != current:  # a new phase: restart the elapsed clock
            current = name
            line.reset(task, description=name, so_far="")
        so_far = [f"{mb_s:,.1f} MB/s"] if mb_s is not None else []
        so_far += [f"{samples:,} samples"] if samples is not None else []
        line.update(task, so_far="  ".join(so_far))

    with line:
        def peer_status(name: str, elapsed: float) -> None:
            status(name, elapsed, None, None)

        rows = run_bench(urls, connections=args.connections, vs_webdataset=args.vs_webdataset,
                         max_buffered_bytes=args.max_buffered_bytes, faults=args.faults,
                         status=status if shown else None, autotune=args.autotune, peers=peers,
                         endpoint=args.endpoint, ca_file=os.path.abspath(args.ca_file) if args.ca_file else None,
                         peer_status=peer_status if shown else None)
    if peers:
        from .peers._report import format_peers_table, plot_peers

        print(format_peers_table(rows, args.connections))
        if args.plot:
            plot_peers(rows, args.plot, f"{len(urls)} shards, {args.connections} connections")
            print(f"plot: {args.plot}")
    else:
        print(format_table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=2)
    return 0


def _phase_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m wds_async.bench")
    parser.add_argument("--phase", choices=("raw", "loader", "loader-auto", "webdataset"), required=True)
    parser.add_argument("--connections", type=int, default=16)
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
    else:
        result = _phase_webdataset(args.urls, reporter)
    print(json.dumps(result))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return _phase_main(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
