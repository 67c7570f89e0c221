"""Shard sources of the pipeline form and the stages that reshape a shard stream.

* :class:`SimpleShardList`: each URL once, optionally shuffled; :func:`shardspec` builds one from a string.
* :class:`ResampledShards`: shards drawn with replacement, endlessly or ``nshards`` of them, with webdataset's
  positional arguments and its seeding: ``deterministic=True`` seeds from ``(worker_seed(), epoch, seed)``
  (the same draws as webdataset 1.0.2), the epoch advancing on every new iteration.
* :func:`resampled` (a stage: draw ``n`` items with replacement from whatever came before) and
  :func:`non_empty` (raise when a stage received nothing).

Items are ``{"url": ...}`` dicts, which :func:`~wds_async.data.pipeline.tarfile_samples` reads.
"""

from __future__ import annotations

import os
import random
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

from ..errors import UrlError
from ..urls import expand_urls
from ._torch import IterableDataset
from .stages.base import pipelinefilter
from .topology import node_info, worker_info

__all__ = ["ResampledShards", "SimpleShardList", "default_worker_seed", "make_seed", "non_empty", "resampled",
           "shardspec"]


class SimpleShardList(IterableDataset):  # type: ignore[type-arg]
    """Yields ``{"url": u}`` for each shard URL (brace patterns expanded), optionally shuffled by ``seed``.

    As in webdataset, ``seed`` shuffles with ``random.Random(seed)``, the same order on every pass; ``seed=True``
    draws one from the clock. To reshuffle per epoch, set ``.seed`` (``pipeline.stage(0).seed = epoch``), or use
    ``WebDataset(urls, shardshuffle=True)``, which reshuffles every epoch by itself."""

    def __init__(self, urls: str | Iterable[str], seed: int | bool | None = None) -> None:
        super().__init__()
        self.urls = expand_urls(urls)
        self.seed: int | float | None = time.time() if seed is True else seed

    def __len__(self) -> int:
        return len(self.urls)

    def __iter__(self) -> Iterator[dict[str, str]]:
        urls = list(self.urls)
        if self.seed is not None:
            random.Random(self.seed).shuffle(urls)
        for url in urls:
            yield {"url": url}


def shardspec(spec: str) -> SimpleShardList:
    """The shard list a spec string names: brace patterns and ``::``-joined lists (webdataset's ``shardspec``).

    webdataset also reads a ``.yaml`` file of several sources (its deprecated ``MultiShardSample``); that is
    refused here with a :class:`~wds_async.UrlError`."""
    if spec.endswith(".yaml"):
        raise UrlError(f"YAML shard specs (webdataset's deprecated MultiShardSample) are not supported: {spec!r}; "
                       "list the shards as a brace pattern, or mix sources with RandomMix / RoundRobin", url=spec)
    return SimpleShardList(spec)


def make_seed(*parts: Any) -> int:
    """A 31-bit seed folded from ``parts``: webdataset's formula (``seed * 31 + hash(part)``) for numbers, where
    ``hash`` is the same in every process; other parts are hashed with CRC-32 of their ``repr`` instead, which
    is stable across processes where ``hash`` of a string is not."""
    seed = 0
    for part in parts:
        h = hash(part) if isinstance(part, (int, float)) else zlib.crc32(repr(part).encode())
        seed = (seed * 31 + h) & 0x7FFFFFFF
    return seed


def default_worker_seed() -> int:
    """webdataset's default worker seed: ``rank * 1000 + worker``."""
    rank, _ = node_info()
    worker, _ = worker_info()
    return rank * 1000 + worker


class ResampledShards(IterableDataset):  # type: ignore[type-arg]
    """An endless (or ``nshards`` long) stream of shards drawn with replacement.

    ``deterministic=True`` seeds each iteration from ``make_seed(worker_seed(), epoch, seed)``, so ranks and
    workers draw differently and a run can be repeated; otherwise each iteration seeds from the OS
    (``WDS_SHOW_SEED=1`` prints the seed, as in webdataset). Each shard is ``urls[rng.randint(0, len - 1)]``,
    webdataset 1.0.2's draw. ``epoch``
    starts at -1 and is incremented by every new iteration, so each epoch draws anew. ``urls``: a pattern
    (expanded) or a sequence; at most ``max_urls`` are taken from a non-list iterable. With ``empty_check``
    an empty list raises ``ValueError``; without, the stream is empty."""

    def __init__(self, urls: str | Iterable[str], nshards: int = sys.maxsize, seed: int = 0,
                 worker_seed: Callable[[], int] | None = None, deterministic: bool = False,
                 max_urls: int = int(1e6), empty_check: bool = True) -> None:
        super().__init__()
        if not isinstance(urls, (str, list)):
            urls = list(islice(urls, max_urls))
        if isinstance(urls, list) and not urls:
            if empty_check:
                raise ValueError("empty_check=True, but ResampledShards was given no shards")
            self.urls: list[str] = []
        else:
            self.urls = expand_urls(urls)
        self.nshards = nshards
        self.seed = seed
        self.worker_seed = worker_seed if worker_seed is not None else default_worker_seed
        self.deterministic = deterministic
        self.epoch = -1

    def __iter__(self) -> Iterator[dict[str, str]]:
        self.epoch += 1
        if self.deterministic:
            seed = make_seed(self.worker_seed(), self.epoch, self.seed)
        else:
            seed = random.SystemRandom().getrandbits(64)  # webdataset mixes pid, clock and os.urandom into one
        if os.environ.get("WDS_SHOW_SEED", "0") == "1":
            print(f"# ResampledShards seed {seed}")
        self.rng = random.Random(seed)
        if not self.urls:
            return
        last = len(self.urls) - 1
        for _ in range(self.nshards):
            yield {"url": self.urls[self.rng.randint(0, last)]}



def _resampled(src: Iterable[Any], n: int = sys.maxsize) -> Iterator[Any]:
    items = list(src)
    if not items:
        raise ValueError("resampled: the stage before it yielded nothing to draw from")
    rng = random.Random()  # seeded from os.urandom, different in every process and pass
    for _ in range(n):
        yield rng.choice(items)


#: Stage: collect the input, then draw ``n`` items from it with replacement (endless by default).
resampled = pipelinefilter(_resampled)


def non_empty(src: Iterable[Any]) -> Iterator[Any]:
    """Pass items through; raise ``ValueError`` at the end if there were none."""
    count = 0
    for item in src:
        count += 1
        yield item
    if count == 0:
        raise ValueError("non_empty: the stage before it yielded no items at all")
