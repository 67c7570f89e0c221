"""TarWriter / ShardWriter: read back by webdataset 1.0.2, GNU tar and tarfile; parity; bit-exactness; errors."""

from __future__ import annotations

import gc
import gzip
import io
import pickle
import shlex
import subprocess
import tarfile
import time
import warnings
from pathlib import Path
from typing import Any

import cbor2
import msgpack
import numpy as np
import PIL.Image
import pytest
import torch
import webdataset

from wds_async.errors import NotFound, PipeError, SampleError, UrlError
from wds_async.write.writer import ShardWriter, TarWriter, default_handlers, make_encoder

MTIME = 1_234_567_890

# -- samples covering every default encoder ------------------------------------------------------------


def make_sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    rgb = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (6, 5), dtype=np.uint8)
    smooth = np.stack([np.add.outer(np.arange(16) * 8, np.arange(16) * 4) + i] * 3, -1).astype(np.uint8)  # JPEG-able
    return {
        "__key__": f"dir/sample{i:03d}",
        "txt": f"héllo {i}", "text": "t", "transcript": "tr", "html": "<p>x</p>", "htm": "<b>",
        "cls": i, "cls2": i + 1, "class": 3, "count": 4, "index": i * 10, "inx": 7, "id": 123456789,
        "json": {"i": i, "list": [1, 2.5, None], "s": "ü"}, "jsn": [i],
        "npy": rng.standard_normal((3, 4)).astype(np.float32),
        "npz": {"a": np.arange(i + 3), "b": np.eye(2)},
        "mp": {"i": i, "b": b"raw"}, "msgpack": [1, 2], "msg": 5,
        "cbor": {"i": i, "f": 1.5},
        "ten": np.arange(12, dtype=np.int32).reshape(3, 4),
        "tb": [np.ones(3, np.float64), np.zeros((2, 2), np.uint8)],
        "pyd": {"set": {1, 2}}, "pickle": (1, "a"), "pkl": [i],
        "pth": torch.arange(4, dtype=torch.float32) * i,
        "png": rgb, "seg.png": gray, "ppm": rgb, "pgm": gray, "pbm": (gray > 127).astype(np.uint8) * 255,
        "tiff": rgb, "tif": rgb[:, :, :1],
        "jpg": smooth, "jpeg": PIL.Image.fromarray(smooth),
        "flt.png": rgb.astype(np.float64) / 255.0,
        "chw.png": torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0,
        "txt.gz": "compressed " * 20,
        "bin": bytes(range(256)) * 3,
        "foo": "plain str under an unknown extension",
    }


def expected_image(field: str, value: Any) -> np.ndarray:
    """What an RGB uint8 decode of the encoded field must give."""
    if isinstance(value, PIL.Image.Image):
        value = np.asarray(value)
    elif isinstance(value, torch.Tensor):
        value = (value.permute(1, 2, 0).numpy() * 255.0).astype(np.uint8)
    elif value.dtype.kind == "f":
        value = (value * 255.0).astype(np.uint8)
    if value.ndim == 3 and value.shape[2] == 1:
        value = value[:, :, 0]
    return np.stack([value] * 3, -1) if value.ndim == 2 else value


IMAGE_EXTS = {"png", "ppm", "pgm", "pbm", "tiff", "tif", "jpg", "jpeg"}


def check_value(field: str, original: Any, decoded: Any) -> None:
    """``decoded`` is webdataset's ``.decode(cbor, "rgb8")`` of the member (or equivalent)."""
    ext = field.rsplit(".", 1)[-1]
    if ext in IMAGE_EXTS:
        want = expected_image(field, original)
        assert decoded.shape == want.shape, field
        diff = np.abs(decoded.astype(int) - want.astype(int))
        assert (diff.mean() < 4) if ext in ("jpg", "jpeg") else not diff.any(), field
    elif field in ("npy", "ten"):
        np.testing.assert_array_equal(decoded if field == "npy" else decoded[0], original)
    elif field == "tb":
        assert len(decoded) == 2 and all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(decoded, original))
    elif field == "npz":
        assert decoded.keys() == original.keys() and all(np.array_equal(decoded[k], original[k]) for k in original)
    elif field == "pth":
        assert torch.equal(decoded, original)
    elif field == "msgpack":  # webdataset decodes .mp and .msg only
        assert msgpack.unpackb(decoded) == original
    elif isinstance(decoded, bytes) and not isinstance(original, bytes):  # webdataset has no decoder for it
        assert field in ("foo", "class", "count", "html", "htm") and decoded == str(original).encode()
    else:
        assert decoded == original, field


def cbor_handler(key: str, data: bytes) -> Any:
    # webdataset's own cbor decoder imports the legacy ``cbor`` package, which is not installed.
    return cbor2.loads(data) if key.endswith("cbor") else None


def read_webdataset(urls: Any, *decode_args: Any) -> list[dict[str, Any]]:
    """Read with webdataset 1.0.2; it leaves its shard file to the garbage collector (a ResourceWarning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        dataset = webdataset.WebDataset(urls, shardshuffle=False).decode(*decode_args)
        samples = list(dataset)
        del dataset
        gc.collect()
    return samples


def assert_roundtrip(samples: list[dict[str, Any]], decoded: list[dict[str, Any]]) -> None:
    assert [s["__key__"] for s in decoded] == [s["__key__"] for s in samples]
    for original, got in zip(samples, decoded):
        fields = {k for k in got if not k.startswith("__")}
        assert fields == {k for k in original if not k.startswith("_")}
        for field in fields:
            check_value(field, original[field], got[field])


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


def write_bytes(cls: Any, samples: list[dict[str, Any]], **kw: Any) -> tuple[bytes, list[int]]:
    buf = io.BytesIO()
    writer = cls(buf, **kw)
    sizes = [writer.write(s) for s in samples]
    writer.close()
    return buf.getvalue(), sizes


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
    real_write, calls = writer._out.write, []

    def interrupted(data: Any) -> Any:
        calls.append(data)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real_write(data)

    writer._out.write = interrupted
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


# -- rejected samples ----------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["../x", "/abs", "a//b", "a\x00b", "a/../b", "\\win", "..\\x", "C:x", ""])
def test_unsafe_keys_are_rejected_and_nothing_is_written(key: str) -> None:
    buf = io.BytesIO()
    with TarWriter(buf, mtime=1) as writer:
        with pytest.raises(SampleError) as info:
            writer.write({"__key__": key, "txt": "a", "cls": 1})
        assert repr(key) in str(info.value)
        writer.write({"__key__": "fine", "txt": "b"})
    with tarfile.open(fileobj=io.BytesIO(buf.getvalue())) as tf:
        assert tf.getnames() == ["fine.txt"]


@pytest.mark.parametrize("field", ["x/../../y", "/../etc", "a\x00", "sub/", "a//b"])
def test_unsafe_field_names_are_rejected(field: str) -> None:
    with TarWriter(io.BytesIO()) as writer, pytest.raises(SampleError, match="unsafe member name"):
        writer.write({"__key__": "k", field: b"x"})


def test_missing_or_bad_key_is_rejected() -> None:
    with TarWriter(io.BytesIO()) as writer:
        with pytest.raises(SampleError, match=r"\['jpg', 'txt'\] has no __key__"):
            writer.write({"txt": "a", "jpg": b"..."})
        with pytest.raises(SampleError, match="__key__"):
            writer.write({"__key__": 5, "txt": "a"})
        with pytest.raises(TypeError):
            writer.write([("__key__", "k")])  # type: ignore[arg-type]


def test_unknown_extension_with_non_bytes_value_names_key_and_extension() -> None:
    with TarWriter(io.BytesIO()) as writer:
        with pytest.raises(SampleError, match=r"'k7'.*'data.xyz'.*'xyz'") as info:
            writer.write({"__key__": "k7", "data.xyz": 3.5})
        assert info.value.member == "k7.data.xyz"
        with pytest.raises(SampleError, match="txt"):
            writer.write({"__key__": "k8", "txt": 12})
        with pytest.raises(SampleError, match=r"\[0, 1\]"):
            writer.write({"__key__": "k9", "png": np.full((2, 2), 2.0)})
        with pytest.raises(SampleError, match="Object arrays"):
            writer.write({"__key__": "k10", "npy": np.array([{}], dtype=object)})


def test_encoder_false_requires_bytes_and_callable_replaces_default() -> None:
    with TarWriter(io.BytesIO(), encoder=False) as writer:
        with pytest.raises(SampleError, match="'txt' is str, not bytes"):
            writer.write({"__key__": "k", "txt": "a"})
        assert writer.write({"__key__": "k", "txt": b"ab", "__url__": "ignored"}) == 2
    data, _ = write_bytes(TarWriter, [{"__key__": "k", "n": 5}], encoder=lambda s: {**s, "n": b"%d!" % s["n"]})
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert tf.extractfile("k.n").read() == b"5!"  # type: ignore[union-attr]
    data, _ = write_bytes(TarWriter, [{"__key__": "k", "n.up": "abc"}], encoder={"up": lambda v: v.upper()})
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert tf.extractfile("k.n.up").read() == b"abc"  # type: ignore[union-attr]  (str -> utf-8 first)
    data, _ = write_bytes(TarWriter, [{"n": b"1"}], encoder=lambda s: {**s, "__key__": "added"})
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert tf.getnames() == ["added.n"]  # a callable encoder may supply the key, as in webdataset
    assert make_encoder(True)({"__key__": "k", "cls": 3}) == {"__key__": "k", "cls": b"3"}
    with pytest.raises(ValueError):
        make_encoder("jpg")  # type: ignore[arg-type]


def test_keep_meta_writes_underscore_fields() -> None:
    data, _ = write_bytes(TarWriter, [{"__key__": "k", "txt": "a", "__url__": "u", "_x": "y"}], keep_meta=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tf:
        assert tf.getnames() == ["k.__url__", "k._x", "k.txt"]


# -- lifecycle -----------------------------------------------------------------------------------------


def test_lifecycle(tmp_path: Path) -> None:
    buf = io.BytesIO()
    writer = TarWriter(buf)
    writer.close()
    writer.close()
    assert not buf.closed and len(buf.getvalue()) == tarfile.RECORDSIZE  # borrowed objects stay open
    with pytest.raises(ValueError, match="closed"):
        writer.write({"__key__": "k", "txt": "a"})
    with TarWriter(tmp_path / "p.tar") as owned:  # os.PathLike accepted
        owned.write({"__key__": "k", "txt": "a"})
    assert owned.stream.closed
    with pytest.raises(NotFound):
        TarWriter(str(tmp_path / "missing-dir" / "x.tar"))
    with pytest.raises(ValueError, match="mtime"):
        TarWriter(io.BytesIO(), mtime=-1)
    with pytest.raises(ValueError, match="compress"):
        TarWriter(io.BytesIO(), compress="zip")
    with TarWriter(io.BytesIO(), format="ustar") as ustar, pytest.raises(SampleError, match="too long"):
        ustar.write({"__key__": "k" * 200, "txt": "a"})
