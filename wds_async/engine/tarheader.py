"""The fields of one tar header block and the records of a PAX extended header, decoded.

Pure functions over bytes, without state: the checksum (POSIX's unsigned sum, or the signed sum some historic tars
wrote), the size field (octal, or GNU's base-256), the name (with the ustar prefix), PAX records, and the guess of
whether the first bytes of a stream are tar at all, for the error that says what they are instead.
:class:`~wds_async.engine.tarstream.TarParser` owns the stream's state and turns a :class:`HeaderError` into a
:class:`~wds_async.errors.ShardFormatError` that names the shard and the offset.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

__all__ = ["HeaderError", "PaxFields", "block_sum", "check_checksum", "excerpt", "header_name", "looks_like_tar",
           "parse_pax", "parse_size"]

_OCTAL = b"01234567"
_CONTROL = bytes(range(1, 32)) + b"\x7f"
_MAGICS = (b"ustar\x00", b"ustar ", bytes(6))
_NUMERIC_FIELDS = ((100, 108), (108, 116), (116, 124), (124, 136), (136, 148), (148, 156))


class HeaderError(ValueError):
    """A header field or PAX record that cannot be decoded; the message says which and how."""


class PaxFields(NamedTuple):
    """What a PAX extended header says of the member after it: its path and size, where given."""

    path: str | None
    size: int | None


def block_sum(block: bytes) -> int:
    """The sum of a 512-byte block's bytes. A 256-byte half sums to at most 65280, below adler32's
    modulus, so adler32's low 16 bits are exactly 1 + that half's sum: two C calls, not 512 additions."""
    return (zlib.adler32(block[:256]) & 0xFFFF) + (zlib.adler32(block[256:]) & 0xFFFF) - 2


def excerpt(buf: bytes | bytearray | memoryview, limit: int = 40) -> str:
    """The first ``limit`` bytes of ``buf`` for an error message, with ``...`` where it was cut."""
    text = repr(bytes(buf[:limit]))
    return text[:-1] + "..." + text[-1] if len(buf) > limit else text


def looks_like_tar(buf: bytes | bytearray) -> bool:
    """Whether a (possibly partial) first block could be a tar header at all."""
    name = bytes(buf[:100]).split(b"\0", 1)[0]
    if len(name.translate(None, _CONTROL)) != len(name):
        return False  # newlines and other control bytes: text, HTML, JSON error bodies
    for start, end in _NUMERIC_FIELDS:
        num = bytes(buf[start:end])
        if num and not num[0] & 0x80 and num.translate(None, _OCTAL + b" \0"):
            return False
    magic = bytes(buf[257:263])
    return not magic or any(m.startswith(magic) for m in _MAGICS)


def header_name(block: bytes) -> str:
    """The entry's path: the name field, after the prefix field in a POSIX ustar header."""
    name = block[:100].split(b"\0", 1)[0]
    if block[345] and block[257:263] == b"ustar\x00":  # POSIX ustar: the prefix field extends the name
        prefix = block[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def check_checksum(block: bytes, first: bool) -> None:
    """Raise :class:`HeaderError` unless the header's checksum field matches its bytes. ``first``: the stream's
    first header, where a mismatch more likely means the bytes are not tar at all (and the error says so)."""
    raw = block[148:156]
    digits = raw.split(b"\0", 1)[0].strip(b" ")
    if digits and not digits.translate(None, _OCTAL):
        stored = int(digits, 8)
        unsigned = block_sum(block) - sum(raw) + 8 * 32  # the field itself counts as spaces
        if stored == unsigned:
            return
        # Some historic tars summed signed chars; POSIX readers accept either.
        signed = sum(struct.unpack_from("148b", block)) + sum(struct.unpack_from("356b", block, 156))
        if stored == signed + 8 * 32:
            return
        problem = f"tar header checksum mismatch (stored {stored}, computed {unsigned})"
    else:
        problem = f"tar header has a non-octal checksum field {raw!r}"
    if first and not looks_like_tar(block):
        problem = f"the bytes are not a tar archive; they start with {excerpt(block)}"
    raise HeaderError(problem)


def parse_size(block: bytes) -> int:
    """The size field: octal, or GNU's base-256 (0x80, then a big-endian number)."""
    raw = block[124:136]
    if raw[0] & 0x80:  # 0xff would be negative
        if raw[0] == 0x80:
            return int.from_bytes(raw[1:], "big")
        raise HeaderError(f"tar header has an impossible size field {raw!r}")
    digits = raw.split(b"\0", 1)[0].strip(b" ")
    if digits.translate(None, _OCTAL):
        raise HeaderError(f"tar header has a non-octal size field {raw!r}")
    return int(digits, 8) if digits else 0


def parse_pax(data: bytes) -> PaxFields:
    """Parse ``"<len> <key>=<value>\\n"`` records and return the ones that frame the next member."""
    records: dict[bytes, bytes] = {}
    pos, end = 0, len(data)
    while pos < end and data[pos]:  # NUL padding after the last record is tolerated
        space = data.find(b" ", pos, pos + 20)
        digits = data[pos:space] if space > pos else b""
        stop = pos + int(digits) if digits.isdigit() else -1
        key, eq, value = data[space + 1 : stop - 1].partition(b"=")
        if stop <= space + 1 or stop > end or data[stop - 1] != 0x0A or not eq or not key:
            raise HeaderError(f"bad PAX record {excerpt(data[pos:])}")
        records[key] = value
        pos = stop
    if any(key.startswith(b"GNU.sparse.") for key in records):
        raise HeaderError("GNU sparse members are not supported")
    path = records.get(b"path")
    size = records.get(b"size")
    if size is not None and not size.isdigit():
        raise HeaderError(f"bad PAX size {size!r}")
    return PaxFields(path.decode("utf-8", "surrogateescape").rstrip("/") if path else None,
                     int(size) if size is not None else None)
