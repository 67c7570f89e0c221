"""The knee, the early stop and the recommendation of ``wds-async tune``, on synthetic numbers."""

from __future__ import annotations

import pytest

from wds_async.cli.tune.recommend import find_knee, plateaued, recommend, size_text
from wds_async.node import MIN_BUFFERED_BYTES

MiB = 1 << 20
LEVELS = [1, 2, 4, 8, 16, 32]


def test_knee_is_the_smallest_level_within_5_percent_of_the_best() -> None:
    assert find_knee(LEVELS, [10, 20, 40, 78, 80, 79]) == 8      # 78 >= 0.95 * 80
    assert find_knee(LEVELS, [10, 20, 40, 75, 80, 79]) == 16     # 75 < 76
    assert find_knee(LEVELS, [50, 50, 50, 50, 50, 50]) == 1
    assert find_knee(LEVELS, [10, 20, 40, 80, 60, 30]) == 8      # past the peak it only gets worse
    assert find_knee([4], [0.0]) == 4


def test_throttled_levels_are_no_knee_unless_all_are() -> None:
    rates = [10, 20, 30, 41, 41, 41]
    assert find_knee(LEVELS, rates, [0, 0, 0, 0.3, 0.5, 0.7]) == 4   # the best of the unthrottled levels
    assert find_knee(LEVELS, rates, [0, 0, 0, 0.01, 0.5, 0.7]) == 8  # 1% is still acceptable
    assert find_knee(LEVELS, rates, [0.5] * 6) == 8                  # nothing qualifies: plain rule
    with pytest.raises(ValueError):
        find_knee(LEVELS, rates[:3])


def test_sweep_stops_after_two_levels_without_a_5_percent_gain() -> None:
    assert not plateaued([10, 20])
    assert not plateaued([10, 20, 40, 78, 80])       # 78 still beat 40 by far
    assert plateaued([10, 20, 40, 78, 80, 79])       # 80 and 79 gained < 5% over 78
    assert not plateaued([10, 20, 40, 78, 82, 90])   # 90 > 1.05 * 82
    assert plateaued([10, 20, 40, 78, 60, 81])       # 81 is under 1.05 * 78, the best before it
    assert not plateaued([0, 0, 5])                  # nothing moved, then something did


def test_recommendation_divides_the_knee_among_processes() -> None:
    for knee, ranks, workers in [(16, 1, 1), (16, 2, 3), (1, 4, 8), (64, 8, 8), (100, 3, 1)]:
        advice = recommend(knee, 300.0, ranks=ranks, workers=workers)
        assert advice.node_connections == knee
        assert advice.process_connections == max(1, -(-knee // (ranks * workers)))


def test_buffer_holds_two_seconds_rounded_and_floored() -> None:
    advice = recommend(16, 300.0)
    assert advice.node_buffered_bytes == 576 * MiB  # 600 MB rounded up to 16 MiB
    assert advice.process_buffered_bytes == 576 * MiB
    small = recommend(2, 1.0, ranks=4, workers=1)  # 2 MB of data: the per-process floor wins
    assert small.node_buffered_bytes == 4 * MIN_BUFFERED_BYTES
    assert small.process_buffered_bytes == MIN_BUFFERED_BYTES
    split = recommend(16, 300.0, ranks=8, workers=7)
    assert split.process_buffered_bytes % MiB == 0 and split.process_buffered_bytes >= MIN_BUFFERED_BYTES
    with pytest.raises(ValueError):
        recommend(4, 1.0, ranks=0)


def test_sizes_are_written_as_the_node_variables_read_them() -> None:
    from wds_async.node import parse_bytes

    for n in (576 * MiB, 2 << 30, 4_000_000, 256_000, 64 << 10, 12345):
        assert parse_bytes(size_text(n)) == n
    assert size_text(576 * MiB) == "576MiB" and size_text(256_000) == "256KB"
