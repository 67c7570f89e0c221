"""Writing WebDataset shards: :class:`TarWriter` (one tar) and :class:`ShardWriter` (numbered tars).

A drop-in for ``webdataset.TarWriter`` / ``ShardWriter`` 1.0.2: same signatures and defaults, members
named ``{key}.{field}`` in sorted field order, owner ``bigdata:bigdata``, mode ``0o444``, PAX headers,
10240-byte records, ``write()`` returning the sample's payload bytes (headers not counted: that is what
``ShardWriter(maxsize=)`` adds up), and the same default encoder table (:data:`default_handlers`).

Bit-exact output: with a fixed ``mtime=`` two runs write identical bytes, ``.tgz`` included (the gzip
header then carries that mtime and no file name, where tarfile stamps the clock and the name). The
encoders are pure: ``.gz`` fields and ``.npz`` archives get fixed inner timestamps. With the same fixed
``mtime`` an uncompressed shard equals webdataset's byte for byte.

Sanitising: a member name never leads out of the directory it is extracted into. ``{key}.{field}`` is
rejected with :class:`~wds_async.errors.SampleError` (a ValueError naming the sample) when it is
absolute (``/x``, ``\\x``, ``C:x``), has an empty or ``..`` component (``/`` and ``\\`` both separate)
or holds NUL. A rejected sample writes nothing: all fields are encoded and checked before any byte.

Where the bytes go (:mod:`wds_async.write.sinks`): a local path or ``file://`` URL is written to
``.NAME.<random>.wds-partial`` (:mod:`wds_async._atomic`) and renamed into place when the shard is closed; ``s3://``, ``gs://``, ``az://``
and Azure https URLs stream as multipart, resumable or block uploads with the reading side's credentials
(``backend_options=``, the same environment), holding about three parts in memory (``part_bytes=``,
retried per ``retry=``), committed when the shard is closed. A shard that fails (an error mid-sample, a
failed upload, Ctrl-C) or is left by an exception out of a ``with`` block is aborted: no file or object,
whole or half, appears under its name. ``pipe:CMD`` feeds a command's stdin; ``-`` is stdout.

Deliberate differences from webdataset 1.0.2: the default mtime is whole seconds (a float costs a PAX
record per member); ``format=`` is honoured (webdataset ignores it); a ``pipe:`` command must exit 0
(webdataset lets 141 pass) and ``WDS_ASYNC_NO_PIPE=1`` forbids it; object stores are written directly
(webdataset needs ``pipe:``); a shard appears only once complete, and an exception out of ``with`` discards
it (webdataset closes it as a shorter, valid tar); ``pbm``/``pgm``, HxWx1 arrays, RGBA and torch tensors
(CHW) encode; ``npy``/``npz`` never pickle; ``cbor`` uses cbor2; ``ShardWriter`` logs to stderr, closes
what ``opener`` returned, keeps its attributes after an idempotent ``close()``.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import re
import sys
import tarfile
import time
from collections.abc import Callable, Mapping
from contextlib import suppress
from typing import IO, TYPE_CHECKING, Any

from ..config import RetryPolicy
from ..errors import SampleError, UrlError
from ..index.format import ShardEntry, ShardIndex
from ..io.registry import backend_key
from ..urls import redact_url, scheme_of
from .encoders import _BYTES, _encode_sample, default_handlers, make_encoder
from .sinks import open_sink, put_bytes
from .sinks.pipe import PipeSink

if TYPE_CHECKING:
    from typing import Self

__all__ = ["ShardWriter", "TarWriter", "default_handlers", "make_encoder"]

_FORMATS = {"ustar": tarfile.USTAR_FORMAT, "gnu": tarfile.GNU_FORMAT, "pax": tarfile.PAX_FORMAT}
_UNSAFE_NAME = re.compile(r"^[/\\]|^[A-Za-z]:|(^|[/\\])(\.\.)?([/\\]|$)|\x00")


def _compression(target: Any, compress: bool | str | None) -> str | None:
    if compress is False:
        return None
    if compress in (True, "gz", "gzip", "bz2", "xz"):
        return "gz" if compress in (True, "gzip") else compress  # type: ignore[return-value]
    if compress is not None:
        raise ValueError(f"compress must be None, True, False, 'gz', 'bz2' or 'xz', not {compress!r}")
    name = target if isinstance(target, str) else ""
    return next((kind for kind in ("gz", "bz2", "xz") if name.endswith(kind)), None)


class TarWriter:
    """Write samples (dicts with ``__key__``) into one tar: a path or ``file://`` URL, ``s3://``, ``gs://``,
    ``az://`` or an Azure https URL, ``pipe:CMD``, ``-`` (stdout) or a file object.

    ``compress``: None (from the name: ``...gz``, ``...bz2``, ``...xz``), True/"gz", "bz2", "xz" or False.
    ``encoder``: True (:data:`default_handlers`), a dict of handlers, a callable sample -> sample, or
    False/None (values must already be bytes; metadata may be str). ``keep_meta`` also writes the fields
    starting with ``_`` (except ``__key__``). ``mtime`` (seconds) makes the output bit-exact. ``format``:
    None (PAX, as webdataset writes), "ustar", "gnu", "pax" or a tarfile constant. ``record_samples``
    keeps ``(key, offset, end)`` of each written sample in ``samples``: the byte range of its members in
    the tar stream, before compression (what a shard index records). ``compression`` is the compressor
    in use: None, "gz", "bz2" or "xz". ``backend_options`` (as ``WebDataset`` takes them), ``part_bytes``
    and ``retry`` configure the upload to a store (:func:`wds_async.write.sinks.open_sink`). The tar is committed
    by :meth:`close` and discarded by :meth:`abort`, by a failure mid-write, or by an exception out of a
    ``with`` block (see the module docstring).
    """

    def __init__(self, fileobj: str | os.PathLike[str] | IO[bytes], user: str = "bigdata", group: str = "bigdata",
                 mode: int = 0o0444, compress: bool | str | None = None, encoder: Any = True, keep_meta: bool = False,
                 mtime: float | None = None, format: Any = None, *, record_samples: bool = False,
                 backend_options: Mapping[str, Any] | None = None, part_bytes: int | None = None,
                 retry: RetryPolicy | None = None) -> None:
        if mtime is not None and (isinstance(mtime, bool) or not isinstance(mtime, (int, float)) or mtime < 0):
            raise ValueError(f"mtime must be a non-negative number of seconds, not {mtime!r}")
        self._format: Any = _FORMATS.get(format, format) if format is not None else tarfile.PAX_FORMAT
        if self._format not in _FORMATS.values():
            raise ValueError(f"format must be 'ustar', 'gnu', 'pax' or a tarfile format constant, not {format!r}")
        self.user, self.group, self.mode, self.compress = user, group, mode, compress
        self.keep_meta, self.mtime, self.encoder = keep_meta, mtime, make_encoder(encoder)
        self._handlers = default_handlers if encoder is True else encoder if isinstance(encoder, Mapping) else None
        target = os.fspath(fileobj) if isinstance(fileobj, (str, os.PathLike)) else fileobj
        kind = self.compression = _compression(target, compress)
        self.url: str | None = redact_url(target) if isinstance(target, str) else None
        self._owned = isinstance(target, str) and target != "-"
        if target == "-":
            self.stream: Any = sys.stdout.buffer
        elif isinstance(target, str) and target.startswith("pipe:"):
            self.stream = PipeSink(target)
        elif isinstance(target, str):
            self.stream = open_sink(target, options=backend_options, part_bytes=part_bytes, policy=retry)
        else:
            self.stream = target
        gz_mtime = None if mtime is None else min(int(mtime), 0xFFFFFFFF)
        # Compressors wrap the stream without owning it; close() finishes them before the stream.
        self._out: Any = self.stream
        if kind == "gz":  # no file name in the header, and the fixed mtime when given: bit-exact .tgz
            self._out = gzip.GzipFile(filename="", mode="wb", fileobj=self.stream, compresslevel=9, mtime=gz_mtime)
        elif kind == "bz2":
            self._out = bz2.BZ2File(self.stream, "wb")
        elif kind == "xz":
            self._out = lzma.LZMAFile(self.stream, "wb")  # noqa: SIM115
        self._offset, self._closed, self._broken = 0, False, False
        self.samples: list[tuple[str, int, int]] | None = [] if record_samples else None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def abort(self) -> None:
        """Discard the tar: nothing is committed (no file or object; a ``pipe:`` command is killed; a borrowed
        file object gets no end-of-archive marker). Never raises."""
        if not self._closed:
            self._broken = True
            with suppress(Exception):
                self.close()

    def _members(self, sample: Mapping[str, Any]) -> tuple[str, list[tuple[bytes, Any]]]:
        """Encode and check the whole sample: its key, and (header, payload) per member in webdataset's
        sorted order."""
        if not isinstance(sample, Mapping):
            raise TypeError(f"a sample is a dict, not {type(sample).__name__}")
        encoded: Mapping[str, Any] = sample if self._handlers is not None else self.encoder(dict(sample))
        if not isinstance(encoded, Mapping):
            raise TypeError(f"the encoder returned {type(encoded).__name__}, not a dict")
        if "__key__" not in encoded:  # checked after a callable encoder, which may add it (as webdataset)
            raise SampleError(f"sample with fields {sorted(encoded)} has no __key__")
        fields = [f for f in sorted(encoded) if f != "__key__" and (self.keep_meta or not f.startswith("_"))]
        if self._handlers is not None:  # only the fields that will be written are encoded
            encoded = _encode_sample(encoded, [*fields, "__key__"], self._handlers)
        key = encoded["__key__"]
        if not isinstance(key, str) or not key:
            raise SampleError(f"__key__ must be a non-empty str, got {key!r}")
        now = int(time.time()) if self.mtime is None else self.mtime
        members = []
        for field in fields:
            name, value = f"{key}.{field}", encoded[field]
            if isinstance(value, str) and field.startswith("_"):
                value = value.encode("utf-8")
            if not isinstance(value, _BYTES):
                raise SampleError(f"sample {key!r}: field {field!r} is {type(value).__name__}, not bytes, after "
                                  "encoding", member=name)
            if not field or _UNSAFE_NAME.search(name):
                raise SampleError(f"sample {key!r}: unsafe member name {name!r} (absolute, empty or '..' "
                                  "component, or NUL)", member=name)
            if isinstance(value, memoryview):  # len() must count bytes
                value = value.cast("B") if value.c_contiguous else value.tobytes()
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode, info.uname, info.gname = len(value), now, self.mode, self.user, self.group
            try:
                header = info.tobuf(self._format, "utf-8", "surrogateescape")
            except ValueError as exc:
                raise SampleError(f"sample {key!r}: {exc}", member=name) from None
            members.append((header, value))
        return key, members

    def write(self, obj: Mapping[str, Any]) -> int:
        """Write one sample; return its payload size in bytes (tar headers and padding not counted)."""
        if self._closed or self._broken:
            raise ValueError(f"write to a {'closed' if self._closed else 'failed'} TarWriter")
        key, members = self._members(obj)
        start, total = self._offset, 0
        try:
            for header, data in members:
                self._out.write(header)
                self._out.write(data)
                padding = -len(data) % tarfile.BLOCKSIZE
                self._out.write(b"\0" * padding)
                self._offset += len(header) + len(data) + padding
                total += len(data)
        except BaseException:
            self._broken = True  # a member is half-written: never add the end marker after it
            raise
        if self.samples is not None:
            self.samples.append((key, start, self._offset))
        return total

    def close(self) -> None:
        """Write the end-of-archive blocks, finish compression, and commit what this writer opened (the file
        or object appears now, whole); a failed writer discards it instead."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._broken:
                end = self._offset + 2 * tarfile.BLOCKSIZE
                self._out.write(b"\0" * (2 * tarfile.BLOCKSIZE + (-end % tarfile.RECORDSIZE)))
                if self._out is not self.stream:
                    self._out.close()
                if not self._owned and hasattr(self.stream, "flush"):
                    self.stream.flush()
        except BaseException:
            self._broken = True
            raise
        finally:
            if self._broken:
                if self._out is not self.stream:
                    with suppress(Exception):
                        self._out.close()
                if self._owned:
                    self.stream.abort()  # nothing committed: no file, no object, the command killed
            elif self._owned:
                try:
                    self.stream.close()  # commits; a sink that fails to aborts itself, then raises
                except BaseException:
                    self._broken = True
                    raise

    @property
    def identity(self) -> Any:
        """After :meth:`close`, what the sink committed (:class:`~wds_async.io.ObjectIdentity`:
        size, ETag or generation), when it knows; else None."""
        return getattr(self.stream, "identity", None) if self._owned and not self._broken else None


class ShardWriter:
    """Write samples into shards ``pattern % n`` (n from ``start_shard``), each a :class:`TarWriter`.

    A new shard starts before a write when the current one holds ``maxcount`` samples or ``maxsize``
    payload bytes (so a shard may pass ``maxsize`` by one sample). ``post(fname)`` runs after each shard
    is closed; ``opener(fname)`` returns the file object to write (closed with the shard); ``**kw`` go to
    TarWriter (``backend_options``, ``part_bytes`` and ``retry`` among them, for a store). The first shard
    is opened at construction. Attributes: ``fname``, ``shard`` (the next number), ``count`` and ``size``
    (current shard), ``total`` (all samples). ``index``: a local path or store URL where ``close()``
    writes the shard index (:mod:`wds_async.index.format`) of the shards written, each entry named as
    ``pattern % n`` with the identity its upload committed (size, and the ETag or generation of a stored
    object; no size for ``pipe:`` or ``opener`` targets). An exception out of a ``with`` block, or
    :meth:`abort`, discards the shard being written (those closed before stay) and writes no index.
    """

    def __init__(self, pattern: str, maxcount: int = 100000, maxsize: float = 3e9,
                 post: Callable[[str], Any] | None = None, start_shard: int = 0, verbose: int = 1,
                 opener: Callable[[str], IO[bytes]] | None = None, *, index: str | os.PathLike[str] | None = None,
                 backend_options: Mapping[str, Any] | None = None, **kw: Any) -> None:
        try:
            distinct = pattern % start_shard != pattern % (start_shard + 1)
        except (TypeError, ValueError):
            distinct = False
        if not distinct:
            raise ValueError(f"pattern {pattern!r} must hold one %-format for the shard number, like 'out-%06d.tar'")
        if maxcount < 1 or maxsize <= 0:
            raise ValueError(f"maxcount ({maxcount}) and maxsize ({maxsize}) must be positive")
        self.pattern, self.maxcount, self.maxsize, self.post = pattern, maxcount, maxsize, post
        self.verbose, self.opener, self.kw = verbose, opener, kw
        self.backend_options = backend_options
        if backend_options is not None:
            kw["backend_options"] = backend_options
        self.index = None if index is None else os.fspath(index)
        self._entries: list[ShardEntry] = []
        if self.index is not None:
            if backend_key(self.index) not in ("file", "s3", "gs", "az", "azure"):
                raise UrlError("an index is written to a local path or an object store URL", url=redact_url(self.index))
            if _compression(None if opener else pattern % start_shard, kw.get("compress")) not in (None, "gz"):
                raise ValueError("ShardWriter(index=...) needs plain or gzip shards: wds-async reads no bz2 or xz")
            kw["record_samples"] = True
        self.shard, self.total, self.count, self.size = start_shard, 0, 0, 0
        self.fname: str | None = None
        self.tarstream: TarWriter | None = None
        self._opened: IO[bytes] | None = None
        self._closed = False
        self.next_stream()

    def next_stream(self) -> None:
        """Close the current shard and open the next."""
        self.finish()
        self.fname = self.pattern % self.shard
        if self.verbose:
            print("# writing", self.fname, self.count, f"{self.size / 1e9:.1f} GB", self.total, file=sys.stderr)
        self.shard += 1
        self._opened = self.opener(self.fname) if self.opener else None
        try:
            self.tarstream = TarWriter(self._opened if self._opened is not None else self.fname, **self.kw)
        except BaseException:
            if self._opened is not None:
                self._opened.close()
            raise
        self.count, self.size = 0, 0

    def write(self, obj: Mapping[str, Any]) -> None:
        """Write one sample, starting a new shard first when the current one is full."""
        if self._closed:
            raise ValueError("write to a closed ShardWriter")
        if self.tarstream is None or self.count >= self.maxcount or self.size >= self.maxsize:
            self.next_stream()
        assert self.tarstream is not None
        size = self.tarstream.write(obj)
        self.count, self.total, self.size = self.count + 1, self.total + 1, self.size + size

    def finish(self) -> None:
        """Close the current shard and call ``post`` with its name (``close()`` is the public way)."""
        if self.tarstream is None:
            return
        stream, opened, fname = self.tarstream, self._opened, self.fname or ""
        self.tarstream, self._opened = None, None
        try:
            stream.close()
        finally:
            if opened is not None:
                opened.close()
        if self.index is not None and not stream._broken:  # before post(), which may move the file
            self._entries.append(self._index_entry(stream, fname))
        if callable(self.post):
            self.post(fname)

    def close(self) -> None:
        """Finish the last shard and write the index; later calls do nothing."""
        if not self._closed:
            self._closed = True
            self.finish()
            if self.index is not None:
                self._save_index(ShardIndex(self._entries))

    def abort(self) -> None:
        """Discard the shard being written (closed shards stay) and write no index. Never raises."""
        self._closed = True
        stream, opened, self.tarstream, self._opened = self.tarstream, self._opened, None, None
        if stream is not None:
            stream.abort()
        if opened is not None:
            with suppress(Exception):
                opened.close()

    def _save_index(self, index: ShardIndex) -> None:
        assert self.index is not None
        if scheme_of(self.index) == "file":
            index.save(self.index)
            return
        data = index.dumps()
        if self.index.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        put_bytes(self.index, data, options=self.backend_options, policy=self.kw.get("retry"))

    def _index_entry(self, stream: TarWriter, fname: str) -> ShardEntry:
        """The index entry of a shard just closed, with the identity its sink committed (none for ``pipe:``
        and ``opener`` targets)."""
        identity = stream.identity if self.opener is None else None
        rows = stream.samples or []
        return ShardEntry(url=redact_url(fname), size=getattr(identity, "size", None),
                          etag=getattr(identity, "etag", None), generation=getattr(identity, "generation", None),
                          last_modified=getattr(identity, "last_modified", None),
                          compressed=stream.compression == "gz", keys=tuple(r[0] for r in rows),
                          offsets=tuple(r[1] for r in rows), ends=tuple(r[2] for r in rows))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()
