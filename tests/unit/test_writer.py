"""TarWriter's output: read back by webdataset 1.0.2, GNU tar and tarfile; parity; bit-exactness.

The shared samples and read-back helpers live in ``writer_common.py``; ShardWriter rollover and ``pipe:``
destinations are tested in ``test_writer_shards.py``, rejected samples, encoder options and the lifecycle in
``test_writer_errors.py``.
"""

from __future__ import annotations

import gzip
import io
import pickle
import shlex
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import PIL.Image
import pytest
import webdataset

from tests.unit.writer_common import MTIME, assert_roundtrip, cbor_handler, make_sample, read_webdataset, write_bytes
from wds_async.write.writer import ShardWriter, TarWriter, default_handlers


def target(tmp_path: Path, kind: str) -> tuple[str, Path]:
    """(what to pass to TarWriter, the file that ends up holding the shard)."""
    if kind == "pipe":
        path = tmp_path / "piped.tar"
        return f"pipe:cat > {shlex.quote(str(path))}", path
    path = tmp_path / f"out{kind}"
    return str(path), path


# -- read back -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", [".tar", ".tgz", ".tar.gz", ".tar.bz2", ".tar.xz", "pipe"])
def test_every_encoder_reads_back_with_webdataset(tmp_path: Path, kind: str) -> None:
    url, path = target(tmp_path, kind)
    samples = [make_sample(i) for i in range(3)]
    with TarWriter(url) as writer:
        for sample in samples:
            writer.write(sample)
    assert path.stat().st_size > 0
    assert_roundtrip(samples, read_webdataset(str(path), cbor_handler, "rgb8"))


def test_members_named_sorted_and_owned_as_webdataset(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    samples = [make_sample(i) for i in range(2)]
    with TarWriter(str(path), mtime=MTIME) as writer:
        sizes = [writer.write(s) for s in samples]
    with tarfile.open(path) as tf:
        members = tf.getmembers()
        names = [m.name for m in members]
        contents = {m.name: tf.extractfile(m).read() for m in members}  # type: ignore[union-attr]
        assert all(m.isreg() and m.uname == m.gname == "bigdata" and m.uid == m.gid == 0 for m in members)
        assert {(m.mode, m.mtime) for m in members} == {(0o444, MTIME)}
        assert all(not m.pax_headers for m in members)
    expected = [f"{s['__key__']}.{f}" for s in samples for f in sorted(s) if not f.startswith("_")]
    assert names == expected
    assert sizes == [sum(len(contents[f"{s['__key__']}.{f}"]) for f in s if f != "__key__") for s in samples]
    assert contents["dir/sample001.txt"] == "héllo 1".encode()
    assert gzip.decompress(contents["dir/sample001.txt.gz"]) == ("compressed " * 20).encode()
    assert contents["dir/sample001.cls"] == b"1"
    assert contents["dir/sample001.json"] == b'{"i": 1, "list": [1, 2.5, null], "s": "\\u00fc"}'
    assert msgpack.unpackb(contents["dir/sample001.mp"]) == {"i": 1, "b": b"raw"}
    assert pickle.loads(contents["dir/sample001.pyd"]) == {"set": {1, 2}}
    assert PIL.Image.open(io.BytesIO(contents["dir/sample001.pbm"])).mode == "1"
    assert PIL.Image.open(io.BytesIO(contents["dir/sample001.pgm"])).mode == "L"
    assert PIL.Image.open(io.BytesIO(contents["dir/sample001.jpg"])).format == "JPEG"
    assert path.stat().st_size % tarfile.RECORDSIZE == 0


@pytest.mark.parametrize("kind", [".tar", ".tgz", "pipe"])
def test_gnu_tar_lists_and_extracts(tmp_path: Path, kind: str) -> None:
    url, path = target(tmp_path, kind)
    samples = [make_sample(i) for i in range(2)]
    with TarWriter(url, mtime=MTIME) as writer:
        for sample in samples:
            writer.write(sample)
    listing = subprocess.run(["tar", "-tvf", str(path)], check=True, capture_output=True, text=True).stdout
    rows = [line.split() for line in listing.splitlines()]
    assert {(r[0], r[1]) for r in rows} == {("-r--r--r--", "bigdata/bigdata")}
    assert [r[-1] for r in rows] == [f"{s['__key__']}.{f}" for s in samples for f in sorted(s) if f != "__key__"]
    with tarfile.open(path) as tf:
        for name in ("dir/sample000.txt", "dir/sample001.npy", "dir/sample001.png", "dir/sample000.bin"):
            extracted = subprocess.run(["tar", "-xOf", str(path), name], check=True, capture_output=True).stdout
            assert extracted == tf.extractfile(name).read()  # type: ignore[union-attr]
    text = subprocess.run(["tar", "-xOf", str(path), "dir/sample000.txt"], check=True, capture_output=True).stdout
    assert text == "héllo 0".encode()


def test_tarfile_data_filter_extracts_everything(tmp_path: Path) -> None:
    path = tmp_path / "a.tar"
    with TarWriter(str(path)) as writer:
        writer.write({"__key__": "deep/dir/k", "txt": "x", "weird name.json": {"a": 1}})
    with tarfile.open(path) as tf:
        tf.extractall(tmp_path / "x", filter="data")
    assert (tmp_path / "x/deep/dir/k.txt").read_bytes() == b"x"


# -- parity with webdataset 1.0.2 ----------------------------------------------------------------------


# webdataset cannot encode cbor here (it imports the absent ``cbor`` package) and stamps the clock into
# .gz members and .npz archives, has no ``pkl`` encoder, and its pgm/pbm encoders fail with current Pillow
# (KeyError 'PGM'); it takes neither HxWx1 arrays nor torch tensors as images. Every other encoder gives
# the same bytes.
NOT_COMPARABLE = {"cbor", "npz", "txt.gz", "pkl", "pgm", "pbm", "tif", "chw.png"}


@pytest.mark.parametrize("mtime", [MTIME, 1_700_000_000.25])
def test_byte_identical_to_webdataset_with_fixed_mtime(mtime: float) -> None:
    samples = [{k: v for k, v in make_sample(i).items() if k not in NOT_COMPARABLE} for i in range(3)]
    ours, our_sizes = write_bytes(TarWriter, samples, mtime=mtime)
    theirs, their_sizes = write_bytes(webdataset.TarWriter, samples, mtime=mtime)
    assert ours == theirs and our_sizes == their_sizes


def test_byte_identical_to_webdataset_variants() -> None:
    raw = [{"__key__": f"k{i}", "a.bin": b"x" * i, "b": b"yz", "__url__": "u", "_m": "meta"} for i in range(4)]
    for kw in ({"encoder": False}, {"encoder": False, "keep_meta": True}, {"keep_meta": True},
               {"user": "me", "group": "us", "mode": 0o640}):
        assert write_bytes(TarWriter, raw, mtime=7, **kw) == write_bytes(webdataset.TarWriter, raw, mtime=7, **kw)
    views = [{"__key__": "k", "a": bytearray(b"yz"), "b": memoryview(b"abc")}]
    assert write_bytes(TarWriter, views, mtime=7, encoder=False) == write_bytes(
        webdataset.TarWriter, views, mtime=7, encoder=False)
    shouty = [{"__key__": "k", "DATA.JSON": [1], "X.Cls": 3, "long" * 40 + ".txt": "ünï"}]
    assert write_bytes(TarWriter, shouty, mtime=7) == write_bytes(webdataset.TarWriter, shouty, mtime=7)
    # tenbin is our own implementation: same bytes as webdataset's.
    for value in (np.arange(5, dtype=np.float16), [np.ones((2, 3), np.int64), np.zeros(0, np.uint8)]):
        assert default_handlers["ten"](value) == webdataset.writer.tenbin_dumps(value)


def test_default_mtime_is_now_in_whole_seconds(tmp_path: Path) -> None:
    before = int(time.time())
    data, _ = write_bytes(TarWriter, [{"__key__": "k", "txt": "a"}])
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        (member,) = tf.getmembers()
    assert before <= member.mtime <= time.time() and not member.pax_headers


# -- bit-exactness -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("suffix", "compress"), [(".tar", False), (".tgz", "gz"), (".tar.bz2", "bz2"), (".tar.xz", "xz")]
)
def test_two_runs_with_same_mtime_are_identical(tmp_path: Path, suffix: str, compress: Any) -> None:
    outputs = []
    for run in range(2):
        path = tmp_path / f"run{run}{suffix}"
        with TarWriter(str(path), mtime=MTIME) as writer:
            for i in range(3):
                writer.write(make_sample(i))
        with TarWriter(buf := io.BytesIO(), mtime=MTIME, compress=compress) as w:
            for i in range(3):
                w.write(make_sample(i))
        assert buf.getvalue() == path.read_bytes()  # compress= on a file object: the same bytes
        outputs.append(path.read_bytes())
        if run == 0:
            time.sleep(1.1)  # a clock leaking in anywhere (gzip, zip, tar headers) would now differ
    assert outputs[0] == outputs[1]


def test_tgz_header_carries_mtime_and_no_name(tmp_path: Path) -> None:
    path = tmp_path / "a.tgz"
    with TarWriter(str(path), mtime=MTIME) as writer:
        writer.write({"__key__": "k", "txt": "a"})
    head = path.read_bytes()[:10]
    assert head[:3] == b"\x1f\x8b\x08" and head[3] == 0  # no FNAME flag
    assert int.from_bytes(head[4:8], "little") == MTIME


def test_shardwriter_runs_are_identical(tmp_path: Path) -> None:
    trees = []
    for run in range(2):
        (tmp_path / str(run)).mkdir()
        with ShardWriter(str(tmp_path / str(run) / "s-%03d.tgz"), maxcount=2, mtime=MTIME, verbose=0) as sink:
            for i in range(5):
                sink.write(make_sample(i))
        trees.append({p.name: p.read_bytes() for p in sorted((tmp_path / str(run)).iterdir())})
    assert trees[0] == trees[1] and list(trees[0]) == ["s-000.tgz", "s-001.tgz", "s-002.tgz"]
