"""Tests of the sans-IO tar parser's errors: corrupt checksums and size fields, not a tar, every kind of truncation,
damaged gzip, bad PAX records, sparse members and a parser that stays failed. Agreement with ``tarfile`` is in
``test_tarstream.py``; the archive builders both use are in ``tarstream_common.py``."""

from __future__ import annotations

import gzip
import tarfile

import pytest

from tests.unit.tarstream_common import (
    URL,
    Entry,
    build,
    fail,
    files,
    header_offsets,
    parse,
    patch,
    rand_bytes,
)
from wds_async.engine.tarstream import TarParser
from wds_async.errors import ShardFormatError, TruncatedShard

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
