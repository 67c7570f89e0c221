"""The local sink (a ``.x.tar.<random>.wds-partial`` file renamed into place), what ``open_sink`` accepts, and the writers'
all-or-nothing rule on local files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import wds_async as wds
from tests.conftest import break_second_write
from wds_async._atomic import is_partial
from wds_async.write.sinks import Sink, open_sink
from wds_async.write.sinks.local import LocalSink


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_the_file_appears_whole_at_close(tmp_path: Path) -> None:
    target = tmp_path / "x.tar"
    sink = open_sink(f"file://{target}")
    assert isinstance(sink, LocalSink) and isinstance(sink, Sink)
    assert sink.write(b"abc") == 3 and sink.write(memoryview(b"def")) == 3
    sink.flush()
    [partial] = _names(tmp_path)
    assert is_partial(partial) and partial.startswith(".x.tar.") and not target.exists()
    sink.close()
    sink.close()
    assert _names(tmp_path) == ["x.tar"] and target.read_bytes() == b"abcdef"
    assert sink.identity is not None and sink.identity.size == 6
    sink.abort()  # after a commit: nothing to undo
    assert target.read_bytes() == b"abcdef"


def test_abort_leaves_what_was_there(tmp_path: Path) -> None:
    target = tmp_path / "x.tar"
    target.write_bytes(b"old")
    sink = open_sink(str(target))
    sink.write(b"new and longer")
    sink.abort()
    sink.abort()
    assert _names(tmp_path) == ["x.tar"] and target.read_bytes() == b"old"
    with pytest.raises(wds.BackendError, match="closed"):
        sink.write(b"more")


def test_errors_name_the_path(tmp_path: Path) -> None:
    with pytest.raises(wds.NotFound, match="directory does not exist") as caught:
        open_sink(str(tmp_path / "missing" / "x.tar"))
    assert caught.value.url == str(tmp_path / "missing" / "x.tar")


def test_a_device_is_written_in_place() -> None:
    sink = open_sink("/dev/null")
    sink.write(b"x" * 1000)
    sink.close()
    assert sink.identity is not None and sink.identity.size is None


@pytest.mark.parametrize("url", ["http://host/x.tar", "https://host/x.tar", "ftp://host/x.tar", "pipe:cat"])
def test_unwritable_urls_are_refused(url: str) -> None:
    with pytest.raises(wds.UrlError, match="cannot write"):
        open_sink(url)


def test_interrupted_writer_leaves_no_file(tmp_path: Path) -> None:
    writer = wds.TarWriter(str(tmp_path / "x.tar"))
    writer.write({"__key__": "k0", "txt": "a"})
    break_second_write(writer)
    with pytest.raises(KeyboardInterrupt):
        writer.write({"__key__": "k1", "txt": "b"})
    writer.close()
    assert _names(tmp_path) == [] and writer.identity is None


def test_an_exception_out_of_with_discards_the_shard(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), wds.TarWriter(str(tmp_path / "x.tar")) as writer:
        writer.write({"__key__": "k0", "txt": "a"})
        raise RuntimeError("stop")
    assert _names(tmp_path) == []
    pattern, index = str(tmp_path / "s-%02d.tar"), tmp_path / "index.jsonl"
    with pytest.raises(RuntimeError), wds.ShardWriter(pattern, maxcount=2, verbose=0, index=index) as shards:
        for i in range(3):
            shards.write({"__key__": f"k{i}", "txt": "a"})
        raise RuntimeError("stop")
    assert _names(tmp_path) == ["s-00.tar"]  # the closed shard stays; the open one and the index do not
    assert [s["__key__"] for s in wds.WebDataset(pattern % 0)] == ["k0", "k1"]


def test_shard_writer_index_records_the_committed_size(tmp_path: Path) -> None:
    pattern = str(tmp_path / "s-%02d.tar")
    with wds.ShardWriter(pattern, maxcount=2, verbose=0, index=tmp_path / "index.jsonl") as shards:
        for i in range(5):
            shards.write({"__key__": f"k{i}", "txt": "a" * i})
    entries = wds.ShardIndex.load(tmp_path / "index.jsonl").shards
    assert [e.size for e in entries] == [os.path.getsize(pattern % n) for n in range(3)]
    assert not [name for name in _names(tmp_path) if is_partial(name)]
