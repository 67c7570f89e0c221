"""Throughput counters shared by the engine (writer, loop thread) and the consumer (reader), and their sum
over a dataset's DataLoader workers.

:class:`Stats`: plain integer and float attributes: the loop thread increments them, any thread may read a
slightly stale snapshot. ``snapshot()`` derives the rates.

:class:`SharedStats`: a small block of shared memory (``multiprocessing.RawArray``) a dataset creates at
construction, before any DataLoader worker exists. Forked workers inherit it; spawned ones receive it
with the process (it pickles as itself only while a process is being spawned; any other pickle or
``deepcopy`` gets a fresh block). Each worker writes its counters into the slot of its worker id from a
small thread, every ``PUBLISH_INTERVAL`` seconds and when its iteration ends; the main process sums the slots of the
latest run. A sequence number per slot (odd while written) lets a reader skip a half-written slot.

:func:`watched`: the live counters of this process, for :mod:`wds_async.metrics` to export: every
:class:`SharedStats` that has counted something (a dataset iterated here or by its DataLoader workers), and the
:class:`Stats` objects handed to :func:`watch` (the node service's).
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import get_spawning_popen
from typing import Any

__all__ = ["PUBLISH_INTERVAL", "SharedStats", "Stats", "watch", "watched"]

#: Seconds between two publications of a DataLoader worker's counters (and when its iteration ends).
PUBLISH_INTERVAL = 0.1
#: Worker slots per dataset; DataLoader workers with a higher id are not counted in the main process.
MAX_WORKERS = 128


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
    cache_hits: int = 0            # items read from a complete copy in the shard cache
    cache_fills: int = 0           # shards written to the shard cache (committed) while they streamed
    cache_bypasses: int = 0        # shards read from the store, uncached, while another process's fill of them stalled
    batches_read_ahead: int = 0    # random access: batches whose reads had started before they were asked for
    ttfb_s: float | None = None    # time to first byte, a moving average over requests
    request_bytes: float | None = None  # bytes an answered request asks for, a moving average (see observe_ttfb)
    open_streams: int = 0          # requests answered and streaming now (not those waiting or backing off)
    concurrency: int = 0           # requests the engine allows in flight now
    concurrency_cap: int = 0       # the most it may allow (fixed, or the autotuner's ceiling)
    concurrency_reason: str = ""   # why the concurrency last changed
    wait_seconds: float = 0.0      # consumer time spent blocked on the engine: the starvation signal
    #: Seconds from ``started`` (the iteration's start) to the first sample handed to the consumer.
    first_sample_s: float | None = None
    buffered_bytes: int = 0
    buffer_limit: int = 0
    reserved_bytes: int = 0        # budget held for open streams' transport buffers (not data)
    peak_buffered_bytes: int = 0
    finished: float | None = None
    #: This process's share of the node budgets (``NodeShare.as_dict()``), set by the dataset.
    node_share: dict[str, int] | None = None
    #: The engine's live byte budget, read for current/peak buffered bytes (set by the engine).
    budget: Any = field(default=None, repr=False, compare=False)

    def observe_ttfb(self, seconds: float, length: int | None = None) -> None:
        """Fold one request's time to first byte, and the bytes it asks for (``length``, when the answer
        says), into the moving averages."""
        self.ttfb_s = seconds if self.ttfb_s is None else 0.8 * self.ttfb_s + 0.2 * seconds
        if length is not None and length > 0:
            self.request_bytes = length if self.request_bytes is None else 0.8 * self.request_bytes + 0.2 * length

    def delivered(self, count: int) -> None:
        """Count ``count`` samples handed to the consumer; the first ones stamp ``first_sample_s``."""
        if count:
            self.samples_delivered += count
            if self.first_sample_s is None:
                self.first_sample_s = time.perf_counter() - self.started

    def snapshot(self) -> dict[str, Any]:
        """A dict of counters plus derived rates (MB/s uses 10**6 bytes)."""
        if self.budget is not None:
            self.buffered_bytes = self.budget.data
            self.reserved_bytes = self.budget.reserved
            self.peak_buffered_bytes = self.budget.peak
        end = self.finished if self.finished is not None else time.perf_counter()
        # The engine can finish reading before the consumer takes its first sample (a pass of a few ms over local
        # files): the run lasted at least until then.
        elapsed = max(end - self.started, self.first_sample_s or 0.0, 1e-9)
        return {
            "elapsed_s": round(elapsed, 4),  # as first_sample_s, which it must never read below
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
            "cache_hits": self.cache_hits,
            "cache_fills": self.cache_fills,
            "cache_bypasses": self.cache_bypasses,
            "batches_read_ahead": self.batches_read_ahead,
            "ttfb_ms": None if self.ttfb_s is None else round(self.ttfb_s * 1000, 1),
            "concurrency": self.concurrency,
            "concurrency_cap": self.concurrency_cap,
            "concurrency_reason": self.concurrency_reason,
            "wait_s": round(self.wait_seconds, 3),
            "wait_fraction": round(self.wait_seconds / elapsed, 3),
            "first_sample_s": None if self.first_sample_s is None else round(self.first_sample_s, 4),
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


#: What one worker's slot holds, in order (all as doubles; integers below 2**53 are exact).
_COUNTERS = ("bytes_read", "samples_read", "samples_delivered", "shards_total", "shards_done", "shards_in_flight",
             "shards_skipped", "samples_skipped", "retries", "requests", "throttled", "parts", "cache_hits",
             "cache_fills", "cache_bypasses", "batches_read_ahead", "open_streams",
             "concurrency", "concurrency_cap", "buffered_bytes", "buffer_limit", "reserved_bytes",
             "peak_buffered_bytes")
_HEAD = ("seq", "workers", "started", "stamp", "wait_seconds", "ttfb_s", "first_sample_at")
_WIDTH = len(_HEAD) + len(_COUNTERS)


def _to_monotonic(perf: float) -> float:
    """A ``time.perf_counter()`` reading on the system-wide ``time.monotonic()`` clock, comparable across processes."""
    return time.monotonic() - (time.perf_counter() - perf)


def _noop() -> None:
    return None


def _dataloader_worker() -> Any:
    """``torch.utils.data.get_worker_info()`` (None outside a DataLoader worker), asked without importing torch: a
    worker has always imported it, so where it is not loaded (no torch installed, the command line) there is none."""
    loaded = sys.modules.get("torch.utils.data")
    return None if loaded is None else loaded.get_worker_info()


class _Publisher:
    """Copies one worker's :class:`Stats` into its slot: now, every ``PUBLISH_INTERVAL`` s, and on ``stop()``."""

    def __init__(self, array: Any, base: int, workers: int, stats: Stats) -> None:
        self._array, self._base, self._workers, self._stats = array, base, workers, stats
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._write()
        threading.Thread(target=self._run, name="wds-async-stats", daemon=True).start()

    def _run(self) -> None:
        while not self._stopped.wait(PUBLISH_INTERVAL):
            self._write()

    def stop(self) -> None:
        """Write the final counters and end the thread (idempotent)."""
        if not self._stopped.is_set():
            self._write()
            self._stopped.set()

    def _write(self) -> None:
        stats, array, base = self._stats, self._array, self._base
        with self._lock:
            if self._stopped.is_set():
                return
            stats.snapshot()  # refreshes the buffered-bytes fields from the live byte budget
            now = time.monotonic()
            stamp = _to_monotonic(stats.finished) if stats.finished is not None else now
            ttfb = math.nan if stats.ttfb_s is None else stats.ttfb_s
            started = _to_monotonic(stats.started)
            first = math.nan if stats.first_sample_s is None else started + stats.first_sample_s
            values = [self._workers, started, stamp, stats.wait_seconds, ttfb, first]
            values += [getattr(stats, name) for name in _COUNTERS]
            array[base] += 1  # odd: being written
            array[base + 1:base + _WIDTH] = values
            array[base] += 1


#: Every SharedStats of this process (datasets hold them; gone with their dataset) and the Stats watched by name.
_SHARED: weakref.WeakSet[SharedStats] = weakref.WeakSet()
_NAMED: dict[str, Stats] = {}
_IDS = itertools.count()


def watch(stats: Stats, name: str) -> None:
    """Export ``stats`` (a live :class:`Stats`, e.g. the node service's) under the label ``name``."""
    _NAMED[name] = stats


def watched() -> list[tuple[str, dict[str, Any]]]:
    """(name, snapshot) of every live set of counters of this process: the :class:`Stats` given to :func:`watch`,
    then each :class:`SharedStats` with counts (its ``name``; a dataset's is its number in this process, in the
    order datasets were built), its DataLoader workers summed as ``stats()`` shows them."""
    found = [(name, stats.snapshot()) for name, stats in list(_NAMED.items())]
    for shared in sorted(list(_SHARED), key=lambda s: s.number):
        snap = shared.live()
        if snap is not None:
            found.append((shared.name, snap))
    return found


class SharedStats:
    """The counters of a dataset's DataLoader workers, one slot per worker id, summed for the main process."""

    def __init__(self, array: Any = None) -> None:
        self._array = array if array is not None else multiprocessing.RawArray("d", MAX_WORKERS * _WIDTH)
        self._local: Stats | None = None  # the latest iteration of this process (see publish())
        self.number = next(_IDS)
        #: The label :func:`watched` gives these counters (``wds_async.metrics.watch(dataset, name)`` sets it).
        self.name = str(self.number)
        _SHARED.add(self)

    def __reduce__(self) -> tuple[Any, ...]:
        # The block travels only with a process being started (spawn/forkserver: its fd is passed to the child);
        # a pickle made for any other reason cannot carry shared memory, so its copy starts a block of its own.
        if get_spawning_popen() is not None:
            return (SharedStats, (self._array,))
        return (SharedStats, ())

    def publish(self, stats: Stats) -> Callable[[], None]:
        """In a DataLoader worker: clear this worker's slot, copy ``stats`` into it every ``PUBLISH_INTERVAL``
        seconds from a small thread (so the counters stay live while the worker waits on the DataLoader's
        queue), and return ``stop()``, which writes them a last time. Elsewhere: nothing, and a no-op ``stop``.
        Anywhere, ``stats`` becomes the local run :meth:`live` shows."""
        self._local = stats
        info = _dataloader_worker()
        if info is None or info.id >= MAX_WORKERS:
            return _noop
        return _Publisher(self._array, info.id * _WIDTH, min(info.num_workers, MAX_WORKERS), stats).stop

    def learned_level(self) -> int:
        """In a DataLoader worker: the concurrency at which the previous run in this worker's slot ended (an
        earlier epoch's worker with the same id, in a DataLoader with as many workers), else 0. A DataLoader's
        workers are new processes every epoch unless ``persistent_workers=True``, so a dataset's own memory of
        where its last epoch settled stays in the worker that learned it; the slot outlives that process."""
        info = _dataloader_worker()
        if info is None or info.id >= MAX_WORKERS:
            return 0
        row = self._slot(info.id)
        if row is None or int(row["workers"]) != min(info.num_workers, MAX_WORKERS):
            return 0
        return int(row["concurrency"])

    def _slot(self, slot: int) -> dict[str, float] | None:
        """One slot's last complete write, or None when it was never written (or a writer held it throughout)."""
        base = slot * _WIDTH
        for _ in range(100):  # a writer holds a slot for microseconds
            seq = self._array[base]
            row = self._array[base:base + _WIDTH]
            if seq % 2 == 0 and row[0] == seq:
                break
        else:
            return None
        if not seq:
            return None
        return {"slot": slot, **dict(zip(_HEAD, row))} | dict(zip(_COUNTERS, row[len(_HEAD):]))

    def _slots(self) -> list[dict[str, float]]:
        return [row for row in map(self._slot, range(MAX_WORKERS)) if row is not None]

    def live(self) -> dict[str, Any] | None:
        """:meth:`combined` over the latest local run published here, or None when neither this process nor
        a DataLoader worker has run one yet."""
        if self._local is None and (_dataloader_worker() is not None or not self._slots()):
            return None
        return self.combined(self._local)

    def combined(self, local: Stats | None = None) -> dict[str, Any]:
        """The snapshot ``stats()`` shows: in the main process, the latest run of its DataLoader workers, summed
        (with a ``workers`` count), unless ``local`` (this process's own iteration) started after them; in a
        worker, ``local``."""
        rows = [] if _dataloader_worker() is not None else self._slots()
        if not rows or (local is not None and _to_monotonic(local.started) > max(r["started"] for r in rows)):
            return (local or Stats()).snapshot()
        workers = int(max(rows, key=lambda r: r["started"])["workers"])
        rows = [r for r in rows if r["slot"] < workers]
        first, last = min(r["started"] for r in rows), max(r["stamp"] for r in rows)
        ttfbs = [r["ttfb_s"] for r in rows if not math.isnan(r["ttfb_s"])]
        # The first sample any worker delivered, from the first worker's start: what the training loop waited.
        firsts = [r["first_sample_at"] for r in rows if not math.isnan(r["first_sample_at"])]
        total = Stats(started=time.perf_counter() - (time.monotonic() - first),
                      finished=time.perf_counter() - (time.monotonic() - last),
                      wait_seconds=sum(r["wait_seconds"] for r in rows),
                      ttfb_s=sum(ttfbs) / len(ttfbs) if ttfbs else None,
                      first_sample_s=min(firsts) - first if firsts else None,
                      concurrency_reason=f"summed over {len(rows)} DataLoader workers")
        for name in _COUNTERS:
            setattr(total, name, int(sum(r[name] for r in rows)))
        snap = total.snapshot()
        busy = sum(max(r["stamp"] - r["started"], 0.0) for r in rows)
        snap["wait_fraction"] = round(total.wait_seconds / busy, 3) if busy > 0 else 0.0
        snap["workers"] = len(rows)
        return snap
