"""wids' public API (the indexed datasets webdataset 1.0.2 points to) on top of :class:`~wds_async.IndexedWebDataset`.

``webdataset.wids`` (and the separate ``wids`` package) give :class:`ShardListDataset`: a map-style dataset over a
list of shards described as ``[{"url": ..., "nsamples": ...}, ...]`` or by a JSON descriptor::

    {"wids_version": 1, "name": "train", "base": "https://host/data/",
     "shardlist": [{"url": "shard-000000.tar", "nsamples": 250, "filesize": 16777216}, ...],
     "datasets": [{"source_url": "https://host/other.json"}, {"name": "x", "shardlist": [...]}]}

(shard URLs relative to ``base``, else to the descriptor's own location; ``datasets`` adds the shards of other
descriptors, at most one ``source_url`` hop). A sample is ``{".ext": value, "__key__": ..., "__index__": i,
"__shard__": url, "__shardindex__": j, "__dataset__": name}`` (each field an ``io.BytesIO``, as wids gives them) after the ``transformations`` (default ``"PIL"``:
wds-async's decoder with images as PIL).

How it reads, unlike wids: with a wds-async index (``index=`` here, or ``"wds_async_index": URL`` in the descriptor)
every sample is a ranged read of its own bytes, batched and concurrent (``__getitems__``), with no whole-shard
download; without one, each shard is read whole on first use in a process into the cache directory (``cache_dir``,
else ``WIDS_CACHE``, else ``/tmp/_wids_cache``) as wids does, and later reads are ranges of that local copy.

Samplers: :class:`ChunkedSampler` (contiguous chunks of ``chunksize`` indices, chunk order shuffled from the second
epoch on unless ``shufflefirst``, indices shuffled within chunks), :func:`DistributedChunkedSampler` (this rank's
contiguous share, then chunked) and :class:`ShardListSampler` (chunks = shards), with wids' arguments and
permutations (``random.Random(seed + 1289738273 * epoch)``).

Differences: extensions are lower-cased (wds-async's grouping rule, as streaming yields them); ``get_shard`` and the
LRU of open shards do not exist (there are no open shard files to hold); ``localname``/``keep``/``lru_size``/
``cache_size`` are accepted and ignored.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import math
import os
import posixpath
import random
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .._loop import run_private
from ..data.indexed import IndexedWebDataset
from ..data.samplers import distributed_rank
from ..urls import redact_url

__all__ = ["ChunkedSampler", "DistributedChunkedSampler", "ShardListDataset", "ShardListSampler", "ShardedSampler",
           "load_dsdesc_and_resolve", "urldir", "urlmerge"]

#: wids' epoch multiplier in its samplers' seeds.
_EPOCH_MULT = 1289738273


def urldir(url: str) -> str:
    """The URL of the folder holding ``url``."""
    parsed = urllib.parse.urlparse(url)
    return parsed._replace(path=posixpath.dirname(parsed.path)).geturl()


def urlmerge(base: str, url: str) -> str:
    """``url`` resolved against ``base`` (scheme, host and path from ``base`` where ``url`` has none; paths joined
    as ``os.path.join`` does, then normalised; query and fragment only from ``url``)."""
    b, u = urllib.parse.urlparse(base), urllib.parse.urlparse(url)
    path = u.path if u.path.startswith("/") else posixpath.normpath(posixpath.join(b.path, u.path))
    return urllib.parse.urlunparse((u.scheme or b.scheme, u.netloc or b.netloc, path, u.params, u.query, u.fragment))


def _read(source: str) -> bytes:
    """The bytes of a descriptor at a local path or any URL the backends read."""
    from ..config import EngineConfig
    from ..io import BackendSet
    from ..io.reader import RangeReader, ReadContext

    async def read() -> bytes:
        config = EngineConfig()
        backends = BackendSet(config)
        try:
            reader = RangeReader(backends.for_url(source), source, context=ReadContext(config.retry))
            return b"".join([chunk async for chunk in reader.chunks()])
        finally:
            await backends.aclose()

    return run_private(read)


def _load(source: str | io.IOBase) -> dict[str, Any]:
    if isinstance(source, io.IOBase):
        data: Any = json.load(source)  # type: ignore[arg-type]
    else:
        raw = _read(source)
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"{redact_url(source)} is not a JSON dataset descriptor: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError("a dataset descriptor must be a JSON object")
    return data


def _check_shards(shards: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(shards, list):
        raise ValueError(f"{where}: 'shardlist' must be a list")
    for shard in shards:
        if not isinstance(shard, dict) or not isinstance(shard.get("url"), str):
            raise ValueError(f"{where}: every shard must be an object with a 'url' (string), not {shard!r:.80}")
        n = shard.get("nsamples")
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"{where}: shard {shard['url']!r} needs 'nsamples', a non-negative int")
    return shards


def resolve_dsdesc(desc: dict[str, Any], *, options: dict[str, Any] | None = None, base: str | None = None,
                   where: str = "the dataset descriptor") -> dict[str, Any]:
    """A descriptor with its shard URLs made absolute and its sub-datasets' shards appended (wids' rules)."""
    desc = {**desc, **(options or {})}
    if desc.get("wids_version") != 1:
        raise ValueError(f"{where}: 'wids_version' must be 1 (found {desc.get('wids_version')!r})")
    base = desc.get("base", base)
    shards = [dict(s) for s in _check_shards(desc.get("shardlist", []), where)]
    for shard in shards:
        if base is not None:
            shard["url"] = urlmerge(base, shard["url"])
        for key in ("weight", "name"):
            if desc.get(key) is not None:
                shard.setdefault(key, desc[key])
    for component in desc.get("datasets", []):
        weight, source_url = component.get("weight"), component.get("source_url")
        if source_url is not None:
            component = _load(source_url)
            if "source_url" in component:
                raise ValueError(f"{redact_url(source_url)}: a referenced descriptor may not reference another")
        if "shardlist" not in component:
            raise ValueError(f"{where}: a sub-dataset has no 'shardlist'")
        sub_base = component.get("base", urldir(source_url) if source_url else None)
        sub = [dict(s) for s in _check_shards(component["shardlist"], where)]
        for shard in sub:
            if sub_base is not None:
                shard["url"] = urlmerge(sub_base, shard["url"])
            for key, value in (("weight", weight), ("source_url", source_url), ("dataset", component.get("name"))):
                if value is not None:
                    shard.setdefault(key, value)
        shards.extend(sub)
    if not shards:
        raise ValueError(f"{where}: no shards")
    desc["shardlist"] = shards
    return desc


def load_dsdesc_and_resolve(source: str | io.IOBase, *, options: dict[str, Any] | None = None,
                            base: str | None = None) -> dict[str, Any]:
    """Read a JSON descriptor (a path, a URL or an open file) and resolve it."""
    where = redact_url(source) if isinstance(source, str) else "the dataset descriptor"
    return resolve_dsdesc(_load(source), options=options, base=base, where=where)


def _hash_name(text: str) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())[:16].decode("ascii")


def _decoder(spec: str) -> Callable[[dict[str, Any]], dict[str, Any]]:
    from ..data.decoders import decoder_from_args

    return decoder_from_args(spec)


def _decode_dotted(decoder: Callable[[dict[str, Any]], dict[str, Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A wds-async decoder applied to a wids sample (``.ext`` keys)."""

    def apply(sample: dict[str, Any]) -> dict[str, Any]:
        plain = {(k[1:] if k.startswith(".") else k): v.getvalue() if isinstance(v, io.BytesIO) else v
                 for k, v in sample.items()}
        decoded = decoder(plain)
        return {(k if k.startswith("__") else "." + k): v for k, v in decoded.items()}

    return apply


def _transformations(spec: Any) -> list[Callable[[Any], Any]]:
    out = []
    for t in spec if isinstance(spec, list) else [spec]:
        if t == "PIL":
            out.append(_decode_dotted(_decoder("pil")))
        elif t == "numpy":
            out.append(_decode_dotted(_decoder("rgb8")))
        elif callable(t):
            out.append(t)
        else:
            raise ValueError(f"a transformation is 'PIL', 'numpy' or a callable, not {t!r}")
    return out


class ShardListDataset(IndexedWebDataset):
    """wids' ``ShardListDataset`` on wds-async's indexed reads (see the module docstring).

    Args:
        shards: a list of ``{"url", "nsamples", ...}`` dicts, or a descriptor (path, URL or open file).
        cache_size: accepted for wids compatibility (the cache's size limit is ``cache_bytes``).
        cache_dir: where whole shards go without an index (default ``WIDS_CACHE``, else ``/tmp/_wids_cache``); with
            an index, copies are kept only when this is given.
        lru_size: accepted and ignored (there are no open shard files).
        dataset_name: the name (default: a hash of ``shards``).
        localname: accepted and ignored.
        transformations: ``"PIL"`` (default), ``"numpy"``, a callable, or a list of them, applied in order.
        keep: accepted and ignored.
        base: the URL relative shard URLs are resolved against (default: the descriptor's folder).
        options: descriptor fields that override the file's.
        index: a wds-async shard index (path, URL or :class:`~wds_async.ShardIndex`); default the descriptor's
            ``"wds_async_index"`` (resolved like a shard URL), else none.
        engine: further :class:`~wds_async.IndexedWebDataset` options (``max_connections``, ``backend_options``, ...).
    """

    def __init__(self, shards: Any, *, cache_size: int = int(1e12), cache_dir: str | None = None, lru_size: int = 10,
                 dataset_name: str | None = None, localname: Any = None, transformations: Any = "PIL",
                 keep: bool = False, base: str | None = None, options: dict[str, Any] | None = None,
                 index: Any = None, **engine: Any) -> None:
        if isinstance(shards, (str, io.IOBase)):
            if base is None and isinstance(shards, str):
                base = urldir(shards)
            self.base = base
            self.spec = load_dsdesc_and_resolve(shards, options=options or {}, base=base)
            self.shards = self.spec["shardlist"]
            self.dataset_name = self.spec.get("name") or _hash_name(str(shards))
            named = self.spec.get("wds_async_index")
            if index is None and isinstance(named, str):
                index = urlmerge(base, named) if base is not None else named
        else:
            self.base = None
            self.spec = dict(options or {})
            self.shards = [dict(s) for s in _check_shards(list(shards), "the shard list")]
            self.dataset_name = dataset_name or _hash_name(str(shards))
        self.lengths = [s["nsamples"] for s in self.shards]
        self.cum_lengths = [sum(self.lengths[:k + 1]) for k in range(len(self.lengths))]
        self.total_length = sum(self.lengths)
        urls = [s["url"] for s in self.shards]
        self.cache_dir: str | None
        if index is None:
            self.cache_dir = str(cache_dir or os.environ.get("WIDS_CACHE", "/tmp/_wids_cache"))
            super().__init__(urls, nsamples=self.lengths, cache_dir=self.cache_dir, **engine)
        else:
            self.cache_dir = str(cache_dir) if cache_dir is not None else None
            super().__init__(urls, index=index, cache_dir=cache_dir, **engine)
            for shard, (given, entry) in enumerate(zip(self.lengths, self.entries)):
                if entry is not None and entry.nsamples != given:
                    raise ValueError(f"{redact_url(urls[shard])}: the shard list says {given} samples but the "
                                     f"index holds {entry.nsamples}: rebuild one of them")
        self.transformations = _transformations(transformations)
        self._accesses = 0

    def add_transform(self, transform: Callable[[Any], Any]) -> ShardListDataset:
        """Append a transformation (applied after the others)."""
        self.transformations.append(transform)
        return self

    def get_stats(self) -> tuple[int, int]:
        """``(accesses, whole-shard reads)`` in this process."""
        proc = self._proc
        return self._accesses, (len(proc.copied) if proc is not None else 0)

    def check_cache_misses(self) -> None:
        """wids warns when its LRU misses often; ranged reads have no such cliff."""

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        located = [self.locate(i) for i in indices]
        samples = super().__getitems__(indices)
        out = []
        for i, (shard, j), sample in zip(indices, located, samples):
            self._accesses += 1
            desc = self.shards[shard]
            item: dict[str, Any] = {"__key__": sample["__key__"]}
            for k, v in sample.items():  # fields as wids gives them: ".ext" -> a stream of the bytes
                if not k.startswith("__"):
                    item["." + k] = io.BytesIO(v) if isinstance(v, bytes) else v
            item["__dataset__"] = desc.get("dataset")
            item["__index__"] = i
            item["__shard__"] = desc["url"]
            item["__shardindex__"] = j
            for transform in self.transformations:
                item = transform(item)
            out.append(item)
        return out

    def close(self) -> None:
        super().close()


class ChunkedSampler:
    """wids' ``ChunkedSampler``: indices in chunks of ``chunksize``; chunk order shuffled (from the second epoch,
    or from the first with ``shufflefirst``) and indices shuffled within each chunk when ``shuffle``."""

    def __init__(self, dataset: Any, *, dslength_per_replica: int = -1, num_samples: Any = None,
                 chunksize: int = 2000, seed: int = 0, shuffle: bool = True, shufflefirst: bool = False) -> None:
        if isinstance(num_samples, int):
            lo, hi = 0, num_samples
        elif num_samples is None:
            lo, hi = 0, len(dataset)
        else:
            lo, hi = num_samples
        if chunksize < 1:
            raise ValueError(f"chunksize must be >= 1, not {chunksize!r}")
        self.dslength_per_replica = dslength_per_replica if dslength_per_replica > 0 else hi - lo
        self.ranges = [(i, min(i + chunksize, hi)) for i in range(lo, hi, chunksize)]
        self.seed, self.shuffle, self.shufflefirst = seed, shuffle, shufflefirst
        self.epoch = 0
        _follow(dataset, self)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        rng = random.Random(self.seed + _EPOCH_MULT * self.epoch)
        yield from _ranges(self.ranges, rng, self.shuffle, self.shuffle and (self.shufflefirst or self.epoch > 0))
        self.epoch += 1

    def __len__(self) -> int:
        return self.dslength_per_replica


def _follow(dataset: Any, sampler: Any) -> None:
    """Our datasets read ahead along the sampler's order (IndexedWebDataset.follow); wids' own ignore it."""
    if isinstance(dataset, ShardListDataset):
        dataset.follow(sampler)


def _ranges(ranges: list[tuple[int, int]], rng: random.Random, within: bool, order: bool) -> Iterator[int]:
    chosen = list(range(len(ranges)))
    if order:
        rng.shuffle(chosen)
    for k in chosen:
        block = list(range(*ranges[k]))
        if within:
            rng.shuffle(block)
        yield from block


class ShardListSampler:
    """wids' ``ShardListSampler``: shards in shuffled order (from the second epoch, or with ``shufflefirst``), the
    indices of each shard shuffled."""

    def __init__(self, dataset: Any, *, lengths: Sequence[int] | None = None, seed: int = 0,
                 shufflefirst: bool = False) -> None:
        lengths = list(dataset.lengths if lengths is None else lengths)
        starts = [sum(lengths[:k]) for k in range(len(lengths))]
        self.ranges = [(s, s + n) for s, n in zip(starts, lengths)]
        self.seed, self.shufflefirst, self.epoch = seed, shufflefirst, 0
        _follow(dataset, self)

    def __iter__(self) -> Iterator[int]:
        rng = random.Random(self.seed + _EPOCH_MULT * self.epoch)
        yield from _ranges(self.ranges, rng, True, self.shufflefirst or self.epoch > 0)
        self.epoch += 1

    def __len__(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)


ShardedSampler = ShardListSampler


def DistributedChunkedSampler(dataset: Any, *, num_replicas: int | None = None, num_samples: int | None = None,
                              rank: int | None = None, shuffle: bool = True, shufflefirst: bool = False,
                              seed: int = 0, drop_last: bool | None = None, chunksize: int = 1000000
                              ) -> ChunkedSampler:
    """wids' ``DistributedChunkedSampler``: this rank's contiguous share of ``[0, num_samples)`` (the world from
    torch.distributed when it is initialized, else one process), chunked as :class:`ChunkedSampler`.
    ``drop_last`` is accepted and ignored, as wids does."""
    world, me = distributed_rank(num_replicas, rank)
    per_replica = math.ceil(len(dataset) / world) if world > 1 else len(dataset)
    total = num_samples or len(dataset)
    chunk = (total + world - 1) // world
    lo = me * chunk
    return ChunkedSampler(dataset, dslength_per_replica=per_replica, num_samples=(lo, min(lo + chunk, total)),
                          chunksize=chunksize, seed=seed, shuffle=shuffle, shufflefirst=shufflefirst)
