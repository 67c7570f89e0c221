"""Mixing several datasets into one stream: :class:`RandomMix` and :class:`RoundRobin` (webdataset's names,
arguments and draws), on one engine, resumable from a checkpoint.

Both take any iterables (WebDatasets and their pipelines, DataPipelines, lists) and start a fresh pass over every
one on each ``iter()``. Both are fluid pipelines, so ``RandomMix([a, b], [3, 1]).batched(64)`` works without
webdataset's ``FluidWrapper``.

Draws
    ``RandomMix(..., seed=None)`` (the default) draws from the global ``random`` module exactly as webdataset
    1.0.2 does, one ``random.random()`` per item, so ``random.seed(n)`` gives webdataset's sequence of sources.
    With a ``seed`` the mix draws from its own generator, seeded by ``(seed, epoch, DataLoader worker)`` (every
    rank draws the same sequence, so ranks whose sources hold equal shares end an epoch together), and by default
    *balanced*: source ``i``'s ``k``-th item is due at ``(k + u) / w_i`` with a fresh uniform ``u``, and the
    source due first is drawn. Each source then stays within two items of its weight over any stretch of the
    stream, where independent draws drift by ``sqrt(w (1 - w) n)`` (about 14 items in 1,000 at ``w = 0.3``);
    ``draws="independent"`` gives independent draws from the seeded generator instead. The draws themselves
    live in :mod:`wds_async.data.draws`.

One engine
    The WebDataset sources of a mix that read from stores with the same options are read on one
    :class:`~wds_async.engine.shared.SharedEngine` for the whole pass: one byte budget, one limiter and autotuner,
    one connection pool per store, with each source prefetching in proportion to its weight. Sources with other
    backend options, backends or cache get an engine per such group; sources read through the node service share
    the service's engine; other iterables (a ``DataPipeline`` with its own tar stage, a list) run as they are.

Checkpoints
    ``state_dict()`` holds each source's own state (where its shards stand, its shuffle buffer), the draws'
    generator and which sources ran out; ``load_state_dict()`` continues the same sequence, in this process or a
    fresh one, through ``StatefulDataLoader`` and under torchrun. :func:`~wds_async.merge_states` re-splits a mix
    for another world size: every source's remaining samples exactly once, the draws restarted with the weights.
    A mix with ``seed=None`` draws from the global generator, which no checkpoint can restore: its states say so
    and loading one is refused. Stateful stages appended to the mix itself (``mix.shuffle(n)``) cannot be
    checkpointed while they hold items (put the shuffle in the sources).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from ..engine.shared import SharedEngine
from ..engine.spec import StreamSpec
from ..stats import SharedStats, Stats
from .draws import BalancedDraws, Chooser, GlobalDraws, IndependentDraws, Turns, check_weights, draw
from .fluid import FluidPipeline
from .topology import worker_info

__all__ = ["RandomMix", "RoundRobin"]

_DRAWS = ("balanced", "independent")


def _round_robin(sources: list[Iterator[Any]], longest: bool) -> Iterator[Any]:
    """webdataset's ``round_robin_shortest`` / ``round_robin_longest`` over iterators."""
    return draw(sources, Turns(len(sources)), longest, set())


def _random_samples(sources: list[Iterator[Any]], probs: Sequence[float] | None, longest: bool) -> Iterator[Any]:
    """webdataset's ``random_samples`` over iterators: global ``random`` draws with ``probs`` (default equal)."""
    yield from draw(sources, GlobalDraws(check_weights("random_samples", probs, len(sources))), longest, set())


# -- sources -------------------------------------------------------------------------------------------------
class _Counted:
    """A plain iterable as a source: its state is how many items were taken; a resume skips that many."""

    def __init__(self, data: Iterable[Any]) -> None:
        self.data = data
        self.taken = 0
        self._skip = 0

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.data)
        for _ in range(self._skip):
            if next(it, _MISSING) is _MISSING:
                raise ValueError(f"cannot resume a mix: its source {self.data!r} has fewer than {self._skip} items now")
        self.taken, self._skip = self._skip, 0
        for item in it:
            self.taken += 1
            yield item

    def state_dict(self) -> dict[str, Any]:
        return {"taken": self.taken}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._skip = int(state["taken"])


_MISSING = object()


def _copy(data: Any) -> Any:
    """The source a pass reads: a copy of a pipeline (with counters of its own, so the user's dataset object does
    not show the mix's), or a counted plain iterable."""
    if not isinstance(data, FluidPipeline):
        return _Counted(data)
    source = copy.copy(data)
    if hasattr(source, "_stats_box"):
        source._stats_box = [None]
    return source


def _fingerprint(data: Any) -> str:
    planner = getattr(data, "_planner", None)
    if planner is not None:
        return str(planner.fingerprint)
    return type(data).__name__


class _MixPass:
    """One pass of a mix: its sources (copies bound to its engines), the chooser and what ran out."""

    def __init__(self, sources: list[Any], chooser: Chooser, engines: list[SharedEngine], epoch: int,
                 seed_text: str | None) -> None:
        self.sources = sources
        self.chooser = chooser
        self.engines = engines
        self.ended: set[int] = set()
        self.epoch = epoch
        self.seed_text = seed_text

    def __getstate__(self) -> dict[str, Any]:
        # A pickled mix (for a spawned DataLoader worker) carries where its pass stands, never its engines.
        return {**self.__dict__, "engines": []}


class _Mix(FluidPipeline):
    """What :class:`RandomMix` and :class:`RoundRobin` share (see the module docstring)."""

    _kind = "mix"

    def __init__(self, datasets: Sequence[Iterable[Any]], weights: Sequence[float] | str | None, longest: bool,
                 seed: Any, draws: str) -> None:
        super().__init__()
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError(f"{type(self).__name__} needs at least one dataset")
        if isinstance(weights, str):
            weights = _sizes(type(self).__name__, weights, self.datasets)
        self.weights = check_weights(type(self).__name__, weights, len(self.datasets))
        self.longest = longest
        self.seed = seed
        if draws not in _DRAWS:
            raise ValueError(f"{type(self).__name__}: draws must be one of {_DRAWS}, not {draws!r}")
        self.draws = draws
        self.epoch = 0
        self._stats_box: list[Stats | None] = [None]
        self._worker_stats = SharedStats()  # created before DataLoader workers fork, as a WebDataset's
        self._tuned = 0

    # -- what subclasses choose ----------------------------------------------------------------------
    def _chooser(self, seed_text: str | None) -> Chooser:
        raise NotImplementedError

    def _seed_text(self) -> str | None:
        if self.seed is None:
            return None
        worker, _ = worker_info()
        return f"wds-async-mix:{self.seed}:{self.epoch}:{worker}"

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch of the mix (its draws) and of every source that has epochs."""
        self.epoch = epoch
        for data in self.datasets:
            if hasattr(data, "set_epoch"):
                data.set_epoch(epoch)

    # -- a pass ----------------------------------------------------------------------------------------
    def _source(self, run: Any, resume: dict[str, Any] | None) -> Iterator[Any]:
        saved = self._saved(resume)
        elastic = saved is not None and saved.get("elastic", False)
        epoch = int(saved["epoch"]) if saved is not None and not elastic else self.epoch
        sources = [_copy(d) for d in self.datasets]
        seed_text = self._seed_text() if saved is None or elastic else saved["seed_text"]
        chooser = self._chooser(seed_text)
        mix = _MixPass(sources, chooser, [], epoch, seed_text)
        run.source = mix
        if saved is not None:
            for source, state in zip(sources, saved["sources"]):
                if state is not None:
                    source.load_state_dict(state)
            if not elastic:
                chooser.load(saved["chooser"])
                mix.ended = {int(i) for i in saved["ended"]}
        mix.engines = self._bind(sources, chooser.first_order() if saved is None else None)
        return self._items(mix)

    def _bind(self, sources: list[Any], order: list[int] | None) -> list[SharedEngine]:
        """Put the WebDataset sources on shared engines, one per group of compatible stores (see the module
        docstring); when the pass starts afresh, prime them in ``order`` (the order of their first draws): every
        source's first item first, then the rest of their windows in the order the draws will need them
        (:meth:`~wds_async.engine.shared.SharedEngine.prime_all`)."""
        from .dataset import WebDataset

        specs: dict[int, StreamSpec] = {}
        groups: list[list[int]] = []
        for i, source in enumerate(sources):
            if not isinstance(source, WebDataset) or (self.weights[i] <= 0 and not self.longest):
                continue
            spec, _share = source._stream_spec()
            if spec.service is not None:
                continue  # read through the node service, whose engine all its clients share already
            specs[i] = spec
            for members in groups:
                if _compatible(specs[members[0]], spec):
                    members.append(i)
                    break
            else:
                groups.append([i])
        engines = []
        stats = Stats()
        self._stats_box[0] = stats
        if not self._tuned:  # a DataLoader worker forked for this pass: where its slot's last pass settled
            self._tuned = self._worker_stats.learned_level()
        for members in groups:
            spec = specs[members[0]]
            engine = SharedEngine(StreamSpec(spec.config.starting_at(self._tuned), spec.handler, spec.select_files, spec.rename_files,
                                             backends=spec.backends, backend_options=spec.backend_options,
                                             cache=spec.cache, log_interval=spec.log_interval,
                                             routes=tuple(specs[i] for i in members)),
                                  stats, [self.weights[i] for i in members])
            engines.append(engine)
            for route, i in enumerate(members):
                sources[i]._shared = (engine, route)
        if order is not None:
            plans: dict[int, Iterator[Any]] = {}
            for i in order:
                if getattr(sources[i], "_shared", None) is None:
                    continue
                try:
                    plans[i] = iter(sources[i].work_items())
                except Exception:  # a plan that cannot be previewed is read unprimed
                    continue
            by_engine: dict[int, list[tuple[int, Iterator[Any]]]] = {}
            for i, plan in plans.items():
                engine, route = sources[i]._shared
                by_engine.setdefault(id(engine), []).append((route, plan))
            for engine in engines:
                engine.prime_all(by_engine.get(id(engine), []))
        return engines

    def _items(self, mix: _MixPass) -> Iterator[Any]:
        """The pass's items: the draws' generator itself, which ends the pass (closes the sources and engines) when it ends."""
        iterators = [iter(source) for source in mix.sources]
        stop_publishing = self._worker_stats.publish(self._stats_box[0] or Stats())

        def end_pass() -> None:
            stop_publishing()
            for it in iterators:
                close = getattr(it, "close", None)
                if close is not None:
                    close()
            for engine in mix.engines:
                engine.close()
            # The pass stays readable for state_dict(), but keeps no engine (a lock, a thread): the mix pickles
            # after a pass, as spawned DataLoader workers need.
            mix.engines = []
            for source in mix.sources:
                if getattr(source, "_shared", None) is not None:
                    source._shared = None
            stats = self._stats_box[0]
            if stats is not None and stats.concurrency:
                self._tuned = stats.concurrency

        return draw(iterators, mix.chooser, self.longest, mix.ended, end_pass)

    # -- checkpoints -----------------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        return {"mix": self._kind, "weights": list(self.weights), "longest": self.longest,
                "datasets": [_fingerprint(d) for d in self.datasets], "draws": self.draws,
                "seeded": self.seed is not None}

    def _source_state(self, run: Any) -> dict[str, Any] | None:
        mix = run.source if run is not None else None
        if mix is None:
            # Before the first pass: each source's own state before iteration (where it would start, in this
            # process), so that merge_states can count this process's shares as wholly owed.
            return {**self._identity(), "fresh": True, "epoch": self.epoch, "seed_text": None, "chooser": None,
                    "ended": [], "sources": [d.state_dict() if isinstance(d, FluidPipeline) else {"taken": 0}
                                             for d in self.datasets]}
        return {**self._identity(), "epoch": mix.epoch, "seed_text": mix.seed_text, "chooser": mix.chooser.state(),
                "ended": sorted(mix.ended), "sources": [source.state_dict() for source in mix.sources]}

    def _saved(self, resume: dict[str, Any] | None) -> dict[str, Any] | None:
        """The mix's part of ``resume``, checked against this mix (None: start afresh)."""
        if resume is None:
            return None
        saved = resume.get("source")
        if saved is None:
            return None
        name = type(self).__name__
        if not isinstance(saved, dict) or "mix" not in saved:
            raise ValueError(f"{name}: the state is not a mix's (load the state of the mix that saved it)")
        mine = self._identity()
        for key, what in (("mix", "kind of mix"), ("datasets", "datasets (their shards, in order)"),
                          ("weights", "weights"), ("longest", "longest"), ("draws", "draws")):
            if saved[key] != mine[key]:
                raise ValueError(f"{name}: the state is from a mix with other {what} ({saved[key]!r}, this one "
                                 f"has {mine[key]!r}); load it into the mix that saved it")
        if saved.get("fresh"):
            return None  # saved before the first pass: start afresh
        if not saved["seeded"] and not saved.get("elastic", False):
            raise ValueError(f"{name}: the state is from a mix without a seed, whose draws came from the global "
                             "random module, which no checkpoint restores; give the mix a seed (seed=...) "
                             "to resume it exactly")
        return dict(saved)

    def stats(self) -> dict[str, Any]:
        """The counters of the mix's engine in the latest pass (see :meth:`wds_async.WebDataset.stats`)."""
        return self._worker_stats.combined(self._stats_box[0])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self.datasets)} datasets, weights={self.weights}, longest={self.longest})"


def _compatible(a: StreamSpec, b: StreamSpec) -> bool:
    """Whether two sources can share one engine: the same backends, options per scheme and cache (the engine's
    settings, its byte budget and connections, are those of the first source of the group)."""
    return (a.backends is b.backends or (not a.backends and not b.backends)) and \
        _options(a.backend_options) == _options(b.backend_options) and _cache_key(a.cache) == _cache_key(b.cache)


def _cache_key(cache: Any) -> Any:
    """Two caches are the same when they keep the same directory under the same rules (each dataset makes its
    own ``ShardCache`` object, even from one ``cache_dir`` or ``WDS_CACHE``)."""
    if cache is None:
        return None
    return (type(cache).__name__, cache.directory, cache.max_bytes, cache.validate)


def _options(options: Any) -> Any:
    return repr(sorted((options or {}).items(), key=lambda kv: str(kv[0])))


def _sizes(name: str, by: str, datasets: list[Any]) -> list[float]:
    """Weights proportional to each dataset's size: ``"shards"`` (its shard count) or ``"samples"`` (its sample
    count, from its index)."""
    from .dataset import WebDataset

    if by not in ("shards", "samples"):
        raise ValueError(f"{name}: weights are numbers, \"shards\" or \"samples\", not {by!r}")
    sizes = []
    for i, data in enumerate(datasets):
        if not isinstance(data, WebDataset):
            raise ValueError(f"{name}: weights={by!r} needs WebDataset sources; dataset {i} is a {type(data).__name__}")
        if by == "shards":
            sizes.append(float(len(data.urls)))
        elif data.index is None:
            raise ValueError(f"{name}: weights=\"samples\" counts samples in each dataset's index, and dataset {i} "
                             "has none (WebDataset(..., index=...), built with `wds-async index`)")
        else:
            sizes.append(float(sum(len(entry.offsets) for entry in data.index.entries_for(data.urls))))
    return sizes


class RandomMix(_Mix):
    """Items drawn at random from ``datasets``, dataset ``i`` with probability ``probs[i] / sum(probs)``
    (default: equal; ``"shards"`` or ``"samples"``: in proportion to each WebDataset's shard count, or to its
    sample count in its index). Ends when a drawn dataset is exhausted, or with ``longest=True`` when all are.

    ``seed=None`` draws as webdataset 1.0.2 does, from the global ``random`` module (not resumable); a ``seed``
    draws from the mix's own generator, ``draws="balanced"`` (default: every source within two items of its
    weight over any stretch) or ``"independent"``. See :mod:`wds_async.data.mix`.
    """

    _kind = "random"

    def __init__(self, datasets: Sequence[Iterable[Any]], probs: Sequence[float] | str | None = None,
                 longest: bool = False, *, seed: Any = None, draws: str = "balanced") -> None:
        super().__init__(datasets, probs, longest, seed, draws)
        self.probs = probs

    def _chooser(self, seed_text: str | None) -> Chooser:
        if seed_text is None:
            return GlobalDraws(self.weights)
        if self.draws == "independent":
            return IndependentDraws(self.weights, seed_text)
        return BalancedDraws(self.weights, seed_text)


class RoundRobin(_Mix):
    """Items from ``datasets`` in turn: one from the first, one from the second, ... Ends when any dataset
    ends, or with ``longest=True`` when all have (the others go on in turn). Always resumable.

    ``seed`` is taken so that a call written for :class:`RandomMix` (``Mix(datasets, seed=s)``) works with either
    mix; round robin draws nothing, so its order is the same whatever the seed (the sources' own shuffles take
    their seeds from the sources)."""

    _kind = "round_robin"

    def __init__(self, datasets: Sequence[Iterable[Any]], longest: bool = False, *, seed: Any = None) -> None:
        super().__init__(datasets, None, longest, seed=0, draws="balanced")

    def _chooser(self, seed_text: str | None) -> Chooser:
        return Turns(len(self.datasets))
