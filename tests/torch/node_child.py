"""One torchrun-like rank for ``test_node_memory.py``: a DataLoader with 2 workers and a slow consumer.

    python tests/torch/node_child.py OUT_DIR SAMPLES_PER_WORKER SLEEP_S URL [URL ...]

Launched with LOCAL_WORLD_SIZE, RANK, WORLD_SIZE and the WDS_ASYNC_NODE_* variables set. Each worker
builds its ``WebDataset`` inside ``__iter__`` with its share of the node budgets, reads a bounded number
of samples while a thread samples its RSS, and writes ``OUT_DIR/rank{R}-worker{W}.json``: the share,
``ds.stats()`` and the RSS figures.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from wds_async import EngineConfig, WebDataset
from wds_async.node import share_config


class _RssPeak:
    """Polls this process's RSS every few milliseconds until stopped; ``peak`` is the largest seen."""

    def __init__(self) -> None:
        self._proc = psutil.Process()
        self.baseline = self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="rss-peak", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)


class NodeShared(IterableDataset):  # type: ignore[type-arg]
    """Builds the dataset in the worker, with the worker's share of the node budgets."""

    def __init__(self, urls: list[str], samples: int, out_dir: Path) -> None:
        super().__init__()
        self.urls = urls
        self.samples = samples
        self.out_dir = out_dir

    def __iter__(self) -> Iterator[tuple[str, int]]:
        rss = _RssPeak()
        cfg, share = share_config(EngineConfig())
        # Resampled: every worker draws shards endlessly, so its engine always has more to read ahead
        # than the slow consumer takes and the byte budget, not the data, bounds what it holds.
        ds = WebDataset(self.urls, config=cfg, resampled=True, detshuffle=True)
        samples = iter(ds)
        try:
            for _ in range(self.samples):
                sample = next(samples)
                yield sample["__key__"], len(sample["bin"])
        finally:
            close = getattr(samples, "close", None)
            if close is not None:
                close()
            rss.stop()
        info = get_worker_info()
        report = {"rank": int(os.environ["RANK"]), "worker": info.id if info is not None else -1,
                  "pid": os.getpid(), "share": share.as_dict(), "stats": ds.stats(),
                  "rss_baseline": rss.baseline, "rss_peak": rss.peak}
        path = self.out_dir / f"rank{report['rank']}-worker{report['worker']}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report))
        os.replace(tmp, path)


def main(argv: list[str]) -> int:
    out_dir, samples, sleep_s, urls = Path(argv[0]), int(argv[1]), float(argv[2]), argv[3:]
    loader = DataLoader(NodeShared(urls, samples, out_dir), batch_size=None, num_workers=2)
    received = 0
    for _ in loader:
        received += 1
        time.sleep(sleep_s)  # the slow training step
    return 0 if received == 2 * samples else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
