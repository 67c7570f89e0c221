"""A DataLoader worker whose share ran out before the first checkpoint, resumed twice.

Its snapshot at the first checkpoint is the state at the end of its epoch; resumed, it delivers nothing, and its
snapshot at the second checkpoint must still be that position. It was the state of a pipeline never iterated (the
epoch's start), so the second resume delivered the worker's share once more: found by the resume soak
(tests/soak.py, a ``RandomMix`` over ``pipe:`` shards with a worker that had no shard of a one-shard source).
"""

from __future__ import annotations

from typing import Any

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards


@pytest.fixture(scope="module")
def uneven(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three shards in the order worker 0, 1, 0 take them: worker 1's has 2 samples, the others 12 each."""
    root = tmp_path_factory.mktemp("uneven")
    make_shards(root / "big", n_shards=2, shard_bytes=48 << 10, sample_bytes=4 << 10, seed=1)
    make_shards(root / "small", n_shards=1, shard_bytes=8 << 10, sample_bytes=4 << 10, seed=2)
    return [str(root / "big" / "shard-000000.tar"), str(root / "small" / "shard-000000.tar"),
            str(root / "big" / "shard-000001.tar")]


def _dataset(urls: list[str], kind: str) -> Any:
    if kind == "webdataset":
        return wds.WebDataset(urls, nodesplitter=None)
    # a mix whose worker 1 has the 2 samples of the small shard and no shard of the second source
    return wds.RandomMix([wds.WebDataset([urls[0], urls[1]], nodesplitter=None),
                          wds.WebDataset([urls[2]], nodesplitter=None)], [3, 1], seed=5, longest=True)


def _keys(loader: Any, upto: int | None = None) -> list[str]:
    out = []
    for sample in loader:
        out.append(sample["__url__"].rsplit("/", 2)[-2] + "/" + sample["__key__"])
        if upto is not None and len(out) >= upto:
            break
    return out


@pytest.mark.parametrize("kind", ["webdataset", "mix"])
def test_a_worker_that_ended_before_the_first_checkpoint_stays_ended_after_the_second(uneven: list[str],
                                                                                      kind: str) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    def loader() -> Any:
        return StatefulDataLoader(_dataset(uneven, kind), batch_size=None, num_workers=2)

    full = _keys(loader())
    assert len(full) == len(set(full)) > 12
    cuts = [8, 14]  # worker 1 has delivered all it has before the first
    got: list[str] = []
    state = None
    for cut in [*cuts, None]:
        current = loader()
        if state is not None:
            current.load_state_dict(state)
        it = iter(current)
        while cut is None or len(got) < cut:
            try:
                sample = next(it)
            except StopIteration:
                break
            got.append(sample["__url__"].rsplit("/", 2)[-2] + "/" + sample["__key__"])
        if cut is not None:
            state = current.state_dict()
        del it, current
    assert got == full


@pytest.mark.parametrize("kind", ["webdataset", "mix"])
def test_a_state_at_the_end_of_the_epoch_is_still_the_position_after_an_empty_resume(uneven: list[str],
                                                                                       kind: str) -> None:
    """In one process: the state after a whole pass, loaded, delivers nothing; the state taken then is the same
    position (not a fresh epoch's), and the next ``iter()`` of that object starts the next epoch as usual."""
    ds = _dataset(uneven, kind)
    whole = _keys(ds)
    end = ds.state_dict()
    again = _dataset(uneven, kind)
    again.load_state_dict(end)
    assert _keys(again) == []
    assert again.state_dict() == end
    third = _dataset(uneven, kind)
    third.load_state_dict(again.state_dict())
    assert _keys(third) == []
    assert _keys(third) == whole  # the next iter(): the next epoch, from its start
