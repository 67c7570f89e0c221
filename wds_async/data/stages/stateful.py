"""Stages that hold items between input and output, as objects whose state can be saved and restored.

``shuffle`` holds a buffer and a random generator, ``batched`` a partial batch, ``slice`` a count. Each
is a :class:`StatefulStage` (picklable, shared by pipeline copies) that makes a fresh runner for every
pass; the runner's :meth:`~Runner.state_dict` is small: counters, the random generator's state and,
for every item it holds, the source *positions* it was made from ``[item, offset, end]`` instead of its
bytes. A resumed pipeline re-reads those samples and replays the stages before this one over them to
rebuild the held items (see :mod:`wds_async.data.fluid`).

The input of a runner is ``(item, positions)`` pairs: the positions of the samples the pipeline pulled
from its source since this stage's previous input. That is exact when the stages before it emit each
item from the samples pulled since their previous output (map, select, decode, to_tuple, batched, ...),
which :meth:`FluidPipeline.state_dict` checks.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["Batched", "Runner", "Shuffle", "Slice", "StatefulStage"]

Positions = list[list[int]]
Pairs = Iterable[tuple[Any, Positions]]


class Runner:
    """One pass of a stateful stage."""

    def __call__(self, data: Pairs) -> Iterator[Any]:
        raise NotImplementedError

    def held(self) -> list[Positions]:
        """The positions of each held item, in the order :meth:`load_state_dict` wants the items back."""
        return []

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any], pairs: list[tuple[Any, Positions]]) -> None:
        """Restore from ``state``; ``pairs`` are the held items rebuilt from :meth:`held`'s positions, each
        with its positions."""


class StatefulStage:
    """A fluid stage with a state; ``runner()`` starts a pass, ``replay(data)`` passes items through it
    the way rebuilding a later stage's items needs (order unchanged, nothing held back at the end)."""

    #: Whether a stage after this one may trust "positions pulled since my previous input" (see above).
    streaming = True

    def runner(self) -> Runner:
        raise NotImplementedError

    def replay(self, data: Iterable[Any]) -> Iterator[Any]:
        return iter(data)

    def __call__(self, data: Iterable[Any]) -> Iterator[Any]:
        """Run without positions (the pipeline form, a plain iterator)."""
        return self.runner()((x, []) for x in data)


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


class _ShuffleRunner(Runner):
    """webdataset 1.0.2's buffer shuffle, draw for draw: for each input, add it and, while the buffer is below
    ``bufsize``, one more; once ``min(initial, bufsize)`` are held, yield one picked by ``rng.randint(0, len - 1)``
    (the last item takes its place). When the input ends, the rest come out the same way, one pick each."""

    def __init__(self, stage: Shuffle) -> None:
        self.bufsize, self.initial = stage.bufsize, min(stage.initial, stage.bufsize)
        if stage.rng is not None:
            self.rng = stage.rng  # shared by every pass, as webdataset's: each pass goes on drawing from it
        else:
            self.rng = random.Random(stage.seed) if stage.seed is not None else random.Random()
        self.buf: list[tuple[Any, Positions]] = []
        self.draining = False  # the input ended: only picks are left

    def _pick(self) -> Any:
        buf = self.buf
        k = self.rng.randint(0, len(buf) - 1)
        item = buf[k][0]
        buf[k] = buf[-1]
        buf.pop()
        return item

    def __call__(self, data: Pairs) -> Iterator[Any]:
        buf = self.buf
        if not self.draining:
            source = iter(data)
            for pair in source:
                buf.append(pair)
                if len(buf) < self.bufsize:
                    extra = next(source, None)  # items are (item, positions) pairs: never None
                    if extra is not None:
                        buf.append(extra)
                if len(buf) >= self.initial:
                    yield self._pick()
            self.draining = True
        while buf:
            yield self._pick()

    def held(self) -> list[Positions]:
        return [pos for _, pos in self.buf]

    def state_dict(self) -> dict[str, Any]:
        return {"rng": _rng_state(self.rng), "draining": self.draining}

    def load_state_dict(self, state: dict[str, Any], pairs: list[tuple[Any, Positions]]) -> None:
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))
        self.draining = bool(state["draining"])
        self.buf = list(pairs)  # in held() order: the picks index into the buffer


class Shuffle(StatefulStage):
    """Shuffle within a buffer of ``bufsize`` items, starting to yield once ``initial`` are held; the draws are
    webdataset 1.0.2's ``shuffle``'s, so the same ``seed`` or the same ``rng`` gives the same order.

    ``seed``: every pass starts a ``random.Random(seed)`` (the same order each pass); ``rng``: every pass draws
    on from that generator; neither: a generator seeded by the OS per pass. webdataset refuses both at once."""

    streaming = False

    def __init__(self, bufsize: int = 1000, initial: int = 100, seed: Any = None,
                 rng: random.Random | None = None) -> None:
        if seed is not None and rng is not None:
            raise ValueError("shuffle: pass seed= or rng=, not both")
        self.bufsize, self.initial, self.seed, self.rng = bufsize, initial, seed, rng

    def runner(self) -> Runner:
        return _ShuffleRunner(self)

    def __repr__(self) -> str:
        return f"shuffle({self.bufsize})"


class _BatchedRunner(Runner):
    def __init__(self, stage: Batched) -> None:
        self.stage = stage
        self.batch: list[tuple[Any, Positions]] = []

    def _collate(self, items: list[Any]) -> Any:
        fn = self.stage.collation_fn
        return fn(items) if fn is not None else items

    def __call__(self, data: Pairs) -> Iterator[Any]:
        size = self.stage.batchsize
        for pair in data:
            self.batch.append(pair)
            if len(self.batch) == size:
                items, self.batch = [x for x, _ in self.batch], []
                yield self._collate(items)
        if self.batch and self.stage.partial:
            items, self.batch = [x for x, _ in self.batch], []
            yield self._collate(items)

    def held(self) -> list[Positions]:
        return [pos for _, pos in self.batch]

    def load_state_dict(self, state: dict[str, Any], pairs: list[tuple[Any, Positions]]) -> None:
        self.batch = list(pairs)


class Batched(StatefulStage):
    """Group items into lists of ``batchsize`` and collate them; ``partial=False`` drops a short tail."""

    def __init__(self, batchsize: int, collation_fn: Callable[[list[Any]], Any] | None, partial: bool = True) -> None:
        if batchsize < 1:
            raise ValueError(f"batchsize must be >= 1, got {batchsize}")
        self.batchsize, self.collation_fn, self.partial = batchsize, collation_fn, partial

    def runner(self) -> Runner:
        return _BatchedRunner(self)

    def replay(self, data: Iterable[Any]) -> Iterator[Any]:
        return _BatchedRunner(self)((x, []) for x in data)

    def __repr__(self) -> str:
        return f"batched({self.batchsize})"


class _SliceRunner(Runner):
    def __init__(self, stage: Slice) -> None:
        self.stage = stage
        self.n = 0  # inputs consumed

    def __call__(self, data: Pairs) -> Iterator[Any]:
        start, stop, step = self.stage.bounds
        if stop is not None and self.n >= stop:
            return
        for item, _ in data:
            n, self.n = self.n, self.n + 1
            if n >= start and (n - start) % step == 0:
                yield item
            if stop is not None and self.n >= stop:
                return

    def state_dict(self) -> dict[str, Any]:
        return {"n": self.n}

    def load_state_dict(self, state: dict[str, Any], pairs: list[tuple[Any, Positions]]) -> None:
        self.n = state["n"]


class Slice(StatefulStage):
    """``itertools.islice`` as a stage: ``slice(stop)`` or ``slice(start, stop[, step])``."""

    def __init__(self, *args: int | None) -> None:
        bounds = slice(*args)
        self.bounds = (bounds.start or 0, bounds.stop, bounds.step or 1)
        if self.bounds[0] < 0 or (self.bounds[1] is not None and self.bounds[1] < 0) or self.bounds[2] < 1:
            raise ValueError(f"slice bounds must be non-negative with a positive step, got {args}")

    def runner(self) -> Runner:
        return _SliceRunner(self)

    def __repr__(self) -> str:
        return f"slice{self.bounds}"
