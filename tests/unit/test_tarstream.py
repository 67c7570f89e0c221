"""Tests of the sans-IO tar parser: agreement with ``tarfile`` under random chunking, and every error."""

from __future__ import annotations

import gzip
import io
import random
import tarfile
import tracemalloc
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wds_async.engine.tarstream import Member, TarParser
from wds_async.errors import ShardFormatError, TruncatedShard

URL = "https://example.test/shards/shard-000007.tar"


# -- helpers ---------------------------------------------------------------------------------------


@dataclass
class Entry:
    name: str
    kind: bytes = tarfile.REGTYPE
    data: bytes = field(default=b"", repr=False)
    linkname: str = ""
    pax: dict[str, str] | None = None


def build(
    entries: Iterable[Entry], fmt: int = tarfile.GNU_FORMAT, pax: dict[str, str] | None = None
) -> bytes:
    """A tar archive written by ``tarfile``; entries it cannot represent in ``fmt`` are left out."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt, pax_headers=pax) as tar:
        for e in entries:
            info = tarfile.TarInfo(e.name)
            info.type = e.kind
            info.linkname = e.linkname
            info.mtime = 1_700_000_000
            if e.pax:
                info.pax_headers = dict(e.pax)
            info.size = len(e.data)
            try:
                tar.addfile(info, io.BytesIO(e.data) if info.size else None)
            except ValueError:  # e.g. a name too long for ustar
                continue
    return buf.getvalue()


def expected(raw: bytes) -> list[tuple[str, int, bytes]]:
    """What ``tarfile`` reads: (name, offset, data) of the regular files."""
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        out = []
        for info in tar.getmembers():
            if info.isreg():
                f = tar.extractfile(info)
                assert f is not None
                out.append((info.name, info.offset, f.read()))
        return out


def header_offsets(raw: bytes) -> list[tuple[int, int]]:
    """(first header, own header) offsets of every member, by ``tarfile``."""
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        return [(m.offset, m.offset_data - 512) for m in tar.getmembers()]


def hide_pax_sizes(raw: bytes) -> bytes:
    """Zero the ustar size field of members whose size is in a PAX header, so only the PAX one counts."""
    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        headers = [m.offset_data - 512 for m in tar.getmembers() if "size" in m.pax_headers]
    for header in headers:
        raw = patch(raw, header, 124, b"0" * 11 + b"\0")
    return raw


def chunked(data: bytes, sizes: Sequence[int]) -> list[bytes]:
    out, pos, k = [], 0, 0
    while pos < len(data):
        out.append(data[pos : pos + sizes[k % len(sizes)]])
        pos += sizes[k % len(sizes)]
        k += 1
    return out


def parse(data: bytes, sizes: Sequence[int] = (65536,), **kwargs: object) -> tuple[list[Member], TarParser]:
    parser = TarParser(url=URL, **kwargs)  # type: ignore[arg-type]
    members: list[Member] = []
    for chunk in chunked(data, sizes):
        members += parser.feed(chunk)
    parser.close()
    return members, parser


def fail(data: bytes, sizes: Sequence[int] = (65536,), start_offset: int = 0) -> ShardFormatError:
    """Feed and close, expecting a ShardFormatError (from either); check url and offset presence."""
    parser = TarParser(url=URL, start_offset=start_offset)
    with pytest.raises(ShardFormatError) as info:
        for chunk in chunked(data, sizes):
            parser.feed(chunk)
        parser.close()
    err = info.value
    assert err.url == URL and URL in str(err)
    assert isinstance(err.offset, int) and f"offset={err.offset}" in str(err)
    return err


def patch(raw: bytes, header: int, start: int, value: bytes, checksum: bool = True) -> bytes:
    """Overwrite a header field at ``header + start`` and (by default) recompute the checksum."""
    buf = bytearray(raw)
    buf[header + start : header + start + len(value)] = value
    if checksum:
        block = buf[header : header + 512]
        block[148:156] = b" " * 8
        buf[header + 148 : header + 156] = b"%06o\0 " % sum(block)
    return bytes(buf)


def rand_bytes(n: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(n)


def files(*sizes: int, prefix: str = "s/") -> list[Entry]:
    return [Entry(f"{prefix}{i:04d}.bin", data=rand_bytes(n, i)) for i, n in enumerate(sizes)]


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


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("which", [0, 1])
def test_corrupt_checksum(which: int) -> None:
    raw = build(files(100, 100))
    header = header_offsets(raw)[which][1]
    err = fail(patch(raw, header, 0, b"X", checksum=False))
    assert type(err) is ShardFormatError and err.offset == header and "checksum" in err.message


def test_signed_checksum_accepted() -> None:
    raw = build([Entry("\xe9t\xe9", data=b"abc")])  # utf-8 bytes >= 0x80 make the sums differ
    signed = sum(b - 256 if b > 127 else b for b in raw[:148] + b" " * 8 + raw[156:512])
    members, _ = parse(patch(raw, 0, 148, b"%06o\0 " % signed, checksum=False))
    assert [m.data for m in members] == [b"abc"]


@pytest.mark.parametrize("field", [b"00000x001750", b"\xff" * 12])
def test_bad_size_field(field: bytes) -> None:
    raw = build(files(100, 100))
    header = header_offsets(raw)[1][1]
    err = fail(patch(raw, header, 124, field))
    assert type(err) is ShardFormatError and err.offset == header and "size" in err.message


@pytest.mark.parametrize(
    "body",
    [
        b"<html><head><title>404 Not Found</title></head>\n<body>" + b"x" * 1000 + b"</body></html>",
        b"<html><head><title>403</title></head></html>\n",  # shorter than one block
        b"AccessDenied: request has expired\n" * 40,
        b"Not Found\n",
        rand_bytes(4096, 3),
    ],
)
def test_not_a_tar(body: bytes) -> None:
    err = fail(body, [100])
    assert type(err) is ShardFormatError and err.offset == 0
    assert "not a tar archive" in err.message and repr(body[:12])[2:-1] in err.message


def test_zero_bytes() -> None:
    for data in (b"", gzip.compress(b"")):
        err = fail(data)
        assert isinstance(err, TruncatedShard) and err.offset == 0 and "empty shard" in err.message


def test_truncated_mid_header() -> None:
    raw = build(files(100, 100))
    header = header_offsets(raw)[1][0]
    err = fail(raw[: header + 100], [64])
    assert isinstance(err, TruncatedShard) and err.offset == header and "header" in err.message


def test_truncated_mid_member() -> None:
    raw = build([Entry("x/y.jpg", data=rand_bytes(5000))])
    err = fail(raw[: 512 + 1234])
    assert isinstance(err, TruncatedShard) and err.offset == 0
    assert "stream ended 1234 bytes into member 'x/y.jpg' of 5000 bytes" in err.message


def test_truncated_mid_padding() -> None:
    raw = build(files(100, 5000))
    first, own = header_offsets(raw)[1]
    parser = TarParser(url=URL)
    assert len(parser.feed(raw[: own + 512 + 5000 + 10])) == 2  # member data complete: returned
    with pytest.raises(TruncatedShard) as info:
        parser.close()
    assert info.value.offset == first and "padding" in info.value.message and URL in str(info.value)


def test_truncated_at_member_boundary() -> None:
    raw = build(files(100, 5000))
    end = header_offsets(raw)[-1][1] + 512 + 5120
    err = fail(raw[:end])
    assert isinstance(err, TruncatedShard) and err.offset == end
    assert "end-of-archive marker" in err.message and "member boundary" in err.message


def test_truncated_after_prefix_headers() -> None:
    raw = build(files(10, prefix="L" * 300), tarfile.GNU_FORMAT)
    first, own = header_offsets(raw)[0]
    err = fail(raw[:own])
    assert isinstance(err, TruncatedShard) and err.offset == first == 0


@pytest.mark.parametrize("cut", [-4, -30, 40, 11])
def test_truncated_gzip(cut: int) -> None:
    data = gzip.compress(build(files(3000, 20)))
    err = fail(data[:cut])
    assert isinstance(err, TruncatedShard) and "gzip" in err.message


def test_corrupt_gzip() -> None:
    data = bytearray(gzip.compress(build(files(3000, 20))))
    data[-6] ^= 0xFF  # the CRC-32 of the member
    err = fail(bytes(data))
    assert type(err) is ShardFormatError and "gzip" in err.message and 0 <= err.offset <= 10240
    err = fail(gzip.compress(b"")[:10] + b"\xff" * 40)  # invalid deflate block type
    assert type(err) is ShardFormatError and "gzip" in err.message and err.offset == 0


def test_garbage_between_gzip_members() -> None:
    raw = build(files(3000, 20))
    err = fail(gzip.compress(raw[:1000]) + b"PK\x03\x04" + gzip.compress(raw[1000:]))
    assert type(err) is ShardFormatError and "gzip" in err.message and err.offset == 1000


@pytest.mark.parametrize(
    "records", [b"999 path=a\n", b"5 path=abc\n", b"abc\n", b"12 pathabcd\n", b"12 path=abc ", b"9 size=x\n"]
)
def test_bad_pax_records(records: bytes) -> None:
    raw = build([Entry("pax", b"x", data=records), *files(3)])
    err = fail(raw)
    assert type(err) is ShardFormatError and err.offset == 0 and "PAX" in err.message


def test_sparse_members_are_refused() -> None:
    raw = patch(build(files(10)), 0, 156, b"S")
    err = fail(raw)
    assert type(err) is ShardFormatError and "sparse" in err.message


def test_dead_parser_reraises() -> None:
    parser = TarParser(url=URL)
    with pytest.raises(ShardFormatError) as info:
        parser.feed(b"<html>" * 100)
    for again in (lambda: parser.feed(build(files(1))), parser.close):
        with pytest.raises(ShardFormatError) as second:
            again()
        assert second.value is info.value
