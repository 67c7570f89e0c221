from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from wds_async.data.stages.plain import batched, default_collation_fn, shuffle, to_tuple


def test_shuffle_is_a_permutation_and_mixes() -> None:
    data = list(range(1000))
    out = list(shuffle(iter(data), bufsize=100, initial=10, rng=random.Random(0)))
    assert sorted(out) == data and out != data


def test_shuffle_buffer_grows_to_bufsize() -> None:
    # An item can travel at most about bufsize positions; with bufsize 500 some must move > 100.
    out = list(shuffle(iter(range(5000)), bufsize=500, initial=10, rng=random.Random(1)))
    assert max(abs(i - v) for i, v in enumerate(out)) > 100


@pytest.mark.parametrize("how", ["rng", "seed"])
def test_shuffle_draws_are_webdatasets(how: str) -> None:
    """Every fill size, buffer size and input length gives webdataset 1.0.2's order, and leaves a shared generator
    where webdataset's leaves it (a single item left still costs a draw)."""
    from webdataset.filters import _shuffle

    for n in (0, 1, 2, 3, 9, 64, 250):
        for bufsize in (-1, 0, 1, 2, 5, 32, 1000):
            for initial in (-2, 0, 1, 4, 100):
                if how == "rng":
                    theirs_rng, ours_rng = random.Random(n + bufsize), random.Random(n + bufsize)
                    theirs = list(_shuffle(iter(range(n)), bufsize, initial, rng=theirs_rng))
                    ours = list(shuffle(iter(range(n)), bufsize, initial, rng=ours_rng))
                    assert ours_rng.getstate() == theirs_rng.getstate()
                else:
                    theirs = list(_shuffle(iter(range(n)), bufsize, initial, seed=n))
                    ours = list(shuffle(iter(range(n)), bufsize, initial, seed=n))
                assert ours == theirs, (n, bufsize, initial)
                assert sorted(ours) == list(range(n))


@pytest.mark.parametrize("stop", [0, 3, 17, 40, 59, 60, 61, 79])
def test_shuffle_runner_resumes_from_its_state(stop: int) -> None:
    """Stopped after ``stop`` outputs (filling, steady, or draining), a runner's state plus its held items rebuilt
    from their positions continues into exactly the rest of the uninterrupted order."""
    from wds_async.data.stages.stateful import Shuffle

    pairs = [(i, [[0, i, i + 1]]) for i in range(80)]  # the item, and the source position it came from
    stage = Shuffle(25, 6, seed=3)
    full = list(stage.runner()(iter(pairs)))
    runner = stage.runner()
    source = iter(pairs)
    out = runner(source)
    head = [next(out) for _ in range(stop)]
    state, held = runner.state_dict(), runner.held()
    consumed = len(pairs) - len(list(source))  # what the runner pulled from its input
    again = stage.runner()
    again.load_state_dict(state, [(pos[0][1], pos) for pos in held])
    rest = list(again(iter(pairs[consumed:])))
    assert head + rest == full


def test_to_tuple_alternatives_and_missing() -> None:
    samples = [{"__key__": "a", "png": 1, "cls": 2}, {"__key__": "b", "jpg": 3, "cls": 4}]
    assert list(to_tuple(iter(samples), "jpg;png", "cls")) == [(1, 2), (3, 4)]
    assert list(to_tuple(iter(samples), "cls __key__")) == [(2, "a"), (4, "b")]
    with pytest.raises(ValueError, match="json"):
        list(to_tuple(iter(samples), "json"))
    assert list(to_tuple(iter(samples), "json", handler=lambda e: True)) == []


def test_batched_and_collation() -> None:
    rows = [(i, np.ones(2) * i, torch.tensor([i]), f"k{i}") for i in range(5)]
    batches = list(batched(iter(rows), 2))
    assert len(batches) == 3
    first = batches[0]
    assert first[0].tolist() == [0, 1] and first[1].shape == (2, 2) and first[2].shape == (2, 1)
    assert first[3] == ["k0", "k1"]
    assert len(list(batched(iter(rows), 2, partial=False))) == 2
    assert default_collation_fn([{"a": 1}, {"a": 2}])["a"].tolist() == [1, 2]
    assert list(batched(iter(range(3)), 2, collation_fn=None)) == [[0, 1], [2]]


class _Closable:
    """An iterable source that is not a generator and says whether it was closed."""

    def __init__(self, items: list[int]) -> None:
        self.items, self.closed = items, False

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.items)

    def close(self) -> None:
        self.closed = True


def test_a_pipeline_without_stages_iterates_any_iterable_source_and_closes_it() -> None:
    """A fluid pipeline with no stage iterates its source directly when it is a generator (no frame of its own); a
    source that is a plain iterable, not a generator, still works, repeats, and is closed when the consumer stops
    early."""
    import wds_async as wds

    sources: list[_Closable] = []

    def source() -> _Closable:
        sources.append(_Closable([1, 2, 3]))
        return sources[-1]

    assert list(wds.DataPipeline(source)) == [1, 2, 3] and sources[-1].closed
    assert list(wds.DataPipeline(source).repeat(2)) == [1, 2, 3, 1, 2, 3] and all(s.closed for s in sources)
    stream = iter(wds.DataPipeline(source))
    assert next(stream) == 1 and not sources[-1].closed
    stream.close()  # type: ignore[attr-defined]
    assert sources[-1].closed
    assert list(wds.DataPipeline(lambda: [4, 5])) == [4, 5]  # a list: iterable, nothing to close
    assert list(wds.DataPipeline(source).map(lambda x: x * 10)) == [10, 20, 30]  # with a stage: _staged
