"""The fluid interface shared by :class:`~wds_async.WebDataset`, :class:`~wds_async.DataPipeline` and
:class:`~wds_async.WebLoader`: chained stage methods, epochs, repetition and ``len()``.

Every method returns a **new** pipeline and leaves the receiver unchanged (webdataset mutates and
returns ``self`` for ``with_epoch``/``repeat``; a copy cannot surprise a second user of the object).
Stages are picklable :class:`~wds_async.data.stages.base.Stage` objects, so pipelines cross into spawned DataLoader workers.

Epoch semantics follow webdataset: ``with_epoch(n)`` makes each ``iter()`` yield exactly ``n`` items,
restarting the underlying stream as often as needed; ``repeat(k)`` runs the stream ``k`` times (forever
without ``k``); an empty stream never loops.
"""

from __future__ import annotations

import contextlib
import copy
import operator
import random
import sys
from collections.abc import Callable, Generator, Iterable, Iterator
from types import GeneratorType
from typing import TYPE_CHECKING, Any

from ._torch import IterableDataset
from .handlers import resolve_handler
from .recorder import Recorder
from .stages import patterns as _p
from .stages import plain as _s
from .stages.base import Stage, pipelinefilter
from .stages.stateful import Batched, Runner, Shuffle, Slice, StatefulStage
from .state import STATE_VERSION

if TYPE_CHECKING:
    from typing import Self

__all__ = ["FluidPipeline", "Stage", "pipelinefilter"]

HandlerArg = Callable[[BaseException], bool] | str | None


#: Plain stages that emit each item from the inputs pulled since their previous output.
_STREAMING = frozenset([_s.map_stage, _s.select, _s.to_tuple, _s.map_dict, _s.map_tuple, _s.rename, _s.rsample,
                        _p.extract_keys, _p.rename_keys, _p.xdecode])


def _streaming(stage: Any) -> bool:
    if isinstance(stage, StatefulStage):
        return stage.streaming
    return isinstance(stage, Stage) and stage.fn in _STREAMING


_second = operator.itemgetter(1)


def _position(numbered: enumerate[Any]) -> int:
    """The number the next item of ``numbered`` would get: the items yielded so far (from its pickle form, the
    one public view of an enumerate's count)."""
    return int(numbered.__reduce__()[1][1])  # type: ignore[index]


class _Pass:
    """One pass over the source: the stage runners, and the source positions each of them consumed.

    ``pulled`` holds ``[item, offset, end]`` of the samples the source yielded; a tap in front of the
    stateful stage ``k`` hands it, with every input, the positions pulled since its previous input. With
    no tap (no stateful stage) nothing reads them, and none are kept.
    """

    def __init__(self) -> None:
        self.pulled: list[list[int]] = []
        self.first = 0  # absolute number of pulled[0]
        self.marks: dict[int, int] = {}
        self.runners: dict[int, Runner] = {}
        self.source: Any = None  # what the source keeps for its own state (set by the source)
        self.recorders: list[Recorder] = []
        self.numbered: enumerate[Any] | None = None  # counts the items yielded, where no limit needs a count per item

    def recorder(self, positions: dict[int, int], finished: Callable[[int], None], *,
                 one_item_runs: bool = False) -> Recorder:
        """The :class:`Recorder` of a source's samples in this pass: ``positions[item] = end`` of each sample
        delivered, ``finished(item)`` after an item's last one; flushed by :meth:`flush` before a checkpoint.
        ``one_item_runs``: the source's engine delivers items in order (see :class:`Recorder`)."""
        recorder = Recorder(positions, finished, self.marks, self.pulled, one_item_runs=one_item_runs)
        self.recorders.append(recorder)
        return recorder

    def flush(self) -> None:
        """Bring the positions of every recorder of this pass up to the samples delivered so far."""
        for recorder in self.recorders:
            recorder.flush()

    def tap(self, stream: Iterable[Any], k: int) -> Iterator[tuple[Any, list[list[int]]]]:
        self.marks[k] = self.first + len(self.pulled)
        for item in stream:
            end = self.first + len(self.pulled)
            group = self.pulled[self.marks[k] - self.first:]
            self.marks[k] = end
            if len(self.pulled) > 4096:
                low = min(self.marks.values())
                del self.pulled[: low - self.first]
                self.first = low
            yield item, group


class FluidPipeline(IterableDataset):  # type: ignore[type-arg]
    """Base: subclasses implement :meth:`_source` (a fresh iterator per pass); stages apply after it.

    Checkpoints: :meth:`state_dict` / :meth:`load_state_dict` (the ``Stateful`` protocol that torchdata's
    ``StatefulDataLoader`` calls) save where the source stands, each stateful stage's state and the
    epoch counters; the next ``iter()`` resumes there.
    """

    _stages: tuple[Callable[[Iterator[Any]], Iterator[Any]], ...] = ()
    _repetitions: int = 1
    _nsamples: int = -1
    _size: int | None = None
    _pending: dict[str, Any] | None = None
    _current: tuple[_Pass, list[int]] | None = None
    #: A state loaded at the end of its epoch, which the last ``iter()`` found nothing left of: still the position.
    _finished: dict[str, Any] | None = None

    def _source(self, run: _Pass, resume: dict[str, Any] | None) -> Iterator[Any]:
        """A fresh iterator over the source; records each item's position with ``run.recorder()`` when it can."""
        raise NotImplementedError

    def _source_state(self, run: _Pass | None) -> dict[str, Any] | None:
        """Where the source stands in ``run`` (None: before the first iteration)."""
        return None

    def _reread(self, run: _Pass, positions: list[list[int]]) -> list[Any]:
        raise ValueError(f"{type(self).__name__} cannot re-read items by position to restore a stage's buffer")

    def _iterate_once(self, run: _Pass, resume: dict[str, Any] | None) -> Generator[Any, None, None]:
        """One pass: the source through the stages. A source that is a generator and meets no stage is the pass
        itself: one generator frame less per item (a mix pays each layer once for itself and once for the source
        the item came from)."""
        source = self._source(run, resume)
        if not self._stages and isinstance(source, GeneratorType):
            return source
        return self._staged(run, resume, source)

    def _staged(self, run: _Pass, resume: dict[str, Any] | None, source: Iterator[Any]) -> Generator[Any, None, None]:
        stream: Iterator[Any] = source
        stage_states = resume.get("stages") if resume and "elastic" not in resume else None
        for k, stage in enumerate(self._stages):
            if isinstance(stage, StatefulStage):
                runner = stage.runner()
                run.runners[k] = runner
                if stage_states and stage_states[k]:
                    self._restore(run, k, runner, stage_states[k])
                stream = runner(run.tap(stream, k))
            else:
                stream = stage(stream)
        try:
            yield from stream
        finally:
            # Close from the outside in, so resources stop now rather than at garbage collection.
            for it in (stream, source):
                close = getattr(it, "close", None)
                if close is not None:
                    close()

    def _restore(self, run: _Pass, k: int, runner: Runner, state: dict[str, Any]) -> None:
        """Rebuild stage ``k``'s held items: re-read their samples, replay the stages before it over them."""
        groups = state["held"]
        items: list[Any] = []
        if groups:
            data: Iterator[Any] = iter(self._reread(run, [pos for group in groups for pos in group]))
            for stage in self._stages[:k]:
                data = stage.replay(data) if isinstance(stage, StatefulStage) else stage(data)
            items = list(data)
            if len(items) != len(groups):
                raise ValueError(f"cannot restore stage {k} ({self._stages[k]!r}): replaying the stages before it "
                                 f"gave {len(items)} items for {len(groups)} held ones; are they deterministic?")
        runner.load_state_dict(state["state"], list(zip(items, groups)))

    def __iter__(self) -> Iterator[Any]:
        resume, self._pending, self._finished = self._pending, None, None
        limit = self._nsamples if self._repetitions != 1 and self._nsamples > 0 else -1
        counters = [0, 0]  # [repetition, items yielded in this epoch]
        if resume is not None and "elastic" not in resume:
            counters = [resume["reps"], resume["count"]]
            if 0 < limit <= counters[1] or counters[0] >= self._repetitions:
                # Saved at the end of the epoch (its last item delivered, or every repetition done): nothing is left
                # of it, and the state stays that position, so that a checkpoint taken now (a DataLoader worker
                # whose share ran out before the first checkpoint, resumed, then checkpointed again) resumes
                # there too, rather than at a fresh epoch that delivers the share once more.
                self._finished = resume
                return
        while counters[0] < self._repetitions:
            run = _Pass()
            self._current = (run, counters)
            before = counters[1]
            with contextlib.closing(self._iterate_once(run, resume)) as items:
                resume = None
                if limit > 0:
                    for item in items:
                        counters[1] += 1
                        yield item
                        if limit <= counters[1]:
                            return
                else:  # the common case: no limit to check, so no bytecode of ours per item
                    run.numbered = numbered = enumerate(items, counters[1])
                    try:
                        yield from map(_second, numbered)
                    finally:  # closed early too: a pass pickles (for spawned workers) without its generator
                        counters[1] = _position(numbered)
                        run.numbered = None
            if counters[1] == before:
                return  # an empty stream never loops
            counters[0] += 1

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """This process's position: small (positions and counters, never sample bytes); see
        :mod:`wds_async.data.state`. Before any iteration, the state loaded last, or the epoch's start."""
        if self._pending is not None:
            return self._pending
        if self._finished is not None:
            return self._finished
        run, counters = self._current if self._current is not None else (None, [0, 0])
        count = counters[1] if run is None or run.numbered is None else _position(run.numbered)
        if run is not None:
            run.flush()
        stages: list[dict[str, Any] | None] = []
        for k, stage in enumerate(self._stages):
            runner = run.runners.get(k) if run is not None else None
            if runner is None:
                stages.append(None)
                continue
            held = runner.held()
            if held:
                blocked = [s for s in self._stages[:k] if not _streaming(s)]
                if blocked or not all(held):
                    why = (f"it follows {blocked[0]!r}, which does not emit items in input order" if blocked
                           else "its items carry no source positions (the source is not a WebDataset)")
                    raise ValueError(f"cannot checkpoint {stage!r} while it holds items: {why}")
            stages.append({"state": runner.state_dict(), "held": held})
        return {"wds_async": STATE_VERSION, "source": self._source_state(run), "stages": stages,
                "reps": counters[0], "count": count}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` at the next ``iter()``: one from :meth:`state_dict` of this process, or
        :func:`~wds_async.merge_states` of every process of a job with another world size."""
        if not isinstance(state, dict) or state.get("wds_async") != STATE_VERSION:
            raise ValueError("not a wds-async state (from ds.state_dict() or wds_async.merge_states()), or one of "
                             f"another version than {STATE_VERSION}")
        if "elastic" not in state and len(state["stages"]) != len(self._stages):
            raise ValueError(f"the state has {len(state['stages'])} stages but this pipeline {len(self._stages)}; "
                             "load it into the pipeline that saved it")
        self._pending = state

    def __len__(self) -> int:
        if self._size is None:
            raise TypeError(f"{type(self).__name__} has no length; set one with .with_length(n)")
        return self._size

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    # -- composition -----------------------------------------------------------------------------
    def compose(self, *stages: Callable[[Iterator[Any]], Iterator[Any]]) -> Any:
        """A new pipeline with ``stages`` (each ``iterator -> iterator``) appended."""
        new = copy.copy(self)
        new._stages = self._stages + tuple(stages)
        return new

    def _with(self, **attrs: Any) -> Any:
        new = copy.copy(self)
        for name, value in attrs.items():
            setattr(new, name, value)
        return new

    def with_length(self, n: int, silent: bool = False) -> Any:
        """Set what ``len()`` returns (it does not change how many samples an epoch has)."""
        return self._with(_size=int(n))

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> Any:
        """Each ``iter()`` yields exactly ``max(nsamples, nbatches)`` items, restarting the stream as needed."""
        return self._with(_repetitions=sys.maxsize, _nsamples=max(nsamples, nbatches))

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> Any:
        """Run the stream ``nepochs`` times (forever when not positive), at most ``nbatches`` items."""
        return self._with(_repetitions=nepochs if nepochs > 0 else sys.maxsize, _nsamples=nbatches)

    # -- stages ----------------------------------------------------------------------------------
    def shuffle(self, size: int, initial: int = 100, seed: Any = None, rng: random.Random | None = None,
                handler: Any = None) -> Any:
        """Shuffle within a buffer of ``size`` items (``size < 1``: unchanged), with webdataset's draws: ``seed``
        restarts ``random.Random(seed)`` every pass, ``rng`` draws on from that generator, neither seeds from the
        OS. ``handler`` is accepted and unused, as in webdataset."""
        if size < 1:
            return self
        return self.compose(Shuffle(size, initial, seed=seed, rng=rng))

    def map(self, f: Callable[[Any], Any], handler: HandlerArg = None) -> Any:
        """Apply ``f`` to every item (``None`` results are dropped)."""
        return self.compose(Stage(_s.map_stage, f=f, handler=resolve_handler(handler)))

    def select(self, predicate: Callable[[Any], bool], **kw: Any) -> Any:
        """Keep the items for which ``predicate`` is true."""
        return self.compose(Stage(_s.select, predicate=predicate))

    def to_tuple(self, *keys: str, handler: HandlerArg = None, missing_is_error: bool = True) -> Any:
        """Dict samples -> tuples of fields; ``"jpg;png"`` takes the first present."""
        return self.compose(Stage(_s.to_tuple, *keys, handler=resolve_handler(handler),
                                  missing_is_error=missing_is_error))

    def map_dict(self, handler: HandlerArg = None, **kw: Callable[[Any], Any]) -> Any:
        """Apply a function per field: ``map_dict(jpg=f, cls=g)``."""
        return self.compose(Stage(_s.map_dict, handler=resolve_handler(handler), **kw))

    def map_tuple(self, *fs: Callable[[Any], Any] | None, handler: HandlerArg = None) -> Any:
        """Apply the i-th function to the i-th tuple element."""
        return self.compose(Stage(_s.map_tuple, *fs, handler=resolve_handler(handler)))

    def rename(self, handler: HandlerArg = None, keep: bool = True, **kw: str) -> Any:
        """Rename fields: ``rename(image="jpg;png", label="cls")``."""
        return self.compose(Stage(_s.rename, handler=resolve_handler(handler), keep=keep, **kw))

    def slice(self, *args: int | None) -> Any:
        """``itertools.islice`` over the items."""
        return self.compose(Slice(*args))

    def batched(self, batchsize: int, collation_fn: Callable[[list[Any]], Any] | None = _s.default_collation_fn,
                partial: bool = True) -> Any:
        """Group items into batches of ``batchsize`` collated by ``collation_fn``."""
        return self.compose(Batched(batchsize, collation_fn, partial))

    def unbatched(self) -> Any:
        """Split batches back into items."""
        return self.compose(Stage(_s.unbatched))

    def listed(self, batchsize: int, partial: bool = True) -> Any:
        """Group items into plain lists of ``batchsize``."""
        return self.compose(Batched(batchsize, None, partial))

    def unlisted(self) -> Any:
        """Flatten lists of items."""
        return self.compose(Stage(_s.unlisted))

    def decode(self, *args: Any, pre: Any = None, post: Any = None, only: Any = None, partial: bool = False,
               handler: HandlerArg = None, allow_pickle: bool | None = None) -> Any:
        """Decode fields by extension: image specs (``"pil"``, ``"rgb8"``, ``"torchrgb"``, ...) and/or
        handler callables, then the default table. Unpickling formats need ``allow_pickle=True``."""
        from .decoders import decoder_from_args

        decoder = decoder_from_args(*args, pre=pre, post=post, only=only, partial=partial, allow_pickle=allow_pickle)
        return self.compose(Stage(_s.map_stage, f=decoder, handler=resolve_handler(handler)))

    # -- webdataset's further fluid methods --------------------------------------------------------
    def rsample(self, p: float = 0.5) -> Any:
        """Keep each item with probability ``p`` (drawn from the global ``random`` module, as webdataset)."""
        return self.compose(Stage(_s.rsample, p=p))

    def extract_keys(self, *patterns: str | list[str], **kw: Any) -> Any:
        """Dict samples -> tuples of the fields matching glob ``patterns`` (see :func:`~wds_async.extract_keys`)."""
        return self.compose(Stage(_p.extract_keys, *patterns, **kw))

    def rename_keys(self, *args: tuple[str, str], **kw: Any) -> Any:
        """Rename fields by glob pattern: ``rename_keys(image="*.png")`` (see :func:`~wds_async.rename_keys`)."""
        return self.compose(Stage(_p.rename_keys, *args, **kw))

    def xdecode(self, *args: tuple[str, Callable[[Any], Any]], **kw: Any) -> Any:
        """Decode fields with stream decoders chosen by glob pattern (see :func:`~wds_async.xdecode`)."""
        return self.compose(Stage(_p.xdecode, *args, **kw))

    def mcached(self) -> Any:
        """Keep the items of the first complete pass in memory and replay them on later passes."""
        from .stages.cached import Cached

        return self.compose(Cached())

    def lmdb_cached(self, *args: Any, **kw: Any) -> Any:
        """Cache the items of the first complete pass in an LMDB file (see :class:`~wds_async.LMDBCached`)."""
        from .stages.cached import LMDBCached

        return self.compose(LMDBCached(*args, **kw))
