"""One rank of ``benchmarks/service.py``: a DataLoader with ``--workers`` workers over every sample of its share.

Started by torchrun (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` set). Writes ``{rank, samples, bytes,
start, end}`` (wall-clock seconds) as JSON to ``OUT/rank-N.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

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
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    ds = wds.WebDataset(args.pattern, service=args.service) if args.service else wds.WebDataset(args.pattern)
    loader = DataLoader(ds, batch_size=None, num_workers=args.workers, multiprocessing_context="fork",
                        prefetch_factor=2 if args.workers else None)
    start = time.time()
    samples = nbytes = 0
    for sample in loader:
        samples += 1
        nbytes += _nbytes(sample)
        if args.delay:
            time.sleep(args.delay)
    end = time.time()
    Path(args.out, f"rank-{rank}.json").write_text(json.dumps(
        {"rank": rank, "samples": samples, "bytes": nbytes, "start": start, "end": end}))


if __name__ == "__main__":
    main()
