"""One rank of ``benchmarks/service.py``: a DataLoader with ``--workers`` persistent workers over every sample of
its share, ``--epochs`` times.

Started by torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` set). Writes the last epoch's ``{rank, samples,
bytes, start, end, cpu_s}`` (wall-clock seconds; CPU of the rank and its workers) as JSON to ``OUT/rank-N.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import psutil
from torch.utils.data import DataLoader

import wds_async as wds


def _nbytes(sample: dict) -> int:  # type: ignore[type-arg]
    return sum(len(v) for k, v in sample.items() if isinstance(v, (bytes, bytearray, memoryview)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("pattern")
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--service", default=None)
    parser.add_argument("--delay", type=float, default=0.0, help="seconds of 'training step' per sample")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    ds = wds.WebDataset(args.pattern, service=args.service) if args.service else wds.WebDataset(args.pattern)
    loader = DataLoader(ds, batch_size=None, num_workers=args.workers, multiprocessing_context="fork",
                        persistent_workers=args.workers > 0, prefetch_factor=2 if args.workers else None)
    me = psutil.Process()
    epochs = []
    for _ in range(args.epochs):  # the last epoch is the steady state: imports, forks and warm-up are behind
        cpu0 = _cpu(me)
        start = time.time()
        samples = nbytes = 0
        for sample in loader:
            samples += 1
            nbytes += _nbytes(sample)
            if args.delay:
                time.sleep(args.delay)
        epochs.append({"samples": samples, "bytes": nbytes, "start": start, "end": time.time(),
                       "cpu_s": _cpu(me) - cpu0})
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps({"rank": rank, **epochs[-1], "epochs": epochs}))


def _cpu(me: psutil.Process) -> float:
    """CPU seconds of this rank and its (persistent) DataLoader workers."""
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


if __name__ == "__main__":
    main()
