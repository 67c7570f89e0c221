"""wds_async.data.decoders' handler chain, options and decode stage against webdataset 1.0.2's, on the same samples.

Custom handlers, ``Continue``, ``pre``/``post``, ``only``, ``partial`` and metadata fields; the ``decode`` stage's
errors (which carry key/field/url) re-raised or routed to a handler; whole tar shards read by webdataset and
decoded by both. Field formats are tested in ``test_decoders.py``, image specs in ``test_decoders_images.py``;
the helpers they share live in ``decoders_common.py``.
"""

from __future__ import annotations

import gc
import gzip
import io
import json
import pickle
import sys
import tarfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import webdataset
from webdataset import autodecode as wds_ad
from webdataset import filters as wds_filters

from tests.unit.decoders_common import ARRAY, IMAGES, TENBIN, assert_same, npy_bytes, wds_reference
from wds_async.data.decoders import (
    Continue,
    Decoder,
    DecodingError,
    basichandlers,
    decode,
    decoder_from_args,
    gzfilter,
    handle_extension,
)
from wds_async.data.handlers import ignore_and_continue, ignore_and_stop
from wds_async.engine.grouping import Sample
from wds_async.errors import MissingDependency, WdsError

# ---------------------------------------------------------------- handle_extension, handlers, chain


@pytest.mark.parametrize("extensions", ["png", "seg.png", "PNG jpg", "a.b.c", "json"])
@pytest.mark.parametrize("key", [".png", ".seg.png", ".x.seg.png", ".SEG.PNG", ".xpng", ".png.gz", "png",
                                 ".a.b.c", ".b.c", ".jpg", ".json"])
def test_handle_extension_matches_webdataset(extensions: str, key: str) -> None:
    ours = handle_extension(extensions, lambda data: ("hit", data))(key, b"d")
    ref = wds_ad.handle_extension(extensions, lambda data: ("hit", data))(key, b"d")
    assert ours == ref


def test_custom_handlers_order_and_passing() -> None:
    calls: list[str] = []

    def shout(key: str, data: bytes) -> Any:
        calls.append(key)
        return data.decode().upper() if key.endswith(".txt") else None

    sample = {"__key__": "k", "txt": b"abc", "seg.txt.gz": gzip.compress(b"gz"), "cls": b"1"}
    ours = decoder_from_args(shout, handle_extension("cls", lambda d: -int(d)))(sample)
    assert ours == {"__key__": "k", "txt": "ABC", "seg.txt.gz": "GZ", "cls": -1}
    assert calls == [".txt", ".seg.txt", ".cls"]  # handlers see "." + field, after gunzip
    assert_same(ours, wds_reference(sample, shout, wds_ad.handle_extension("cls", lambda d: -int(d))))


def test_continue_goes_on_with_the_next_handler() -> None:
    def unwrap(key: str, data: bytes) -> Continue | None:
        return Continue(key[:-4], data[1:]) if key.endswith(".rot") else None

    def unwrap_ref(key: str, data: bytes) -> Any:
        return wds_ad.Continue(key[:-4], data[1:]) if key.endswith(".rot") else None

    sample = {"__key__": "k", "json.rot": b"x[1]", "rot": b"xy", "cls.rot.rot": b"xx3"}
    ours = Decoder([unwrap])(sample)
    assert ours == {"__key__": "k", "json.rot": [1], "rot": b"y", "cls.rot.rot": b"x3"}
    assert_same(ours, wds_reference(sample, unwrap_ref))


def test_pre_and_post_replace_the_defaults() -> None:
    sample = {"__key__": "k", "txt": b"a", "json.gz": gzip.compress(b"[1]")}
    theirs: dict[Any, Any] = {gzfilter: wds_ad.gzfilter, basichandlers: wds_ad.basichandlers}
    Chain = list[Callable[[str, bytes], Any]] | None
    variants: list[tuple[Chain, Chain]] = [(None, []), ([], None), ([], []), (None, [gzfilter, basichandlers])]
    for pre, post in variants:
        ref = wds_reference(sample, pre=pre and [theirs[h] for h in pre], post=post and [theirs[h] for h in post])
        assert_same(Decoder([], pre=pre, post=post)(sample), ref, f"pre={pre} post={post}")
    assert Decoder([], post=[])(sample)["txt"] == b"a"


def test_non_callable_handlers_are_refused() -> None:
    with pytest.raises(TypeError):
        Decoder(["rgb"])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        Decoder([], post="basic")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decode"):
        decoder_from_args(3)  # type: ignore[arg-type]


# ---------------------------------------------------------------- only, partial, metadata


@pytest.mark.parametrize("only", [None, "json", ["txt", "seg.png"], "txt json", [], "nothing"])
def test_only_matches_webdataset(only: Any) -> None:
    sample = {"__key__": b"k", "txt": b"a", "json": b"[1]", "seg.png": IMAGES["l.png"]}
    assert_same(decoder_from_args("l8", only=only)(sample), wds_reference(sample, "l8", only=only), str(only))


def test_partial() -> None:
    sample = {"__key__": "k", "txt": "already", "cls": 3, "json": b"[1]"}
    assert_same(Decoder([], partial=True)(sample), wds_reference(sample, partial=True))
    assert Decoder([], partial=True)(sample) == {"__key__": "k", "txt": "already", "cls": 3, "json": [1]}
    with pytest.raises(DecodingError, match="partial=True") as info:
        Decoder([])(sample)
    assert info.value.field == "txt"
    with pytest.raises(wds_ad.DecodingError):
        wds_reference(sample)
    for kw in ({}, {"partial": True}):  # None is an error even with partial, as in 1.0.2
        with pytest.raises(DecodingError):
            Decoder([], **kw)({"__key__": "k", "txt": None})  # type: ignore[arg-type]
        with pytest.raises(wds_ad.DecodingError):
            wds_reference({"__key__": "k", "txt": None}, **kw)


def test_metadata_fields(capsys: pytest.CaptureFixture[str]) -> None:
    sample = {"__key__": b"k\xc3\xa9", "__url__": "u", "__local_path__": b"\xff", "__index__": 3, "txt": b"a"}
    ours = Decoder([])(sample)
    assert ours == {"__key__": "ké", "__url__": "u", "__local_path__": b"\xff", "__index__": 3, "txt": "a"}
    assert_same(ours, wds_reference(sample))
    assert "Can't decode" in capsys.readouterr().out  # 1.0.2 prints; we keep quiet


def test_sample_position_is_kept() -> None:
    sample = Sample({"__key__": "k", "__url__": "s.tar", "txt": b"a"})
    sample.url, sample.offset = "s.tar", 1536
    out = Decoder([])(sample)
    assert isinstance(out, Sample) and (out.url, out.offset) == ("s.tar", 1536) and out["txt"] == "a"
    assert type(Decoder([])({"txt": b"a"})) is dict
    sample["json"] = b"{"
    with pytest.raises(DecodingError) as info:
        Decoder([])(sample)
    assert info.value.offset == 1536 and "offset=1536" in str(info.value)


# ---------------------------------------------------------------- the decode stage and errors


def bad_stream() -> Iterator[dict[str, Any]]:
    yield {"__key__": "a", "__url__": "s.tar", "json": b"[1]"}
    yield {"__key__": "b", "__url__": "s.tar", "json": b"[oops"}
    yield {"__key__": "c", "__url__": "s.tar", "json": b"[3]"}


def test_decode_error_reraised_by_default() -> None:
    with pytest.raises(DecodingError) as info:
        list(decode(bad_stream()))
    err = info.value
    assert isinstance(err, WdsError) and isinstance(err, ValueError)
    assert (err.key, err.field, err.k, err.url) == ("b", "json", "json", "s.tar")
    assert isinstance(err.__cause__, json.JSONDecodeError)
    message = str(err)
    assert "'json'" in message and "'b'" in message and "url=s.tar" in message and "JSONDecodeError" in message


@pytest.mark.parametrize("handler, keys", [(ignore_and_continue, ["a", "c"]), (ignore_and_stop, ["a"])])
def test_decode_error_routed_to_handler(handler: Callable[[BaseException], bool], keys: list[str]) -> None:
    seen: list[BaseException] = []

    def spy(exn: BaseException) -> bool:
        seen.append(exn)
        return handler(exn)

    ours = list(decode(bad_stream(), handler=spy))
    assert [s["__key__"] for s in ours] == keys
    assert len(seen) == 1 and isinstance(seen[0], DecodingError) and seen[0].key == "b"
    assert_same(ours, list(wds_filters._decode(bad_stream(), handler=handler)))


def test_decode_checks_specs_at_the_call() -> None:
    with pytest.raises(ValueError, match="imagespec"):
        decode(iter([]), "rgb9")
    with pytest.raises(TypeError):
        list(decode(iter([["not", "a", "dict"]])))  # type: ignore[arg-type]


def test_decoding_error_pickles() -> None:
    err = DecodingError("m", url="u", offset=3, key="k", field="f")
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.url, back.offset, back.key, back.field, str(back)) == (
        DecodingError, "u", 3, "k", "f", str(err))


def test_missing_optional_dependency(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "msgpack", None)  # import msgpack now raises ImportError
    with pytest.raises(DecodingError, match="pip install msgpack") as info:
        Decoder([])({"__key__": "k", "mp": b"\x01"})
    assert isinstance(info.value.__cause__, MissingDependency)


# ---------------------------------------------------------------- tar shards read by webdataset 1.0.2


def write_tar(path: Path, members: list[tuple[str, bytes]]) -> str:
    with tarfile.open(path, "w") as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return str(path)


def read_with_webdataset(url: str, *args: Any, decoded: bool = True, **kw: Any) -> list[dict[str, Any]]:
    # webdataset 1.0.2 leaves its shard file open (ResourceWarning when collected): its leak, silenced here.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        ds = webdataset.WebDataset(url, shardshuffle=False)
        samples = list(ds.decode(*args, **kw) if decoded else ds)
        del ds
        gc.collect()
    return samples


@pytest.mark.parametrize("specs", [(), ("rgb8",), ("torchrgb",), ("pill",), ("l",)])
def test_tar_shard_matches_webdataset(tmp_path: Path, specs: tuple[str, ...]) -> None:
    members = []
    for i in range(4):
        members += [(f"s{i:03d}.jpg", IMAGES["rgb.jpg"]), (f"s{i:03d}.seg.png", IMAGES["p.png"]),
                    (f"s{i:03d}.cls", str(i).encode()), (f"s{i:03d}.json", json.dumps({"i": i}).encode()),
                    (f"s{i:03d}.npy", npy_bytes(ARRAY * i)), (f"s{i:03d}.txt.gz", gzip.compress(b"x" * i)),
                    (f"s{i:03d}.ten", TENBIN), (f"s{i:03d}.mp", msgpack.packb([i])), (f"s{i:03d}.bin", bytes([i]))]
    url = write_tar(tmp_path / "shard.tar", members)
    raw = read_with_webdataset(url, decoded=False)
    ours = list(decode(iter(raw), *specs))
    ref = read_with_webdataset(url, *specs)
    assert len(ours) == 4
    assert_same(ours, ref)


def test_tar_shard_bad_sample_skipped_like_webdataset(tmp_path: Path) -> None:
    members = [("a.json", b"[1]"), ("b.json", b"{"), ("c.json", b"[3]"), ("c.pyd", pickle.dumps(3))]
    url = write_tar(tmp_path / "bad.tar", members)
    raw = read_with_webdataset(url, decoded=False)
    ours = list(decode(iter(raw), handler=ignore_and_continue))
    assert [s["__key__"] for s in ours] == ["a"]  # b is bad JSON, c holds a pickle we refuse
    ref = read_with_webdataset(url, handler=wds_ad_ignore)
    assert [s["__key__"] for s in ref] == ["a", "c"]  # 1.0.2 unpickles c
    assert_same(list(decode(iter(raw), handler=ignore_and_continue, allow_pickle=True)), ref)


def wds_ad_ignore(exn: BaseException) -> bool:
    return True
