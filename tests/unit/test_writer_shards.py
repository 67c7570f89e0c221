"""ShardWriter (rollover by count and size, ``post``, openers, patterns) and ``pipe:`` destinations (exit status,
commands that fail or stop reading, forbidden pipes, unwritable schemes).

The shared helpers live in ``writer_common.py``; TarWriter's output and parity are tested in ``test_writer.py``,
rejected samples, encoder options and the lifecycle in ``test_writer_errors.py``.
"""

from __future__ import annotations

import gzip
import io
import shlex
import tarfile
from pathlib import Path
from typing import Any

import pytest
import webdataset

from tests.conftest import break_second_write
from tests.unit.writer_common import MTIME, assert_roundtrip, cbor_handler, make_sample, read_webdataset
from wds_async.errors import NotFound, PipeError, UrlError
from wds_async.write.writer import ShardWriter, TarWriter

# -- ShardWriter ---------------------------------------------------------------------------------------


def count_members(path: Path) -> int:
    with tarfile.open(path) as tf:
        return len(tf.getmembers())


def test_shardwriter_maxcount_rollover_and_post(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    closed: list[str] = []
    pattern = str(tmp_path / "shard-%06d.tar")
    samples = [make_sample(i) for i in range(10)]
    with ShardWriter(pattern, maxcount=3, post=closed.append, start_shard=5) as sink:
        for sample in samples:
            sink.write(sample)
        assert (sink.shard, sink.count, sink.total, sink.fname) == (9, 1, 10, pattern % 8)
    names = [pattern % n for n in range(5, 9)]
    assert closed == names and sorted(str(p) for p in tmp_path.iterdir()) == names
    fields = len(samples[0]) - 1
    assert [count_members(Path(n)) for n in names] == [3 * fields] * 3 + [fields]
    assert_roundtrip(samples, read_webdataset(names, cbor_handler, "rgb8"))
    assert "# writing" in capsys.readouterr().err  # verbose=1 by default, as webdataset, but on stderr
    sink.close()  # idempotent


def test_shardwriter_maxsize_matches_webdataset(tmp_path: Path) -> None:
    samples = [{"__key__": f"k{i}", "bin": bytes(100 + i)} for i in range(10)]
    layouts = []
    for cls, sub in ((ShardWriter, "ours"), (webdataset.ShardWriter, "theirs")):
        (tmp_path / sub).mkdir()
        sink = cls(str(tmp_path / sub / "%d.tar"), maxsize=250, verbose=0, mtime=1)
        for sample in samples:
            sink.write(sample)
        sink.close()
        layouts.append([(p.name, p.read_bytes()) for p in sorted((tmp_path / sub).iterdir())])
    assert layouts[0] == layouts[1]
    assert [count_members(tmp_path / "ours" / name) for name, _ in layouts[0]] == [3, 3, 3, 1]


def test_shardwriter_passes_kw_and_uses_opener(tmp_path: Path) -> None:
    opened: list[Any] = []

    def opener(fname: str) -> Any:
        opened.append(open(fname, "wb"))  # noqa: SIM115 (ShardWriter closes it)
        return opened[-1]

    with ShardWriter(str(tmp_path / "o-%d"), maxcount=1, opener=opener, compress=True, mtime=3, verbose=0) as sink:
        sink.write({"__key__": "a", "txt": "1"})
        sink.write({"__key__": "b", "txt": "2"})
    assert len(opened) == 2 and all(f.closed for f in opened)
    assert gzip.decompress((tmp_path / "o-1").read_bytes())[512:513] == b"2"


def test_shardwriter_empty_still_writes_one_valid_shard(tmp_path: Path) -> None:
    ShardWriter(str(tmp_path / "e-%d.tar"), verbose=0).close()
    assert count_members(tmp_path / "e-0.tar") == 0


@pytest.mark.parametrize("pattern", ["no-format.tar", "a-%d-%d.tar", "a-%%d.tar"])
def test_shardwriter_rejects_patterns_without_one_number(tmp_path: Path, pattern: str) -> None:
    with pytest.raises(ValueError, match="pattern"):
        ShardWriter(str(tmp_path / pattern), verbose=0)
    assert not list(tmp_path.iterdir())


# -- pipe: ---------------------------------------------------------------------------------------------


def test_pipe_nonzero_exit_raises_with_stderr_tail(tmp_path: Path) -> None:
    writer = TarWriter("pipe:cat > /dev/null; echo 'upload refused' >&2; exit 3")
    writer.write({"__key__": "k", "txt": "a"})
    with pytest.raises(PipeError, match=r"exited with status 3.*upload refused") as info:
        writer.close()
    assert info.value.returncode == 3 and info.value.stderr_tail == "upload refused"
    writer.close()  # reported once


def test_pipe_command_not_found() -> None:
    writer = TarWriter("pipe:no-such-command-wds-async-xyz")
    with pytest.raises(NotFound, match="127"):
        writer.close()


def test_pipe_command_that_stops_reading_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(PipeError, match="before reading all its input"), TarWriter("pipe:head -c 10 >/dev/null") as w:
        for i in range(50):
            w.write({"__key__": f"k{i}", "bin": bytes(1 << 16)})


def test_failure_mid_write_kills_the_pipe_command(tmp_path: Path) -> None:
    flag = tmp_path / "committed"
    writer = TarWriter(f"pipe:cat > {tmp_path}/x.tar && touch {flag}")
    writer.write({"__key__": "k0", "txt": "a"})
    break_second_write(writer)
    with pytest.raises(KeyboardInterrupt):
        writer.write({"__key__": "k1", "txt": "b"})
    with pytest.raises(ValueError, match="failed TarWriter"):
        writer.write({"__key__": "k2", "txt": "c"})
    writer.close()  # kills the command's process group: a half-written archive is never committed
    assert not flag.exists()


def test_failure_mid_write_leaves_no_end_marker() -> None:
    class Full(io.BytesIO):
        def write(self, data: Any) -> int:
            if self.tell() > 600:
                raise OSError(28, "No space left on device")
            return super().write(data)

    buf = Full()
    writer = TarWriter(buf, mtime=1)
    writer.write({"__key__": "k0", "txt": "a"})
    with pytest.raises(OSError, match="No space"):
        writer.write({"__key__": "k1", "bin": bytes(2000)})
    writer.close()
    assert buf.getvalue()[-1024:] != bytes(1024)  # a reader will see a truncated archive, not a short one


def test_shardwriter_through_pipe(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    samples = [make_sample(i) for i in range(5)]
    with ShardWriter(f"pipe:cat > {shlex.quote(str(tmp_path))}/p-%02d.tar", maxcount=2, mtime=MTIME) as sink:
        for sample in samples:
            sink.write(sample)
    names = [str(tmp_path / f"p-{n:02d}.tar") for n in range(3)]
    assert sorted(str(p) for p in tmp_path.iterdir()) == names
    assert_roundtrip(samples, read_webdataset(names, cbor_handler, "rgb8"))
    out = capsys.readouterr()
    assert out.out == "" and out.err.count("# writing") == 3


def test_pipes_can_be_forbidden(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WDS_ASYNC_NO_PIPE", "1")
    with pytest.raises(UrlError, match="WDS_ASYNC_NO_PIPE"):
        TarWriter(f"pipe:cat > {tmp_path}/x.tar")
    with pytest.raises(UrlError):
        ShardWriter(f"pipe:cat > {tmp_path}/x-%d.tar", verbose=0)
    assert not list(tmp_path.iterdir())


def test_unwritable_schemes_are_refused() -> None:
    for url in ("http://host/shard.tar", "https://host/shard.tar", "ftp://host/shard.tar"):
        with pytest.raises(UrlError, match=r"cannot write|unknown URL scheme"):
            TarWriter(url)
