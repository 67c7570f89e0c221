"""Stages that keep the items of a first complete pass and replay them afterwards: :class:`Cached` in memory,
:class:`LMDBCached` in an LMDB file that outlives the process (``pip install 'wds-async[lmdb]'``).

A pass that stops early (``break``, an error) caches nothing, so a cache is always a whole pass. Put the
stage after the expensive steps (download, decode, augment-free transforms) and before anything random.
With DataLoader workers, each worker caches its own share: ``Cached`` in its own memory, while processes
that name one LMDB file would overwrite each other's items, so use ``LMDBCached`` in one process per file.

Differences from webdataset 1.0.2's ``LMDBCached``: items are stored under their position (``000000000042``),
not their ``__key__``, so a replay returns every item in the order it was first seen; webdataset stores by
``__key__`` and so loses items whose keys repeat and replays in key order. The LMDB environment is opened on
first use in each process (stages naming one file share it), so the stage pickles into spawned workers
and is safe across fork. The file holds pickles of your own items and is read back with ``pickler.loads``:
point it only at files this code wrote.
"""

from __future__ import annotations

import importlib
import os
import pickle
import types
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from ...errors import MissingDependency

__all__ = ["Cached", "LMDBCached"]

_COMPLETE = b"_"  # the marker a finished pass writes; sorts after the digit keys, as webdataset's does
#: LMDB refuses to open one file twice in a process, so stages naming the same file (copies, unpickled
#: duplicates) share its environment, which closes once the last of them is gone.
_OPEN: weakref.WeakValueDictionary[tuple[int, str], Any] = weakref.WeakValueDictionary()


class Cached:
    """Keep the items of the first complete pass in memory; later passes replay them without reading the
    source."""

    def __init__(self) -> None:
        self.cached: list[Any] | None = None

    def __call__(self, source: Iterable[Any]) -> Iterator[Any]:
        if self.cached is not None:
            yield from self.cached
            return
        items: list[Any] = []
        for item in source:
            items.append(item)
            yield item
        self.cached = items

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        """One pass (webdataset's ``PipelineStage.run``)."""
        return self(source)


class LMDBCached:
    """Keep the items of the first complete pass in the LMDB database ``fname``; later passes, in this process
    or a new one, replay them from there.

    ``map_size``: the most bytes the database may grow to (address space, not disk, is reserved);
    ``pickler``: any object with ``dumps``/``loads``; ``chunksize``: items written per transaction."""

    def __init__(self, fname: str | os.PathLike[str], map_size: float = 1e12, pickler: Any = pickle,
                 chunksize: int = 500) -> None:
        _import_lmdb()  # fail at construction, with the install hint, rather than at the first item
        if chunksize < 1:
            raise ValueError(f"LMDBCached: chunksize must be >= 1, got {chunksize}")
        self.fname = os.fspath(fname)
        self.map_size = int(map_size)
        self.pickler = pickler
        self.chunksize = chunksize
        self._db: Any = None
        self._pid = -1

    @property
    def db(self) -> Any:
        """This process's LMDB environment, opened on first use (again after a fork)."""
        if self._db is None or self._pid != os.getpid():
            key = (os.getpid(), os.path.realpath(self.fname))
            db = _OPEN.get(key)
            if db is None:
                db = _OPEN[key] = _import_lmdb().open(self.fname, readonly=False, map_size=self.map_size)
            self._db, self._pid = db, os.getpid()
        return self._db

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_db"], state["_pid"] = None, -1
        if isinstance(self.pickler, types.ModuleType):  # a module (the default, pickle) travels by name
            state["pickler"] = _ModuleName(self.pickler.__name__)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        if isinstance(state["pickler"], _ModuleName):
            state["pickler"] = importlib.import_module(state["pickler"])
        self.__dict__.update(state)

    def is_complete(self) -> bool:
        """Whether a whole pass is stored."""
        with self.db.begin(write=False) as txn:
            return txn.get(_COMPLETE) is not None

    def __call__(self, source: Iterable[Any]) -> Iterator[Any]:
        if self.is_complete():
            with self.db.begin(write=False) as txn:
                for key, value in txn.cursor():
                    if key != _COMPLETE:
                        yield self.pickler.loads(value)
            return
        db = self.db
        with db.begin(write=True) as txn:
            txn.drop(db.open_db(), delete=False)  # leftovers of an interrupted pass
        chunk: list[tuple[bytes, bytes]] = []
        for i, item in enumerate(source):
            chunk.append((b"%012d" % i, self.pickler.dumps(item)))
            if len(chunk) >= self.chunksize:
                self._put(chunk)
                chunk = []
            yield item
        self._put([*chunk, (_COMPLETE, b"1")])

    def _put(self, pairs: list[tuple[bytes, bytes]]) -> None:
        with self.db.begin(write=True) as txn:
            for key, value in pairs:
                txn.put(key, value)

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        """One pass (webdataset's ``PipelineStage.run``)."""
        return self(source)

    def close(self) -> None:
        """Let go of this process's LMDB environment (it closes when no stage on the same file holds it; the
        next use reopens it)."""
        self._db, self._pid = None, -1


class _ModuleName(str):
    """A pickler module's name in a pickled stage."""


def _import_lmdb() -> Any:
    try:
        import lmdb
    except ImportError:
        raise MissingDependency("LMDBCached needs the lmdb package: pip install 'wds-async[lmdb]'") from None
    return lmdb
