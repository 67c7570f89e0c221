"""The autotuner's decisions, driven by a synthetic store: finds the knee, backs off on 503s, yields to a
slow consumer, leaves the concurrency alone when it is not the limit, and jumps once at the start where
requests mostly wait for their first byte."""

from __future__ import annotations

import asyncio

import pytest

from wds_async.engine.autotune import Autotuner, Observation, latency_level, waiting_share
from wds_async.engine.limiter import Limiter
from wds_async.stats import Stats

MB = 1e6


def _tuner(start: int = 16, cap: int = 256, minimum: int = 2) -> Autotuner:
    return Autotuner(Limiter(start), Stats(), None, minimum=minimum, cap=cap, probe_every=5.0)


def _drive(tuner: Autotuner, store, seconds: float, step: float = 0.5) -> list[tuple[float, int, float, int]]:  # type: ignore[no-untyped-def]
    """Run the tuner against ``store(level) -> (bytes/s, throttled)`` and return (t, level, rate, throttled)."""
    trace = []
    t = 0.0
    while t < seconds:
        level = tuner.limiter.total
        rate, throttled, *served = store(level)
        trace.append((t, level, rate, throttled))
        tuner.decide(Observation(now=t, throughput=rate, throttled=throttled, limited=1.0, consumer_bound=0.0,
                                 in_flight=level, served=served[0] if served else level - throttled))
        t += step
    return trace


def _per_connection(per: float, total: float):  # type: ignore[no-untyped-def]
    return lambda level: (min(level * per, total), 0)


def test_ramps_to_the_knee_and_holds_near_the_best_rate() -> None:
    for per, total in ((20 * MB, 250 * MB), (3.3 * MB, 300 * MB), (50 * MB, 60 * MB)):
        tuner = _tuner()
        trace = _drive(tuner, _per_connection(per, total), 300)
        late = [rate for t, _, rate, _ in trace if t >= 10]
        assert sum(late) / len(late) >= 0.9 * total, (per, total)
        knee = total / per
        assert tuner.limiter.total <= max(4 * knee, 16), (per, total, tuner.limiter.total)
        assert tuner.limiter.total >= min(knee, 32) * 0.9, (per, total, tuner.limiter.total)


def test_noise_does_not_send_it_to_the_cap() -> None:
    import random

    rng = random.Random(5)
    tuner = _tuner()
    _drive(tuner, lambda level: (min(level * 20 * MB, 250 * MB) * rng.uniform(0.93, 1.07), 0), 120)
    assert tuner.limiter.total <= 64


def test_a_store_that_rejects_above_n_sees_few_rejections_after_the_start() -> None:
    n = 24

    def store(level: int) -> tuple[float, int]:
        return min(level, n) * 10 * MB, max(0, level - n)

    tuner = _tuner()
    trace = _drive(tuner, store, 300)
    late = [(level, throttled) for t, level, _, throttled in trace if t >= 5]
    rejected = sum(th for _, th in late)
    requests = sum(min(level, n) * 0.5 * 10 for level, _ in late)  # 10 requests/s per connection
    assert rejected / requests < 0.01
    rates = [rate for t, _, rate, _ in trace if t >= 5]
    assert sum(rates) / len(rates) >= 0.8 * n * 10 * MB
    assert any("throttled" in r for r in [tuner.stats.concurrency_reason]) or tuner.limiter.total <= n


def test_backs_off_at_once_on_throttling_to_what_the_store_served() -> None:
    tuner = _tuner(start=40)
    tuner.decide(Observation(now=0, throughput=100 * MB, throttled=3, limited=1.0, consumer_bound=0.0, in_flight=40,
                             served=30))
    assert tuner.limiter.total == 30
    assert "3 throttled" in tuner.stats.concurrency_reason and tuner.stats.concurrency == 30
    # at least one below what drew the rejections, never less than half of it
    tuner.decide(Observation(now=1, throughput=100 * MB, throttled=3, limited=1.0, consumer_bound=0.0, in_flight=30,
                             served=30))
    assert tuner.limiter.total == 29
    tuner.decide(Observation(now=2, throughput=100 * MB, throttled=3, limited=1.0, consumer_bound=0.0, in_flight=29,
                             served=0))
    assert tuner.limiter.total == 14


def test_a_slow_consumer_shrinks_it_to_the_floor_and_a_fast_one_ramps_again() -> None:
    tuner = _tuner(start=64, minimum=4)
    for t in range(20):
        tuner.decide(Observation(now=t, throughput=5 * MB, throttled=0, limited=0.0, consumer_bound=1.0,
                                 in_flight=tuner.limiter.total))
    assert tuner.limiter.total == 4 and "consumer" in tuner.stats.concurrency_reason
    tuner.decide(Observation(now=30, throughput=5 * MB, throttled=0, limited=1.0, consumer_bound=0.0, in_flight=4))
    assert tuner.limiter.total == 8 and "ramping" in tuner.stats.concurrency_reason


def test_nothing_changes_when_concurrency_is_not_the_limit() -> None:
    tuner = _tuner(start=16)
    for t in range(10):
        tuner.decide(Observation(now=t, throughput=50 * MB, throttled=0, limited=0.1, consumer_bound=0.0,
                                 in_flight=3))
    assert tuner.limiter.total == 16 and tuner.stats.concurrency_reason == "start"


def test_stays_within_floor_and_cap() -> None:
    tuner = _tuner(start=8, cap=20, minimum=3)
    _drive(tuner, _per_connection(1 * MB, 1000 * MB), 30)
    assert tuner.limiter.total == 20
    for t in range(100, 110):
        tuner.decide(Observation(now=t, throughput=1, throttled=50, limited=1.0, consumer_bound=0.0, in_flight=4))
    assert tuner.limiter.total == 3


# -- the latency check: one jump at the start where requests mostly wait for their first byte ----------------


def test_waiting_share_is_the_part_of_a_request_spent_before_its_first_byte() -> None:
    assert waiting_share(0.2, 1e6, 10e6) == pytest.approx(0.2 / 0.3)  # 200 ms, then 1 MB at 10 MB/s
    assert waiting_share(0.05, 16e6, 20e6) == pytest.approx(0.05 / 0.85)  # 50 ms, then 16 MB at 20 MB/s
    assert waiting_share(0.2, 1e6, 0.0) == 0.0  # no transfer measured: no claim


def test_latency_level_jumps_only_where_waiting_dominates() -> None:
    assert latency_level(32, waiting_share(0.2, 1e6, 10e6)) == 96  # 2/3 waiting: 32 / (1/3)
    assert latency_level(32, waiting_share(0.05, 16e6, 20e6)) == 32  # large shards: transfer dominates, the ramp decides
    assert latency_level(32, waiting_share(0.005, 1e6, 100e6)) == 32  # loopback: no wait to hide
    assert latency_level(4, waiting_share(10.0, 1e3, 1e9)) == 80  # the wait share is capped at 0.95 (no division by ~0)


def _streaming(stats: Stats, ttfb: float, request_bytes: float, streams: int) -> None:
    stats.ttfb_s, stats.request_bytes, stats.open_streams = ttfb, request_bytes, streams


def test_the_check_measures_one_tick_then_jumps_once_within_cap_and_items_left() -> None:
    tuner = _tuner(start=32, cap=204)
    stats = tuner.stats
    assert not tuner.size(0.0)  # nothing answered yet
    stats.shards_total = 256
    _streaming(stats, 0.2, 1e6, 32)
    assert not tuner.size(1.0)  # the first tick with answers streaming marks the bytes read
    stats.bytes_read += int(32 * 10e6 * 0.05)  # 32 streams at 10 MB/s for one tick
    assert tuner.size(1.05)
    # 32 / (1 - 2/3) = 96, and half the 256 items of the list: 128; a short list then holds (two waves)
    assert tuner.limiter.total == 128 and tuner.stats.concurrency_reason.startswith("latency-bound: 67%")
    assert tuner.phase == "hold"
    stats.bytes_read += int(128 * 10e6 * 0.05)
    assert not tuner.size(1.1) and tuner.limiter.total == 128  # once only

    tuner = _tuner(start=32, cap=204)
    tuner.stats.shards_total, tuner.stats.shards_done = 80, 20
    _streaming(tuner.stats, 0.2, 1e6, 32)
    tuner.size(0.0)
    tuner.stats.bytes_read += int(32 * 10e6 * 0.05)
    assert tuner.size(0.05) and tuner.limiter.total == 60  # no more than the 60 items not yet done

    tuner = _tuner(start=32, cap=64)
    _streaming(tuner.stats, 0.2, 1e6, 32)  # a list of unknown length (a feed): the cap bounds it
    tuner.size(0.0)
    tuner.stats.bytes_read += int(32 * 10e6 * 0.05)
    assert tuner.size(0.05) and tuner.limiter.total == 64 and tuner.phase == "ramp"  # unknown length: ramps on


def test_the_check_leaves_bandwidth_bound_reads_and_a_throttled_store_to_the_ramp() -> None:
    tuner = _tuner(start=32, cap=204)
    _streaming(tuner.stats, 0.05, 16e6, 32)
    tuner.size(0.0)
    tuner.stats.bytes_read += int(32 * 20e6 * 0.05)
    assert not tuner.size(0.05) and tuner.limiter.total == 32 and tuner.stats.concurrency_reason == "start"

    tuner = _tuner(start=32, cap=204)
    tuner.decide(Observation(now=0, throughput=1 * MB, throttled=5, limited=1.0, consumer_bound=0.0, in_flight=32))
    level = tuner.limiter.total
    _streaming(tuner.stats, 0.2, 1e6, level)
    tuner.size(0.0)
    tuner.stats.bytes_read += int(level * 10e6 * 0.05)
    assert not tuner.size(0.05) and tuner.limiter.total == level  # backed off: not ramping any more


# -- before any answer: doublings while every request waits for its first byte ---------------------------------


async def _queued(tuner: Autotuner, extra: int) -> list[asyncio.Task[None]]:
    """Every token of the tuner's limiter taken, and ``extra`` tasks queued for one."""
    limiter = tuner.limiter
    while limiter.try_acquire():
        pass
    tasks = [asyncio.create_task(limiter.acquire()) for _ in range(extra)]
    await asyncio.sleep(0)
    return tasks


@pytest.mark.asyncio
async def test_with_no_answer_it_doubles_every_step_at_most_three_times_within_cap_and_items() -> None:
    tuner = _tuner(start=32, cap=204)
    tuner.stats.shards_total = 256
    tasks = await _queued(tuner, 224)
    tuner._waited = (0.0, 0)  # what run() sets at its start
    assert not tuner.before_answers(0.05) and tuner.limiter.total == 32  # not a step yet
    assert tuner.before_answers(0.1) and tuner.limiter.total == 64
    assert tuner.stats.concurrency_reason == "waiting: no answer after 100 ms with 32 requests out: 32 -> 64"
    assert not tuner.before_answers(0.15)  # a step from the last doubling
    await _queued(tuner, 0)
    assert tuner.before_answers(0.2) and tuner.limiter.total == 128
    await _queued(tuner, 0)
    assert tuner.before_answers(0.3) and tuner.limiter.total == 204  # the cap
    await _queued(tuner, 0)
    assert not tuner.before_answers(0.4) and tuner.limiter.total == 204  # three doublings at most
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)

    tuner = _tuner(start=32, cap=204)
    tuner.stats.shards_total, tuner.stats.shards_done = 48, 0
    tasks = await _queued(tuner, 16)
    tuner._waited = (0.0, 0)
    assert tuner.before_answers(0.1) and tuner.limiter.total == 48  # no more than the items of a known list
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.asyncio
@pytest.mark.parametrize("answer", ["ttfb", "bytes", "throttled", "retries", "none waiting", "learned"])
async def test_an_answer_or_room_stops_the_doublings(answer: str) -> None:
    tuner = _tuner(start=32, cap=204)
    if answer == "learned":  # a next epoch's start, at the level its last one settled at
        tuner = Autotuner(Limiter(32), Stats(), None, minimum=2, cap=204, cold=False)
    tasks = await _queued(tuner, 0 if answer == "none waiting" else 8)
    tuner._waited = (0.0, 0) if answer != "learned" else None
    stats = tuner.stats
    if answer == "ttfb":
        stats.ttfb_s = 0.08
    elif answer == "bytes":
        stats.bytes_read = 512
    elif answer == "throttled":
        stats.throttled = 1
    elif answer == "retries":  # a dead server: more requests would only retry
        stats.retries = 1
    assert not tuner.before_answers(0.1) and not tuner.before_answers(0.2) and tuner.limiter.total == 32
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.asyncio
async def test_the_probe_goes_to_the_start_level_when_no_answer_came_within_10_ms() -> None:
    tuner = Autotuner(Limiter(8), Stats(), None, minimum=2, cap=204, probe_to=32)
    tuner.stats.shards_total = 256
    tasks = await _queued(tuner, 248)
    tuner._waited = (0.0, 0)  # what run() sets at its start
    assert not tuner.before_answers(0.005) and tuner.limiter.total == 8  # within the probe's 10 ms
    assert tuner.before_answers(0.01) and tuner.limiter.total == 32
    assert tuner.stats.concurrency_reason == "probe: no answer after 10 ms with 8 requests out: 8 -> 32"
    await _queued(tuner, 0)
    assert not tuner.before_answers(0.1)  # the doublings count from the probe's end
    assert tuner.before_answers(0.11) and tuner.limiter.total == 64
    assert tuner.stats.concurrency_reason == "waiting: no answer after 100 ms with 32 requests out: 32 -> 64"
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.asyncio
@pytest.mark.parametrize("case", ["answered", "none waiting", "learned"])
async def test_the_probe_level_stays_when_the_store_answered_or_nothing_waits(case: str) -> None:
    tuner = Autotuner(Limiter(8), Stats(), None, minimum=2, cap=204, probe_to=32, cold=case != "learned")
    tasks = await _queued(tuner, 0 if case == "none waiting" else 24)
    tuner._waited = (0.0, 0) if case != "learned" else None
    if case == "answered":
        tuner.stats.ttfb_s = 0.002
    assert not tuner.before_answers(0.01) and not tuner.before_answers(0.2) and tuner.limiter.total == 8
    assert tuner._probe_to is None
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _drive_loop(tuner: Autotuner, store, seconds: float, step: float = 0.5) -> list[tuple[float, int, float]]:  # type: ignore[no-untyped-def]
    """Run the tuner against ``store(level) -> (bytes/s, the loop thread's busy share)``, every request in flight."""
    trace = []
    t = 0.0
    while t < seconds:
        level = tuner.limiter.total
        rate, busy = store(level)
        trace.append((t, level, rate))
        tuner.decide(Observation(now=t, throughput=rate, throttled=0, limited=1.0, consumer_bound=0.0,
                                 in_flight=level, busy=busy))
        t += step
    return trace


def test_a_saturated_loop_is_not_given_more_requests_and_sheds_those_that_add_nothing() -> None:
    # 20 MB/s per connection, but the loop thread parses at most 700 MB/s: 35 connections saturate it.
    def store(level: int) -> tuple[float, float]:
        return min(level * 20 * MB, 700 * MB), min(1.0, level * 20 / 700)

    tuner = _tuner(start=64)
    trace = _drive_loop(tuner, store, 120)
    assert max(level for _, level, _ in trace) == 64  # never ramped past where it started
    assert 35 <= tuner.limiter.total <= 48, tuner.limiter.total  # trimmed to near the fewest that saturate it
    late = [rate for t, _, rate in trace if t >= 10]
    assert sum(late) / len(late) >= 0.9 * 700 * MB
    assert "saturated" in tuner.stats.concurrency_reason or "back to" in tuner.stats.concurrency_reason


def test_where_requests_ahead_cost_the_saturated_loop_it_goes_down_to_the_few_that_are_fastest() -> None:
    # CPU-bound and in order: every request beyond the head reads ahead, which costs the loop (page faults).
    tuner = _tuner(start=32)
    trace = _drive_loop(tuner, lambda level: ((1000 - 10 * level) * MB, 0.97), 10)
    assert [level for _, level, _ in trace][:4] == [32, 24, 18, 13]  # a quarter less each interval
    assert tuner.limiter.total <= 4
    assert max(level for _, level, _ in trace) == 32


def test_an_unsaturated_loop_ramps_as_before() -> None:
    tuner = _tuner(start=16)
    trace = _drive_loop(tuner, lambda level: (min(level * 5 * MB, 2000 * MB), 0.4), 3)
    assert [level for _, level, _ in trace][:3] == [16, 32, 64]


def test_trims_of_a_saturated_loop_are_judged_against_the_best_of_the_chain() -> None:
    # Each quarter fewer loses 4%: within the 5% a single trim may lose, but the losses must not add up.
    tuner = _tuner(start=64)
    trace = _drive_loop(tuner, lambda level: ((600 + 2 * level) * MB, 0.95), 6)
    assert [level for _, level, _ in trace][:4] == [64, 48, 36, 48]  # 36 lost 7.7% against 64's rate: undone
    assert tuner.limiter.total == 48
    assert trace[-1][2] >= 0.95 * trace[0][2]
