"""TarWriter's rejected samples (unsafe keys and member names, values no encoder takes), encoder options,
``keep_meta`` and the writer's lifecycle.

The shared helpers live in ``writer_common.py``; TarWriter's output and parity are tested in ``test_writer.py``,
ShardWriter and ``pipe:`` destinations in ``test_writer_shards.py``.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from tests.unit.writer_common import write_bytes
from wds_async.errors import NotFound, SampleError
from wds_async.write.writer import TarWriter, make_encoder

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
