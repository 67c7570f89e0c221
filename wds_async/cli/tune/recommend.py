"""``wds-async tune``: measure what this node gets from a store, and choose the node's connections.

The sweep runs raw ranged GETs through the loader's own backends (:mod:`wds_async.io.rawread`: the same
sessions and pools, bytes thrown away, no retries; :mod:`wds_async.cli.tune.sweep` measures). For each
concurrency level it keeps that many readers busy for ``seconds``, cycling over the objects (whole
objects), and records MB/s (10**6 bytes per second of the window), this process's CPU seconds per GB,
p50/p99 time to first byte, requests, errors, and throttled answers (HTTP 503 and 429, counted apart
from other errors).

The **knee** is the smallest level whose MB/s is within 5% of the best level's: more connections
past it buy little and cost memory, sockets and the store's patience. Levels where the store
throttled more than 1% of the requests are not candidates (unless every level was throttled): a
store that refuses above N requests still moves bytes above N, but a loader set there spends its
time in retries. The sweep stops once two successive levels fail to beat the best so far by more
than 5% (``full=True`` measures every level).
With ``part_bytes`` sizes, a second sweep at the knee reads the objects as ranged parts of each size.

The recommendation divides the knee among the node's loader processes (``ranks x workers``), and
sizes the byte budget to hold about 2 s of data at the knee's rate (see :mod:`wds_async.node`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ...config import check_size
from ...node import ENV_BUFFERED_BYTES, ENV_CONNECTIONS, MIN_BUFFERED_BYTES, MIN_CONNECTIONS
from .sweep import Measurement, Progress, run_sweep

__all__ = ["DEFAULT_LEVELS", "Measurement", "Recommendation", "TuneResult", "find_knee", "plateaued",
           "recommend", "size_text", "throttled_fraction", "tune"]

DEFAULT_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TOLERANCE = 0.05         # "within 5%" for the knee, "more than 5%" for an improvement
MAX_THROTTLED = 0.01     # a level with more throttled requests than this fraction is no knee
BUFFER_SECONDS = 2.0     # the byte budget holds this much data at the knee's rate
MAX_OBJECTS = 1024       # objects read at most (the first ones given): plenty to cycle over
_BUFFER_STEP = 16 << 20  # the budget is rounded up to whole 16 MiB

@dataclass(frozen=True)
class Recommendation:
    """The settings the sweep suggests for ``ranks x workers`` loader processes on this node."""

    knee: int
    mb_s: float
    ranks: int
    workers: int
    node_connections: int
    process_connections: int
    node_buffered_bytes: int
    process_buffered_bytes: int
    part_bytes: int | None = None  # a part size that beat whole objects by more than 5%, if any

    def lines(self) -> list[str]:
        """The recommendation as the lines the CLI prints."""
        procs = self.ranks * self.workers
        out = [f"recommendation for {self.ranks} rank(s) x {self.workers} worker(s) = {procs} loader process(es):",
               f"  per node:     {ENV_CONNECTIONS}={self.node_connections}   "
               f"(or WebDataset(..., node_connections={self.node_connections}))",
               f"  per process:  max_connections={self.process_connections}",
               f"  buffers:      {ENV_BUFFERED_BYTES}={size_text(self.node_buffered_bytes)}   (about "
               f"{BUFFER_SECONDS:g} s at {self.mb_s:,.0f} MB/s; {size_text(self.process_buffered_bytes)} per process)"]
        if self.part_bytes:
            out.append(f"  parts:        ranged parts of {size_text(self.part_bytes)} beat whole objects "
                       f"(part_bytes={self.part_bytes})")
        return out


@dataclass(frozen=True)
class TuneResult:
    """What :func:`tune` measured and recommends.

    ``levels`` is the sweep asked for; ``sweep`` the whole-object measurements in order (shorter when
    ``stopped_early``); ``parts`` the ranged-part measurements at the knee; ``knee`` the chosen level.
    """

    objects: int
    seconds: float
    levels: tuple[int, ...]
    sweep: list[Measurement]
    parts: list[Measurement]
    knee: int
    best: Measurement
    stopped_early: bool
    recommendation: Recommendation

    @property
    def at_knee(self) -> Measurement:
        return next(m for m in self.sweep if m.concurrency == self.knee)

    @property
    def throttled_from(self) -> int | None:
        """The smallest level where the store throttled more than 1% of the requests, if any."""
        return next((m.concurrency for m in self.sweep if throttled_fraction(m) > MAX_THROTTLED), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def size_text(n: int) -> str:
    """Bytes as :func:`~wds_async.node.parse_bytes` reads them back: ``"2GiB"``, ``"576MiB"``, ``"4MB"``."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB"), (10**9, "GB"), (10**6, "MB"), (10**3, "KB"),
                       (1 << 10, "KiB")):
        if n % unit == 0:
            return f"{n // unit}{name}"
    return str(n)


def throttled_fraction(m: Measurement) -> float:
    return m.throttled / m.requests if m.requests else 0.0


def find_knee(levels: Sequence[int], rates: Sequence[float], throttled: Sequence[float] | None = None, *,
              tolerance: float = TOLERANCE, max_throttled: float = MAX_THROTTLED) -> int:
    """The smallest level whose rate is within ``tolerance`` of the best rate, among the levels whose
    ``throttled`` fraction of requests is at most ``max_throttled`` (all levels when none is)."""
    if not levels or len(levels) != len(rates) or (throttled is not None and len(throttled) != len(levels)):
        raise ValueError("find_knee needs one rate (and throttled fraction) per level")
    points = list(zip(levels, rates))
    if throttled is not None:
        points = [p for p, t in zip(points, throttled) if t <= max_throttled] or points
    best = max(rate for _, rate in points)
    return min(level for level, rate in points if rate >= best * (1 - tolerance))


def _knee(sweep: Sequence[Measurement]) -> int:
    return find_knee([m.concurrency for m in sweep], [m.mb_s for m in sweep], [throttled_fraction(m) for m in sweep])


def plateaued(rates: Sequence[float], tolerance: float = TOLERANCE, patience: int = 2) -> bool:
    """True when each of the last ``patience`` rates failed to beat every rate before it by more than
    ``tolerance``: the sweep has stopped paying."""
    if len(rates) <= patience:
        return False
    return all(rates[i] <= max(rates[:i]) * (1 + tolerance) for i in range(len(rates) - patience, len(rates)))


def recommend(knee: int, mb_s: float, *, ranks: int = 1, workers: int = 1,
              part_bytes: int | None = None) -> Recommendation:
    """Divide ``knee`` connections among ``ranks x workers`` processes (rounding up, at least one each)
    and size the byte budget for ``BUFFER_SECONDS`` at ``mb_s``, floored at the per-process minimum."""
    if ranks < 1 or workers < 1:
        raise ValueError(f"ranks and workers must be at least 1, got {ranks} and {workers}")
    procs = ranks * workers
    need = math.ceil(BUFFER_SECONDS * mb_s * 1e6 / _BUFFER_STEP) * _BUFFER_STEP
    node_bytes = max(need, MIN_BUFFERED_BYTES * procs)
    return Recommendation(knee=knee, mb_s=mb_s, ranks=ranks, workers=workers, node_connections=knee,
                          process_connections=max(MIN_CONNECTIONS, math.ceil(knee / procs)),
                          node_buffered_bytes=node_bytes,
                          process_buffered_bytes=max(MIN_BUFFERED_BYTES, node_bytes // procs >> 20 << 20),
                          part_bytes=part_bytes)


def _check_levels(levels: Sequence[int], max_level: int | None) -> tuple[int, ...]:
    if any(not isinstance(n, int) or isinstance(n, bool) or n < 1 for n in levels):
        raise ValueError(f"levels must be positive ints, got {list(levels)}")
    chosen = tuple(sorted({n for n in levels if max_level is None or n <= max_level}))
    if not chosen:
        raise ValueError(f"no level left at or below --max {max_level} (levels {list(levels)})")
    return chosen


def tune(urls: str | Sequence[str], *, levels: Sequence[int] = DEFAULT_LEVELS, max_level: int | None = None,
         seconds: float = 3.0, part_bytes: Sequence[int] = (), full: bool = False, ranks: int = 1,
         workers: int = 1, backend_options: Mapping[str, Any] | None = None,
         progress: Progress | None = None) -> TuneResult:
    """Sweep the concurrency levels against ``urls`` (patterns and globs expand) from this process and
    return the measurements, the knee and the recommendation (see the module docstring).

    ``seconds`` is each level's window; ``max_level`` drops the levels above it; ``part_bytes`` adds a
    ranged-part sweep at the knee; ``ranks`` and ``workers`` are the node's loader processes the
    recommendation divides among; ``progress`` (see :data:`Progress`) is called about every 0.25 s.
    Raises a :class:`~wds_async.errors.WdsError` naming the URL when an object is missing or the store
    cannot be reached, and ValueError for settings that make no sweep.
    """
    from ..._loop import run_private
    from ...io import scheme_options
    from ...io.listing import expand_globs
    from ...urls import expand_urls

    chosen = _check_levels(levels, max_level)
    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    for size in part_bytes:  # the engine's floor (32 KiB): the sweep plans every part of every object up front
        check_size("part_bytes", size, shown="part_bytes", zero=False)
    if ranks < 1 or workers < 1:
        raise ValueError(f"ranks and workers must be at least 1, got {ranks} and {workers}")
    listed = expand_urls(urls if isinstance(urls, str) else list(urls))
    options = scheme_options(backend_options, listed)
    objects = expand_globs(listed, options=options)[:MAX_OBJECTS]
    report = progress or (lambda done, total, label, rate: None)
    sweep, parts, knee = run_private(lambda: run_sweep(
        objects, chosen, seconds, part_bytes, options, report, knee_of=_knee,
        stop=(lambda done: False) if full else (lambda done: plateaued([m.mb_s for m in done])),
        part_name=size_text))
    best = max(sweep, key=lambda m: m.mb_s)
    at_knee = next(m for m in sweep if m.concurrency == knee)
    fastest_part = max(parts, key=lambda m: m.mb_s, default=None)
    part = (fastest_part.part_bytes if fastest_part is not None
            and fastest_part.mb_s > at_knee.mb_s * (1 + TOLERANCE) else None)
    advice = recommend(knee, at_knee.mb_s, ranks=ranks, workers=workers, part_bytes=part)
    return TuneResult(len(objects), seconds, chosen, sweep, parts, knee, best, len(sweep) < len(chosen), advice)
