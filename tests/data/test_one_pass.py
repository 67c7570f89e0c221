"""``FluidPipeline._one_pass``, what a mix reads of each source: the same items and the same checkpoints as the
pipeline's own ``iter()``, at every point of a pass, once it ran out, and resumed; a pipeline that repeats has
none (the mix takes its ``iter()``)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import wds_async as wds
from emustore import StoreProcess
from tests.data.mixes import ident, source

#: Each built afresh with its seeds given, so that two builds read the same (a copy would share its generators).
PIPELINES: dict[str, Callable[[StoreProcess], Any]] = {
    "plain": lambda store: source(store, "a", seed=1),
    "shuffled": lambda store: source(store, "b", seed=1).shuffle(7, initial=3, seed=5),
    "mapped": lambda store: source(store, "c", seed=1).map(lambda s: s).batched(3, collation_fn=None),
    "resampled": lambda store: wds.WebDataset(source(store, "d").urls, resampled=True, detshuffle=True, seed=2)
    .slice(25),
}


def _key(item: Any) -> Any:
    return [ident(s) for s in item] if isinstance(item, list) else ident(item)


def _state(pipeline: Any) -> str:
    return json.dumps(pipeline.state_dict(), sort_keys=True)


def _walk(pipeline: Any, items: Iterator[Any], end: Callable[[bool], None] | None) -> tuple[list[Any], list[str]]:
    """Every item, and the state before each and after the last (``end(True)`` once ``items`` ran out)."""
    got, states = [], [_state(pipeline)]
    for item in items:
        got.append(_key(item))
        states.append(_state(pipeline))
    if end is not None:
        end(True)
    states.append(_state(pipeline))
    return got, states


@pytest.mark.parametrize("kind", sorted(PIPELINES))
def test_one_pass_gives_the_items_and_states_of_iter(mix_store: StoreProcess, kind: str) -> None:
    reference = PIPELINES[kind](mix_store)
    it = iter(reference)
    first = next(it)  # iter() starts its pass at the first item; _one_pass at once: compare from there on
    items, states = _walk(reference, it, None)
    items.insert(0, _key(first))

    pipeline = PIPELINES[kind](mix_store)
    one = pipeline._one_pass()
    assert one is not None
    flat, end = one
    first = next(flat)
    got, got_states = _walk(pipeline, flat, end)
    got.insert(0, _key(first))
    assert got == items
    assert got_states == states  # after the first item, after each, and once it ran out (as iter() counts it)
    end(False)  # a second end changes nothing
    assert _state(pipeline) == states[-1]

    # resumed after the first item, from the middle and from the end, in a fresh copy: the rest, then nothing
    for cut in (1, len(items) // 2, len(items)):
        resumed = PIPELINES[kind](mix_store)
        resumed.load_state_dict(json.loads(states[cut - 1]))  # states[j]: after j + 1 items
        one = resumed._one_pass()
        assert one is not None
        rest, _ = _walk(resumed, one[0], one[1])
        assert rest == items[cut:], f"resumed after {cut}"


def test_one_pass_ended_early_keeps_its_position_and_closes_its_engine(mix_store: StoreProcess) -> None:
    pipeline = source(mix_store, "e", seed=1)
    one = pipeline._one_pass()
    assert one is not None
    flat, end = one
    taken = [ident(next(flat)) for _ in range(5)]
    end(False)
    state = pipeline.state_dict()
    assert state["reps"] == 0 and state["count"] == 5
    resumed = source(mix_store, "e", seed=1)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert taken + [ident(s) for s in resumed] == [ident(s) for s in source(mix_store, "e", seed=1)]


def test_a_pipeline_that_repeats_has_no_one_pass(mix_store: StoreProcess) -> None:
    assert source(mix_store, "a").repeat(2)._one_pass() is None
    assert source(mix_store, "a").with_epoch(10)._one_pass() is None
