"""The concurrency autotuner: as many requests in flight as raise throughput, and no more.

It sets :attr:`~wds_async.engine.limiter.Limiter.total` of the engine's limiter. Every few tens of milliseconds
it samples two facts (was concurrency the limit: every token taken and work waiting for one; was the
buffer full while the consumer did not wait), and once per *interval* (about three times the measured
time to first byte, between 0.25 s and 2 s, so that new requests have begun to stream before they are
judged; twice, from 0.2 s, while ramping) it compares the bytes per second of that interval, leaving out
its first time-to-first-byte after a change, with the previous ones and decides:

``ramp``
    Start: double the concurrency each interval while throughput rises by at least 20% per doubling
    (TCP's slow start, with throughput standing in for acknowledgements). A doubling that gains less
    than that is the knee: keep the higher level unless it measured clearly worse (10% less), and hold.
    Keeping is the cheaper mistake: one interval's throughput is noisy on a busy host, and a knee
    placed one doubling too high costs some idle connections, one placed too low costs bandwidth.
``hold``
    Stay; every ``probe_every`` seconds try 25% more (at least one more). A probe that gains at least
    7% is kept and ramping resumes; one that does not is undone, the next probe waits twice as long (up
    to a minute), and goes *down* by 25% instead: kept when it loses under 5% (the knee is lower than
    the ramp left it), undone otherwise. So a flat store costs one probe a minute, and the level drifts
    down to the knee rather than staying where a noisy doubling left it.
``latency`` and ``waiting`` (once, at a cold start)
    Where requests mostly wait for their first byte, the level jumps at once rather than ramping, and before any
    answer it doubles while every request waits: see :mod:`wds_async.engine.startup`.
``throttled``
    Any 429/503 (S3 ``SlowDown``, GCS ``rateLimitExceeded``, Azure ``ServerBusy``) in an interval cuts the
    concurrency to the number of requests the store was actually answering at once during it (the best
    estimate of what it accepts), at least one less and at most half less than what was in flight; the
    level that drew the rejection becomes a ceiling
    for a minute. After a throttle, growth is additive (one more request per probe), as in TCP's
    congestion avoidance, so a store that rejects above N concurrent requests sees a rejection about
    once a minute rather than one per doubling.
``saturated``
    The loop thread was on the CPU for 90% of the interval or more (``time.thread_time()`` of the thread the tuner
    runs on): it parses as fast as it can, and more requests can only read further ahead of what the consumer
    needs, which costs memory and, in the shard-list order, the page faults of a growing buffer (measured on an
    unthrottled loopback store: 512 MiB in 0.43 s at 2 connections, 0.64 s at the 32 and 64 the ramp chose). So
    while it is saturated the ramp stops and no probe goes up; instead the level is trimmed a quarter at a time
    from the requests in flight, each trim judged as any trim (kept when it keeps 95% of the throughput, and then
    the next follows at once), down to the floor or the first trim that loses; a probe that comes due while
    saturated goes down again, later each time it is undone.
``consumer``
    The byte buffer stayed full while the consumer never waited: training, not the network, is the
    bottleneck. More requests would only hold more connections open, so the concurrency shrinks by 20%
    per interval down to the floor; when the buffer drains and concurrency limits again, ramping
    restarts.

When fewer requests are open than allowed (few shards left, or the consumer is keeping up anyway), the
interval says nothing about concurrency and nothing changes. Each change sets ``stats.concurrency`` and a
one-line ``stats.concurrency_reason``. The decision logic, :meth:`Autotuner.decide`, is a pure function of
its observations so that tests can drive it with a synthetic store.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..io.budget import ByteBudget
from ..stats import Stats
from .limiter import Limiter
from .startup import PROBE_TICK, TICK, StartUp, latency_level, waiting_share

__all__ = ["Autotuner", "Observation", "latency_level", "waiting_share"]

RAMP_GAIN = 1.20     # a doubling must gain this much to keep doubling
KNEE_KEEP = 0.90     # a doubling that lost more than this is undone at the knee; else kept (see below)
PROBE_GAIN = 1.07    # a probe must gain this much to be kept
TRIM_KEEP = 0.95     # fewer requests are kept when they keep this much of the throughput
TRIM_STEP = 0.75     # a trim (and a shed of a saturated loop) tries this share of the requests
BACKOFF = 0.50       # the deepest cut on throttling (see ``decide``)
SHRINK = 0.80        # per interval while the consumer is the bottleneck
CEILING_SECONDS = 60.0
SATURATED = 0.9      # the loop thread's share of an interval on the CPU above which it is the bottleneck


@dataclass(frozen=True)
class Observation:
    """What one interval showed."""

    now: float
    throughput: float       # bytes/s over the interval
    throttled: int          # 429/503 answers during the interval
    limited: float          # fraction of ticks where concurrency was the limit
    consumer_bound: float   # fraction of ticks with a full buffer and a consumer that did not wait
    in_flight: int          # tokens taken at the end of the interval
    served: int = 0         # the most requests the store was answering at once during the interval
    busy: float = 0.0       # the loop thread's CPU time over the interval's wall time


class Autotuner(StartUp):
    """Drives ``limiter.total`` from the engine's counters (see the module docstring)."""

    def __init__(self, limiter: Limiter, stats: Stats, budget: ByteBudget | None, *, minimum: int, cap: int,
                 probe_every: float = 5.0, has_work: Callable[[], bool] = lambda: True,
                 cold: bool = True, start_reason: str = "start", probe_to: int | None = None) -> None:
        self.limiter = limiter
        #: False once the engine has handed out its last item: waiting readers then wait for nothing.
        self.has_work = has_work
        self.stats = stats
        self.budget = budget
        self.minimum = max(1, min(minimum, cap))
        self.cap = cap
        self.probe_every = probe_every
        self.phase = "ramp"
        self._ramp_from: tuple[int, float] | None = None  # (level, throughput) before the last doubling
        self._probe_from: tuple[int, float] | None = None
        self._held = 0.0                 # throughput at the held level (an average)
        self._probe_wait = probe_every
        self._next_probe = 0.0
        self._ceiling = cap
        self._ceiling_until = 0.0
        self._gentle = False             # additive growth once the store has throttled
        self._trim_next = False          # the next probe goes down (the last one up gained nothing)
        self._shedding = False           # the trim being judged was one of a saturated loop (see _saturated)
        self._sized = not cold           # the latency check has run (see ``size``); a learned start skips it
        self._size_from: tuple[float, int, int] | None = None  # (time, bytes read, streams) at its first tick
        self._waited: tuple[float, int] | None = None  # (time of the last doubling or the start, doublings) before any answer
        #: The start level a cold start probing at PROBE_LEVEL goes to unless an answer comes first (see startup).
        self._probe_to = probe_to if cold else None
        self._set(limiter.total, start_reason)

    # -- the loop ------------------------------------------------------------------------------------
    def interval(self) -> float:
        """Seconds per decision: three times the time to first byte, within [0.25, 2]; while ramping,
        twice, within [0.2, 1], since a doubling that works shows a large gain even over a short time."""
        ttfb = self.stats.ttfb_s
        if ttfb is None:
            return 0.5
        if self.phase == "ramp":
            return min(1.0, max(0.2, 2.0 * ttfb))
        return min(2.0, max(0.25, 3.0 * ttfb))

    async def run(self) -> None:
        """Observe and decide until cancelled (the engine cancels it when the data ends)."""
        loop = asyncio.get_running_loop()
        changed = True
        if not self._sized:
            self._waited = (loop.time(), 0)
        while True:
            started = loop.time()
            level = self.limiter.total
            throttled0, wait0, bytes0 = self.stats.throttled, self.stats.wait_seconds, self.stats.bytes_read
            cpu0 = time.thread_time()  # this coroutine runs on the loop thread: its CPU time is the loop's
            ticks = limited = full = served = 0
            length = self.interval()
            # Right after a change the new requests are still waiting for their first byte: leave that
            # part of the interval out of the throughput it is judged by.
            settle = min(length / 2, 1.2 * (self.stats.ttfb_s or 0.0)) if changed else 0.0
            mark: tuple[float, int] | None = None
            jumped = False
            while loop.time() - started < length:
                if mark is None and loop.time() - started >= settle:
                    mark = (loop.time(), self.stats.bytes_read)
                await asyncio.sleep(PROBE_TICK if self._probe_to is not None else TICK)
                ticks += 1
                if not self._sized and (self.before_answers(loop.time()) or self.size(loop.time())):
                    jumped = True  # the level jumped: this interval judged the old one; start a new one
                    break
                served = max(served, self.stats.open_streams)
                if self.limiting():
                    limited += 1
                if self.budget is not None and self.budget.used >= 0.75 * self.budget.limit:
                    full += 1
            if jumped:
                changed = True
                continue
            elapsed = max(loop.time() - started, 1e-6)
            waited = (self.stats.wait_seconds - wait0) / elapsed
            if mark is None:  # one tick outlasted the whole interval (a stalled loop): judge it from its start
                mark = (started, bytes0)
            obs = Observation(
                now=time.monotonic(),
                throughput=(self.stats.bytes_read - mark[1]) / max(loop.time() - mark[0], 1e-6),
                throttled=self.stats.throttled - throttled0, limited=limited / max(ticks, 1),
                consumer_bound=(full / max(ticks, 1)) if waited < 0.05 else 0.0,
                in_flight=self.limiter.borrowed, served=served, busy=(time.thread_time() - cpu0) / elapsed)
            self.decide(obs)
            changed = self.limiter.total != level

    # -- the decision --------------------------------------------------------------------------------
    def _set(self, level: int, reason: str) -> None:
        level = max(self.minimum, min(self.cap, level))
        if level != self.limiter.total:
            self.limiter.total = level
        self.stats.concurrency = level
        self.stats.concurrency_cap = self.cap
        self.stats.concurrency_reason = reason

    def _top(self, now: float) -> int:
        return self._ceiling if now < self._ceiling_until else self.cap

    def decide(self, obs: Observation) -> None:
        """Change (or keep) the concurrency after one interval."""
        level, mbs = self.limiter.total, obs.throughput / 1e6
        if obs.throttled:
            drawn = max(level, obs.in_flight)
            self._ceiling, self._ceiling_until = max(self.minimum, drawn - 1), obs.now + CEILING_SECONDS
            self._gentle = True
            self.phase, self._ramp_from, self._probe_from = "hold", None, None
            self._held, self._next_probe = 0.0, obs.now + self.probe_every
            # What the store did serve at once is the best estimate of what it accepts: go there, but at least
            # one below what drew the rejections and never below half of it.
            target = max(math.floor(drawn * BACKOFF), min(drawn - 1, obs.served or 0))
            self._set(target, f"backed off: {obs.throttled} throttled answers (429/503) at {drawn} in flight, "
                      f"{obs.served} served at once")
            return
        if obs.consumer_bound > 0.5:
            self.phase, self._ramp_from, self._probe_from = "consumer", None, None
            if level > self.minimum:
                self._set(math.ceil(level * SHRINK), "the consumer is the bottleneck (buffer full, consumer "
                          "not waiting)")
            return
        if self._saturated(obs):
            return
        if obs.limited < 0.5 or not obs.throughput:
            return  # not enough work waiting (or no byte yet) to judge concurrency by this interval
        top = self._top(obs.now)
        if self.phase == "consumer":
            self.phase, self._ramp_from = "ramp", None
        if self.phase == "ramp":
            if self._ramp_from is None or obs.throughput >= self._ramp_from[1] * RAMP_GAIN:
                if level >= top:
                    self._hold(obs, level, f"at the ceiling {top} ({mbs:.0f} MB/s)")
                    return
                gained = ("" if self._ramp_from is None or not self._ramp_from[1]
                          else f" (+{obs.throughput / self._ramp_from[1] - 1:.0%})")
                self._ramp_from = (level, obs.throughput)
                step = level + 1 if self._gentle else level * 2
                self._set(min(top, step), f"ramping up: {mbs:.0f} MB/s at {level}{gained}")
                return
            before, before_thr = self._ramp_from
            keep = level if obs.throughput >= before_thr * KNEE_KEEP else before
            self._hold(obs, keep, f"knee at {keep}: {mbs:.0f} MB/s at {level} vs {before_thr / 1e6:.0f} at {before}",
                       max(obs.throughput, before_thr))
            return
        if self.phase == "trim":
            assert self._probe_from is not None
            before, before_thr = self._probe_from
            self._probe_from = None
            shedding, self._shedding = self._shedding, False
            if obs.throughput >= before_thr * TRIM_KEEP:
                self._hold(obs, level, f"trimmed to {level}: {mbs:.0f} MB/s, as at {before}")
                if obs.busy >= SATURATED:  # still saturated: try fewer again at once, judged against the best
                    self._shed(obs, max(before_thr, obs.throughput))  # of the chain, so losses do not add up
            else:
                if shedding:  # the fewest that saturate the loop: the next trim waits longer
                    self._probe_wait = min(60.0, self._probe_wait * 2)
                self._hold(obs, before, f"back to {before}: {level} gave {mbs:.0f} vs {before_thr / 1e6:.0f} MB/s",
                           before_thr)
            return
        if self.phase == "probe":
            assert self._probe_from is not None
            before, before_thr = self._probe_from
            self._probe_from = None
            # a step of +1 at 22 can only gain 4.5%: ask for half of what the step could give, at most 7%
            if obs.throughput >= before_thr * (1 + min(PROBE_GAIN - 1, 0.5 * (level - before) / before)):
                self._probe_wait = self.probe_every
                if self._gentle:
                    self._hold(obs, level, f"probe kept: {mbs:.0f} MB/s at {level} vs {before_thr / 1e6:.0f} at {before}")
                else:
                    self.phase, self._ramp_from = "ramp", (level, obs.throughput)
                    self._set(min(top, level * 2), f"probe gained: ramping from {level} ({mbs:.0f} MB/s)")
                return
            self._probe_wait = min(60.0, self._probe_wait * 2)
            self._trim_next = True
            self._hold(obs, before, f"probe to {level} gained nothing ({mbs:.0f} vs {before_thr / 1e6:.0f} MB/s)",
                       before_thr)
            return
        # hold
        self._held = obs.throughput if not self._held else 0.7 * self._held + 0.3 * obs.throughput
        if obs.now < self._next_probe:
            return
        if self._trim_next or level >= top:
            self._trim_next = False
            lower = max(self.minimum, math.floor(level * TRIM_STEP))
            if lower < level:
                self.phase, self._probe_from = "trim", (level, self._held)
                self._set(lower, f"trying fewer than {level}")
            else:
                self._next_probe = obs.now + self._probe_wait
            return
        if level < top:
            self.phase, self._probe_from = "probe", (level, self._held)
            step = level + 1 if self._gentle else max(level + 1, math.ceil(level * 1.25))
            self._set(min(top, step), f"probing above {level}")

    def _saturated(self, obs: Observation) -> bool:
        """Where the loop thread was on the CPU nearly all the interval, more requests cannot raise throughput:
        they only read further ahead of what the consumer needs, which costs memory (and, in the shard-list
        order, the page faults of a growing buffer). So the ramp and the probes stop there, and the level is
        trimmed, a quarter at a time from the requests actually in flight, while that keeps 95% of the
        throughput. True when this decided the interval."""
        if obs.busy < SATURATED or not obs.throughput or self.phase not in ("ramp", "hold"):
            return False
        if self.phase == "hold" and obs.now < self._next_probe:
            return True  # no probe upwards while saturated; when one is due, it goes down instead
        self._shed(obs)
        return True

    def _shed(self, obs: Observation, reference: float | None = None) -> None:
        """Try a quarter fewer requests than are in flight (see :meth:`_saturated`); judged as a trim, against
        ``reference`` (default: this interval's throughput)."""
        level = self.limiter.total
        base = min(level, max(obs.in_flight, 1))
        lower = max(self.minimum, math.floor(base * TRIM_STEP))
        if lower >= base:
            self._hold(obs, level, f"the loop thread is saturated ({obs.busy:.0%} busy) at {level}")
            return
        self.phase, self._ramp_from = "trim", None
        self._probe_from = (level, obs.throughput if reference is None else reference)
        self._shedding = True
        self._set(lower, f"the loop thread is saturated ({obs.busy:.0%} busy): trying {lower} instead of {base}")

    def _hold(self, obs: Observation, level: int, reason: str, throughput: float | None = None) -> None:
        self.phase, self._ramp_from = "hold", None
        self._held = obs.throughput if throughput is None else throughput
        self._next_probe = obs.now + self._probe_wait
        self._set(level, reason)
