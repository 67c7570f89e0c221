"""The per-member and per-chunk fast paths agree with the general rules they shortcut."""

from __future__ import annotations

import asyncio
import io
import re
import tarfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wds_async.backends.http import HttpBackend
from wds_async.data.fluid import _Pass
from wds_async.engine.grouping import _skipped, split_key
from wds_async.engine.tarheader import block_sum as _block_sum
from wds_async.engine.tarstream import Member, TarParser
from wds_async.errors import ShardFormatError

# The rules as first written, kept here as the reference the fast versions are checked against.
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # webdataset 1.0.2's base_plus_ext
_META_RE = re.compile(r"__[^/]*__($|/)")


def _split_key_by_regex(name: str) -> tuple[str, str] | None:
    m = _KEY_RE.match(name)
    return None if m is None else (m.group(1), m.group(2))


def _skipped_by_rules(name: str) -> bool:
    if name.startswith("__MACOSX/") or "/__MACOSX/" in name:
        return True
    if name.rsplit("/", 1)[-1].startswith("._"):
        return True
    return _META_RE.match(name) is not None


_names = st.text(alphabet="ab./_\n_MACOSX", max_size=24)


@given(_names)
@settings(max_examples=3000)
def test_split_key_agrees_with_the_regex(name: str) -> None:
    assert split_key(name) == _split_key_by_regex(name)


@pytest.mark.parametrize("name", ["a/b\nc/d.e", "a\n.b", "x/y.z\n", "\n/a.b", "a/.b", "a/b.", "/a.b", "a.b/c"])
def test_split_key_edge_cases(name: str) -> None:
    assert split_key(name) == _split_key_by_regex(name)


@given(_names)
@settings(max_examples=3000)
def test_skipped_agrees_with_the_rules(name: str) -> None:
    assert _skipped(name) == _skipped_by_rules(name)


@given(st.binary(min_size=512, max_size=512))
def test_block_sum_is_the_byte_sum(block: bytes) -> None:
    assert _block_sum(block) == sum(block)


def test_block_sum_at_its_largest() -> None:
    assert _block_sum(b"\xff" * 512) == 255 * 512


def _archive(sizes: list[int], fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for i, size in enumerate(sizes):
            info = tarfile.TarInfo(f"k{i:03d}.bin")
            info.size = size
            tar.addfile(info, io.BytesIO(bytes([i % 251]) * size))
    return buf.getvalue()


def _with_checksum_field(raw: bytes, header: int, field: bytes) -> bytes:
    return raw[: header + 148] + field + raw[header + 156 :]


def _checksum(raw: bytes, header: int) -> int:
    block = raw[header : header + 512]
    return sum(block[:148]) + 8 * 32 + sum(block[156:])


@pytest.mark.parametrize("form", ["%06o\0 ", "%07o\0", "%o\0      ", " %06o\0"])
def test_checksum_fields_in_other_layouts_are_accepted(form: str) -> None:
    raw = _archive([10, 700])
    raw = _with_checksum_field(raw, 0, (form % _checksum(raw, 0)).encode()[:8].ljust(8, b"\0"))
    members = TarParser().feed(raw)
    assert [m.name for m in members] == ["k000.bin", "k001.bin"]


def test_a_wrong_checksum_in_the_usual_layout_is_refused() -> None:
    raw = _archive([10, 700])
    raw = _with_checksum_field(raw, 1024, b"%06o\0 " % (_checksum(raw, 1024) + 1))
    with pytest.raises(ShardFormatError, match="checksum mismatch"):
        TarParser().feed(raw)


@pytest.mark.parametrize("field", [b"00000001750\0", b"1750\0       ", b"     1750 \0 ", b"000000001750"])
def test_size_fields_in_other_layouts(field: bytes) -> None:
    raw = bytearray(_archive([1000, 3]))
    raw[124:136] = field
    raw[148:156] = b"%06o\0 " % (sum(raw[:148]) + 8 * 32 + sum(raw[156:512]))
    members = TarParser().feed(bytes(raw))
    assert [(m.name, len(m.data)) for m in members] == [("k000.bin", 1000), ("k001.bin", 3)]


def test_a_size_with_an_eight_is_refused() -> None:
    raw = bytearray(_archive([1000]))
    raw[124:136] = b"00000001780\0"
    raw[148:156] = b"%06o\0 " % (sum(raw[:148]) + 8 * 32 + sum(raw[156:512]))
    with pytest.raises(ShardFormatError, match="non-octal size"):
        TarParser().feed(bytes(raw))


@given(st.lists(st.integers(0, 1500), min_size=1, max_size=6), st.integers(1, 3000), st.booleans())
@settings(max_examples=300)
def test_fast_and_general_paths_give_the_same_members(sizes: list[int], chunk: int, mutable: bool) -> None:
    raw = _archive(sizes)
    whole = TarParser().feed(raw)  # one chunk: mostly the fast path
    parser = TarParser()
    pieces = []
    for i in range(0, len(raw), chunk):  # small or odd chunks: the general path, and both mixed
        piece = raw[i : i + chunk]
        pieces += parser.feed(bytearray(piece) if mutable else memoryview(piece))
    parser.close()
    assert pieces == whole
    assert all(type(m.data) is bytes for m in whole + pieces)
    assert [(m.name, m.data) for m in whole] == [(f"k{i:03d}.bin", bytes([i % 251]) * n) for i, n in enumerate(sizes)]


def test_member_is_immutable_and_its_repr_leaves_out_the_data() -> None:
    m = Member("a.jpg", 512, b"x" * 100, 1536)
    assert (m.name, m.offset, m.data, m.end) == ("a.jpg", 512, b"x" * 100, 1536)
    assert Member("a", 0, b"").end == -1
    assert "xxx" not in repr(m) and "a.jpg" in repr(m)
    with pytest.raises(AttributeError):
        m.name = "b"  # type: ignore[misc]


def _sample(item: int, offset: int, end: int) -> Any:
    from wds_async.engine.grouping import Sample

    s = Sample()
    s.item, s.offset, s.end = item, offset, end
    return s


def test_positions_are_kept_only_while_a_tap_reads_them() -> None:
    run = _Pass()
    positions: dict[int, int] = {}
    done: list[int] = []
    recorder = run.recorder(positions, lambda item: (done.append(item), positions.pop(item)))
    assert [s.end for s in recorder.run([_sample(0, k, k + 1) for k in range(10)])] == list(range(1, 11))
    run.flush()
    assert run.pulled == [] and positions == {0: 10}
    got = list(run.tap(iter("ab"), 0))
    assert [item for item, _ in got] == ["a", "b"]
    list(recorder.run([_sample(3, 10, 11)]))
    assert run.pulled[-1] == [3, 10, 11] and positions == {0: 10, 3: 11}
    recorder.item_done(3)
    assert done == [3] and positions == {0: 10}


def test_a_run_recorded_one_by_one_is_not_undone_by_the_run_before() -> None:
    """A run written lazily, then one recorded sample by sample (a tap reads positions): a checkpoint sees the later
    position of the item, not the earlier run's written again."""
    run = _Pass()
    positions: dict[int, int] = {}
    recorder = run.recorder(positions, positions.pop)
    list(recorder.run([_sample(0, k, k + 1) for k in range(5)]))
    run.marks[0] = 0  # a tap starts reading positions
    list(recorder.run([_sample(0, k, k + 1) for k in range(5, 10)]))
    run.flush()
    assert positions == {0: 10}


@pytest.mark.parametrize("seed", range(30))
def test_delivery_in_runs_records_what_one_sample_at_a_time_would(seed: int) -> None:
    """deliver() hands over runs between markers and writes positions lazily; checked against the definition,
    one sample at a time: at any point (a checkpoint), ``positions`` holds the end of the last delivered sample of
    every item not yet finished, the finished items were reported in order, and an error is raised just after
    the samples before it."""
    import random

    from wds_async.data.pipeline import deliver
    from wds_async.engine.work import ItemDone

    rng = random.Random(seed)
    batches: list[list[Any]] = []
    stream: list[Any] = []
    ends = {item: 0 for item in range(6)}
    open_items = list(ends)
    while open_items and len(stream) < 300:
        item = rng.choice(open_items[:2] if rng.random() < 0.8 else open_items)  # interleaved, as unordered reads
        if rng.random() < 0.15:
            stream.append(ItemDone(item))
            open_items.remove(item)
            continue
        size = rng.randint(1, 9)
        stream.append(_sample(item, ends[item], ends[item] + size))
        ends[item] += size
    if rng.random() < 0.3:
        stream.insert(rng.randint(0, len(stream)), ValueError("boom"))
    at = 0
    while at < len(stream):
        n = rng.randint(1, 12)
        batches.append(stream[at:at + n])
        at += n
    run = _Pass()
    positions: dict[int, int] = {}
    finished: list[int] = []

    def finish(item: int) -> None:  # as Progress.finished: the item is done, its position dropped
        finished.append(item)
        positions.pop(item, None)

    samples = deliver(iter(batches), recorder=run.recorder(positions, finish))
    want_positions: dict[int, int] = {}
    want_finished: list[int] = []
    model = iter(stream)
    while True:
        try:
            got = next(samples)
        except ValueError:
            error = next(model)
            while isinstance(error, (ItemDone, type(_sample(0, 0, 0)))):
                if isinstance(error, ItemDone):
                    want_positions.pop(error.id, None)
                    want_finished.append(error.id)
                error = next(model)
            assert isinstance(error, ValueError)
            break
        except StopIteration:
            assert all(isinstance(x, ItemDone) for x in model)
            break
        want = next(model)
        while isinstance(want, ItemDone):
            want_positions.pop(want.id, None)
            want_finished.append(want.id)
            want = next(model)
        assert not isinstance(want, ValueError), "the error was not raised in position"
        assert got is want
        want_positions[want.item] = want.end
        if rng.random() < 0.3:  # a checkpoint here
            run.flush()
            assert positions == want_positions and finished == want_finished


class _Content:
    """A stand-in for aiohttp's StreamReader that hands over the given pieces through readchunk()."""

    def __init__(self, pieces: list[tuple[bytes, bool]]) -> None:
        self.pieces = list(pieces)

    async def readchunk(self) -> tuple[bytes, bool]:
        return self.pieces.pop(0) if self.pieces else (b"", False)


class _Response:
    def __init__(self, pieces: list[tuple[bytes, bool]]) -> None:
        self.content = _Content(pieces)


async def _read(backend: HttpBackend, pieces: list[tuple[bytes, bool]], **kw: Any) -> list[bytes]:
    args = dict(start=0, skip=0, length=None, end=None)
    args.update(kw)
    return [c async for c in backend._chunks(_Response(pieces), "u", **args)]  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [1, 3, 7, 100])
@pytest.mark.parametrize(("skip", "start", "end"), [(0, 0, None), (5, 5, None), (0, 0, 13), (4, 4, 9), (0, 2, 2)])
def test_http_chunks_are_split_skipped_and_cut(limit: int, skip: int, start: int, end: int | None) -> None:
    body = bytes(range(40))
    pieces = [(body[:10], False), (b"", True), (body[10:25], True), (body[25:], False)]
    backend = HttpBackend(chunk_bytes=limit)
    got = asyncio.run(_read(backend, pieces, start=start, skip=skip, end=end))
    assert all(0 < len(c) <= limit for c in got) and all(type(c) is bytes for c in got)
    want = body[start:] if skip else body
    if end is not None:
        want = want[: end - start]
    assert b"".join(got) == want
