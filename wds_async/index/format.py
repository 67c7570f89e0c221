"""The shard index: per shard its identity, per sample its key and the byte range of its members.

Built by streaming the shards once (:func:`wds_async.index.build.build_index`, ``wds-async index``) or
for free while writing them (``ShardWriter(index=...)``). The file is JSON lines in UTF-8, gzipped
when its name ends in ``.gz`` (:meth:`ShardIndex.load` recognises gzip by its magic bytes)::

    {"format": "wds-async-index", "version": 1, "shards": 2, "samples": 3}
    {"url": "https://host/a.tar", "size": 30720, "etag": "\\"1f-9\\"", "generation": null,
     "last_modified": "Sat, 01 Mar 2025 10:00:00 GMT", "compressed": false,
     "samples": [["k0", 0, 10240], ["k1", 10240, 20480]]}
    {"url": "https://host/b.tar", ...}

Line 1 is the header; then one line per shard, in shard order. Each sample is ``[key, offset, end]``:
``offset`` is its first member's first header block (PAX prefixes included, as ``TarInfo.offset``),
``end`` is just past its last member's padding, both counted in the tar stream (decompressed when
``compressed``), so ``[offset, end)`` holds exactly the sample's members and a new parser can start
there. Keys follow the default grouping rules (no ``rename_files``/``select_files``).

URLs are stored as given but redacted (a signature is never written). A job's URLs are matched to
entries by :func:`url_key`, which ignores query, fragment and userinfo, so re-signed URLs still match.

Identity: a reader checks ``size``, ``etag`` and ``generation`` (:meth:`ShardEntry.identity`);
``last_modified`` is recorded but never compared, because the same file served over http and read as
a local file spells it differently.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from .._atomic import AtomicFile
from .._loop import run_private
from ..backends.file import local_path
from ..config import EngineConfig
from ..errors import UrlError
from ..io import BackendSet, ObjectIdentity, validate_url
from ..io.reader import RangeReader, ReadContext
from ..urls import expand_urls, redact_url, scheme_of, url_key

__all__ = ["INDEX_FORMAT", "INDEX_VERSION", "ShardEntry", "ShardIndex", "url_key"]

INDEX_FORMAT = "wds-async-index"
INDEX_VERSION = 1


@dataclass(frozen=True)
class ShardEntry:
    """One shard of an index: its URL (redacted), identity, and per sample key, offset and end.

    ``size`` is the object's size as its source announced it, else the bytes streamed (a ``pipe:``);
    ``compressed`` says gzip, in which case offsets count the decompressed tar stream.
    """

    url: str
    size: int | None
    etag: str | None = None
    generation: str | None = None
    last_modified: str | None = None
    compressed: bool = False
    keys: tuple[str, ...] = ()
    offsets: tuple[int, ...] = ()
    ends: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not len(self.keys) == len(self.offsets) == len(self.ends):
            raise ValueError(f"{self.url}: keys, offsets and ends must have one item per sample")

    @property
    def nsamples(self) -> int:
        return len(self.keys)

    def identity(self) -> ObjectIdentity:
        """What a reader checks the shard against: size, ETag and generation (not Last-Modified)."""
        return ObjectIdentity(size=self.size, etag=self.etag, generation=self.generation)


def _entry_to_json(entry: ShardEntry) -> dict[str, Any]:
    return {"url": entry.url, "size": entry.size, "etag": entry.etag, "generation": entry.generation,
            "last_modified": entry.last_modified, "compressed": entry.compressed,
            "samples": [list(row) for row in zip(entry.keys, entry.offsets, entry.ends)]}


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry_from_json(obj: object) -> ShardEntry:
    """A ShardEntry from one parsed line; ValueError saying what is wrong."""
    if not isinstance(obj, dict):
        raise ValueError("a shard line must be a JSON object")
    if not isinstance(obj.get("url"), str) or not obj["url"]:
        raise ValueError("'url' must be a non-empty string")
    if obj.get("size") is not None and not _is_count(obj["size"]):
        raise ValueError("'size' must be a non-negative integer or null")
    for name in ("etag", "generation", "last_modified"):
        if not isinstance(obj.get(name), (str, type(None))):
            raise ValueError(f"{name!r} must be a string or null")
    if not isinstance(obj.get("compressed", False), bool) or not isinstance(obj.get("samples"), list):
        raise ValueError("'compressed' must be true or false and 'samples' a list")
    for row in obj["samples"]:
        if (not isinstance(row, list) or len(row) != 3 or not isinstance(row[0], str)
                or not _is_count(row[1]) or not _is_count(row[2]) or row[1] >= row[2]):
            raise ValueError(f"a sample must be [key, offset, end] with offset < end, not {row!r:.80}")
    rows = obj["samples"]
    return ShardEntry(url=obj["url"], size=obj.get("size"), etag=obj.get("etag"),
                      generation=obj.get("generation"), last_modified=obj.get("last_modified"),
                      compressed=obj.get("compressed", False), keys=tuple(r[0] for r in rows),
                      offsets=tuple(r[1] for r in rows), ends=tuple(r[2] for r in rows))


def _parse(data: bytes, shown: str) -> list[ShardEntry]:
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise ValueError(f"{shown}: a damaged gzip file ({exc})") from None
    lines = data.split(b"\n")  # bytes.split: U+2028 inside a key is not a line break
    if lines[-1] == b"":
        lines.pop()
    try:
        header = json.loads(lines[0]) if lines else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("format") != INDEX_FORMAT:
        raise ValueError(f"{shown} is not a wds-async index (line 1 is not a {INDEX_FORMAT!r} header)")
    if not all(_is_count(header.get(name)) for name in ("version", "shards", "samples")):
        raise ValueError(f"{shown}: line 1: 'version', 'shards' and 'samples' must be non-negative integers")
    version: int = header["version"]
    if version > INDEX_VERSION:
        raise ValueError(f"{shown} is a version {version} index and this wds-async reads version "
                         f"{INDEX_VERSION} at most: upgrade wds-async")
    entries = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            entries.append(_entry_from_json(json.loads(line)))
        except ValueError as exc:
            raise ValueError(f"{shown}: line {number}: malformed shard entry: {exc}") from None
    samples = sum(e.nsamples for e in entries)
    if (len(entries), samples) != (header["shards"], header["samples"]):
        raise ValueError(f"{shown}: the header announces {header['shards']} shards and {header['samples']} "
                         f"samples but the file holds {len(entries)} and {samples}: truncated or edited")
    return entries


class ShardIndex:
    """The index of a list of shards (see the module docstring); ``shards`` is in shard order."""

    def __init__(self, shards: Iterable[ShardEntry]) -> None:
        self.shards: list[ShardEntry] = list(shards)

    def __repr__(self) -> str:
        return f"ShardIndex({len(self.shards)} shards, {self.total_samples} samples)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardIndex) and self.shards == other.shards

    __hash__ = None  # type: ignore[assignment]

    @property
    def total_samples(self) -> int:
        return sum(e.nsamples for e in self.shards)

    def fingerprint(self) -> str:
        """sha256 (hex) over each shard's url_key, size, ETag, generation, sample count and offsets:
        equal fingerprints mean two indexes split the same shard versions at the same places."""
        digest = hashlib.sha256()
        for e in self.shards:
            row = [url_key(e.url), e.size, e.etag, e.generation, e.nsamples, list(e.offsets)]
            digest.update(json.dumps(row, separators=(",", ":")).encode() + b"\n")
        return digest.hexdigest()

    def dumps(self) -> bytes:
        """The index file's bytes (uncompressed)."""
        header = {"format": INDEX_FORMAT, "version": INDEX_VERSION, "shards": len(self.shards),
                  "samples": self.total_samples}
        lines = [header, *(_entry_to_json(e) for e in self.shards)]
        return "".join(json.dumps(x, ensure_ascii=False, separators=(",", ":")) + "\n" for x in lines).encode()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the index to a local path or ``file://`` URL (gzipped when it ends in ``.gz``), atomically."""
        target = os.fspath(path)
        if scheme_of(target) != "file":
            raise UrlError("an index is written to a local path; copy it next to the shards afterwards",
                           url=redact_url(target))
        local = local_path(target)
        data = self.dumps()
        if local.endswith(".gz"):
            data = gzip.compress(data, mtime=0)
        with AtomicFile(local) as out:
            out.write(data)
            out.commit()

    @classmethod
    def load(cls, source: str | os.PathLike[str], *,
             backend_options: Mapping[str, Any] | None = None) -> ShardIndex:
        """Read an index from a local path or any URL the backends read (http(s), s3, gs, az, file://).

        Raises ValueError naming ``source`` for a file that is not an index, a newer version, a
        malformed line or counts that contradict the header; backend errors (NotFound, ...) as they are.
        """
        url = os.fspath(source)
        validate_url(url)
        data = run_private(lambda: _read_all(url, backend_options or {}))
        return cls(_parse(data, redact_url(url)))

    def entries_for(self, urls: str | Sequence[str]) -> list[ShardEntry]:
        """The entries for a job's shard URLs, in their order, matched by :func:`url_key` (then by the
        redacted URL where several entries share a key). ValueError names the first URL not covered."""
        by_key: dict[str, list[ShardEntry]] = {}
        for e in self.shards:
            by_key.setdefault(url_key(e.url), []).append(e)
        found = []
        for url in expand_urls(urls) if isinstance(urls, str) else urls:
            shown = redact_url(url)
            candidates = by_key.get(url_key(url), [])
            if len(candidates) > 1:
                candidates = [e for e in candidates if e.url == shown]
            if len(candidates) != 1:
                what = "several entries" if candidates else "no entry"
                raise ValueError(f"the index has {what} for {shown}: rebuild the index with wds-async index")
            found.append(candidates[0])
        return found


async def _read_all(url: str, options: Mapping[str, Any]) -> bytes:
    config = EngineConfig()
    backends = BackendSet(config, options=options)
    try:
        reader = RangeReader(backends.for_url(url), url, context=ReadContext(config.retry))
        async with aclosing(reader.chunks()) as chunks:
            return b"".join([chunk async for chunk in chunks])
    finally:
        await backends.aclose()
