"""Throughput counters shared by the engine (writer, loop thread) and the consumer (reader).

Plain integer and float attributes: the loop thread increments them, any thread may read a slightly
stale snapshot. ``snapshot()`` derives the rates.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Stats"]


@dataclass
class Stats:
    """Counters of one iteration (one process or DataLoader worker)."""

    started: float = field(default_factory=time.perf_counter)
    bytes_read: int = 0            # bytes received from sources (compressed size for .tar.gz)
    samples_read: int = 0          # samples completed by the engine
    samples_delivered: int = 0     # samples handed to the consumer thread
    shards_total: int = 0
    shards_done: int = 0
    shards_in_flight: int = 0
    shards_skipped: int = 0
    samples_skipped: int = 0
    retries: int = 0
    requests: int = 0              # opens of a source (each retry and each ranged part is one)
    throttled: int = 0             # 429/503 answers: the store asked to slow down
    parts: int = 0                 # extra ranged parts fetched beside large shards' in-order reads
    ttfb_s: float | None = None    # time to first byte, a moving average over requests
    open_streams: int = 0          # requests answered and streaming now (not those waiting or backing off)
    concurrency: int = 0           # requests the engine allows in flight now
    concurrency_cap: int = 0       # the most it may allow (fixed, or the autotuner's ceiling)
    concurrency_reason: str = ""   # why the concurrency last changed
    wait_seconds: float = 0.0      # consumer time spent blocked on the engine: the starvation signal
    buffered_bytes: int = 0
    buffer_limit: int = 0
    reserved_bytes: int = 0        # budget held for open streams' transport buffers (not data)
    peak_buffered_bytes: int = 0
    finished: float | None = None
    #: This process's share of the node budgets (``NodeShare.as_dict()``), set by the dataset.
    node_share: dict[str, int] | None = None
    #: The engine's live byte budget, read for current/peak buffered bytes (set by the engine).
    budget: Any = field(default=None, repr=False, compare=False)

    def observe_ttfb(self, seconds: float) -> None:
        """Fold one request's time to first byte into the moving average."""
        self.ttfb_s = seconds if self.ttfb_s is None else 0.8 * self.ttfb_s + 0.2 * seconds

    def snapshot(self) -> dict[str, Any]:
        """A dict of counters plus derived rates (MB/s uses 10**6 bytes)."""
        if self.budget is not None:
            self.buffered_bytes = self.budget.data
            self.reserved_bytes = self.budget.reserved
            self.peak_buffered_bytes = self.budget.peak
        end = self.finished if self.finished is not None else time.perf_counter()
        elapsed = max(end - self.started, 1e-9)
        return {
            "elapsed_s": round(elapsed, 3),
            "mb_per_s": round(self.bytes_read / elapsed / 1e6, 2),
            "samples_per_s": round(self.samples_delivered / elapsed, 1),
            "bytes_read": self.bytes_read,
            "samples_read": self.samples_read,
            "samples_delivered": self.samples_delivered,
            "buffered_bytes": self.buffered_bytes,
            "buffer_limit": self.buffer_limit,
            "reserved_bytes": self.reserved_bytes,
            "peak_buffered_bytes": self.peak_buffered_bytes,
            "shards_total": self.shards_total,
            "shards_done": self.shards_done,
            "shards_in_flight": self.shards_in_flight,
            "shards_skipped": self.shards_skipped,
            "samples_skipped": self.samples_skipped,
            "retries": self.retries,
            "requests": self.requests,
            "throttled": self.throttled,
            "parts": self.parts,
            "ttfb_ms": None if self.ttfb_s is None else round(self.ttfb_s * 1000, 1),
            "concurrency": self.concurrency,
            "concurrency_cap": self.concurrency_cap,
            "concurrency_reason": self.concurrency_reason,
            "wait_s": round(self.wait_seconds, 3),
            "wait_fraction": round(self.wait_seconds / elapsed, 3),
            "node_share": None if self.node_share is None else dict(self.node_share),
        }

    def line(self) -> str:
        """One log line."""
        s = self.snapshot()
        return (
            f"{s['mb_per_s']:.1f} MB/s, {s['samples_per_s']:.0f} samples/s, "
            f"buffered {s['buffered_bytes'] / 1e6:.1f}/{s['buffer_limit'] / 1e6:.0f} MB, "
            f"shards {s['shards_done']}/{s['shards_total']} done, {s['shards_in_flight']} in flight, "
            f"{s['concurrency']} requests allowed ({s['concurrency_reason'] or 'fixed'}), "
            f"{s['retries']} retries, {s['shards_skipped']} shards and {s['samples_skipped']} samples skipped, "
            f"consumer waited {s['wait_s']:.1f} s ({100 * s['wait_fraction']:.0f}%)"
        )
