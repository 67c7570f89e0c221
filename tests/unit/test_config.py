"""EngineConfig and RetryPolicy refuse bad values at construction: every size option has a floor (and
``chunk_bytes`` a ceiling) that keeps the process bounded, with an error that names the option, the value, the
range and the fix. The same table serves ``WebDataset(...)`` and ``wds-async tune --part-bytes``."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc

import pytest

import wds_async as wds
from wds_async.config import (
    MAX_CHUNK_BYTES,
    MIN_BYTES,
    MIN_CHUNK_BYTES,
    MIN_PART_BYTES,
    SIZE_LIMITS,
    EngineConfig,
    RetryPolicy,
    check_size,
)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


@pytest.mark.parametrize(("name", "value"), [
    ("part_bytes", 1), ("part_bytes", 512), ("part_bytes", MIN_PART_BYTES - 1), ("part_bytes", -1),
    ("chunk_bytes", 1), ("chunk_bytes", MIN_CHUNK_BYTES - 1), ("chunk_bytes", MAX_CHUNK_BYTES + 1),
    ("chunk_bytes", 1 << 40),
    ("max_buffered_bytes", 1), ("max_buffered_bytes", 0), ("max_buffered_bytes", MIN_BYTES - 1),
    ("max_sample_bytes", 1), ("max_sample_bytes", -5),
    ("handoff_max_bytes", 1), ("handoff_max_bytes", MIN_BYTES - 1),
])
def test_an_absurd_size_is_refused_naming_option_value_range_and_fix(name: str, value: int) -> None:
    with pytest.raises(ValueError) as info:
        EngineConfig(**{name: value})  # type: ignore[arg-type]
    text = str(info.value)
    low, high, _ = SIZE_LIMITS[name]
    assert f"EngineConfig.{name}={value!r}" in text  # the option and the value
    assert f"{low:,} bytes" in text  # the range
    if high is not None:
        assert f"{high:,} bytes" in text
    assert ("raise it to" in text) if value < low else ("lower it to" in text)  # what to do


@pytest.mark.parametrize("name", sorted(SIZE_LIMITS))
@pytest.mark.parametrize("value", [1.5, "16MiB", True, None])
def test_a_size_that_is_not_an_int_is_refused(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"EngineConfig.{name}=.*whole number of bytes"):
        EngineConfig(**{name: value})  # type: ignore[arg-type]


@pytest.mark.parametrize(("name", "value"), [
    # the smallest and largest accepted, and the small values existing tests and benchmarks pass on purpose:
    ("part_bytes", 0), ("part_bytes", MIN_PART_BYTES), ("part_bytes", 32 << 10), ("part_bytes", 64 << 10),
    ("part_bytes", MiB // 2), ("part_bytes", 1 << 50),
    ("chunk_bytes", MIN_CHUNK_BYTES), ("chunk_bytes", 16 << 10), ("chunk_bytes", 1 << 16),
    ("chunk_bytes", MiB // 2), ("chunk_bytes", MAX_CHUNK_BYTES),
    ("max_buffered_bytes", 1024), ("max_buffered_bytes", 64 << 10), ("max_buffered_bytes", 1 << 45),
    ("max_sample_bytes", MIN_BYTES), ("max_sample_bytes", MiB), ("max_sample_bytes", 16 * GiB),
    ("handoff_max_bytes", MIN_BYTES),
])
def test_meaningful_small_and_large_sizes_pass(name: str, value: int) -> None:
    assert getattr(EngineConfig(**{name: value}), name) == value  # type: ignore[arg-type]


def test_the_defaults_are_inside_their_ranges() -> None:
    config = EngineConfig()
    for name in SIZE_LIMITS:
        assert check_size(name, getattr(config, name)) == getattr(config, name)


def test_replace_validates_too() -> None:
    with pytest.raises(ValueError, match="part_bytes=1 "):
        EngineConfig().replace(part_bytes=1)


def test_starting_at_a_learned_level_only_where_the_concurrency_is_autotuned() -> None:
    auto = EngineConfig()
    learned = auto.starting_at(48)
    assert (learned.start_connections, learned.early_start, learned.first_connections) == (48, False, 48)
    assert auto.starting_at(0) is auto  # nothing learned
    fixed = EngineConfig(max_connections=8)
    assert fixed.starting_at(48) is fixed and fixed.first_connections == 8


def test_webdataset_options_reach_the_same_check() -> None:
    # the probe: part_bytes=1 grew to a MemoryError; now it is refused before anything is read
    with pytest.raises(ValueError, match=r"EngineConfig\.part_bytes=1 is out of range.*32 KiB.*pass 0"):
        wds.WebDataset("/nonexistent/a.tar", part_bytes=1)
    with pytest.raises(ValueError, match=r"max_buffered_bytes=8 .*1 KiB"):
        wds.WebDataset("/nonexistent/a.tar", max_buffered_bytes=8)
    with pytest.raises(ValueError, match=r"max_sample_bytes=100 .*1 KiB"):
        wds.WebDataset("/nonexistent/a.tar", max_sample_bytes=100)
    assert wds.WebDataset("/nonexistent/a.tar", part_bytes=32 << 10).config.part_bytes == 32 << 10


def test_the_part_floor_bounds_the_plan_of_a_large_object() -> None:
    # What the floor's comment computes: the engine plans one _Part per part_bytes of an object. Measure a
    # part's cost here so a heavier _Part shows up as a failure of the bound the comment promises (5.6%).
    from wds_async.engine.parts import _Part

    count = 20_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        parts = [_Part(i, i + 1) for i in range(count)]
        per_part = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert len(parts) == count
    assert per_part / MIN_PART_BYTES < 0.06, f"a part costs {per_part:.0f} bytes: the floor's bound no longer holds"


def test_tune_part_bytes_takes_the_engine_floor() -> None:
    from wds_async.cli.tune.recommend import tune

    for bad in ([1], [0], [4 * MiB, 100]):
        with pytest.raises(ValueError, match=r"part_bytes=.*32 KiB"):
            tune("/nonexistent/a.tar", part_bytes=bad)


def test_tune_command_line_refuses_a_tiny_part_size() -> None:
    out = subprocess.run([sys.executable, "-m", "wds_async.cli", "tune", "/nonexistent/a.tar", "--part-bytes",
                          "4MiB,1"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--part-bytes=1 is out of range" in out.stderr and "32 KiB" in out.stderr


def test_bench_command_line_refuses_a_tiny_budget() -> None:
    out = subprocess.run([sys.executable, "-m", "wds_async.cli", "bench", "/nonexistent/a.tar", "--max-buffered-bytes",
                          "10"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--max-buffered-bytes=10 is out of range" in out.stderr and "1 KiB" in out.stderr


def test_counts_stay_positive_ints() -> None:
    for name in ("min_connections", "start_connections", "connection_cap", "handoff_max_samples"):
        with pytest.raises(ValueError, match=name):
            EngineConfig(**{name: 0})  # type: ignore[arg-type]


@pytest.mark.parametrize("kw", [dict(attempts=0), dict(base_delay=-1.0), dict(base_delay=5.0, max_delay=1.0),
                                dict(deadline=0.0)])
def test_retry_policy_refuses_bad_values(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="RetryPolicy"):
        RetryPolicy(**kw)  # type: ignore[arg-type]
