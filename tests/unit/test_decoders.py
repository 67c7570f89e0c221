"""wds_async.data.decoders' field formats against webdataset 1.0.2's autodecode, on the same samples.

Every basic field type (text, numbers, JSON, msgpack, npy/npz, tenbin, gzip) is decoded by both and compared value
by value (type, dtype, shape). The deliberate differences are asserted on their own: pickle-family fields are
refused unless opted in, ``.cbor`` uses cbor2, tenbin reads ``u4`` and 0-d arrays. Image specs are tested in
``test_decoders_images.py``; handlers, options, the decode stage and its errors in ``test_decoders_stage.py``;
the helpers they share live in ``decoders_common.py``.
"""

from __future__ import annotations

import gzip
import importlib.util
import io
import pickle
import struct
from typing import Any

import cbor2
import msgpack
import numpy as np
import pytest
import torch
from webdataset import autodecode as wds_ad
from webdataset import tenbin as wds_tenbin

from tests.unit.decoders_common import ARRAY, TENBIN, assert_same, npy_bytes, wds_reference
from wds_async.data.decoders import (
    Decoder,
    DecodingError,
    basichandlers,
    decode,
    decoder_from_args,
    read_tenbin,
)

# ---------------------------------------------------------------- helpers


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def pth_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


class Custom:
    """Picklable only by reference: torch's weights_only loader refuses it."""

    def __init__(self, x: int) -> None:
        self.x = x

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Custom) and other.x == self.x


def tenbin_bytes(arrays: list[np.ndarray], codes: list[str]) -> bytes:
    """The tenbin layout, written by hand so that codes webdataset cannot encode (u4) can be tested."""
    out = bytearray()

    def chunk(payload: bytes) -> None:
        out.extend(b"~TenBin~" + struct.pack("=q", len(payload)) + payload)
        out.extend(b"\0" * (-len(payload) % 64))

    for a, code in zip(arrays, codes):
        words = [struct.unpack("=q", code.encode().ljust(8, b"\0"))[0], 0, a.ndim, *a.shape]
        chunk(np.array(words, dtype="=i8").tobytes())
        chunk(a.tobytes())
    return bytes(out)


# ---------------------------------------------------------------- basic types

BASIC_FIELDS: dict[str, bytes] = {
    "txt": "héllo".encode(), "text": b"t", "transcript": b"words",
    "cls": b" 7\n", "cls2": b"-3", "index": b"12", "inx": b"0", "id": b"42",
    "json": b'{"a": [1, 2.5, null]}', "jsn": b"[true]", "seg.json": b"{}",
    "mp": msgpack.packb({"a": [1, "b"]}), "msg": msgpack.packb([1.5, None]),
    "npy": npy_bytes(ARRAY), "npz": npz_bytes(x=ARRAY, y=np.arange(3)),
    "ten": TENBIN, "tb": TENBIN,
    # gz is unwrapped and the inner extension decoded, once (a second .gz stays compressed bytes)
    "json.gz": gzip.compress(b'{"z": 1}'), "txt.gz": gzip.compress(b"zipped"), "npy.gz": gzip.compress(npy_bytes(ARRAY)),
    "gz": gzip.compress(b"bare"), "txt.gz.gz": gzip.compress(gzip.compress(b"twice")),
    # not decoded by 1.0.2 (whatever its docstring says): stay bytes
    "class": b"3", "count": b"4", "msgpack": msgpack.packb(1), "JSON": b"[1]", "bin": b"\x00\xff", "Txt": b"x",
}


@pytest.mark.parametrize("field", sorted(BASIC_FIELDS))
def test_basic_field_matches_webdataset(field: str) -> None:
    sample = {"__key__": "k", field: BASIC_FIELDS[field]}
    assert_same(Decoder([])(sample), wds_reference(sample), field)


def test_basic_values() -> None:
    out = Decoder([])({"__key__": "k", **BASIC_FIELDS})
    assert out["txt"] == "héllo" and out["cls"] == 7 and out["json"] == {"a": [1, 2.5, None]}
    assert out["json.gz"] == {"z": 1} and out["txt.gz"] == "zipped" and out["gz"] == b"bare"
    assert gzip.decompress(out["txt.gz.gz"]) == b"twice"
    assert out["class"] == b"3" and out["JSON"] == b"[1]"
    assert isinstance(out["npz"], dict) and sorted(out["npz"]) == ["x", "y"]
    assert_same(out["ten"], [ARRAY, np.array([1, -2]), np.zeros((2, 0), "u1")], flags=False)
    assert out["mp"] == {"a": [1, "b"]}


def test_basichandlers_direct() -> None:
    for key in (".txt", ".seg.json", ".npy", ".unknown", ".gz", "txt"):
        data = {".txt": b"x", ".seg.json": b"1", ".npy": npy_bytes(ARRAY)}.get(key, b"raw")
        assert_same(basichandlers(key, data), wds_ad.basichandlers(key, data), key)
    assert basichandlers(".unknown", b"raw") is None


def test_cbor_uses_cbor2() -> None:
    value = {"a": [1, 2.5, "x"], "b": b"bytes"}
    sample = {"__key__": "k", "cbor": cbor2.dumps(value)}
    assert Decoder([])(sample)["cbor"] == value
    if importlib.util.find_spec("cbor") is None:
        # deliberate difference: 1.0.2 imports the old `cbor` package and fails without it
        with pytest.raises(wds_ad.DecodingError):
            wds_reference(sample)


def test_npy_refuses_object_arrays() -> None:
    sample = {"__key__": "k", "npy": npy_bytes(np.array([{"a": 1}], dtype=object))}
    with pytest.raises(DecodingError, match="allow_pickle"):
        Decoder([])(sample)
    with pytest.raises(wds_ad.DecodingError):
        wds_reference(sample)


def test_bad_data_fails_in_both() -> None:
    for field, data in {"json": b"{", "cls": b"x", "txt": b"\xff", "json.gz": b"not gzip", "npz": b"PK"}.items():
        sample = {"__key__": "k", field: data}
        with pytest.raises(DecodingError) as ours:
            Decoder([])(sample)
        with pytest.raises(wds_ad.DecodingError) as ref:
            wds_reference(sample)
        assert type(ours.value.__cause__) is type(ref.value.__cause__), field


# ---------------------------------------------------------------- tenbin


def test_tenbin_matches_webdataset_encoder() -> None:
    arrays = [np.arange(n, dtype=dt) for n, dt in enumerate(["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2",
                                                             "u8"])]
    arrays.append(np.ones((2, 3, 4), dtype="f4"))
    data = bytes(wds_tenbin.encode_buffer(arrays))
    assert_same(read_tenbin(data), wds_tenbin.decode_buffer(data))
    assert read_tenbin(b"") == []


def test_tenbin_reads_what_1_0_2_cannot() -> None:
    # 1.0.2's table misspells uint32 ("unit32") and takes np.prod(()) == 1.0 as a count for 0-d arrays
    arrays = [np.array([1, 2**32 - 1], dtype="u4"), np.array(2.5)]
    data = tenbin_bytes(arrays, ["u4", "f8"])
    assert_same(read_tenbin(data), arrays, flags=False)
    with pytest.raises(TypeError):
        wds_tenbin.decode_buffer(data)


@pytest.mark.parametrize("data", [b"~TenBin!" + bytes(72), TENBIN[:-70], TENBIN[:TENBIN.index(b"~TenBin~", 8)],
                                  tenbin_bytes([np.zeros(1)], ["c8"])])
def test_tenbin_malformed(data: bytes) -> None:
    with pytest.raises(ValueError, match="tenbin"):
        read_tenbin(data)
    with pytest.raises(DecodingError, match="'ten'"):
        Decoder([])({"__key__": "k", "ten": data})


# ---------------------------------------------------------------- pickle family (deliberate difference)

PICKLED = {"pkl": pickle.dumps({"a": 1}), "pickle": pickle.dumps([1, 2]), "pyd": pickle.dumps(Custom(5)),
           "pth": pth_bytes({"t": torch.arange(4), "obj": Custom(6)})}


@pytest.mark.parametrize("field", sorted(PICKLED))
def test_pickle_family_refused_by_default(field: str) -> None:
    sample = {"__key__": "s1", "__url__": "file:x.tar", field: PICKLED[field]}
    with pytest.raises(DecodingError) as info:
        Decoder([])(sample)
    err = info.value
    assert (err.key, err.field, err.url) == ("s1", field, "file:x.tar")
    message = str(err)
    for needle in (f"'{field}'", f".{field}", "'s1'", "allow_pickle=True", "WDS_ASYNC_ALLOW_PICKLE=1", "file:x.tar"):
        assert needle in message, needle
    with pytest.raises(DecodingError, match="allow_pickle=True"):
        list(decode(iter([sample])))
    with pytest.raises(DecodingError, match="refusing to unpickle"):
        basichandlers("." + field, PICKLED[field])


@pytest.mark.parametrize("field", sorted(PICKLED))
def test_pickle_family_opt_in_matches_webdataset(field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    sample = {"__key__": "k", field: PICKLED[field], f"x.{field}.gz": gzip.compress(PICKLED[field])}
    ref = wds_reference(sample)
    assert_same(Decoder([], allow_pickle=True)(sample), ref)
    assert_same(decoder_from_args(allow_pickle=True)(sample), ref)
    monkeypatch.setenv("WDS_ASYNC_ALLOW_PICKLE", "1")
    assert_same(Decoder([])(sample), ref)
    assert_same(next(decode(iter([sample]))), ref)
    with pytest.raises(DecodingError):  # an explicit False wins over the environment
        Decoder([], allow_pickle=False)(sample)


def test_pth_weights_only_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_PYTORCH_WEIGHTS_ONLY", "1")
    safe = {"__key__": "k", "pth": pth_bytes({"t": torch.arange(3)})}
    assert torch.equal(Decoder([], allow_pickle=True)(safe)["pth"]["t"], torch.arange(3))
    with pytest.raises(DecodingError, match="pth"):
        Decoder([], allow_pickle=True)({"__key__": "k", "pth": PICKLED["pth"]})
