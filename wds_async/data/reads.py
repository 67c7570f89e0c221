"""What one process reads an :class:`~wds_async.IndexedWebDataset` with: its engine, its item ids, the shards it knows
to have a local copy, and the batches it reads ahead; and the reads planned for one batch."""

from __future__ import annotations

import dataclasses
import os
import threading
from typing import Any

from ..engine.fetcher import Requests
from ..engine.spec import StreamSpec
from ..engine.work import WorkItem
from ..stats import Stats
from .readahead import Ahead

__all__ = ["Planned", "ProcessReads"]


@dataclasses.dataclass
class Planned:
    """The reads of one batch: its work items, per item id its shard and ``{offset: sample}`` (None: a shard read
    whole to learn its layout), and the samples asked for by shard."""

    items: list[WorkItem]
    wanted: dict[int, tuple[int, dict[int, int] | None]]
    by_shard: dict[int, set[int]]


class ProcessReads:
    """What one process reads with: its engine, its item ids, the shards it knows to have a local copy, and the
    batches it reads ahead (by their position in the followed order)."""

    def __init__(self, spec: StreamSpec) -> None:
        self.pid = os.getpid()
        self.requests = Requests(spec, Stats())
        self.lock = threading.Lock()
        self._ids = 0
        self.copied: set[int] = set()
        self.ahead: Ahead | None = None
        #: Batches read ahead, by (epoch, position) in the followed order; guarded by ahead_lock, as is ahead.
        self.pending: dict[tuple[int, int], Planned] = {}
        self.ahead_lock = threading.Lock()
        #: Guesses were submitted to this engine since it last failed: an error may be theirs, not the batch's.
        self.guessed = False

    def drop_ahead(self, keep_after: tuple[int, int] | None = None) -> None:
        """Forget the batches read ahead, but those of the same epoch after the position ``keep_after`` names."""
        for key in [k for k in self.pending if keep_after is None or k[0] != keep_after[0] or k[1] <= keep_after[1]]:
            self.requests.discard(item.id for item in self.pending.pop(key).items)

    def next_id(self) -> int:
        self._ids += 1
        return self._ids

    def has_copy(self, cache: Any, shard: int, url: str) -> bool:
        if shard in self.copied or not cache.cacheable(url):
            return True
        if os.path.exists(cache.path(url, ".json")) and os.path.exists(cache.path(url)):
            self.copied.add(shard)
            return True
        return False
