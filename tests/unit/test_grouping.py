from __future__ import annotations

import pytest

from wds_async.engine.grouping import Grouper, Sample, split_key
from wds_async.engine.tarstream import Member
from wds_async.errors import SampleError, WdsError


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a.jpg", ("a", "jpg")),
        ("dir/a.seg.png", ("dir/a", "seg.png")),
        ("d.x/y/img.JPG", ("d.x/y/img", "JPG")),
        ("noext", None),
        ("dir.x/noext", None),
        (".hidden", None),
        ("q/.hidden.txt", ("q/", "hidden.txt")),  # webdataset: the folder is the key
        ("a/b/.x.Y", ("a/b/", "x.Y")),
        ("a.b/c/.x", ("a.b/c/", "x")),
        ("a.b/.x", None),  # no run of non-dots before the dot that starts after a slash
        ("q/..x", ("q/", ".x")),
    ],
)
def test_split_key(name: str, expected: tuple[str, str] | None) -> None:
    assert split_key(name) == expected


def _members(*names: str) -> list[Member]:
    return [Member(name, i * 1024, name.encode()) for i, name in enumerate(names)]


def _raise(err: WdsError) -> None:
    raise err


def test_groups_consecutive_members_and_lowercases() -> None:
    g = Grouper("u", _raise)
    out = g.push(_members("a.jpg", "a.CLS", "b.jpg", "__MACOSX/a.jpg", "dir/._b.jpg", "__meta__", "b.json"))
    out += g.finish()
    assert [dict(s) for s in out] == [
        {"__key__": "a", "__url__": "u", "jpg": b"a.jpg", "cls": b"a.CLS"},
        {"__key__": "b", "__url__": "u", "jpg": b"b.jpg", "json": b"b.json"},
    ]
    assert [(s.url, s.offset) for s in out] == [("u", 0), ("u", 2048)]


def test_dot_files_in_a_folder_group_under_the_folder_but_forks_are_skipped() -> None:
    g = Grouper("u", _raise)
    out = g.push(_members("q/.hidden.txt", "q/._hidden.txt", "q/.hidden.JSON", "q/x.txt")) + g.finish()
    assert [dict(s) for s in out] == [
        {"__key__": "q/", "__url__": "u", "hidden.txt": b"q/.hidden.txt", "hidden.json": b"q/.hidden.JSON"},
        {"__key__": "q/x", "__url__": "u", "txt": b"q/x.txt"},
    ]


def test_repeated_extension_routed_to_handler() -> None:
    errors: list[WdsError] = []
    g = Grouper("u", errors.append)
    out = g.push(_members("a.jpg", "a.jpg", "a.cls", "b.jpg")) + g.finish()
    assert [s["__key__"] for s in out] == ["b"]  # the whole bad sample is dropped
    assert isinstance(errors[0], SampleError) and errors[0].member == "a.jpg" and errors[0].url == "u"
    with pytest.raises(SampleError, match="repeated extension 'jpg'"):
        Grouper("u", _raise).push(_members("a.jpg", "a.jpg"))


def test_pending_bytes_tracks_partial_sample() -> None:
    g = Grouper("u", _raise)
    g.push(_members("a.jpg", "a.cls"))
    assert g.pending_bytes == len(b"a.jpg") + len(b"a.cls")
    g.finish()
    assert g.pending_bytes == 0


def test_sample_pickles_with_position() -> None:
    import pickle

    s = Sample(__key__="k", jpg=b"x")
    s.url, s.offset = "u", 512
    t = pickle.loads(pickle.dumps(s))
    assert t == s and (t.url, t.offset) == ("u", 512) and isinstance(t, dict)


def test_sample_copies_with_position_as_a_dataloader_converts_it() -> None:
    import copy

    collate = pytest.importorskip("torch.utils.data._utils.collate")
    default_convert = collate.default_convert

    s = Sample(__key__="k", jpg=b"x")
    s.url, s.offset, s.end, s.item = "u", 512, 2048, 3
    for t in (copy.copy(s), default_convert(s)):
        assert type(t) is Sample and t == s and t is not s
        assert (t.url, t.offset, t.end, t.item) == ("u", 512, 2048, 3)
    t = copy.copy(s)
    t["cls"] = b"1"
    assert "cls" not in s  # a shallow copy: its own dict
    assert copy.copy(Sample(a=b"1")).offset is None
