"""Stages that pick, rename and decode fields by glob pattern (webdataset's ``extract_keys``, ``rename_keys``
and ``xdecode``).

Patterns are :mod:`fnmatch` globs. ``extract_keys`` matches a pattern against a field name and against the
name with a dot in front, so ``"*.png"``, ``".png"`` and ``"png"`` all select the ``png`` field;
``rename_keys`` and ``xdecode`` match the lower-cased part of the name after its last ``/``, and a later
pattern takes precedence over an earlier one.

``xdecode`` hands each decoder a binary stream. Its default table reads ``*.bin`` as bytes and ``*.txt``
as UTF-8; ``*.pyd`` (pickle) is refused unless ``allow_pickle=True`` or ``WDS_ASYNC_ALLOW_PICKLE=1``,
as everywhere in wds-async: a shard is data from elsewhere, and unpickling it runs code.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable, Iterable, Iterator, Sequence
from fnmatch import fnmatch
from typing import IO, Any

from ...errors import DecodingError
from ..decoders import ALLOW_PICKLE_ENV

__all__ = ["default_decoders", "extract_keys", "rename_keys", "xdecode"]

StreamDecoder = Callable[[IO[bytes]], Any]


def extract_keys(source: Iterable[dict[str, Any]], *patterns: str | Sequence[str], duplicate_is_error: bool = True,
                 ignore_missing: bool = False) -> Iterator[tuple[Any, ...]]:
    """Dict samples -> tuples with one value per pattern (``"*.png;*.jpg"``: alternatives).

    A pattern that matches no field raises ``ValueError`` (``ignore_missing=True``: it is left out of the
    tuple); one that matches several raises too, unless ``duplicate_is_error=False`` (the first is taken)."""
    specs = [p.split(";") if isinstance(p, str) else list(p) for p in patterns]
    for sample in source:
        values = []
        for alternatives in specs:
            matches = [k for k in sample if any(fnmatch("." + k, p) or fnmatch(k, p) for p in alternatives)]
            if not matches:
                if ignore_missing:
                    continue
                raise ValueError(f"no field of sample {sample.get('__key__')!r} matches {alternatives} "
                                 f"(fields: {list(sample)})")
            if len(matches) > 1 and duplicate_is_error:
                raise ValueError(f"several fields of sample {sample.get('__key__')!r} match {alternatives}: {matches}; "
                                 "pass duplicate_is_error=False to take the first")
            values.append(sample[matches[0]])
        yield tuple(values)


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def rename_keys(source: Iterable[dict[str, Any]], *args: tuple[str, str], keep_unselected: bool = False,
                must_match: bool = True, duplicate_is_error: bool = True, **kw: str) -> Iterator[dict[str, Any]]:
    """Rename fields whose (lower-cased) name matches a pattern: ``rename_keys(image="*.png", label="cls")`` or
    ``rename_keys(("image", "*.png"))``.

    Fields that match no pattern are dropped (``__key__`` too), unless ``keep_unselected=True``. With
    ``must_match`` every pattern has to match a field of every sample; two fields renamed to one name raise
    unless ``duplicate_is_error=False`` (the first is kept)."""
    renamings = [(pattern, new) for new, pattern in args] + [(pattern, new) for new, pattern in kw.items()]
    latest_first = renamings[::-1]
    for sample in source:
        renamed: dict[str, Any] = {}
        matched = {pattern: False for pattern, _ in renamings}
        for name, value in sample.items():
            base = _basename(name).lower()
            hit = next(((pattern, new) for pattern, new in latest_first if fnmatch(base, pattern)), None)
            if hit is None:
                if keep_unselected:
                    renamed[name] = value
                continue
            pattern, new = hit
            matched[pattern] = True
            if new in renamed:
                if duplicate_is_error:
                    raise ValueError(f"two fields of sample {sample.get('__key__')!r} are renamed to {new!r} "
                                     f"(fields: {list(sample)}); pass duplicate_is_error=False to keep the first")
                continue
            renamed[new] = value
        if must_match and not all(matched.values()):
            missing = [p for p, hit in matched.items() if not hit]
            raise ValueError(f"patterns {missing} match no field of sample {sample.get('__key__')!r} "
                             f"(fields: {list(sample)}); pass must_match=False to allow that")
        yield renamed


def _read_bytes(stream: IO[bytes]) -> bytes:
    return stream.read()


def _read_text(stream: IO[bytes]) -> str:
    return stream.read().decode("utf-8")


def _refuse_pickle(stream: IO[bytes]) -> Any:
    raise DecodingError(f"xdecode refuses to unpickle a .pyd field: unpickling runs code from the data; if you trust "
                        f"these shards, pass allow_pickle=True or set {ALLOW_PICKLE_ENV}=1")


def _unpickle(stream: IO[bytes]) -> Any:
    return pickle.load(stream)


#: ``(pattern, decoder)`` pairs ``xdecode`` starts from; a decoder takes a binary stream.
default_decoders: list[tuple[str, StreamDecoder]] = [("*.bin", _read_bytes), ("*.txt", _read_text),
                                                     ("*.pyd", _refuse_pickle)]


def _find_decoder(decoders: list[tuple[str, Any]], name: str) -> Any:
    base = _basename(name).lower()
    for pattern, decoder in reversed(decoders):
        if fnmatch(base, pattern) or fnmatch("." + base, pattern):
            return decoder
    return None


def xdecode(source: Iterable[dict[str, Any]], *args: tuple[str, StreamDecoder], must_decode: bool = True,
            defaults: Sequence[tuple[str, StreamDecoder]] = tuple(default_decoders), allow_pickle: bool | None = None,
            **kw: StreamDecoder) -> Iterator[dict[str, Any]]:
    """Decode each field with the decoder of the last matching pattern: ``xdecode(("*.custom", f), png=imread)``
    (``png=f`` means ``("*.png", f)``); a decoder gets ``io.BytesIO(value)``. Fields named ``__*`` pass
    unchanged, and so does a field whose decoder is ``False``.

    A field no pattern matches raises ``ValueError``, or passes unchanged with ``must_decode=False``."""
    if allow_pickle is None:
        allow_pickle = os.environ.get(ALLOW_PICKLE_ENV, "").strip().lower() in ("1", "true", "yes")
    decoders: list[tuple[str, Any]] = [*defaults, *args, *((f"*.{ext}", f) for ext, f in kw.items())]
    if allow_pickle:
        decoders = [(p, _unpickle if f is _refuse_pickle else f) for p, f in decoders]
    for sample in source:
        decoded: dict[str, Any] = {}
        for name, value in sample.items():
            if name.startswith("__"):
                decoded[name] = value
                continue
            decoder = _find_decoder(decoders, name)
            if decoder is None:
                if must_decode:
                    raise ValueError(f"xdecode: no decoder for field {name!r} of sample {sample.get('__key__')!r}; "
                                     "add one or pass must_decode=False")
                decoded[name] = value
            elif decoder is False:
                decoded[name] = value
            else:
                decoded[name] = decoder(io.BytesIO(value) if isinstance(value, bytes) else value)
        yield decoded
