"""The autotuner's start-up (:class:`~wds_async.engine.autotune.Autotuner`): what it does before it has measured
an interval, at a cold start only (a dataset's next epoch starts at the level its last one settled at, and
``EngineConfig(early_start=False)`` turns them off).

``probe`` (at a cold start with the default start level, before anything else)
    The engine starts at :data:`PROBE_LEVEL` (8) requests, not the start level (32), and the tuner looks every
    :data:`PROBE_TICK`. A store on the same host or rack answers within :data:`PROBE_WAIT` (10 ms); there one
    stream alone delivers about as fast as the loop thread parses, and every request more only reads further
    ahead of the shard the consumer needs (a list of 32 x 16 MiB over loopback http, one pass: 849-959 MB/s
    from 8 against 565-727 from 32), so the level stays and the ramp and the saturation rule take it from there.
    A store that has not answered by then (on the 2-core machine, even one of 1 ms to first byte, whose first
    answer arrives after the connection and the loop's start) gets the start level at once, and the
    ``waiting`` doublings count from there: what the probe costs it is 10 ms for the requests above 8. A start
    the user chose, a learned one and a list of local files skip it.
``latency``
    Doublings judged an interval apart are slow where a request mostly waits for its first byte: at 200 ms
    to first byte a doubling costs 0.4 s, and an epoch of small shards is over before the ramp finds its
    knee. So once the first answers stream, the tuner reads one tick of their transfer and the share of a
    request's time spent waiting, ``w = t / (t + s / r)`` (``t`` the time to first byte, ``s`` the bytes a
    request asks for, ``r`` one stream's rate). Where most of it is waiting (``w >= 0.5``), more requests
    cost connections but little CPU and few bytes each, and the level jumps at once to ``level / (1 - w)``:
    what keeps as many requests transferring as now with the wait hidden, and for a known list at least to
    half the items not yet done (a short epoch, such as an evaluation pass, lasts a few request times: two
    waves of requests, not a ramp), capped by the budget's connection cap and by the items left. A jump
    for a known list holds there (probing later, as from any knee); one for an unknown length ramps on.
    Starting at half a known list at once, before any answer, was measured and dropped: it won (b) but cost
    a list of 397 shards of 2 MiB at 50 ms a later first sample (+60 ms) and 0.3 s more waiting, since
    transfer dominated there and the first shard shared the link with 197 others.
    Where transfer dominates (large shards, ``w`` small) nothing changes: a jump there would start past the
    knee that only the ramp can find.
``waiting`` (at a cold start, before the latency check)
    The check needs an answer, and at 200 ms to first byte the first answers come after the first wave's whole
    wait, with most of a short list still queued behind the starting level. So while no request has been
    answered (no first byte, no rejection, no retry) and every token is taken with items waiting for one, the
    level doubles every :data:`WAIT_STEP` (0.1 s), at most :data:`WAIT_DOUBLINGS` times, within the cap and for a
    known list within the items left. Requests waiting for a first byte cost a connection each and no bytes or
    CPU; a store that answers within 0.1 s never sees a doubling, and one that answers sooner than the first wave
    ends stops them at its first byte, where the latency check takes over (from the level reached).

The tuner calls :meth:`StartUp.before_answers` (the probe, then the doublings) and then :meth:`StartUp.size` every
tick until the latency check has run; either returning True ends the interval being measured (it judged the old
level).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..stats import Stats
    from .limiter import Limiter

__all__ = ["PROBE_LEVEL", "PROBE_TICK", "PROBE_WAIT", "StartUp", "latency_level", "waiting_share"]

TICK = 0.05          # seconds between the tuner's samples of its counters
PROBE_LEVEL = 8      # a default cold start sends this many requests first (see ``probe``)
PROBE_WAIT = 0.01    # and goes to the start level unless an answer came within this many seconds
PROBE_TICK = 0.005   # the tuner's tick meanwhile
LATENCY_BOUND = 0.5  # the waiting share of a request above which the latency check jumps
WAIT_STEP = 0.1      # before any answer, the level doubles after each this many seconds (see ``waiting``)
WAIT_DOUBLINGS = 3   # and at most this many times


def waiting_share(ttfb: float, request_bytes: float, rate: float) -> float:
    """The share of a request's time spent waiting for its first byte: ``t / (t + s / r)``."""
    if rate <= 0:
        return 0.0
    return ttfb / (ttfb + request_bytes / rate)


def latency_level(level: int, waiting: float) -> int:
    """The level the latency check jumps to from ``level`` where ``waiting`` is the share of a request spent
    waiting for its first byte (see the module docstring), or ``level``."""
    if waiting < LATENCY_BOUND:
        return level
    return max(level, math.ceil(level / max(1.0 - waiting, 0.05)))


class StartUp:
    """The start-up checks of :class:`~wds_async.engine.autotune.Autotuner` (a mixin: the tuner owns the state)."""

    limiter: Limiter
    stats: Stats
    phase: str
    has_work: Callable[[], bool]
    _sized: bool
    _size_from: tuple[float, int, int] | None
    _waited: tuple[float, int] | None
    _probe_to: int | None
    _ramp_from: tuple[int, float] | None
    _held: float
    _next_probe: float
    _probe_wait: float

    def _set(self, level: int, reason: str) -> None:
        raise NotImplementedError

    def _top(self, now: float) -> int:
        raise NotImplementedError

    def limiting(self) -> bool:
        """Whether the concurrency is what limits now: every token taken, and work waiting for one."""
        limiter = self.limiter
        return limiter.borrowed >= limiter.total and bool(limiter.waiting) and self.has_work()

    def before_answers(self, now: float) -> bool:
        """Before any answer (``waiting`` in the module docstring), called every tick until the latency check has
        run: double the level when :data:`WAIT_STEP` has passed since the start or the last doubling with no
        request answered, every token taken and items waiting. True when the level doubled."""
        stats, limiter = self.stats, self.limiter
        if self._waited is None or self._sized or self.phase != "ramp":
            return False
        if stats.ttfb_s is not None or stats.bytes_read or stats.throttled or stats.retries:
            self._waited = self._probe_to = None  # answered (or refused): the latency check decides from here
            return False
        since, doublings = self._waited
        if self._probe_to is not None:
            return self._probe(now, since, self._probe_to)
        if now - since < WAIT_STEP - 1e-6 or doublings >= WAIT_DOUBLINGS:  # (two ticks make a step)
            return False
        if not self.limiting():
            return False
        level = limiter.total
        target = min(2 * level, self._top(time.monotonic()))
        if stats.shards_total:
            target = min(target, stats.shards_total - stats.shards_done)
        if target <= level:
            return False
        self._waited = (now, doublings + 1)
        self._ramp_from = None
        self._set(target, f"waiting: no answer after {WAIT_STEP * (doublings + 1) * 1000:.0f} ms with {level} "
                          f"requests out: {level} -> {target}")
        return True

    def _probe(self, now: float, since: float, target: int) -> bool:
        """``probe`` in the module docstring: no answer :data:`PROBE_WAIT` after the start, so go to the start
        level ``target`` (when every token is taken with items waiting); the doublings count from here. True when
        it rose."""
        if now - since < PROBE_WAIT - 1e-6:
            return False
        level = self.limiter.total
        self._probe_to = None
        self._waited = (now, 0)
        if target <= level or not self.limiting():
            return False
        self._ramp_from = None
        self._set(target, f"probe: no answer after {PROBE_WAIT * 1000:.0f} ms with {level} requests out: "
                          f"{level} -> {target}")
        return True

    def size(self, now: float) -> bool:
        """The latency check (see the module docstring), called every tick until it has run once: the first
        tick with answers streaming marks the bytes read, the next one measures their rate and decides.
        True when the level jumped."""
        stats = self.stats
        if self._sized or self.phase != "ramp" or stats.ttfb_s is None or not stats.request_bytes or not stats.open_streams:
            return False
        if self._size_from is None:
            self._size_from = (now, stats.bytes_read, stats.open_streams)
            return False
        since, bytes0, open0 = self._size_from
        if now - since < TICK / 2:
            return False
        self._sized = True
        # One stream's bytes/s, over the most streams open at either end of the tick: a rate taken too high
        # would call transfers waits (a stream's first burst, streams that ended within the tick).
        rate = (stats.bytes_read - bytes0) / (now - since) / max(open0, stats.open_streams)
        level = self.limiter.total
        waiting = waiting_share(stats.ttfb_s, stats.request_bytes, rate)
        seen = (f"{waiting:.0%} of a request waits for its first byte ({stats.ttfb_s * 1000:.0f} ms, then "
                f"{stats.request_bytes / 1e6:.1f} MB at {rate / 1e6:.0f} MB/s per stream)")
        target = latency_level(level, waiting)
        if target <= level:
            return False
        left = stats.shards_total - stats.shards_done
        if stats.shards_total:  # a known list: at least half the items left, and no more than all of them
            target = min(max(target, left // 2), left)
        target = min(self._top(time.monotonic()), target)
        if target <= level:
            return False
        self._ramp_from = None
        self._set(target, f"latency-bound: {seen}: {level} -> {target}")
        if stats.shards_total:  # two waves of a short list: hold rather than double into one at the ceiling
            self.phase, self._held, self._next_probe = "hold", 0.0, time.monotonic() + self._probe_wait
        return True
