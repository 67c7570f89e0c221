"""The recorder of a source's positions: the end of the last sample taken of each item, written at a flush, from
runs of one item (delivery in order: only the last sample taken is read) or of interleaved items (every one)."""

from __future__ import annotations

from wds_async.data.recorder import Recorder
from wds_async.engine.grouping import Sample


def _sample(item: int, end: int) -> Sample:
    s = Sample({"__key__": f"{item}-{end}"})
    s.item, s.offset, s.end = item, end - 10, end
    return s


def _recorder(one_item_runs: bool) -> tuple[Recorder, dict[int, int], list[int]]:
    positions: dict[int, int] = {}
    finished: list[int] = []
    return Recorder(positions, finished.append, {}, [], one_item_runs=one_item_runs), positions, finished


def test_a_run_of_one_item_records_the_last_sample_taken() -> None:
    recorder, positions, finished = _recorder(True)
    run = recorder.run([_sample(7, end) for end in (10, 20, 30, 40)])
    assert [next(run)["__key__"] for _ in range(3)] == ["7-10", "7-20", "7-30"]
    recorder.flush()
    assert positions == {7: 30}
    next(run)
    recorder.item_done(7)
    assert positions == {7: 40} and finished == [7]
    recorder.run([_sample(8, 15)])  # nothing of it taken yet: the next run's flush writes nothing for it
    recorder.flush()
    assert positions == {7: 40}


def test_interleaved_items_record_each_items_last_sample() -> None:
    recorder, positions, _ = _recorder(False)
    run = recorder.run([_sample(1, 10), _sample(2, 10), _sample(1, 20), _sample(2, 20), _sample(1, 30)])
    for _ in range(4):
        next(run)
    recorder.flush()
    assert positions == {1: 20, 2: 20}
