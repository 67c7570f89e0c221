"""Which source of a mix gives the next item: the draws of :class:`~wds_async.RandomMix` and
:class:`~wds_async.RoundRobin` (:mod:`wds_async.data.mix`), each with its state for a checkpoint.

:class:`GlobalDraws`
    webdataset 1.0.2's: one ``random.random()`` of the global generator per item, searched in the cumulative
    weights of the sources still active.
:class:`IndependentDraws`
    The same from a generator of the mix's own (``draws="independent"``).
:class:`BalancedDraws`
    Source ``i``'s ``k``-th item is due at ``(k + u) / w_i`` with a fresh uniform ``u``; the source due first is
    drawn, from a heap of due times. Every source stays within two items of its weight over any stretch.
:class:`Turns`
    Round robin.

:func:`draw` takes items from iterators in the order a chooser picks them, dropping or stopping at an iterator
that runs out.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
import numbers
import operator
import random
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

__all__ = ["BalancedDraws", "Chooser", "GlobalDraws", "IndependentDraws", "Turns", "check_weights", "draw"]


class Chooser:
    """Picks the next source among those not run out (:meth:`drop` removes one); state for checkpoints.
    ``first_order()`` lists the sources by when they are likely first drawn (what priming follows)."""

    def __init__(self, weights: Sequence[float]) -> None:
        self.weights = list(weights)
        self.active = list(range(len(weights)))

    def pick(self) -> int:
        """The next source (what the default :meth:`picks` hands out)."""
        raise NotImplementedError

    def picks(self) -> Iterator[int]:
        """The next picks, as :func:`draw` reads them until one source runs out. Here one :meth:`pick` per item,
        forever. A chooser may hand out picks it made ahead, as long as :meth:`state` is where the picks taken
        so far leave it and :meth:`drop` undoes those not taken (the next picks differ)."""
        pick = self.pick
        while True:
            yield pick()

    def drop(self, i: int) -> None:
        if i in self.active:
            self.active.remove(i)

    def first_order(self) -> list[int]:
        return sorted(self.active, key=lambda i: (-self.weights[i], i))

    def state(self) -> dict[str, Any]:
        return {}

    def load(self, state: dict[str, Any]) -> None:
        return None


class GlobalDraws(Chooser):
    """webdataset 1.0.2's draws: one ``random.random()`` of the global generator per item, searched in the
    cumulative weights of the sources still active (renormalised, as webdataset recomputes them every draw)."""

    def __init__(self, weights: Sequence[float]) -> None:
        super().__init__(weights)
        self._cumulative = self._sums()

    def _sums(self) -> list[float]:
        weights = [self.weights[i] for i in self.active]
        total = sum(weights)
        return list(itertools.accumulate(w / total for w in weights)) if total > 0 else []

    def _random(self) -> float:
        return random.random()

    def pick(self) -> int:
        r = self._random()
        if not self._cumulative:
            return self.active[0]  # only zero-weight sources are left (longest=True): drained in order, as webdataset
        # The first cumulative weight >= r, like numpy's searchsorted; rounding cannot overrun.
        return self.active[min(bisect.bisect_left(self._cumulative, r), len(self.active) - 1)]

    def drop(self, i: int) -> None:
        super().drop(i)
        self._cumulative = self._sums()

    def state(self) -> dict[str, Any]:
        return {"global": True}


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _set_rng(rng: random.Random, state: list[Any]) -> None:
    rng.setstate((state[0], tuple(state[1]), state[2]))


class IndependentDraws(GlobalDraws):
    """The same draws from a generator of the mix's own."""

    def __init__(self, weights: Sequence[float], seed: str) -> None:
        self.rng = random.Random(seed)
        super().__init__(weights)

    def _random(self) -> float:
        return self.rng.random()

    def state(self) -> dict[str, Any]:
        return {"rng": _rng_state(self.rng)}

    def load(self, state: dict[str, Any]) -> None:
        _set_rng(self.rng, state["rng"])


class BalancedDraws(Chooser):
    """Source ``i``'s ``k``-th item is due at ``(k + u) / w_i`` (``u`` uniform, fresh per item); the source due
    first is drawn (see the module docstring), from a heap of ``(due, source, count)``. Zero-weight sources are
    never due; they are drained in order once they are all that is left.

    Picks are made :data:`AHEAD` at a time, in one tight loop, and handed out from a list: a mix's consumer
    then spends a list step per item on them instead of a method call that touches the heap, the generator and
    three lists, on caches its sleep between items (a training step) left cold. :meth:`state` is the state
    before the current block (``mark``) and how many of its picks were taken (``skip``); :meth:`load` recomputes
    the block and skips those. A state without ``skip`` (saved one pick at a time) loads as ``skip`` 0.
    Each block starts by taking that state (the generator's 625 words as Python ints, the counts and due times),
    so the block is long: at 128 picks a block, the states were 4% of a mix's consumer CPU (py-spy, the slow phase
    of ``benchmarks.mix``) and 1,024 took the consumer's CPU inside ``next()`` from 27.9 to 25.7 and from 27.6 to
    26.5 us per sample (medians of 4 and 5 runs in turn, two runs). A load or a drop recomputes at most one
    block: about 0.4 ms with twenty sources.

    While picks are made the heap is the truth: each entry carries its source's count, and ``count`` and ``due``
    are brought up to date from it (:meth:`_sync`) only where they are read (a state, a drop). The loop then
    makes one C heap call and no list writes per pick: 37 bytecodes where it took 46 (traced over a mix's
    samples), on the path of every sample of a mix."""

    #: Picks made at a time.
    AHEAD = 1024

    def __init__(self, weights: Sequence[float], seed: str) -> None:
        super().__init__(weights)
        self.rng = random.Random(seed)
        self.count = [0] * len(weights)
        self.due = [self._due(i) for i in range(len(weights))]
        self._heap: list[tuple[float, int, int]] = []
        self._block: list[int] = []
        self._ahead: Iterator[int] = iter(self._block)  # the picks of _block not yet taken
        self._mark: dict[str, Any] | None = None  # the state before _block was picked
        self._skip = 0  # picks of the next block already taken (from a loaded state)
        self._rebuild()

    def _no_block(self) -> None:
        self._mark = None
        self._block = []
        self._ahead = iter(self._block)

    def _due(self, i: int) -> float:
        u = self.rng.random()
        return (self.count[i] + u) / self.weights[i] if self.weights[i] > 0 else math.inf

    def _rebuild(self) -> None:
        """The heap from ``count`` and ``due``, which must be current (:meth:`_sync` first if picks were made)."""
        self._heap = [(self.due[i], i, self.count[i]) for i in self.active if self.weights[i] > 0]
        heapq.heapify(self._heap)

    def _sync(self) -> None:
        """Bring ``count`` and ``due`` up to date with the heap."""
        due, count = self.due, self.count
        for d, i, k in self._heap:
            due[i], count[i] = d, k

    def _pick_many(self, n: int) -> list[int]:
        """The next ``n`` picks, advancing the generator, the counts and the due times: the draws, in the same
        order, as ``(count + u) / weight`` with a fresh ``u`` per pick."""
        heap = self._heap
        if not heap:
            return [self.active[0]] * n
        weights, rand, pushpop = self.weights, self.rng.random, heapq.heappushpop
        out: list[int] = []
        append = out.append
        # The source due first is held out of the heap: pushing its next due and popping the smallest is then one
        # call, which gives the next source due first.
        top = heapq.heappop(heap)
        for _ in itertools.repeat(None, n):
            _, i, k = top
            k += 1
            append(i)
            top = pushpop(heap, ((k + rand()) / weights[i], i, k))
        heapq.heappush(heap, top)
        return out

    def picks(self) -> Iterator[int]:
        # draw() asks again once every pick of the last block was taken, or after a drop() undid the rest.
        self._mark = self._state()
        skip, self._skip = self._skip, 0
        self._block = self._pick_many(max(self.AHEAD, skip))
        self._ahead = iter(self._block)
        for _ in itertools.islice(self._ahead, skip):
            pass
        return self._ahead

    def _taken(self) -> int:
        return len(self._block) - operator.length_hint(self._ahead)

    def _settle(self) -> None:
        """Undo the picks of the block not taken: the state is where the taken ones leave it."""
        if self._mark is None:
            return
        taken = self._taken()
        self._load(self._mark)
        self._pick_many(taken)
        self._no_block()

    def drop(self, i: int) -> None:
        self._settle()
        self._sync()
        super().drop(i)
        self._rebuild()

    def first_order(self) -> list[int]:
        return [i for _, i, _ in sorted(self._heap)] + [i for i in self.active if self.weights[i] <= 0]

    def _state(self) -> dict[str, Any]:
        self._sync()
        return {"rng": _rng_state(self.rng), "count": list(self.count),
                "due": [d if math.isfinite(d) else None for d in self.due]}

    def _load(self, state: dict[str, Any]) -> None:
        _set_rng(self.rng, state["rng"])
        self.count = [int(c) for c in state["count"]]
        self.due = [math.inf if d is None else float(d) for d in state["due"]]
        self._rebuild()

    def state(self) -> dict[str, Any]:
        if self._mark is None:
            return {**self._state(), "skip": self._skip}
        return {**self._mark, "skip": self._taken()}

    def load(self, state: dict[str, Any]) -> None:
        self._load(state)
        self._no_block()
        self._skip = int(state.get("skip", 0))


class Turns(Chooser):
    """Round robin: the sources in turn, skipping those that ran out."""

    def __init__(self, count: int) -> None:
        super().__init__([1.0] * count)
        self.next = 0

    def pick(self) -> int:
        at = bisect.bisect_left(self.active, self.next)
        i = self.active[at] if at < len(self.active) else self.active[0]
        self.next = i + 1
        return i

    def first_order(self) -> list[int]:
        return list(self.active)

    def state(self) -> dict[str, Any]:
        return {"next": self.next}

    def load(self, state: dict[str, Any]) -> None:
        self.next = int(state["next"])


def draw(iterators: list[Iterator[Any]], chooser: Chooser, longest: bool, ended: set[int],
         finish: Callable[[], None] | None = None) -> Generator[Any, None, None]:
    """Items of ``iterators`` in the order ``chooser`` picks them. A picked iterator that has run out is added
    to ``ended`` and ends the stream, or with ``longest`` is dropped and the rest go on. ``finish()`` runs when
    the generator ends for any reason: a mix's pass is this generator alone, one frame per item."""
    try:
        if ended and not longest:
            # A pass that ended when a source ran out (a state saved at its end: a DataLoader worker's last
            # snapshot can be taken before its pipeline counted the pass): nothing is left of it.
            return
        for i in ended:
            chooser.drop(i)
        takes = [it.__next__ for it in iterators]
        while chooser.active:
            for i in chooser.picks():
                try:
                    item = takes[i]()
                except StopIteration:
                    ended.add(i)
                    if not longest:
                        return
                    chooser.drop(i)
                    break
                yield item
    finally:
        if finish is not None:
            finish()


def check_weights(name: str, weights: Sequence[float] | None, count: int) -> list[float]:
    """``weights`` checked for ``count`` sources (None: all equal): finite, non-negative numbers, not all zero."""
    if weights is None:
        return [1.0] * count
    if any(isinstance(w, (str, bytes, bool)) or not isinstance(w, numbers.Real) for w in weights):
        raise ValueError(f"{name}: weights must be numbers, got {list(weights)!r}")
    values = [float(w) for w in weights]
    if len(values) != count:
        raise ValueError(f"{name}: {len(values)} weights (probabilities) for {count} datasets")
    bad = [i for i, w in enumerate(values) if not (w >= 0 and math.isfinite(w))]
    if bad:
        raise ValueError(f"{name}: the weight of dataset {bad[0]} is {values[bad[0]]!r}; weights must be finite "
                         "and non-negative")
    if sum(values) <= 0:
        raise ValueError(f"{name}: the weights are all zero; at least one dataset needs a positive weight")
    return values
