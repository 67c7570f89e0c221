"""The explicit pipeline form (webdataset's ``DataPipeline``), its splitters and the tar-reading stage.

    ds = wds.DataPipeline(
        wds.SimpleShardList("shards-{000000..000099}.tar"),
        wds.shuffle(100),            # shuffles the shard list
        wds.split_by_worker,
        wds.tarfile_to_samples(),    # the async engine: many shards in flight, exactly once
        wds.shuffle(1000), wds.decode("pil"), wds.to_tuple("png", "json"), wds.batched(16),
    )

Shard streams are items ``{"url": ...}`` (plain strings are accepted too); the sources are in
:mod:`wds_async.data.shardlists`. ``tarfile_to_samples()`` (or the uncurried ``tarfile_samples``) hands the
stream to the engine, which pulls it lazily in its loop thread, so an endless
:class:`~wds_async.ResampledShards` stream works.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import Any

from ..config import EngineConfig
from ..engine.bridge import Bridge
from ..engine.grouping import Sample
from ..engine.spec import StreamSpec
from ..engine.work import ItemDone
from ..stats import Stats
from ._torch import DataLoader, IterableDataset, require_torch
from .fluid import FluidPipeline
from .handlers import reraise_exception, resolve_handler
from .recorder import Recorder
from .stages.base import Stage
from .topology import node_info, worker_info

__all__ = [
    "DataPipeline", "FluidWrapper", "WebLoader", "deliver", "node_info", "split_by_node", "split_by_worker", "stream_samples",
    "tarfile_samples", "tarfile_to_samples", "worker_info",
]


def split_by_node(src: Iterable[Any], group: Any = None) -> Iterator[Any]:
    """This rank's share of a shard stream: every ``world``-th item starting at ``rank``."""
    rank, world = node_info()
    return itertools.islice(src, rank, None, world)


def split_by_worker(src: Iterable[Any]) -> Iterator[Any]:
    """This DataLoader worker's share of a shard stream."""
    worker, count = worker_info()
    return itertools.islice(src, worker, None, count)


def _url(item: Any) -> Any:
    return item["url"] if isinstance(item, dict) else item


def stream_samples(urls: Iterable[Any], spec: StreamSpec, *, stats: Stats | None = None,
                   recorder: Recorder | None = None) -> Generator[Any, None, None]:
    """Samples of the shards in ``urls`` (a list or a lazy stream of URLs, ``{"url": ...}`` or
    :class:`~wds_async.engine.work.WorkItem`) read as ``spec`` says: in this process, by a bridge that lives exactly
    as long as this generator, or, with ``spec.service``, by the node service. Both hand over the same lists
    (samples, end-of-item markers, errors to raise), consumed here by one loop, so planning, callbacks and
    checkpoints are the same either way.

    ``recorder`` (a :class:`~wds_async.data.recorder.Recorder`) is told the positions of the samples yielded and
    each work item whose samples were all yielded: what a checkpoint needs to know."""
    stats = stats if stats is not None else Stats()
    batches: Generator[list[Any], None, None] | Iterator[list[Any]]
    if spec.service is not None:
        from ..service.client import service_batches

        batches = service_batches(urls, spec, stats)
        close: Callable[[], None] = batches.close
    else:
        bridge = Bridge((_url(item) for item in urls) if not isinstance(urls, list) else [_url(u) for u in urls],
                        spec, stats)
        bridge.start()
        batches, close = bridge.batches(), bridge.close
    yield from deliver(batches, close, recorder=recorder)


def deliver(batches: Iterator[list[Any]], close: Callable[[], None] | None = None, *,
            recorder: Recorder | None = None) -> Generator[Any, None, None]:
    """The samples in ``batches`` (lists of samples, end-of-item markers and errors, as a bridge hands them
    over), errors raised in position; ``recorder`` (see :func:`stream_samples`) is told where each ends.
    ``close()`` (and the batches' own ``close``) runs when the generator ends for any reason.

    A list is yielded in runs between its end-of-item markers, found at C speed (``list.count``, ``list.index``
    over the items' types), each run through ``yield from``: no bytecode of ours per sample. A list that holds an
    error goes item by item."""
    runs: Callable[[list[Any]], Iterator[Any]] = recorder.run if recorder is not None else iter
    try:
        for batch in batches:
            kinds = list(map(type, batch))
            n = len(batch)
            plain = kinds.count(Sample)
            if plain == n:
                yield from runs(batch)
                continue
            if plain + kinds.count(ItemDone) < n:
                yield from _one_by_one(batch, runs, recorder)
                continue
            start = 0
            while start < n:
                try:
                    stop = kinds.index(ItemDone, start)
                except ValueError:
                    stop = n
                if stop > start:
                    yield from runs(batch[start:stop])
                if stop < n and recorder is not None:
                    recorder.item_done(batch[stop].id)
                start = stop + 1
    finally:
        if recorder is not None:
            recorder.close()
        stop_batches = getattr(batches, "close", None)
        if stop_batches is not None:
            stop_batches()
        if close is not None:
            close()


def _one_by_one(batch: list[Any], runs: Callable[[list[Any]], Iterator[Any]],
                recorder: Recorder | None) -> Generator[Any, None, None]:
    """A list that holds an error: its samples up to the error, in runs, then the error raised."""
    run: list[Any] = []
    for item in batch:
        kind = type(item)
        if kind is not ItemDone and not isinstance(item, BaseException):
            run.append(item)
            continue
        if run:
            yield from runs(run)
            run = []
        if kind is ItemDone:
            if recorder is not None:
                recorder.item_done(item.id)
        else:
            raise item
    if run:
        yield from runs(run)


def tarfile_samples(src: Iterable[Any], handler: Callable[[BaseException], bool] | str | None = reraise_exception,
                    select_files: Callable[[str], bool] | None = None, rename_files: Callable[[str], str] | None = None,
                    **engine: Any) -> Iterator[Any]:
    """A stream of shards (``{"url": ...}`` or URL strings) -> its samples, through the async engine: the stage
    itself, used as ``DataPipeline(SimpleShardList(urls), wds.tarfile_samples, ...)``. ``engine`` takes
    :class:`~wds_async.config.EngineConfig` fields."""
    config = EngineConfig().replace(**engine) if engine else EngineConfig()
    return stream_samples(src, StreamSpec(config, resolve_handler(handler), select_files, rename_files))


def tarfile_to_samples(handler: Any = None, select_files: Callable[[str], bool] | None = None,
                       rename_files: Callable[[str], str] | None = None, **engine: Any) -> Stage:
    """Stage: a stream of shard URLs -> samples, through the async engine. ``engine`` takes
    :class:`~wds_async.config.EngineConfig` fields (``max_connections=``, ``max_buffered_bytes=``, ...)."""
    return Stage(tarfile_samples, handler=handler, select_files=select_files, rename_files=rename_files,
                 **engine)


class DataPipeline(FluidPipeline):
    """``DataPipeline(source, stage, stage, ...)``: a source (an iterable, IterableDataset or DataLoader,
    or a callable returning an iterator) followed by ``iterator -> iterator`` stages."""

    def __init__(self, *args: Any) -> None:
        super().__init__()
        steps: list[Any] = []
        for arg in args:
            if arg is None:
                continue
            steps.extend(arg) if isinstance(arg, list) else steps.append(arg)
        if not steps:
            raise ValueError("DataPipeline needs at least a source")
        self.pipeline = steps

    @staticmethod
    def _invoke(step: Any, *args: Any) -> Any:
        if not args and isinstance(step, (IterableDataset, DataLoader)):
            return iter(step)
        if not args and isinstance(step, list):
            return iter(step)
        if callable(step):
            return step(*args)
        if not args and isinstance(step, Iterable):
            return iter(step)
        raise ValueError(f"{step!r} is not a valid pipeline stage")

    def _source(self, run: Any, resume: Any) -> Iterator[Any]:
        if resume is not None:
            raise ValueError("a DataPipeline cannot resume from a state: its source has no positions; build the "
                             "pipeline with WebDataset(...) for checkpoints")
        stream = self._invoke(self.pipeline[0])
        for step in self.pipeline[1:]:
            stream = self._invoke(step, stream)
        return stream  # type: ignore[no-any-return]

    def stage(self, i: int) -> Any:
        """Step ``i`` of the pipeline: the source is 0, then the stages given, then those appended by fluid
        methods (``DataPipeline(src, wds.detshuffle(10)).stage(1).epoch``)."""
        return [*self.pipeline, *self._stages][i]

    def append(self, step: Any) -> None:
        self.pipeline.append(step)


class FluidWrapper(DataPipeline):
    """webdataset's ``FluidWrapper(iterable)``: that iterable as the source of a pipeline with the fluid methods,
    ``FluidWrapper(RoundRobin([a, b])).shuffle(100)``. Every pipeline here is fluid already, so it is kept for code
    written against webdataset."""

    def __init__(self, initial: Any) -> None:
        super().__init__(initial)


class WebLoader(DataPipeline):
    """A ``torch.utils.data.DataLoader`` with the fluid interface: ``WebLoader(ds, num_workers=4,
    batch_size=None).unbatched().shuffle(1000).batched(64)``. Needs torch (``pip install 'wds-async[torch]'``);
    without it, constructing one raises :class:`~wds_async.errors.MissingDependency`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        require_torch("WebLoader (a torch DataLoader)")
        super().__init__(DataLoader(*args, **kwargs))
