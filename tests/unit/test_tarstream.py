"""Tests of the sans-IO tar parser: agreement with ``tarfile`` under random chunking, and the framing details
(offsets, pending bytes, gzip, skipped entries, PAX). Every error is in ``test_tarstream_errors.py``; the archive
builders both use are in ``tarstream_common.py``."""

from __future__ import annotations

import gzip
import io
import random
import tarfile
import tracemalloc
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit.tarstream_common import (
    URL,
    Entry,
    build,
    expected,
    fail,
    files,
    header_offsets,
    hide_pax_sizes,
    parse,
    patch,
    rand_bytes,
)
from wds_async.engine.tarstream import TarParser
from wds_async.errors import TruncatedShard

# -- agreement with tarfile ------------------------------------------------------------------------

_component = st.text(
    st.characters(codec="utf-8", exclude_categories=("Cs", "Cc"), exclude_characters="/"),
    min_size=1,
    max_size=40,
)
_name = st.lists(_component, min_size=1, max_size=7).map("/".join)


@st.composite
def _entry(draw: st.DrawFn, fmt: int) -> Entry:
    name = draw(_name)
    kind = draw(st.sampled_from([tarfile.REGTYPE] * 5 + [tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE]))
    if kind != tarfile.REGTYPE:
        return Entry(name, kind, linkname=draw(_name) if kind != tarfile.DIRTYPE else "")
    size = draw(st.one_of(st.integers(0, 1100), st.integers(0, 20_000)))
    pax = {"size": str(size)} if fmt == tarfile.PAX_FORMAT and draw(st.booleans()) else None
    return Entry(name, data=rand_bytes(size, draw(st.integers(0, 9))), pax=pax)


@st.composite
def _archive(draw: st.DrawFn) -> tuple[int, list[Entry], bool]:
    """A compact description (format, entries, global header?) that hypothesis can print."""
    fmt = draw(st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT]))
    entries = draw(st.lists(_entry(fmt), max_size=6))
    # (tarfile itself cannot read an archive holding nothing but a global header)
    return fmt, entries, fmt == tarfile.PAX_FORMAT and bool(entries) and draw(st.booleans())


_chunk_size = st.one_of(st.just(1), st.integers(1, 16), st.integers(505, 520), st.integers(1, 70_000))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=_archive(), sizes=st.lists(_chunk_size, min_size=1, max_size=6), gz=st.sampled_from([0, 1, 3]))
def test_matches_tarfile(spec: tuple[int, list[Entry], bool], sizes: list[int], gz: int) -> None:
    fmt, entries, global_header = spec
    raw = hide_pax_sizes(build(entries, fmt, {"comment": "global header"} if global_header else None))
    data = raw
    if gz:  # gz gzip members, concatenated
        cuts = sorted(random.Random(len(raw)).sample(range(len(raw)), gz - 1))
        data = b"".join(gzip.compress(raw[a:b]) for a, b in zip([0, *cuts], [*cuts, len(raw)]))
    members, parser = parse(data, sizes)
    assert [(m.name, m.offset, m.data) for m in members] == expected(raw)
    assert parser.finished and parser.pending_bytes == 0


def test_one_byte_chunks_with_long_names_and_gzip() -> None:
    entries = [Entry("d" * 150, tarfile.DIRTYPE), *files(0, 700, 513, prefix="x" * 120 + "/ü")]
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        raw = build(entries, fmt)
        want = expected(raw)
        assert len(want) == 3
        for data in (raw, gzip.compress(raw)):
            members, _ = parse(data, [1])
            assert [(m.name, m.offset, m.data) for m in members] == want


# -- framing details -------------------------------------------------------------------------------


def test_start_offset_resumes_at_a_member_boundary() -> None:
    raw = build(files(100, 2000, 30, prefix="p" * 130 + "/"), tarfile.PAX_FORMAT)
    resume = header_offsets(raw)[1][0]
    members, parser = parse(raw[resume:], [777], start_offset=resume)
    assert [(m.name, m.offset, m.data) for m in members] == expected(raw)[1:]
    assert parser.offset > resume


def test_start_offset_in_errors() -> None:
    raw = build(files(100, 2000))
    resume = header_offsets(raw)[1][0]
    err = fail(raw[resume : resume + 600], start_offset=resume)
    assert isinstance(err, TruncatedShard) and err.offset == resume


@pytest.mark.parametrize("tail", [b"garbage after the end", rand_bytes(5000), b"\x1f\x8bnot gzip"])
def test_bytes_after_end_marker_are_ignored(tail: bytes) -> None:
    raw = build(files(10, 600))
    end = header_offsets(raw)[-1][1] + 512 + 1024  # the first zero block
    for data in (raw + tail, raw[: end + 512] + tail, gzip.compress(raw) + tail):
        members, parser = parse(data, [300])
        assert [m.data for m in members] == [e.data for e in files(10, 600)]
        assert parser.finished and parser.offset == end + 512


def test_pending_bytes_returns_to_zero_between_members() -> None:
    raw = build(files(3000, 0, 1000))
    (_, h0), (_, h1), (_, h2) = header_offsets(raw)
    parser = TarParser(url=URL)
    assert parser.feed(raw[:100]) == [] and parser.pending_bytes == 100
    assert parser.feed(raw[100 : h0 + 512 + 2000]) == [] and parser.pending_bytes == 2000
    assert [m.offset for m in parser.feed(raw[h0 + 512 + 2000 : h1])] == [h0]
    assert parser.pending_bytes == 0 and parser.offset == h1
    assert [m.offset for m in parser.feed(raw[h1 : h2 + 512 + 1024])] == [h1, h2]
    assert parser.pending_bytes == 0 and not parser.finished
    parser.feed(raw[h2 + 512 + 1024 :])
    assert parser.finished
    parser.close()


def test_reused_mutable_buffer() -> None:
    raw = build(files(5000, 70))
    parser, members, buf = TarParser(url=URL), [], bytearray(1000)
    for pos in range(0, len(raw), 1000):
        piece = raw[pos : pos + 1000]
        buf[: len(piece)] = piece
        members += parser.feed(memoryview(buf)[: len(piece)])
        buf[:] = b"\xaa" * 1000  # the parser must not keep views of our buffer
    parser.close()
    assert [m.data for m in members] == [e.data for e in files(5000, 70)]


def test_gzip_magic_split_over_feeds() -> None:
    raw = build(files(10))
    data = gzip.compress(raw)
    parser = TarParser(url=URL)
    assert parser.feed(data[:1]) == [] and parser.pending_bytes == 1
    assert [m.data for m in parser.feed(data[1:])] == [files(10)[0].data]
    parser.close()
    # A two-member gzip whose second magic is split across feeds.
    half = len(raw) // 2
    first, second = gzip.compress(raw[:half]), gzip.compress(raw[half:])
    members, _ = parse(first + second, [len(first) + 1, 1, 10_000])
    assert len(members) == 1


def test_gzip_output_is_bounded_per_step() -> None:
    # A tiny compressed stream that inflates to 64 MB of zeros after the end-of-archive marker.
    comp = zlib.compressobj(1, zlib.DEFLATED, 31)
    data = comp.compress(build(files(2000)))
    zeros = bytes(1 << 20)
    data += b"".join(comp.compress(zeros) for _ in range(64)) + comp.flush()
    assert len(data) < 1 << 20
    tracemalloc.start()
    try:
        members, _ = parse(data, [len(data)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(members) == 1 and peak < 8 << 20


def test_skipped_entries_and_overrides() -> None:
    entries = [
        Entry("dir", tarfile.DIRTYPE),
        Entry("link", tarfile.SYMTYPE, linkname="t" * 200),
        Entry("hard", tarfile.LNKTYPE, linkname="dir/file"),
        Entry("fifo", tarfile.FIFOTYPE),
        Entry("vendor", b"V", data=b"v" * 700),  # unknown type: its data is skipped
        Entry("sized", data=b"12345", pax={"size": "5"}),  # size only in the PAX header
        Entry("uni-é", data=b"u"),
    ]
    raw = hide_pax_sizes(build(entries, tarfile.PAX_FORMAT, {"path": "global/must-not-leak", "comment": "c"}))
    members, _ = parse(raw, [513])
    assert [(m.name, m.data) for m in members] == [("sized", b"12345"), ("uni-é", b"u")]
    assert [m.offset for m in members] == [o for o, _ in header_offsets(raw)[-2:]]


def test_v7_directory_and_base256_size() -> None:
    raw = build(files(700, 0))
    (_, h0), (_, h1) = header_offsets(raw)
    raw = patch(raw, h0, 124, b"\x80" + (700).to_bytes(11, "big"))
    raw = patch(raw, h1, 0, b"olddir/\0")
    raw = patch(raw, h1, 156, b"\0")
    members, _ = parse(raw)
    assert [(m.name, m.data) for m in members] == [("s/0000.bin", files(700)[0].data)]


def test_pax_path_record() -> None:
    raw = build([Entry("././@PaxHeader", b"x", data=b"12 path=zzz\n\0\0"), *files(3)])
    members, _ = parse(raw)
    assert [(m.name, m.offset) for m in members] == [("zzz", 0)]


def test_a_pax_path_of_only_slashes_names_the_member_as_tarfile_does() -> None:
    """``path=/`` strips to an empty name, which still wins over the ustar name (tarfile reads ``""`` too)."""
    raw = build([Entry("x.bin", data=b"abc", pax={"path": "/"})], tarfile.PAX_FORMAT)
    members, _ = parse(raw)
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        assert [m.name for m in members] == tar.getnames() == [""]
