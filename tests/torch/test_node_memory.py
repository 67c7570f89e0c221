"""One budget per node, measured: 4 ranks x 2 DataLoader workers stay inside one node budget together.

Four real child processes play the torchrun ranks of one node (``LOCAL_WORLD_SIZE=4``), each with a
2-worker DataLoader and a slow consumer, against the emulated store on 127.0.0.1. The node budget is
16 connections and 64 MiB, so each of the 8 worker processes gets 2 connections and 8 MiB. Every worker
reports its share, the peak of its engine's byte budget and its peak RSS growth (``node_child.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess

MiB = 1 << 20
RANKS = 4
WORKERS = 2
NODE_BYTES = 64 * MiB
NODE_CONNECTIONS = 16
SAMPLES_PER_WORKER = 64        # ~16 MiB of 256 KiB samples: twice a worker's share
SLEEP_S = 0.02                 # per sample in each rank's training loop
RSS_SLACK = 64 * 10**6         # interpreter, engine thread, aiohttp session, allocator slack
CHILD = Path(__file__).with_name("node_child.py")
REPO = Path(__file__).resolve().parents[2]


def _launch(rank: int, out: Path, urls: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WDS_ASYNC_")}
    env.update(LOCAL_WORLD_SIZE=str(RANKS), RANK=str(rank), WORLD_SIZE=str(RANKS),
               WDS_ASYNC_NODE_BUFFERED_BYTES="64MiB", WDS_ASYNC_NODE_CONNECTIONS=str(NODE_CONNECTIONS),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    with open(log, "wb") as err:
        return subprocess.Popen([sys.executable, str(CHILD), str(out), str(SAMPLES_PER_WORKER), str(SLEEP_S), *urls],
                                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=err, stderr=err)


def test_eight_worker_processes_share_one_node_budget(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    make_shards(shards, n_shards=16, shard_bytes=4 << 20, sample_bytes=256 << 10, seed=3)
    out = tmp_path / "reports"
    out.mkdir()
    with StoreProcess(shards, Knobs(seed=7)) as store:
        urls = [store.url(f"shard-{i:06d}.tar") for i in range(16)]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            procs = [_launch(rank, out, urls, tmp_path / f"rank{rank}.log") for rank in range(RANKS)]
            deadline = time.monotonic() + 50
            for proc in procs:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        logs = "\n".join(f"rank {r}: {(tmp_path / f'rank{r}.log').read_text(errors='replace')}" for r in range(RANKS))
        assert [p.returncode for p in procs] == [0] * RANKS, logs

    reports = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert len(reports) == RANKS * WORKERS and len({r["pid"] for r in reports}) == RANKS * WORKERS, logs
    share = {"processes": RANKS * WORKERS, "node_connections": NODE_CONNECTIONS, "node_buffered_bytes": NODE_BYTES,
             "max_connections": NODE_CONNECTIONS // 8, "max_buffered_bytes": NODE_BYTES // 8}
    chunk = 1 * MiB  # EngineConfig.chunk_bytes: a reader may hold one chunk above the limit (queues.py)
    slack = chunk * share["max_connections"]
    figures = []
    for r in reports:
        stats = r["stats"]
        peak, growth = stats["peak_buffered_bytes"], r["rss_peak"] - r["rss_baseline"]
        figures.append((r["rank"], r["worker"], peak, growth))
        assert r["share"] == share
        assert stats["buffer_limit"] == NODE_BYTES // 8
        assert stats["samples_delivered"] >= SAMPLES_PER_WORKER
        # the consumer was slow, so the engine read ahead until the budget stopped it
        assert stats["bytes_read"] > 2 * NODE_BYTES // 8
        assert peak <= NODE_BYTES // 8 + slack, figures
        assert growth <= NODE_BYTES // 8 + RSS_SLACK, figures
    total_peak = sum(peak for _, _, peak, _ in figures)
    assert total_peak <= NODE_BYTES + RANKS * WORKERS * slack, figures
    assert total_peak >= NODE_BYTES // 2, figures  # the budget did bind: this measured something
    print("rank, worker, budget peak, RSS growth:", figures)
