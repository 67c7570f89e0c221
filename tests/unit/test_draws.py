"""The balanced draws of a seeded mix, made ahead in blocks, against a model that makes them one pick at a time:
the same sequence, the same sources run out, and a state taken anywhere continues the same sequence."""

from __future__ import annotations

import heapq
import json
import math
import random
from typing import Any

import pytest

from wds_async.data.draws import BalancedDraws, draw


def model(weights: list[float], seed: str, lengths: list[int], longest: bool) -> list[tuple[int, int]]:
    """The draws one at a time (the definition: source i's k-th item is due at (k + u) / w_i, the source due
    first is drawn, a source that runs out ends the stream or with ``longest`` leaves it): (source, item)."""
    rng = random.Random(seed)
    count = [0] * len(weights)
    units = [rng.random() for _ in weights]  # one per source, zero weights too
    due = [u / w if w > 0 else math.inf for u, w in zip(units, weights)]
    active = list(range(len(weights)))
    taken = [0] * len(weights)
    out = []
    while active:
        live = [(due[i], i) for i in active if weights[i] > 0]
        if live:
            i = min(live)[1]
            count[i] += 1
            due[i] = (count[i] + rng.random()) / weights[i]
        else:
            i = active[0]
        if taken[i] == lengths[i]:
            if not longest:
                break
            active.remove(i)
            continue
        out.append((i, taken[i]))
        taken[i] += 1
    return out


def sources(lengths: list[int]) -> list[Any]:
    return [iter([(i, k) for k in range(n)]) for i, n in enumerate(lengths)]


def case(seed: int) -> tuple[list[float], list[int], bool]:
    rng = random.Random(seed)
    n = rng.randint(1, 7)
    weights = [rng.choice([0.0, 0.005, 0.3, 1.0, rng.random()]) for _ in range(n)]
    if sum(weights) == 0:
        weights[0] = 1.0
    lengths = [rng.randint(0, 400) for _ in range(n)]
    return weights, lengths, rng.random() < 0.5


@pytest.fixture(params=[4, 128, BalancedDraws.AHEAD], ids=lambda n: f"ahead{n}")
def ahead(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """Picks made this many at a time: blocks short enough that the cases below cross many of them, and the
    library's own."""
    monkeypatch.setattr(BalancedDraws, "AHEAD", request.param)
    return int(request.param)


@pytest.mark.parametrize("seed", range(40))
def test_blocks_of_picks_give_the_one_at_a_time_sequence(seed: int, ahead: int) -> None:
    weights, lengths, longest = case(seed)
    got = list(draw(sources(lengths), BalancedDraws(weights, "s"), longest, set()))
    assert got == model(weights, "s", lengths, longest)


@pytest.mark.parametrize("seed", range(40))
def test_a_state_taken_anywhere_continues_the_sequence(seed: int, ahead: int) -> None:
    """Checkpoint after a random number of items (inside a block, at its end, after a source ran out), load the
    JSON state into a fresh chooser over the rest of each source, and again from there: one sequence."""
    weights, lengths, longest = case(seed)
    want = model(weights, "s", lengths, longest)
    rng = random.Random(seed)
    got: list[tuple[int, int]] = []
    state: dict[str, Any] | None = None
    ended: set[int] = set()
    for _ in range(4):  # repeated resumes
        chooser = BalancedDraws(weights, "s")
        if state is not None:
            chooser.load(json.loads(json.dumps(state)))
        taken = [sum(1 for i, _ in got if i == j) for j in range(len(weights))]
        rest = [iter([(j, k) for k in range(taken[j], lengths[j])]) for j in range(len(weights))]
        stream = draw(rest, chooser, longest, ended)
        stop = rng.choice([0, 1, ahead - 1, ahead, ahead + 1, 2 * ahead - 1, 2 * ahead, rng.randint(0, 600)])
        for item in stream:
            got.append(item)
            if len(got) % 1000 == stop % 1000 and rng.random() < 0.7:
                break
        else:
            break
        state = chooser.state()
        stream.close()
    else:
        chooser = BalancedDraws(weights, "s")
        chooser.load(json.loads(json.dumps(state)))
        taken = [sum(1 for i, _ in got if i == j) for j in range(len(weights))]
        got.extend(draw([iter([(j, k) for k in range(taken[j], lengths[j])]) for j in range(len(weights))],
                        chooser, longest, ended))
    assert got == want


def test_a_state_of_one_pick_at_a_time_loads() -> None:
    """A state saved before picks were made ahead (no ``skip``): where its generator, counts and due times are."""
    weights = [0.5, 0.3, 0.2]
    rng = random.Random("s")
    count = [0, 0, 0]
    due = [(0 + rng.random()) / w for w in weights]
    heap = [(d, i) for i, d in enumerate(due)]
    heapq.heapify(heap)
    for _ in range(10):
        i = heap[0][1]
        count[i] += 1
        due[i] = (count[i] + rng.random()) / weights[i]
        heapq.heapreplace(heap, (due[i], i))
    version, internal, gauss = rng.getstate()
    chooser = BalancedDraws(weights, "s")
    chooser.load({"rng": [version, list(internal), gauss], "count": count, "due": due})
    lengths = [1000, 1000, 1000]
    rest = list(draw(sources(lengths), chooser, False, set()))[:50]
    assert [i for i, _ in rest] == [i for i, _ in model(weights, "s", lengths, False)[10:60]]


@pytest.mark.parametrize("longest", [False, True])
def test_a_source_that_runs_out_at_a_blocks_last_or_first_pick_ends_as_anywhere(ahead: int, longest: bool) -> None:
    """A source that runs out at the last pick of a block, or at the first of the next, ends the stream (or with
    ``longest`` leaves it to the next source) as anywhere else: every item once, and ``ended`` says which ran out."""
    for lengths in ([ahead - 1, 0], [ahead, 0], [ahead + 1, 0], [2 * ahead - 1, 0]):
        ended: set[int] = set()
        got = list(draw(sources(lengths), BalancedDraws([1.0, 0.0], "s"), longest, ended))
        assert got == [(0, k) for k in range(lengths[0])]
        assert ended == ({0, 1} if longest else {0}), lengths
