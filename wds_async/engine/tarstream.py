"""Sans-IO incremental parser for tar and gzipped tar streams.

``TarParser.feed(chunk)`` takes bytes in whatever pieces the network delivers and returns the regular
files those bytes complete; ``close()`` says whether the stream held a whole archive. There is no I/O,
no thread and no clock in here: the async driver is a loop around ``feed``. This module is the stream's state
machine; the fields of one header and PAX records are decoded in :mod:`wds_async.engine.tarheader`.

Invariants:

* Offsets are absolute positions in the decompressed tar stream, counted from ``start_offset``.
  ``Member.offset`` is the member's first header block, its PAX ``x`` / GNU ``L``/``K`` prefix headers
  included, which is what ``tarfile.TarInfo.offset`` reports and a valid point to resume from. A global
  PAX header (``g``) belongs to the archive, not to the next member, and is ignored entirely.
* Each input byte is handled once. A header is sliced out whole when one chunk holds it, otherwise
  gathered in a buffer of at most 511 bytes; member data is kept as a list of slices and joined once, so
  a member costs one copy however it was chunked. A plain regular file whose header and data lie in one
  chunk takes a fast path that copies its data straight out of the chunk and keeps no state.
* ``pending_bytes`` counts every byte the parser retains (partial header, member data, an undecided
  magic byte); it is 0 at each member boundary. A kept slice keeps its whole chunk alive, so the memory
  held exceeds it by less than one chunk. Slices of a mutable input buffer are copied before ``feed``
  returns, so the caller may reuse its buffer.
* Gzip is recognised by its magic bytes, never by name. One zlib call yields at most ``_GZIP_STEP``
  bytes, which bounds memory per step against compression bombs.
* The first all-zero block ends the archive and the bytes after it are ignored (the gzip member that
  holds it is still inflated to its end so that its CRC is checked).
* A regular file whose header announces more than ``max_member_bytes`` raises
  :class:`~wds_async.errors.SampleTooLarge` from that header, before any of its data is kept, so a
  corrupt or hostile size field costs nothing (the engine passes ``EngineConfig.max_sample_bytes``).
* EOF is not success: ``close()`` raises :class:`TruncatedShard` unless the end-of-archive block was
  seen and no gzip member is left open. A parser that raised stays failed and re-raises that error.
"""

from __future__ import annotations

import functools
import zlib
from typing import NamedTuple

from ..errors import SampleTooLarge, ShardFormatError, TruncatedShard
from .tarheader import (
    HeaderError,
    block_sum,
    check_checksum,
    excerpt,
    header_name,
    looks_like_tar,
    parse_pax,
    parse_size,
)

__all__ = ["Member", "TarParser"]

_BLOCK = 512
_ZERO_BLOCK = bytes(_BLOCK)
_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_STEP = 1 << 20  # most bytes one zlib call may produce
_MAX_META = 1 << 20  # largest PAX or GNU long-name payload we agree to buffer
_REGULAR = frozenset(b"0\x007")  # typeflags of regular files (as ints)
_FILE_FLAG, _CONTIG_FLAG = b"07"  # the regular typeflags that need no further look (NUL may be a V7 dir)
_NO_DATA = frozenset(b"123456")  # links, devices, dirs, fifos: like tarfile, ignore their size field
_PAX = frozenset(b"xX")
_GLOBAL, _LONGNAME, _LONGLINK, _SPARSE, _DIRTYPE = b"gLKS5"

# States of the tar layer, and what the data of the current entry is for.
_HEADER, _DATA, _PAD, _DONE = range(4)
_SKIP, _FILE, _PAX_X, _NAME = range(4)


class Member(NamedTuple):
    """A regular file of the archive: full path, offset of its first header block, content, and ``end``:
    the offset just past its data's padding (where the next entry's header starts). Immutable; a tuple
    because one is made per member and a tuple is the cheapest record to build."""

    name: str
    offset: int
    data: bytes
    end: int = -1

    def __repr__(self) -> str:
        return f"Member(name={self.name!r}, offset={self.offset}, end={self.end})"


#: Member(name, offset, data, end) without the Python-level ``__new__`` of a named tuple.
_new_member = functools.partial(tuple.__new__, Member)


class TarParser:
    """Incremental tar (or gzipped tar) parser; see the module docstring for its invariants."""

    def __init__(self, *, url: str | None = None, start_offset: int = 0, max_member_bytes: int | None = None) -> None:
        self._url = url
        self._max_member = max_member_bytes if max_member_bytes is not None else 1 << 63
        self._start = start_offset
        self._pos = start_offset  # absolute offset of the next byte the tar layer takes
        self._error: ShardFormatError | SampleTooLarge | None = None
        self._gzip: bool | None = None  # undecided until two bytes were seen
        self._sniff = b""  # a lone first byte, or half a gzip magic between gzip members
        self._gz: zlib._Decompress | None = None  # the gzip member being inflated
        self._gz_ignore = False  # archive ended and its gzip member closed: drop all further input
        self._state = _HEADER
        self._hbuf = bytearray()  # a header block split across chunks
        self._headers = 0  # header blocks parsed so far
        # The entry whose data is being read: what for, its name, first header, size, what is left.
        self._kind, self._name, self._entry_off, self._size, self._left, self._pad = _SKIP, "", 0, 0, 0, 0
        self._parts: list[bytes | memoryview] = []
        self._parts_len = 0
        # What PAX / GNU prefix headers said about the next member.
        self._prefix_off: int | None = None
        self._next_name: str | None = None
        self._next_size: int | None = None

    @property
    def offset(self) -> int:
        """Absolute position reached in the decompressed stream; stops at the end-of-archive block."""
        return self._pos

    @property
    def pending_bytes(self) -> int:
        """Bytes retained by the parser (partial header, partial member data, undecided magic)."""
        return len(self._hbuf) + self._parts_len + len(self._sniff)

    @property
    def finished(self) -> bool:
        """Whether the end-of-archive block has been seen."""
        return self._state == _DONE

    def feed(self, data: bytes | bytearray | memoryview) -> list[Member]:
        """Parse the next chunk; return the regular files it completed, in archive order."""
        if self._error is not None:
            raise self._error
        mv = memoryview(data)
        if mv.ndim != 1 or mv.format != "B":
            mv = mv.cast("B")
        out: list[Member] = []
        if not mv.nbytes:
            return out
        try:
            if self._gzip is None:  # decide on the first two bytes, holding a lone first byte back
                if len(self._sniff) + len(mv) < 2:
                    self._sniff += mv.tobytes()
                    return out
                self._gzip = (self._sniff + mv[:2].tobytes())[:2] == _GZIP_MAGIC
                if self._sniff and not self._gzip:  # (in gzip mode _gunzip takes the held byte)
                    self._tar(memoryview(self._sniff), out)
                    self._sniff = b""
            if self._gzip:
                self._gunzip(mv, out)
            else:
                self._tar(mv, out)
        except (ShardFormatError, SampleTooLarge) as exc:
            self._error = exc
            raise
        if not mv.readonly and self._parts:
            # The caller may overwrite its buffer once we return: own what we keep of it.
            self._parts = [p if isinstance(p, bytes) or p.readonly else p.tobytes() for p in self._parts]
        return out

    @property
    def compressed(self) -> bool | None:
        """Whether the stream is gzip (None until its first two bytes were seen)."""
        return self._gzip

    @property
    def at_boundary(self) -> bool:
        """Whether the parser stands between two entries (or after the end marker): no member, header or
        extended-header chain is half read. A ranged read that ends at a sample boundary ends here."""
        if self._state == _DONE:
            return True
        return (self._state == _HEADER and not self._hbuf and self._prefix_off is None
                and not (self._gzip and self._gz is not None) and not self._sniff)

    def close(self) -> None:
        """Declare the end of the stream; raise :class:`TruncatedShard` unless the archive was whole."""
        if self._error is not None:
            raise self._error
        try:
            self._check_end()
        except ShardFormatError as exc:
            self._error = exc
            raise

    # -- framing ---------------------------------------------------------------------------------

    def _bad(self, message: str, offset: int) -> ShardFormatError:
        return ShardFormatError(message, url=self._url, offset=offset)

    def _cut(self, message: str, offset: int) -> TruncatedShard:
        return TruncatedShard(message, url=self._url, offset=offset)

    def _too_large(self, name: str, size: int, offset: int) -> SampleTooLarge:
        return SampleTooLarge(
            f"tar member {name!r} announces {size} bytes, more than max_sample_bytes={self._max_member}; "
            "raise max_sample_bytes if samples this large are intended, else the shard is corrupt",
            url=self._url, offset=offset, member=name, size=size, limit=self._max_member)

    def _gunzip(self, mv: memoryview, out: list[Member]) -> None:
        data: bytes | memoryview = mv
        while data and not self._gz_ignore:
            if self._gz is None:  # at the start of the stream or after a gzip member ended
                head = self._sniff + bytes(data[: 2 - len(self._sniff)])
                if len(head) < 2:
                    self._sniff = head
                    return
                if head != _GZIP_MAGIC:  # (after the archive's end _gz_ignore is already set)
                    raise self._bad(f"bytes after a gzip member are not gzip: {excerpt(data)}", self._pos)
                self._gz = zlib.decompressobj(31)
                if self._sniff:
                    held, self._sniff = self._sniff, b""
                    self._inflate(self._gz, held, out)
            data = self._inflate(self._gz, data, out)

    def _inflate(self, gz: zlib._Decompress, data: bytes | memoryview, out: list[Member]) -> bytes:
        """Feed one gzip member; return the input left over after its end (b"" if it goes on)."""
        while True:
            try:
                chunk = gz.decompress(data, _GZIP_STEP)
            except zlib.error as exc:
                raise self._bad(f"corrupt gzip stream: {exc}", self._pos) from exc
            if chunk and self._state != _DONE:
                self._tar(memoryview(chunk), out)
            if gz.eof:
                self._gz = None
                self._gz_ignore = self._state == _DONE
                return gz.unused_data
            data = gz.unconsumed_tail
            # A full output step may leave output inside zlib even when all input was taken.
            if not data and len(chunk) < _GZIP_STEP:
                return b""

    # -- tar -------------------------------------------------------------------------------------

    def _tar(self, mv: memoryview, out: list[Member]) -> None:
        n = len(mv)
        i = 0
        base = self._pos
        while i < n:
            state = self._state
            if state == _DATA:
                take = min(self._left, n - i)
                if self._kind:  # anything but _SKIP keeps its data
                    self._parts.append(mv[i : i + take])
                    self._parts_len += take
                i += take
                self._left -= take
                if not self._left:
                    self._pos = base + i
                    self._complete(out)
            elif state == _PAD:
                take = min(self._pad, n - i)
                i += take
                self._pad -= take
                if not self._pad:
                    self._state = _HEADER
            elif state == _HEADER:
                hbuf = self._hbuf
                if not hbuf and n - i >= _BLOCK:
                    i = self._entries(mv, i, base, out)
                    continue
                take = min(_BLOCK - len(hbuf), n - i)
                hbuf += mv[i : i + take]
                i += take
                if len(hbuf) < _BLOCK:
                    break
                block = bytes(hbuf)
                hbuf.clear()
                self._pos = base + i
                self._header(block, base + i - _BLOCK, out)
            else:  # _DONE: what follows the end-of-archive block is not ours
                self._pos = base + i
                return
        self._pos = base + i

    def _entries(self, mv: memoryview, i: int, base: int, out: list[Member]) -> int:
        """The header state with a whole block at ``mv[i]``: parse entries while their headers lie in this
        chunk and return where it stopped. A plain regular file (typeflag ``0`` or ``7``, no extended
        header before it) whose data lies here too is emitted at once: its data is copied straight out of
        the chunk, and no entry state is kept. Anything else goes through :meth:`_header`.

        This loop runs once per member, so the usual field layouts (what tarfile and GNU tar write) are
        read inline and anything else falls back to the general checks."""
        n = len(mv)
        obj = mv.obj  # slicing the chunk's own bytes makes one object per slice, a memoryview two
        raw = obj if type(obj) is bytes and len(obj) == n else None
        while n - i >= _BLOCK:
            off = base + i
            block = raw[i : i + _BLOCK] if raw is not None else mv[i : i + _BLOCK].tobytes()
            i += _BLOCK
            flag = block[156]
            if (flag != _FILE_FLAG and flag != _CONTIG_FLAG) or self._prefix_off is not None:
                self._pos = base + i
                self._header(block, off, out)
                if self._state != _HEADER:
                    return i
                continue
            # The checksum: when the field reads "%06o\0 " of the computed sum it is right; else the full check.
            field = block[148:156]
            if field != b"%06o\0 " % (block_sum(block) - sum(field) + 8 * 32):
                self._verify_checksum(block, off, not self._headers)
            self._headers += 1
            digits = block[124:135]
            if block[135] or not digits.isdigit():
                size = self._parse_size(block, off)
            else:
                try:
                    size = int(digits, 8)
                except ValueError:  # an 8 or a 9
                    size = self._parse_size(block, off)
            name = header_name(block) if block[345] else block[:100].split(b"\0", 1)[0].decode(
                "utf-8", "surrogateescape")
            if size > self._max_member:
                raise self._too_large(name, size, off)
            if n - i < size:  # the data goes on in the next chunk
                self._pos = base + i
                self._begin(_FILE, size, name, off, out)
                return i
            data = (raw[i : i + size] if raw is not None else mv[i : i + size].tobytes()) if size else b""
            i += size
            pad = -size % _BLOCK
            out.append(_new_member((name, off, data, base + i + pad)))
            if n - i < pad:  # the padding goes on in the next chunk
                self._kind, self._name, self._entry_off, self._size, self._left = _FILE, name, off, size, 0
                self._pad = pad - (n - i)
                self._state = _PAD
                return n
            i += pad
        return i

    def _header(self, block: bytes, off: int, out: list[Member]) -> None:
        if block == _ZERO_BLOCK:
            self._state = _DONE
            return
        first = not self._headers
        self._headers += 1
        self._verify_checksum(block, off, first)
        flag = block[156]
        size = self._parse_size(block, off)
        if flag in _PAX or flag in (_GLOBAL, _LONGNAME, _LONGLINK):
            if size > _MAX_META:
                raise self._bad(f"extended header of {size} bytes is too large", off)
            if flag != _GLOBAL and self._prefix_off is None:
                self._prefix_off = off
            kind = _PAX_X if flag in _PAX else _NAME if flag == _LONGNAME else _SKIP
            self._begin(kind, size, "", off, out)
            return
        if flag == _SPARSE:
            raise self._bad("GNU sparse members are not supported", off)
        name = self._next_name if self._next_name is not None else header_name(block)
        if self._next_size is not None:
            size = self._next_size
        entry_off = off if self._prefix_off is None else self._prefix_off
        self._prefix_off = self._next_name = self._next_size = None
        if flag == 0 and header_name(block).endswith("/"):
            flag = _DIRTYPE  # an old V7 archive's way to say directory
        if flag in _NO_DATA:
            size = 0
        self._begin(_FILE if flag in _REGULAR else _SKIP, size, name, entry_off, out)

    def _begin(self, kind: int, size: int, name: str, off: int, out: list[Member]) -> None:
        if kind == _FILE and size > self._max_member:
            raise self._too_large(name, size, off)
        self._kind, self._name, self._entry_off, self._size, self._left = kind, name, off, size, size
        self._pad = -size % _BLOCK
        if size:
            self._state = _DATA
        else:
            self._complete(out)

    def _complete(self, out: list[Member]) -> None:
        data = b"".join(self._parts)
        self._parts = []
        self._parts_len = 0
        if self._kind == _FILE:
            out.append(Member(self._name, self._entry_off, data, self._pos + self._pad))
        elif self._kind == _PAX_X:
            self._apply_pax(data)
        elif self._kind == _NAME and self._next_name is None:
            self._next_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        self._state = _PAD if self._pad else _HEADER

    def _verify_checksum(self, block: bytes, off: int, first: bool) -> None:
        try:
            check_checksum(block, first)
        except HeaderError as error:
            raise self._bad(str(error), off) from None

    def _parse_size(self, block: bytes, off: int) -> int:
        try:
            return parse_size(block)
        except HeaderError as error:
            raise self._bad(str(error), off) from None

    def _apply_pax(self, data: bytes) -> None:
        """Keep what a PAX header says of the next member; like tarfile, the first header of a chain wins."""
        try:
            fields = parse_pax(data)
        except HeaderError as error:
            raise self._bad(str(error), self._entry_off) from None
        if fields.path is not None and self._next_name is None:  # "" too (path=/), as tarfile reads it
            self._next_name = fields.path
        if fields.size is not None and self._next_size is None:
            self._next_size = fields.size

    # -- end of stream ---------------------------------------------------------------------------

    def _check_end(self) -> None:
        if self._gzip is None:  # fewer than two bytes ever arrived
            if not self._sniff:
                raise self._cut("empty shard: 0 bytes", self._start)
            self._gzip, held, self._sniff = False, self._sniff, b""
            self._tar(memoryview(held), [])
        elif self._gzip and self._gz is not None:
            raise self._cut("stream ended inside a gzip member; the gzip stream is truncated", self._pos)
        if self._state == _DONE:
            return
        if self._state == _HEADER:
            got = len(self._hbuf)
            if got and not self._headers and not looks_like_tar(self._hbuf):
                raise self._bad(f"the bytes are not a tar archive: {excerpt(self._hbuf)}", self._pos - got)
            if got:
                msg = f"stream ended {got} bytes into a 512-byte tar header ({excerpt(self._hbuf, 20)})"
                raise self._cut(msg, self._pos - got)
            if self._pos == self._start:
                msg = "empty shard: 0 bytes" + (" after gzip decompression" if self._gzip else "")
                raise self._cut(msg, self._pos)
            if self._prefix_off is not None:
                msg = "stream ended after the PAX/GNU extended headers of a member, before the member"
                raise self._cut(msg, self._prefix_off)
            msg = "stream ended without the tar end-of-archive marker; the shard is truncated at a member"
            raise self._cut(msg + " boundary", self._pos)
        names = {_FILE: f"member {self._name!r}", _PAX_X: "a PAX extended header", _NAME: "a GNU long name"}
        entry = names.get(self._kind, f"entry {self._name!r}" if self._name else "an extended header")
        if self._state == _DATA:
            msg = f"stream ended {self._size - self._left} bytes into {entry} of {self._size} bytes"
        else:
            msg = f"stream ended in the padding after {entry} ({self._pad} of {-self._size % _BLOCK} missing)"
        raise self._cut(msg, self._entry_off)
