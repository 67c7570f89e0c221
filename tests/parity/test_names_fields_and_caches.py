"""The webdataset 1.0.2 field stages and caches wds_async added for drop-in use (extract_keys, rename_keys, xdecode,
Cached, LMDBCached), run side by side with webdataset on the same input.

The outputs must be equal, or the same exception raised; documented differences (pickle refused by default,
repeated keys kept by LMDBCached) are asserted as such. The sources, shuffles, samplers and mixes are in
``test_names.py``; the helpers both share live in ``names_common.py``, their ``shards`` fixture in ``conftest.py``.
"""

from __future__ import annotations

import io
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import webdataset
from torch.utils.data import IterableDataset

import wds_async
from tests.parity.conftest import ours, reference
from tests.parity.names_common import LIBS, outcome

# -- extract_keys, rename_keys, xdecode -------------------------------------------------------------------

ROWS = [{"__key__": "a", "png": 1, "cls": 2, "x/y.seg.png": 3}, {"__key__": "b", "jpg": 4, "cls": 5, "txt": 6}]


@pytest.mark.parametrize("args,kw", [
    (("png;jpg", "cls"), {}),
    (("*.png;*.jpg", "*.cls"), {}),
    ((".png;.jpg",), {}),
    (("png", "txt"), {"ignore_missing": True}),
    (("png", "txt"), {}),
    (("*png",), {}),
    (("*png",), {"duplicate_is_error": False, "ignore_missing": True}),
    ((["cls", "nothing"],), {}),
])
def test_extract_keys_matches(args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    def run(lib: Any) -> Any:
        return outcome(lambda: list(lib.DataPipeline(lambda: iter([dict(r) for r in ROWS]), lib.extract_keys(*args, **kw))))

    assert run(wds_async) == run(webdataset)


@pytest.mark.parametrize("args,kw", [
    ((), {"image": "png"}),
    ((), {"image": "png", "keep_unselected": True, "must_match": False}),
    ((), {"image": "*png", "must_match": False}),
    ((), {"image": "*png", "must_match": False, "duplicate_is_error": False}),
    ((("image", "*.png"), ("image", "jpg")), {"label": "cls", "must_match": False, "keep_unselected": True}),
    ((), {"label": "CLS", "must_match": False}),
    ((), {"label": "cls", "key": "__key__"}),
])
def test_rename_keys_matches(args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    def run(lib: Any) -> Any:
        return outcome(lambda: list(lib.DataPipeline(lambda: iter([dict(r) for r in ROWS]), lib.rename_keys(*args, **kw))))

    assert run(wds_async) == run(webdataset)


def _upper(stream: io.BytesIO) -> str:
    return stream.read().decode().upper()


@pytest.mark.parametrize("args,kw", [
    ((), {}),
    ((), {"must_decode": False}),
    ((("*.custom", _upper),), {"must_decode": False}),
    ((), {"cls": lambda s: int(s.read()), "custom": _upper}),
    ((("*.txt", _upper),), {"must_decode": False}),
    ((("*.custom", False),), {"cls": lambda s: int(s.read())}),
])
def test_xdecode_matches(args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    rows = [{"__key__": "k", "a.txt": b"hello", "b.bin": b"\x00\x01", "x.CUSTOM": b"shout", "cls": b"7"}]

    def run(lib: Any) -> Any:
        return outcome(lambda: list(lib.DataPipeline(lambda: iter([dict(r) for r in rows]), lib.xdecode(*args, **kw))))

    assert run(wds_async) == run(webdataset)


def test_xdecode_refuses_pickle_unless_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WDS_ASYNC_ALLOW_PICKLE", raising=False)
    rows = [{"__key__": "k", "obj.pyd": pickle.dumps({"a": [1, 2]}), "t.txt": b"x"}]
    with pytest.raises(wds_async.DecodingError, match="allow_pickle"):
        list(wds_async.DataPipeline(lambda: iter(rows), wds_async.xdecode()))
    expected = list(webdataset.DataPipeline(lambda: iter(rows), webdataset.xdecode()))
    assert expected[0]["obj.pyd"] == {"a": [1, 2]}
    assert list(wds_async.DataPipeline(lambda: iter(rows), wds_async.xdecode(allow_pickle=True))) == expected
    monkeypatch.setenv("WDS_ASYNC_ALLOW_PICKLE", "1")
    assert list(wds_async.DataPipeline(lambda: iter(rows), wds_async.xdecode())) == expected


def test_field_stages_as_fluid_methods_on_webdataset(shards: list[str]) -> None:
    def build(ds: Any) -> Any:
        return (ds.rename_keys(image="png", label="cls", keep_unselected=True)
                .xdecode(label=lambda s: int(s.read()), must_decode=False).extract_keys("image", "label"))

    got, expected = ours(shards, build), reference(shards, build)
    assert got == expected and len(got) == 36 and got[0] == (bytes([0, 0]) * 3, 0)


# -- Cached, LMDBCached -----------------------------------------------------------------------------------


class CountingSource(IterableDataset):  # type: ignore[type-arg]
    """A source that counts its passes: a cached replay must not start one."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        super().__init__()
        self.rows, self.passes = rows, 0

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.passes += 1  # counted at the first item pulled (a generator), not at iter()
        yield from [dict(r) for r in self.rows]


ITEMS = [{"__key__": f"k{i:02d}", "v": i, "arr": np.arange(i)} for i in range(23)]


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return len(a) == len(b) and all(x.keys() == y.keys() and x["__key__"] == y["__key__"] and x["v"] == y["v"]
                                    and np.array_equal(x["arr"], y["arr"]) for x, y in zip(a, b))


@LIBS
def test_cached_replays_the_first_complete_pass(lib: Any) -> None:
    source = CountingSource(ITEMS)
    pipeline = lib.DataPipeline(source, lib.Cached())
    first = list(pipeline)
    assert _same(first, ITEMS) and _same(list(pipeline), first) and source.passes == 1
    interrupted = lib.DataPipeline(CountingSource(ITEMS), lib.Cached())
    for _ in zip(range(3), interrupted):
        pass
    assert _same(list(interrupted), ITEMS) and interrupted.stage(0).passes == 2  # a partial pass is not kept


def test_mcached_fluid_method(shards: list[str]) -> None:
    ds = wds_async.WebDataset(shards, deterministic=True).mcached()
    first = [s["__key__"] for s in ds]
    assert [s["__key__"] for s in ds] == first and len(first) == 36


def test_lmdb_cached_replays_across_objects_and_matches(tmp_path: Path) -> None:
    path = str(tmp_path / "ours.lmdb")
    source = CountingSource(ITEMS)
    first = list(wds_async.DataPipeline(source, wds_async.LMDBCached(path, chunksize=5)))
    again = wds_async.DataPipeline(source, wds_async.LMDBCached(path))
    assert _same(first, ITEMS) and _same(list(again), ITEMS) and source.passes == 1
    # Keys unique and in sorted order: webdataset's replay is the same; and it reads the file we wrote.
    theirs = list(webdataset.DataPipeline(CountingSource(ITEMS), webdataset.LMDBCached(str(tmp_path / "w.lmdb"))))
    assert _same(theirs, ITEMS)
    del again
    assert _same(list(webdataset.DataPipeline(CountingSource([]), webdataset.LMDBCached(path))), ITEMS)


def test_lmdb_cached_keeps_repeated_keys_in_order(tmp_path: Path) -> None:
    # The documented difference: webdataset stores by __key__, losing repeats and replaying in key order.
    rows = [{"__key__": k, "v": i} for i, k in enumerate(["b", "a", "b", "c"])]
    ours_ = wds_async.DataPipeline(CountingSource(rows), wds_async.LMDBCached(str(tmp_path / "o.lmdb")))
    assert list(ours_) == rows and list(ours_) == rows
    theirs = webdataset.DataPipeline(CountingSource(rows), webdataset.LMDBCached(str(tmp_path / "w.lmdb")))
    assert list(theirs) == rows and [r["v"] for r in theirs] == [1, 2, 3]


def test_lmdb_cached_pickles_and_reopens(tmp_path: Path) -> None:
    stage = wds_async.LMDBCached(str(tmp_path / "p.lmdb"))
    assert [r["v"] for r in stage(iter(ITEMS[:4]))] == [0, 1, 2, 3]
    copy = pickle.loads(pickle.dumps(stage))  # a spawned worker's copy; shares this process's environment
    assert copy.is_complete() and [r["v"] for r in copy.run(iter([]))] == [0, 1, 2, 3]
    ds = wds_async.MockDataset({"__key__": "m", "v": 1}, 3).lmdb_cached(str(tmp_path / "f.lmdb"))
    assert list(ds) == list(ds) == [{"__key__": "m", "v": 1}] * 3


def test_lmdb_cached_without_lmdb_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "lmdb", None)  # what an interpreter without the package sees
    with pytest.raises(wds_async.MissingDependency, match=r"wds-async\[lmdb\]"):
        wds_async.LMDBCached(str(tmp_path / "x.lmdb"))


