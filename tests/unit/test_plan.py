"""Equal shares, progress and state bookkeeping, checked on their own (no I/O) and end to end."""

from __future__ import annotations

import dataclasses
import os
import re
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import wds_async as wds
from tests.conftest import write_tar
from wds_async.data.plan import split_equal
from wds_async.data.state import Progress
from wds_async.engine.work import WorkItem

runs_strategy = st.lists(st.integers(min_value=0, max_value=9), min_size=1, max_size=8).map(
    lambda counts: [(shard, 0, n) for shard, n in enumerate(counts)])


@settings(max_examples=200, deadline=None)
@given(runs=runs_strategy, count=st.integers(min_value=1, max_value=12), drop_last=st.booleans())
def test_shares_are_equal_and_cover_every_sample(runs: list[tuple[int, int, int]], count: int, drop_last: bool) -> None:
    total = sum(hi - lo for _, lo, hi in runs)
    shares = [split_equal(runs, count, i, drop_last) for i in range(count)]
    sizes = [sum(hi - lo for _, lo, hi in share) for share in shares]
    assert len(set(sizes)) <= 1
    samples = Counter((shard, i) for share in shares for shard, lo, hi in share for i in range(lo, hi))
    every = {(shard, i) for shard, lo, hi in runs for i in range(lo, hi)}
    if total == 0:
        assert sizes == [0] * count
        return
    if drop_last:
        assert sizes[0] == total // count and set(samples.values()) <= {1} and set(samples) <= every
        assert len(samples) == total // count * count
    else:
        assert sizes[0] == -(-total // count) and set(samples) == every
        # Padding wraps around from the start: the repeats are the first samples, in order.
        assert sum(samples.values()) - len(samples) == sizes[0] * count - total


def test_progress_compacts_done_items_and_resumes_partial_ones() -> None:
    progress = Progress()
    progress.pos[0] = 1024  # a sample of item 0 ending at byte 1024 was delivered
    progress.finished(1)
    progress.finished(0)
    progress.pos[2] = 3072
    assert progress.to_dict() == {"done_below": 2, "done": [], "pos": [[2, 3072]]}
    restored = Progress.from_dict(progress.to_dict())
    item = WorkItem(id=2, shard=5, url="u", start=0, end=4096)
    assert restored.resume(item) == WorkItem(id=2, shard=5, url="u", start=3072, end=4096)
    assert restored.resume(WorkItem(id=0, shard=0, url="u")) is None
    restored.pos[2] = 4096
    assert restored.resume(item) is None  # every sample of a bounded range was delivered


@pytest.fixture()
def indexed(tmp_path: Path) -> tuple[list[str], Path]:
    urls = []
    for shard, count in enumerate([3, 5, 1, 4]):
        path = write_tar(tmp_path / f"s{shard}.tar",
                         [(f"k{shard}_{i}.{ext}", f"{shard}-{i}".encode())
                          for i in range(count) for ext in ("txt", "cls")])
        urls.append(str(path))
    index = tmp_path / "index.jsonl"
    wds.build_index(urls).save(index)
    return urls, index


def _keys(ds: wds.WebDataset) -> list[str]:
    return [s["__key__"] for s in ds]


@pytest.mark.parametrize("drop_last", [False, True])
def test_index_splits_samples_equally_between_ranks(indexed: tuple[list[str], Path], monkeypatch: pytest.MonkeyPatch,
                                                    drop_last: bool) -> None:
    urls, index = indexed
    shares = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        shares.append(_keys(wds.WebDataset(urls, index=index, drop_last=drop_last, shardshuffle=True, seed=1)))
    assert [len(s) for s in shares] == ([4, 4, 4] if drop_last else [5, 5, 5])  # 13 samples
    counts = Counter(k for share in shares for k in share)
    assert len(counts) == (12 if drop_last else 13)
    assert sum(counts.values()) - len(counts) == (0 if drop_last else 2)


def test_index_that_no_longer_matches_the_shard_is_a_clear_error(indexed: tuple[list[str], Path]) -> None:
    urls, index = indexed
    write_tar(Path(urls[1]), [("other.txt", b"changed")])
    with pytest.raises(wds.ObjectChanged, match=re.escape("s1.tar")) as info:
        _keys(wds.WebDataset(urls, index=index))
    assert "rebuild the index" in str(info.value)


def test_index_without_an_entry_for_a_url_is_refused(indexed: tuple[list[str], Path], tmp_path: Path) -> None:
    urls, index = indexed
    extra = write_tar(tmp_path / "extra.tar", [("x.txt", b"x")])
    with pytest.raises(ValueError, match=re.escape("extra.tar")):
        wds.WebDataset([*urls, str(extra)], index=index)


def test_state_is_small_and_holds_no_url(indexed: tuple[list[str], Path]) -> None:
    urls, index = indexed
    ds = wds.WebDataset(urls, index=index).shuffle(4, seed=0)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    it.close()
    text = repr(state)
    assert ".tar" not in text and os.path.dirname(urls[0]) not in text
    assert len(text) < 20_000  # dominated by the random generator's 625 words


def _resume_once(make: object, steps: int) -> tuple[list[str], list[str]]:
    """Keys of a full run, and of a run checkpointed after ``steps`` items then resumed in a new pipeline."""
    full = list(make())  # type: ignore[operator]
    ds = make()  # type: ignore[operator]
    it = iter(ds)
    got = [next(it) for _ in range(steps)]
    state = ds.state_dict()
    it.close()
    again = make()  # type: ignore[operator]
    again.load_state_dict(state)
    return full, got + list(again)


def test_index_shares_read_through_pipe_ranges(indexed: tuple[list[str], Path],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A pipe: source cannot seek: the backend skips to the range's start and stops at its end."""
    urls, index = indexed
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    plain = _keys(wds.WebDataset(urls, index=index, deterministic=True))
    piped = wds.WebDataset([f"pipe:cat {u}" for u in urls], deterministic=True, index=wds.ShardIndex(
        [dataclasses.replace(e, url=f"pipe:cat {u}") for e, u in zip(wds.ShardIndex.load(index).shards, urls)]))
    assert _keys(piped) == plain and len(plain) == 7


def test_resampled_with_epoch_resumes_exactly(indexed: tuple[list[str], Path]) -> None:
    urls, _ = indexed

    def make() -> object:
        return wds.WebDataset(urls, resampled=True, deterministic=True).with_epoch(30).map(lambda s: s["__key__"])

    full, resumed = _resume_once(make, 11)
    assert len(full) == 30 and len(resumed) == 30
    # Non-deterministic resampling seeds from the OS and keeps that seed in the state: the resumed run goes on
    # drawing the same shards it would have drawn.
    ds = wds.WebDataset(urls, resampled=True, deterministic=True).with_epoch(30).map(lambda s: s["__key__"])
    it = iter(ds)
    head = [next(it) for _ in range(11)]
    state = ds.state_dict()
    rest = list(it)
    again = wds.WebDataset(urls, resampled=True, deterministic=True).with_epoch(30).map(lambda s: s["__key__"])
    again.load_state_dict(state)
    assert head + list(again) == head + rest


def test_elastic_merge_takes_a_rank_that_never_started(indexed: tuple[list[str], Path],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank checkpointed before its first sample (no epoch in its state) owes its whole share."""
    urls, _ = indexed
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    ds0 = wds.WebDataset(urls, deterministic=True)
    it = iter(ds0)
    got = [next(it)["__key__"] for _ in range(2)]
    state0 = ds0.state_dict()
    it.close()
    monkeypatch.setenv("RANK", "1")
    state1 = wds.WebDataset(urls).state_dict()
    assert state1["source"]["epoch"] is None
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    again = wds.WebDataset(urls)
    again.load_state_dict(wds.merge_states([state1, state0]))
    got += _keys(again)
    assert sorted(got) == sorted(_keys(wds.WebDataset(urls)))


def test_a_merge_may_hand_a_rank_only_the_empty_end_of_a_shard(indexed: tuple[list[str], Path],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Checkpointed right after a shard's last sample, before its end was read: the merge re-splits the end of that
    shard as work. The new rank given only that end reads nothing, which is no empty tar (``EmptyShards`` was
    raised there; found by the resume soak, elastic trials)."""
    urls, _ = indexed  # 3, 5, 1 and 4 samples
    everything = sorted(_keys(wds.WebDataset(urls)))
    ds = wds.WebDataset(urls, deterministic=True)
    it = iter(ds)
    got = [next(it)["__key__"] for _ in range(3)]  # all of shard 0
    state = ds.state_dict()
    it.close()
    assert state["source"]["progress"]["pos"] and state["source"]["progress"]["pos"][0][0] == 0, \
        "shard 0 must still be in flight at the checkpoint for this test to mean anything"
    merged = wds.merge_states([state])
    monkeypatch.setenv("WORLD_SIZE", "4")
    for rank in range(4):
        monkeypatch.setenv("RANK", str(rank))
        again = wds.WebDataset(urls)
        again.load_state_dict(merged)
        got += _keys(again)
    assert sorted(got) == everything
