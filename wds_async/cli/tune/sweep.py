"""The measuring half of :mod:`wds_async.cli.tune.recommend`: windows of raw reads at a fixed concurrency.

A window keeps ``concurrency`` readers busy for ``seconds``; each takes the next ``(url, start, end)``
job from a shared cycle, reads it through :func:`~wds_async.io.rawread.drain` and counts bytes as they
arrive, so a window's end cuts the reads in flight and the bytes they delivered still count. The
readers are cancelled at the end, inside their TaskGroup. A failed read is counted (503 and 429 as
throttled, the rest as errors) and its reader pauses 0.1 s, as a first retry would, so that a store
refusing at once is not hammered; a window in which every request failed raises the last error, which
names the URL.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import re
import time
from asyncio import TaskGroup
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import BackendError, WdsError
from ...io import BackendSet
from ...io.rawread import drain, raw_backends

__all__ = ["THROTTLED", "Measurement", "Progress", "run_sweep"]

# The backends' status errors read "HTTP 503 ...": the one place a throttled answer is recognised.
THROTTLED = re.compile(r"HTTP (429|503)\b")
_ERROR_PAUSE = 0.1       # a reader's pause after a failed request
_TICK = 0.25             # seconds between progress reports within a window
_HEAD_CONCURRENCY = 8    # the sizes are asked gently: a throttling store must not fail the tune
_HEAD_ATTEMPTS = 5       # a throttled HEAD is asked again, after 0.5 s, 1 s, ...

#: ``progress(done, total, label, mb_s)``: steps finished of the planned total, the running step's
#: label ("16 conns", "16 conns x 4MiB parts") and its MB/s so far.
Progress = Callable[[int, int, str, float], None]


@dataclass(frozen=True)
class Measurement:
    """One window of raw reads at a fixed concurrency; ``part_bytes`` None means whole objects."""

    concurrency: int
    part_bytes: int | None
    seconds: float
    bytes: int
    mb_s: float
    cpu_s_per_gb: float | None  # None when no byte arrived
    ttfb_p50_ms: float | None   # time from sending a request to its first body byte
    ttfb_p99_ms: float | None
    requests: int               # started in the window (those cut by its end included)
    completed: int
    errors: int                 # failed, other than throttled
    throttled: int              # answered 503 or 429


class _Window:
    """The counters of one measurement window, and the reader coroutine that feeds them."""

    def __init__(self, backends: BackendSet, jobs: Iterator[tuple[str, int, int | None]]) -> None:
        self.backends, self.jobs = backends, jobs
        self.bytes = self.requests = self.completed = self.errors = self.throttled = 0
        self.ttfb: list[float] = []
        self.last_error: WdsError | None = None

    async def reader(self) -> None:
        loop = asyncio.get_running_loop()
        while True:  # until the window's end cancels it
            url, start, end = next(self.jobs)
            self.requests += 1
            sent, first = loop.time(), True

            def on_chunk(n: int, sent: float = sent) -> None:
                nonlocal first
                if first:
                    first = False
                    self.ttfb.append(loop.time() - sent)
                self.bytes += n

            try:
                await drain(self.backends, url, start=start, end=end, on_chunk=on_chunk)
            except WdsError as exc:
                if THROTTLED.match(getattr(exc, "message", "")):
                    self.throttled += 1
                else:
                    self.errors += 1
                    self.last_error = exc
                await asyncio.sleep(_ERROR_PAUSE)
            else:
                self.completed += 1


def _percentile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return 1000 * ordered[max(0, math.ceil(q * len(ordered)) - 1)]  # nearest rank


async def _measure(backends: BackendSet, jobs: Iterator[tuple[str, int, int | None]], concurrency: int,
                   part_bytes: int | None, seconds: float, tick: Callable[[float], None]) -> Measurement:
    loop = asyncio.get_running_loop()
    window = _Window(backends, jobs)
    cpu0, t0 = time.process_time(), loop.time()
    async with TaskGroup() as group:
        readers = [group.create_task(window.reader()) for _ in range(concurrency)]
        while (left := t0 + seconds - loop.time()) > 0:
            await asyncio.sleep(min(_TICK, left))
            tick(window.bytes / 1e6 / max(loop.time() - t0, 1e-9))
        elapsed, nbytes = loop.time() - t0, window.bytes
        for reader in readers:
            reader.cancel()
    cpu = time.process_time() - cpu0
    if window.last_error is not None and not window.completed and not window.throttled:
        raise window.last_error  # every request failed: a dead server, a bad object; the error names it
    return Measurement(concurrency, part_bytes, elapsed, nbytes, nbytes / 1e6 / elapsed,
                       cpu / (nbytes / 1e9) if nbytes else None, _percentile_ms(window.ttfb, 0.5),
                       _percentile_ms(window.ttfb, 0.99), window.requests, window.completed, window.errors,
                       window.throttled)


async def _sizes(backends: BackendSet, urls: list[str]) -> list[int | None]:
    """Every object's size (a HEAD each): fails early, naming the URL, on a missing object or a dead store."""
    gate = asyncio.Semaphore(_HEAD_CONCURRENCY)

    async def size(url: str) -> int | None:
        async with gate:
            for attempt in range(1, _HEAD_ATTEMPTS + 1):
                try:
                    return await backends.for_url(url).size(url)  # type: ignore[no-any-return]
                except WdsError as exc:
                    if attempt == _HEAD_ATTEMPTS or not THROTTLED.match(getattr(exc, "message", "")):
                        raise
                await asyncio.sleep(0.5 * attempt)
        raise AssertionError("unreachable")

    found = await asyncio.gather(*(size(u) for u in urls), return_exceptions=True)
    for outcome in found:
        if isinstance(outcome, BaseException):
            raise outcome
    return found  # type: ignore[return-value]


def _part_jobs(urls: list[str], sizes: list[int | None], part: int) -> Iterator[tuple[str, int, int | None]]:
    ranges: list[tuple[str, int, int | None]] = []
    for url, size in zip(urls, sizes):
        if size is None:
            raise BackendError("ranged parts need the object's size, and the store did not give it", url=url)
        ranges += [(url, start, min(start + part, size)) for start in range(0, size, part)]
    if not ranges:
        raise BackendError("every object is empty: there are no parts to read", url=urls[0])
    return itertools.cycle(ranges)


async def run_sweep(urls: list[str], levels: Sequence[int], seconds: float, part_bytes: Sequence[int],
                    options: Mapping[str, Any] | None, progress: Progress, *,
                    stop: Callable[[list[Measurement]], bool], knee_of: Callable[[list[Measurement]], int],
                    part_name: Callable[[int], str] = str) -> tuple[list[Measurement], list[Measurement], int]:
    """Measure each level in turn until ``stop(done)``; then, at ``knee_of(done)``, each part size.
    Returns the level measurements, the part measurements and the knee."""
    steps = len(levels) + len(part_bytes)
    sweep: list[Measurement] = []
    async with raw_backends(max(levels), dict(options or {})) as backends:
        sizes = await _sizes(backends, urls)
        whole = itertools.cycle([(u, 0, None) for u in urls])
        for level in levels:
            label = f"{level} conns"
            # len(sweep) is this step's number until _measure returns: bound now, as the label is.
            sweep.append(await _measure(backends, whole, level, None, seconds,
                                        functools.partial(progress, len(sweep), steps, label)))
            progress(len(sweep), steps, label, sweep[-1].mb_s)
            if stop(sweep):
                break
        if not any(m.bytes for m in sweep):
            raise BackendError("no level read a single byte (every request was refused or throttled)", url=urls[0])
        knee = knee_of(sweep)
        parts: list[Measurement] = []
        for part in part_bytes:
            label = f"{knee} conns x {part_name(part)} parts"
            done = len(levels) + len(parts)
            parts.append(await _measure(backends, _part_jobs(urls, sizes, part), knee, part, seconds,
                                        functools.partial(progress, done, steps, label)))
            progress(done + 1, steps, label, parts[-1].mb_s)
    return sweep, parts, knee
