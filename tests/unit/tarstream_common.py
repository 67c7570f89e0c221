"""What the tar parser's tests share (``test_tarstream.py``, ``test_tarstream_errors.py``): archives built entry by
entry in any tar format (optionally gzipped), what ``tarfile`` reads from them, chunking, parsing and failing with
the parser, and patching a header's field."""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pytest

from wds_async.engine.tarstream import Member, TarParser
from wds_async.errors import ShardFormatError

URL = "https://example.test/shards/shard-000007.tar"


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
