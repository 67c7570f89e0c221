"""RandomMix and RoundRobin over WebDataset sources on real local servers, checkpointed: a state resumes exactly (in
pieces, through JSON and pickle, with shuffle buffers in the sources, resampled sources, epochs, ``longest``, lists,
stages and another epoch on the mix), an abandoned mix stops its engine, and ``merge_states`` re-splits a state for
another world size."""

from __future__ import annotations

import itertools
import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from emustore import StoreProcess
from tests.conftest import engine_threads, wait_until
from tests.data.mixes import (
    NAMES,
    Ident,
    check_resumes,
    ident,
    in_pieces,
    pattern,
    resampled,
    roundtrip,
    source,
    which,
)

# -- exact resume ----------------------------------------------------------------------------------------
MIXES: dict[str, Callable[[list[Any]], Any]] = {
    "balanced": lambda ds: wds.RandomMix(ds, [0.5, 0.3, 0.2], seed=3),
    "independent": lambda ds: wds.RandomMix(ds, [0.5, 0.3, 0.2], seed=3, draws="independent"),
    "round_robin": lambda ds: wds.RoundRobin(ds),
}


@pytest.mark.parametrize("kind", sorted(MIXES))
def test_resume_equals_the_uninterrupted_run(mix_store: StoreProcess, kind: str) -> None:
    def make() -> Any:
        return MIXES[kind]([source(mix_store, name) for name in "abc"])

    full = check_resumes(make, [0, 1, 7, 30])
    assert {which(s) for s in full} == set("abc")
    assert len(set(full)) == len(full)
    # resumed again and again: every piece from the previous piece's checkpoint
    assert in_pieces(make, [5, 20, 1, 13]) == full
    assert in_pieces(make, [0, 0, 9]) == full


def test_resume_before_any_iteration_and_state_of_a_fresh_mix(mix_store: StoreProcess) -> None:
    def make() -> Any:
        return wds.RandomMix([source(mix_store, name) for name in "abc"], seed=1)

    full = [ident(s) for s in make()]
    fresh = make()
    state = roundtrip(fresh.state_dict())  # never iterated
    again = make()
    again.load_state_dict(state)
    assert [ident(s) for s in again] == full


def test_resume_with_shuffle_buffers_in_the_sources(mix_store: StoreProcess) -> None:
    def make() -> Any:
        sources = [wds.WebDataset(pattern(mix_store, name), shardshuffle=True, seed=5 + i).shuffle(20, seed=i)
                   for i, name in enumerate("abc")]
        return wds.RandomMix(sources, [0.4, 0.4, 0.2], seed=8)

    full = check_resumes(make, [0, 3, 25, 50])
    # the shuffles did shuffle: not in shard order
    a = [s for s in full if which(s) == "a"]
    assert a != sorted(a)
    assert in_pieces(make, [10, 10, 30]) == full


def test_resume_resampled_sources_with_an_epoch_on_the_mix(mix_store: StoreProcess) -> None:
    def make() -> Any:
        return wds.RandomMix([resampled(mix_store, name, 40 + i) for i, name in enumerate("abc")],
                             [0.6, 0.3, 0.1], seed=4).with_epoch(150)

    full = check_resumes(make, [0, 70], at_end=False)  # at the end: see the next test
    assert len(full) == 150 and {which(s) for s in full} == set("abc")
    assert in_pieces(make, [40, 40, 40]) == full


def test_resume_resampled_sources_with_their_own_epochs(mix_store: StoreProcess) -> None:
    def make() -> Any:
        sources = [resampled(mix_store, name, 50 + i).with_epoch(n)
                   for i, (name, n) in enumerate(zip("abc", (60, 30, 10)))]
        return wds.RandomMix(sources, [0.5, 0.3, 0.2], longest=True, seed=6)

    full = check_resumes(make, [0, 35, 80], at_end=False)  # at the end: see the next test
    assert len(full) == 100
    assert [sum(which(s) == name for s in full) for name in "abc"] == [60, 30, 10]


@pytest.mark.parametrize("where", ["epoch-on-the-mix", "epochs-on-the-sources", "a-sources-epoch"])
def test_resume_right_after_an_epochs_last_item(mix_store: StoreProcess, where: str) -> None:
    def make() -> Any:
        if where == "epoch-on-the-mix":  # else: epochs on the sources
            return wds.RandomMix([resampled(mix_store, name, 40 + i) for i, name in enumerate("abc")],
                                 [0.6, 0.3, 0.1], seed=4).with_epoch(150)
        sources = [resampled(mix_store, name, 50 + i).with_epoch(n)
                   for i, (name, n) in enumerate(zip("abc", (60, 30, 10)))]
        return wds.RandomMix(sources, [0.5, 0.3, 0.2], longest=True, seed=6)

    full = [ident(s) for s in make()]
    # the state right after the mix's last item, or right after source c's 10th item, before the mix learnt
    # that c ran out (the mix goes on with a and b): the rest of the run must follow either way
    k = max(i for i, s in enumerate(full) if which(s) == "c") + 1 if where == "a-sources-epoch" else len(full)
    assert k < len(full) or where != "a-sources-epoch"
    assert in_pieces(make, [k]) == full




@pytest.mark.parametrize("kind", ["balanced", "round_robin"])
def test_resume_longest_after_a_source_ran_out(mix_store: StoreProcess, kind: str) -> None:
    counts = {name: len(list(source(mix_store, name, n))) for name, n in zip("abc", (4, 1, 2))}

    def make() -> Any:
        sources = [source(mix_store, name, n) for name, n in zip("abc", (4, 1, 2))]
        if kind == "round_robin":
            return wds.RoundRobin(sources, longest=True)
        return wds.RandomMix(sources, longest=True, seed=2)

    full = check_resumes(make, [0, 5, counts["b"] * 3 + 2, sum(counts.values()) - 3])
    assert len(full) == len(set(full)) == sum(counts.values())
    # b ran out first; the state after the mix saw that says so, and the resumed mix goes on without it
    last_b = max(i for i, s in enumerate(full) if which(s) == "b")
    assert last_b < len(full) - 10
    mix = make()
    it = iter(mix)
    k = 0
    while (mix.state_dict()["source"] or {}).get("ended") != [1]:
        next(it)  # StopIteration here: no state recorded that b ran out
        k += 1
    it.close()
    assert last_b < k < len(full)
    assert in_pieces(make, [k]) == full
    assert in_pieces(make, [k, 3, 3]) == full


def test_a_mix_pickles_after_it_was_iterated(mix_store: StoreProcess) -> None:
    """DataLoader workers started by spawn or forkserver receive the dataset pickled, maybe after the main process
    looked at a sample."""
    def make() -> Any:
        return wds.RandomMix([source(mix_store, name) for name in "abc"], seed=5)

    full = [ident(s) for s in make()]
    mix = make()
    assert [ident(s) for s in pickle.loads(pickle.dumps(mix))] == full  # before any iteration: fine
    single = source(mix_store, "a")
    one: Any = iter(single)
    next(one)
    one.close()
    pickle.dumps(single)  # a WebDataset pickles after an iteration
    it: Any = iter(mix)
    next(it)
    it.close()
    assert [ident(s) for s in pickle.loads(pickle.dumps(mix))] == full


def test_state_is_plain_json(mix_store: StoreProcess) -> None:
    mix = wds.RandomMix([source(mix_store, name).shuffle(10, seed=1) for name in "ab"], seed=3)
    it: Any = iter(mix)
    next(it)
    state = mix.state_dict()
    it.close()
    assert json.loads(json.dumps(state)) == state
    assert pickle.loads(pickle.dumps(state)) == state


def test_resume_with_a_list_and_a_zero_weight_source(mix_store: StoreProcess) -> None:
    listed = [{"__url__": "list/l-0", "__key__": f"item{i}"} for i in range(100)]

    def with_list() -> Any:  # a list: resumed by counting what it gave
        return wds.RandomMix([source(mix_store, "a"), listed], [0.5, 0.5], seed=2)

    full = check_resumes(with_list, [0, 5, 30])
    assert {which(s) for s in full} == {"a", "l"}

    def zero() -> Any:  # b has weight 0: drawn only once a and c ran out
        return wds.RandomMix([source(mix_store, name) for name in "abc"], [1, 0, 1], longest=True, seed=2)

    full = check_resumes(zero, [0, 5, 60, 70])
    b = [i for i, s in enumerate(full) if which(s) == "b"]
    assert len(b) == len(list(source(mix_store, "b"))) and b == list(range(len(full) - len(b), len(full)))


@pytest.mark.parametrize("kind", ["random", "round_robin"])
def test_a_pass_that_ended_at_its_first_draw_stays_ended_when_resumed(mix_store: StoreProcess, kind: str) -> None:
    """A mix (``longest=False``) whose first draw finds its source empty ends with nothing delivered, so its
    pipeline counts no pass: its state is still the pass's, with the source that ran out. Loaded, it must end
    there too, not go on with the other sources. (A DataLoader worker with no shard of a one-shard source is
    such a mix, and its last snapshot such a state: resumed, the worker delivered samples its uninterrupted run
    never had; found by tests/soak.py.)"""
    def make() -> Any:
        sources = [[], source(mix_store, "b")]
        return wds.RandomMix(sources, seed=0) if kind == "random" else wds.RoundRobin(sources)  # both draw source 0 first

    mix = make()
    assert list(mix) == []
    state = roundtrip(mix.state_dict())
    assert state["reps"] == 0 and state["source"]["ended"] == [0]  # the pass was not counted
    resumed = make()
    resumed.load_state_dict(state)
    assert list(resumed) == []


def test_resume_with_stages_on_the_mix_and_another_epoch(mix_store: StoreProcess) -> None:
    def batched() -> Any:
        return wds.RandomMix([source(mix_store, name) for name in "ab"], seed=2).map(ident).batched(
            5, collation_fn=list)

    batches = [tuple(map(tuple, batch)) for batch in batched()]
    assert len(batches) > 5
    for k in (0, 1, 3, len(batches) - 1):
        mix = batched()
        it = iter(mix)
        first = [tuple(map(tuple, b)) for b in itertools.islice(it, k)]
        state = roundtrip(mix.state_dict())
        it.close()
        again = batched()
        again.load_state_dict(state)
        assert first + [tuple(map(tuple, b)) for b in again] == batches, f"resumed after batch {k}"

    def epoch1() -> Any:
        mix = wds.RandomMix([source(mix_store, name) for name in "ab"], seed=2)
        mix.set_epoch(1)
        return mix

    full = [ident(s) for s in epoch1()]
    assert full != [ident(s) for s in wds.RandomMix([source(mix_store, name) for name in "ab"], seed=2)]
    mix = epoch1()
    it = iter(mix)
    head = [ident(s) for s in itertools.islice(it, 10)]
    state = roundtrip(mix.state_dict())
    it.close()
    fresh = wds.RandomMix([source(mix_store, name) for name in "ab"], seed=2)  # epoch 0: the state says 1
    fresh.load_state_dict(state)
    assert head + [ident(s) for s in fresh] == full


def test_what_cannot_be_checkpointed_says_why(mix_store: StoreProcess, mix_data: Path) -> None:
    mix = wds.RandomMix([source(mix_store, name) for name in "ab"], seed=2).shuffle(10, seed=1)
    it: Any = iter(mix)
    next(it)
    with pytest.raises(ValueError, match=r"cannot checkpoint shuffle\(10\) while it holds items"):
        mix.state_dict()
    it.close()

    def with_pipeline() -> Any:
        urls = [str(p) for p in sorted((mix_data / "a").glob("a-*.tar"))]
        return wds.RandomMix([wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples()),
                              source(mix_store, "b")], seed=3)

    assert len(list(with_pipeline())) > 0
    with pytest.raises(ValueError, match="DataPipeline cannot resume"):
        in_pieces(with_pipeline, [7])


def test_an_abandoned_mix_stops_its_engine(mix_store: StoreProcess) -> None:
    wait_until(lambda: not engine_threads())
    before = len(engine_threads())
    mix = wds.RandomMix([source(mix_store, name) for name in NAMES], seed=1)
    it: Any = iter(mix)
    next(it)
    assert len(engine_threads()) == before + 1
    it.close()
    assert wait_until(lambda: len(engine_threads()) == before)
    for _ in itertools.islice(wds.RoundRobin([source(mix_store, name) for name in NAMES]), 3):
        pass  # a for loop left early: the generator is dropped, not closed
    assert wait_until(lambda: len(engine_threads()) == before)


def test_each_source_keeps_its_member_rules(mix_store: StoreProcess) -> None:
    """select_files / rename_files of one source apply to its samples only, whichever source leads the engine."""
    for order in ("ab", "ba"):
        sources = {"a": source(mix_store, "a", select_files=lambda name: not name.endswith(".bin")),
                   "b": source(mix_store, "b", rename_files=lambda name: name.replace(".bin", ".dat"))}
        fields: dict[str, set[str]] = {"a": set(), "b": set()}
        for s in wds.RoundRobin([sources[n] for n in order], longest=True):
            fields[which(ident(s))].update(k for k in s if not k.startswith("__"))
        assert fields == {"a": {"cls", "json"}, "b": {"cls", "dat", "json"}}, order


@pytest.mark.parametrize("shuffle", [0, 10])
def test_merge_states_resplits_a_mix_for_another_world_size(mix_store: StoreProcess, monkeypatch: pytest.MonkeyPatch,
                                                            shuffle: int) -> None:
    """Two ranks' checkpoints merged into one rank: every sample of every source exactly once (what the old
    ranks' shuffle buffers held is read again by the new one)."""
    def make() -> Any:
        return wds.RandomMix([source(mix_store, name).shuffle(shuffle, seed=1) for name in "abc"], [0.5, 0.3, 0.2],
                             seed=7, longest=True)

    everything = {ident(s) for name in "abc" for s in source(mix_store, name)}
    before: list[Ident] = []
    states = []
    for rank, k in ((0, 9), (1, 20)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        mix = make()
        it = iter(mix)
        before += [ident(s) for s in itertools.islice(it, k)]
        states.append(roundtrip(mix.state_dict()))
        it.close()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    merged = roundtrip(wds.merge_states(states))
    mix = make()
    mix.load_state_dict(merged)
    after = [ident(s) for s in mix]
    assert len(before) == 29 and len(before) + len(after) == len(everything)
    assert set(before) | set(after) == everything
