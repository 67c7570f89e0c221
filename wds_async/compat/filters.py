"""``webdataset.filters``: the pipeline stages, both as curried factories (``shuffle(1000)``) and as the plain
iterator functions webdataset keeps under a leading underscore (``_shuffle(src, 1000, 100, rng)``), which open_clip
and timm import.

Every stage is wds-async's own (:mod:`wds_async.data.stages`): ``_shuffle`` is its buffer shuffle, which draws
from ``rng`` (or ``random.Random(seed)``) exactly as webdataset 1.0.2's does, so a seeded shuffle gives the same
order under both. The factories return picklable :class:`~wds_async.Stage` objects.
"""

from __future__ import annotations

import functools
import itertools
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from fnmatch import fnmatch
from typing import IO, Any

import numpy as np

from ..data import decoders as _decoders
from ..data.stages import patterns as _patterns
from ..data.stages import plain as _plain
from ..data.stages.base import Stage
from ..data.stages.cached import Cached, LMDBCached
from ..data.stages.detshuffle import DetShuffle
from ._names import refusing
from .handlers import reraise_exception
from .pytorch import TorchTensor

__all__ = [
    "Cached", "FilterFunction", "LMDBCached", "RestCurried", "associate", "batched", "combine_values", "compose",
    "compose2", "decode", "decode_bin", "decode_text", "default_collation_fn", "default_decoders", "detshuffle",
    "dict2tuple", "extract_keys", "find_decoder", "getfirst", "identity", "info", "log_keys", "map", "map_dict",
    "map_tuple", "parse_field_spec", "pick", "pipeline", "pipelinefilter", "rename", "rename_keys",
    "reraise_exception", "rsample", "select", "shuffle", "slice", "to_tuple", "transform_with", "tuple2dict",
    "unbatched", "unlisted", "xdecode",
]

Handler = Callable[[BaseException], bool]

__getattr__ = refusing("webdataset.filters", {
    "decode_pickle": "it unpickles the data, which runs code from it; xdecode refuses *.pyd unless "
                     "allow_pickle=True or WDS_ASYNC_ALLOW_PICKLE=1",
})

#: webdataset's curried call: ``FilterFunction(f, *args, **kw)(data) == f(data, *args, **kw)``; picklable.
FilterFunction = Stage


class RestCurried:
    """``RestCurried(f)(*args, **kw)`` is ``FilterFunction(f, *args, **kw)``."""

    def __init__(self, f: Callable[..., Iterator[Any]]) -> None:
        self.f = f
        functools.update_wrapper(self, f)

    def __call__(self, *args: Any, **kw: Any) -> Stage:
        return Stage(self.f, *args, **kw)


def pipelinefilter(f: Callable[..., Iterator[Any]]) -> RestCurried:
    """Curry a stage function for the pipeline form: ``pipelinefilter(f)(*a, **k)(data) == f(data, *a, **k)``."""
    return RestCurried(f)


def identity(x: Any) -> Any:
    """``x`` itself."""
    return x


def compose2(f: Callable[[Any], Any], g: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``x -> g(f(x))``."""
    return lambda x: g(f(x))


def compose(*args: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The stages one after the other: ``compose(f, g, h)(x) == h(g(f(x)))``."""
    return functools.reduce(compose2, args)


def pipeline(source: Any, *args: Callable[[Any], Any]) -> Any:
    """``source`` through the stages ``args`` in order."""
    return compose(*args)(source) if args else source


def getfirst(a: dict[str, Any], keys: str | Sequence[str], default: Any = None, missing_is_error: bool = True) -> Any:
    """The value of the first of ``keys`` (a list, or a ``;``-separated string) present in ``a``; else ``default``,
    or :class:`ValueError` when ``missing_is_error``."""
    if isinstance(keys, str):
        if " " in keys:
            raise ValueError(f"getfirst: keys must be separated by ';', not spaces: {keys!r}")
        keys = keys.split(";")
    for key in keys:
        if key in a:
            return a[key]
    if missing_is_error:
        raise ValueError(f"didn't find {keys} in {list(a.keys())}")
    return default


def parse_field_spec(fields: str | Sequence[Any]) -> list[list[str]]:
    """``"jpg;png cls"`` -> ``[["jpg", "png"], ["cls"]]``; a list of such entries likewise."""
    entries = fields.split() if isinstance(fields, str) else list(fields)
    return [entry.split(";") if isinstance(entry, str) else list(entry) for entry in entries]


def transform_with(sample: Sequence[Any], transformers: Sequence[Callable[[Any], Any] | None] | None) -> Any:
    """Apply ``transformers[i]`` to ``sample[i]`` (None leaves that element); returns a list."""
    if not transformers:
        return sample
    if len(transformers) > len(sample):
        raise ValueError(f"transform_with: {len(transformers)} transformers for {len(sample)} elements")
    result = list(sample)
    for i, f in enumerate(transformers):
        if f is not None:
            result[i] = f(sample[i])
    return result


def _info(data: Iterable[Any], fmt: str | None = None, n: int = 3, every: int = -1, width: int = 50,
          stream: IO[str] = sys.stderr, name: str = "") -> Iterator[Any]:
    """Pass the items through, printing the first ``n`` (and every ``every``-th) to ``stream``."""
    for i, sample in enumerate(data):
        if i < n or (every > 0 and (i + 1) % every == 0):
            if fmt is None:
                print("---", name, file=stream)
                for key, value in sample.items():
                    print(key, repr(value)[:width], file=stream)
            else:
                print(fmt.format(**sample), file=stream)
        yield sample


def pick(buf: list[Any], rng: random.Random) -> Any:
    """Remove and return a random item of ``buf``, its place taken by the last item."""
    k = rng.randint(0, len(buf) - 1)
    sample = buf[k]
    buf[k] = buf[-1]
    buf.pop()
    return sample


def _shuffle(data: Iterable[Any], bufsize: int = 1000, initial: int = 100, rng: random.Random | None = None,
             seed: int | None = None, handler: Handler | None = None) -> Iterator[Any]:
    """Shuffle within a buffer of ``bufsize`` items, yielding once ``initial`` are held; draws from ``rng``, or a
    ``random.Random(seed)``, or (neither) a generator seeded by the OS. ``handler`` is unused, as in webdataset."""
    if seed is not None and rng is not None:
        raise ValueError("shuffle: pass seed= or rng=, not both")
    return _plain.shuffle(data, bufsize, initial, rng=rng, seed=seed)


def _select(data: Iterable[Any], predicate: Callable[[Any], bool]) -> Iterator[Any]:
    """The items for which ``predicate`` is true."""
    return _plain.select(data, predicate)


def _log_keys(data: Iterable[dict[str, Any]], logfile: str | None = None) -> Iterator[dict[str, Any]]:
    """Pass the samples through, appending ``__url__`` and ``__key__`` of each to ``logfile`` (when given)."""
    if logfile is None:
        yield from data
        return
    with open(logfile, "a") as out:
        for sample in data:
            print(sample.get("__url__"), sample.get("__key__"), file=out, flush=True)
            yield sample


def _decode(data: Iterable[dict[str, Any]], *args: Any, handler: Handler = reraise_exception,
            **kw: Any) -> Iterator[dict[str, Any]]:
    """Decode each sample (image specs and handlers in ``args``, ``Decoder`` options in ``kw``)."""
    return _decoders.decode(data, *args, handler=handler, **kw)


def _map(data: Iterable[Any], f: Callable[[Any], Any], handler: Handler = reraise_exception) -> Iterator[Any]:
    """``f`` of each item; None results dropped; a dict result keeps the sample's ``__key__``."""
    return _plain.map_stage(data, f, handler)


def _rename(data: Iterable[dict[str, Any]], handler: Handler = reraise_exception, keep: bool = True,
            **kw: str) -> Iterator[dict[str, Any]]:
    """Rename fields: ``new="old"`` (``"jpg;png"`` takes the first present); ``keep=False`` drops the others."""
    return _plain.rename(data, handler=handler, keep=keep, **kw)


def _associate(data: Iterable[dict[str, Any]], associator: Any, **kw: Any) -> Iterator[dict[str, Any]]:
    """Add fields to each sample: ``associator(key)`` (a callable) or ``associator[key]`` (a mapping)."""
    for sample in data:
        extra = associator(sample["__key__"]) if callable(associator) else associator.get(sample["__key__"])
        sample.update(extra or {})
        yield sample


def _map_dict(data: Iterable[dict[str, Any]], handler: Handler = reraise_exception,
              **kw: Callable[[Any], Any]) -> Iterator[dict[str, Any]]:
    """Apply ``kw[field]`` to each named field."""
    return _plain.map_dict(data, handler=handler, **kw)


def _to_tuple(data: Iterable[dict[str, Any]], *args: str, handler: Handler = reraise_exception,
              missing_is_error: bool = True, none_is_error: bool | None = None) -> Iterator[tuple[Any, ...]]:
    """Dict samples -> tuples of the named fields; ``none_is_error`` (default: ``missing_is_error``) also refuses
    a field whose value is None."""
    if none_is_error is None:
        none_is_error = missing_is_error
    tuples = _plain.to_tuple(data, *args, handler=handler, missing_is_error=missing_is_error)
    if not none_is_error:
        yield from tuples
        return
    for result in tuples:
        if any(x is None for x in result):
            if handler(ValueError(f"to_tuple {args}: a field is None: {result}")):
                continue
            break
        yield result


def _map_tuple(data: Iterable[Sequence[Any]], *args: Callable[[Any], Any] | None,
               handler: Handler = reraise_exception) -> Iterator[tuple[Any, ...]]:
    """Apply ``args[i]`` to element ``i`` of each tuple."""
    return _plain.map_tuple(data, *args, handler=handler)


def combine_values(b: list[Any], combine_tensors: bool = True, combine_scalars: bool = True) -> Any:
    """One batch field: numbers -> an array, tensors -> a stacked tensor, arrays -> a stacked array, else the
    list."""
    first = b[0]
    if isinstance(first, (int, float)) and combine_scalars:
        return np.array(b)
    if isinstance(first, TorchTensor) and combine_tensors:
        import torch

        return torch.stack(b)
    if isinstance(first, np.ndarray) and combine_tensors:
        return np.array(b)
    return b


def tuple2dict(values: Sequence[Any]) -> dict[int, Any]:
    """``(a, b)`` -> ``{0: a, 1: b}``."""
    return dict(enumerate(values))


def dict2tuple(d: dict[int, Any]) -> tuple[Any, ...]:
    """``{0: a, 1: b}`` -> ``(a, b)``, in key order."""
    return tuple(d[k] for k in sorted(d))


def default_collation_fn(samples: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True) -> Any:
    """Collate a list of samples (tuples, lists or dicts) field by field (see :func:`combine_values`)."""
    if combine_tensors and combine_scalars:
        return _plain.default_collation_fn(samples)
    first = samples[0]
    if isinstance(first, dict):
        return {key: combine_values([s[key] for s in samples], combine_tensors, combine_scalars) for key in first}
    return [combine_values(list(column), combine_tensors, combine_scalars) for column in zip(*samples)]


def _batched(data: Iterable[Any], batchsize: int = 20, collation_fn: Callable[[list[Any]], Any] | None =
             default_collation_fn, partial: bool = True) -> Iterator[Any]:
    """Lists of ``batchsize`` items, collated; ``partial=False`` drops a short last batch."""
    if collation_fn is default_collation_fn:
        collation_fn = _plain.default_collation_fn
    return _plain.batched(data, batchsize, collation_fn, partial)


def _unlisted(data: Iterable[list[Any]]) -> Iterator[Any]:
    """The items of each list."""
    return _plain.unlisted(data)


def _unbatched(data: Iterable[Any]) -> Iterator[Any]:
    """The samples of each collated batch."""
    return _plain.unbatched(data)


def _rsample(data: Iterable[Any], p: float = 0.5) -> Iterator[Any]:
    """Each item with probability ``p``, drawn from the global ``random``."""
    return _plain.rsample(data, p)


def _extract_keys(source: Iterable[dict[str, Any]], *patterns: str | Sequence[str], duplicate_is_error: bool = True,
                  ignore_missing: bool = False) -> Iterator[tuple[Any, ...]]:
    """Dict samples -> tuples, one value per glob pattern."""
    return _patterns.extract_keys(source, *patterns, duplicate_is_error=duplicate_is_error,
                                  ignore_missing=ignore_missing)


def _rename_keys(source: Iterable[dict[str, Any]], *args: tuple[str, str], keep_unselected: bool = False,
                 must_match: bool = True, duplicate_is_error: bool = True, **kw: str) -> Iterator[dict[str, Any]]:
    """Rename the fields matching glob patterns."""
    return _patterns.rename_keys(source, *args, keep_unselected=keep_unselected, must_match=must_match,
                                 duplicate_is_error=duplicate_is_error, **kw)


def decode_bin(stream: IO[bytes]) -> bytes:
    """The stream's bytes."""
    return stream.read()


def decode_text(stream: IO[bytes]) -> str:
    """The stream's bytes as UTF-8 text."""
    return stream.read().decode("utf-8")


#: ``xdecode``'s defaults: ``(glob, stream -> value)``; ``*.pyd`` (pickle) is refused unless pickle is allowed.
default_decoders = list(_patterns.default_decoders)


def find_decoder(decoders: Sequence[tuple[str, Any]], path: str) -> Any:
    """The decoder of the last pattern in ``decoders`` matching the file name of ``path`` (lower-cased), or None."""
    base = path.rsplit("/", 1)[-1].lower()
    for pattern, decoder in reversed(decoders):
        if fnmatch(base, pattern) or fnmatch("." + base, pattern):
            return decoder
    return None


def _xdecode(source: Iterable[dict[str, Any]], *args: tuple[str, Callable[[IO[bytes]], Any]],
             must_decode: bool = True, defaults: Sequence[tuple[str, Any]] = tuple(default_decoders),
             allow_pickle: bool | None = None, **kw: Callable[[IO[bytes]], Any]) -> Iterator[dict[str, Any]]:
    """Decode each field with the stream decoder of the last matching pattern (``allow_pickle``: wds-async's switch
    for ``*.pyd``)."""
    return _patterns.xdecode(source, *args, must_decode=must_decode, defaults=defaults, allow_pickle=allow_pickle,
                             **kw)


info = pipelinefilter(_info)
shuffle = pipelinefilter(_shuffle)
select = pipelinefilter(_select)
log_keys = pipelinefilter(_log_keys)
decode = pipelinefilter(_decode)
map = pipelinefilter(_map)
rename = pipelinefilter(_rename)
associate = pipelinefilter(_associate)
map_dict = pipelinefilter(_map_dict)
to_tuple = pipelinefilter(_to_tuple)
map_tuple = pipelinefilter(_map_tuple)
batched = pipelinefilter(_batched)
unlisted = pipelinefilter(_unlisted)
unbatched = pipelinefilter(_unbatched)
rsample = pipelinefilter(_rsample)
slice = pipelinefilter(itertools.islice)
extract_keys = pipelinefilter(_extract_keys)
rename_keys = pipelinefilter(_rename_keys)
xdecode = pipelinefilter(_xdecode)
detshuffle = DetShuffle
