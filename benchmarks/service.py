"""The node service against per-process engines: 4 ranks x 2 DataLoader workers on this node.

    python -m benchmarks.service [--ranks 4] [--workers 2] [--shards 32] [--shard-size 16MiB] [--rounds 2]

Serves the shards on 127.0.0.1 (50 ms to first byte, 20 MB/s per connection: the demo's store), then runs
the same job under torchrun, alternating:

* **per process**: every DataLoader worker of every rank runs its own engine (the node budgets divided among
  the ``ranks x workers`` processes);
* **service**: one ``wds-async serve`` process for the node; every worker is a client (``service=``).

While a job runs, a sampler thread reads every 0.1 s the TCP connections open to the store (client side,
ESTABLISHED) and the memory of the job's processes (torchrun, ranks, workers, and the service): anonymous
resident memory summed, plus shared memory counted once (the service maps every client's ring); the peaks are
reported. Throughput is the bytes of sample fields delivered
to the ranks over the last of ``--epochs`` epochs (persistent workers: start-up and warm-up are behind it), first
rank start to last rank end; CPU seconds over that epoch: the ranks and their workers (as each rank reads them),
the service, the store. ``--delay`` makes each rank's consumer
slower than the network (seconds per sample), for the memory bound.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.make_shards import make_shards, parse_size
from emustore import Knobs, StoreProcess

ROOT = Path(__file__).resolve().parent.parent


def _rss(pid: int) -> tuple[int, int]:
    """``RssAnon`` and ``RssShmem`` of a process in bytes (0, 0 when it is gone)."""
    anon = shmem = 0
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    anon = int(line.split()[1]) * 1024
                elif line.startswith("RssShmem:"):
                    shmem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return anon, shmem


class Sampler:
    """Peak connections to ``port`` and peak summed anonymous memory of ``roots`` and their descendants."""

    def __init__(self, port: int, roots: list[psutil.Process], timelines: list[int]) -> None:
        self.port, self.roots = port, roots
        #: pid -> [(wall time, CPU seconds)] for the processes whose CPU is split by time (service, store)
        self.timeline: dict[int, list[tuple[float, float]]] = {pid: [] for pid in timelines}
        self.peak_connections = self.peak_memory = 0
        self.cpu: dict[int, float] = {}  # pid -> the latest user + system seconds seen
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _processes(self) -> list[psutil.Process]:
        seen: dict[int, psutil.Process] = {}
        for root in self.roots:
            try:
                for proc in [root, *root.children(recursive=True)]:
                    seen[proc.pid] = proc
            except psutil.NoSuchProcess:
                continue
        return list(seen.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            procs = self._processes()
            now = time.time()
            for pid, points in self.timeline.items():
                try:
                    points.append((now, _cpu(psutil.Process(pid))))
                except psutil.NoSuchProcess:
                    pass
            memory = shmem = 0
            for proc in procs:
                try:
                    times = proc.cpu_times()
                    self.cpu[proc.pid] = times.user + times.system
                except psutil.NoSuchProcess:
                    pass
                anon, shared = _rss(proc.pid)
                memory += anon
                shmem = max(shmem, shared)  # the service maps every client's ring: count it once
            memory += shmem
            connections = sum(1 for c in psutil.net_connections(kind="tcp")
                              if c.raddr and c.raddr.port == self.port and c.status == psutil.CONN_ESTABLISHED)
            self.peak_memory = max(self.peak_memory, memory)
            self.peak_connections = max(self.peak_connections, connections)
            self._stop.wait(0.1)

    def cpu_between(self, pid: int, start: float, end: float) -> float:
        """CPU seconds ``pid`` used between two wall times (from the nearest samples)."""
        points = self.timeline.get(pid, [])
        if not points:
            return 0.0
        before = min(points, key=lambda p: abs(p[0] - start))[1]
        after = min(points, key=lambda p: abs(p[0] - end))[1]
        return after - before

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


def _job(pattern: str, port: int, args: argparse.Namespace, service: str | None,
         extra: list[psutil.Process], store_proc: psutil.Process) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix="wds-service-bench-"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={args.ranks}",
           str(ROOT / "benchmarks" / "service_rank.py"), pattern, "--out", str(out), "--workers", str(args.workers),
           "--delay", str(args.delay), "--epochs", str(args.epochs)] + (["--service", service] if service else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    sampler = Sampler(port, [psutil.Process(proc.pid), *extra], timelines=[p.pid for p in (*extra, store_proc)])
    _, err = proc.communicate(timeout=900)
    sampler.stop()
    if proc.returncode != 0:
        raise SystemExit(f"the job failed ({proc.returncode}):\n{err.decode()[-3000:]}")
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    shutil.rmtree(out, ignore_errors=True)
    span = max(r["end"] for r in ranks) - min(r["start"] for r in ranks)
    total = sum(r["bytes"] for r in ranks)
    first, last = min(r["start"] for r in ranks), max(r["end"] for r in ranks)
    service_cpu = sum(sampler.cpu_between(p.pid, first, last) for p in extra)
    return {"seconds": span, "bytes": total, "samples": sum(r["samples"] for r in ranks), "mb_per_s": total / span / 1e6,
            "peak_connections": sampler.peak_connections, "peak_memory_mb": sampler.peak_memory / 1e6,
            "job_cpu_s": sum(r["cpu_s"] for r in ranks), "service_cpu_s": service_cpu,
            "store_cpu_s": sampler.cpu_between(store_proc.pid, first, last)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.service", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", default=str(ROOT / ".bench" / "shards"))
    parser.add_argument("--shards", type=int, default=32)
    parser.add_argument("--shard-size", default="16MiB")
    parser.add_argument("--sample-size", default="100KiB")
    parser.add_argument("--ttfb", type=float, default=0.05)
    parser.add_argument("--bw", type=float, default=20e6)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ring-bytes", default=None, help="the service's ring per client (default: its own)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    paths = make_shards(args.dir, n_shards=args.shards, shard_bytes=parse_size(args.shard_size),
                        sample_bytes=parse_size(args.sample_size))
    runs: dict[str, list[dict[str, Any]]] = {"per process": [], "service": []}
    sock_dir = Path(tempfile.mkdtemp(prefix="wds-service-sock-"))
    socket_path = sock_dir / "bench.sock"
    with StoreProcess(args.dir, Knobs(ttfb=args.ttfb, bw=args.bw)) as store:
        pattern = store.base_url + f"shard-{{000000..{len(paths) - 1:06d}}}.tar"
        print(f"{len(paths)} shards x {args.shard_size} on {store.base_url}; {args.ranks} ranks x {args.workers} "
              f"workers; ttfb={args.ttfb}s bw={args.bw / 1e6:.0f} MB/s per connection")
        from wds_async.service import start_service

        store_proc = psutil.Process(store.pid)

        for _ in range(args.rounds):
            runs["per process"].append(_job(pattern, store.port, args, None, [], store_proc))
            with start_service(str(socket_path), ring_bytes=args.ring_bytes) as handle:
                service_proc = psutil.Process(handle.pid)
                runs["service"].append(_job(pattern, store.port, args, f"unix://{socket_path}", [service_proc],
                                            store_proc))
    shutil.rmtree(sock_dir, ignore_errors=True)
    print(f"\n{'mode':<14}{'seconds':>9}{'MB/s':>8}{'peak connections':>18}{'peak memory MB':>16}"
          f"{'CPU s: job':>12}{'service':>9}{'store':>7}")
    summary = {}
    for mode, rows in runs.items():
        s = {k: statistics.median(r[k] for r in rows) for k in (
            "seconds", "mb_per_s", "peak_connections", "peak_memory_mb", "job_cpu_s", "service_cpu_s", "store_cpu_s")}
        summary[mode] = s
        print(f"{mode:<14}{s['seconds']:>9.2f}{s['mb_per_s']:>8.0f}{s['peak_connections']:>18.0f}"
              f"{s['peak_memory_mb']:>16.0f}{s['job_cpu_s']:>12.2f}{s['service_cpu_s']:>9.2f}{s['store_cpu_s']:>7.2f}")
    ratio = summary["service"]["mb_per_s"] / summary["per process"]["mb_per_s"]
    print(f"\nservice / per process throughput: {ratio:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
