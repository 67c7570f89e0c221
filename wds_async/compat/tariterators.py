"""``webdataset.tariterators``: the tar-reading iterators, one step each, as open_clip and timm compose them.

The steps take and yield webdataset's dicts: ``url_opener`` turns ``{"url": u}`` into ``{"url": u, "stream": f}``;
``tar_file_expander`` turns those into one ``{"fname", "data", "__url__"}`` per file; ``group_by_keys`` gathers
files into samples (``__key__``, ``__url__``, one field per extension). They are built from wds-async's pieces:
URLs open through its backends (:func:`~wds_async.compat.gopen.gopen`), archives are read by its incremental tar
parser (which reads gzipped tars too, and reports a truncated archive instead of ending quietly), and keys split by
its :func:`~wds_async.engine.grouping.split_key`, webdataset's rule.

``tarfile_samples``/``tarfile_to_samples`` are wds-async's engine stage (many shards in flight, retries), not this
one-shard-at-a-time chain.

Differences from webdataset 1.0.2, for code written against 0.2.x (open_clip, timm): ``tar_file_expander`` yields
no end-of-shard marker unless ``eof_value`` is given (1.0.2 yields ``{}`` by default, which open_clip's and timm's
own ``group_by_keys_nothrow`` cannot read); ``group_by_keys`` closes a sample where the URL changes as well as
where the key changes, so two shards never merge a sample.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any

from ..data.pipeline import tarfile_samples, tarfile_to_samples
from ..engine.grouping import split_key
from ..engine.tarstream import TarParser
from ..urls import braceexpand
from .gopen import gopen
from .handlers import reraise_exception

__all__ = [
    "base_plus_ext", "group_by_keys", "meta_prefix", "meta_suffix", "shardlist", "tar_file_expander",
    "tar_file_iterator", "tarfile_samples", "tarfile_to_samples", "url_opener", "valid_sample",
]

Handler = Callable[[BaseException], bool]

meta_prefix = "__"
meta_suffix = "__"
trace = False

#: How much of a stream :func:`tar_file_iterator` reads at a time.
_READ_BYTES = 1 << 20


def base_plus_ext(path: str) -> tuple[str, str] | tuple[None, None]:
    """``(key, extensions)`` of a member name, split at the first dot of its basename (``a/b.seg.png`` ->
    ``("a/b", "seg.png")``); ``(None, None)`` for a name that carries no sample field."""
    parts = split_key(path)
    return (None, None) if parts is None else parts


def valid_sample(sample: Any) -> bool:
    """Whether ``sample`` is a non-empty dict not marked ``__bad__``."""
    return isinstance(sample, dict) and len(sample) > 0 and not sample.get("__bad__", False)


def shardlist(urls: str | Iterable[str], *, shuffle: bool = False) -> Iterator[dict[str, str]]:
    """``{"url": u}`` for each URL (a brace pattern, or a list), shuffled with the global ``random`` when asked."""
    listed = braceexpand(urls) if isinstance(urls, str) else list(urls)
    if shuffle:
        random.shuffle(listed)
    for url in listed:
        yield {"url": url}


def url_opener(data: Iterable[dict[str, Any]], handler: Handler = reraise_exception,
               **kw: Any) -> Iterator[dict[str, Any]]:
    """Open each ``{"url": u}`` with :func:`~wds_async.compat.gopen.gopen` and add the stream as ``"stream"``. An
    error (the URL appended to its ``args``) goes to ``handler``: True skips that URL, False stops."""
    for sample in data:
        if not isinstance(sample, dict) or "url" not in sample:
            raise TypeError(f"url_opener expects dicts with a 'url', got {sample!r}")
        url = sample["url"]
        try:
            stream = gopen(url, **kw)
        except Exception as exn:
            exn.args = (*exn.args, url)
            if handler(exn):
                continue
            break
        sample.update(stream=stream)
        yield sample


def _skipped(fname: str, skip_meta: str | None) -> bool:
    if "/" not in fname and fname.startswith(meta_prefix) and fname.endswith(meta_suffix):
        return True
    return skip_meta is not None and re.match(skip_meta, fname) is not None


def tar_file_iterator(fileobj: IO[bytes], skip_meta: str | None = r"__[^/]*__($|/)", handler: Handler =
                      reraise_exception, select_files: Callable[[str], bool] | None = None,
                      rename_files: Callable[[str], str] | None = None) -> Iterator[dict[str, Any]]:
    """``{"fname": name, "data": bytes}`` for each regular file of the (optionally gzipped) tar read from
    ``fileobj``, in archive order; names matching ``skip_meta`` are skipped, then ``rename_files`` and
    ``select_files`` apply (an error of theirs goes to ``handler``: True skips that file, False stops). A malformed
    or truncated archive raises :class:`~wds_async.ShardFormatError` / :class:`~wds_async.TruncatedShard` out of
    the iterator, as tarfile's errors leave webdataset's."""
    name = getattr(fileobj, "name", None)
    parser = TarParser(url=name if isinstance(name, str) else None)
    while True:
        chunk = fileobj.read(_READ_BYTES)
        if not chunk:
            parser.close()
            return
        for member in parser.feed(chunk):
            fname = member.name
            try:
                if _skipped(fname, skip_meta):
                    continue
                if rename_files is not None:
                    fname = rename_files(fname)
                if select_files is not None and not select_files(fname):
                    continue
            except Exception as exn:
                if exn.args:
                    exn.args = (f"{exn.args[0]} @ {fileobj}", *exn.args[1:])
                if handler(exn):
                    continue
                return
            yield {"fname": fname, "data": member.data}


def tar_file_expander(data: Iterable[dict[str, Any]], handler: Handler = reraise_exception,
                      select_files: Callable[[str], bool] | None = None,
                      rename_files: Callable[[str], str] | None = None,
                      eof_value: Any = None) -> Iterator[dict[str, Any]]:
    """The files of each opened shard (``{"url", "stream"}``), each with ``__url__`` (and ``__local_path__`` when
    the source has a ``local_path``); ``eof_value``, when not None, is yielded after each shard. The stream is
    closed once read."""
    for source in data:
        url = source.get("url") if isinstance(source, dict) else None
        try:
            if not isinstance(source, dict) or "stream" not in source:
                raise TypeError(f"tar_file_expander expects dicts with a 'stream', got {source!r}")
            local_path = source.get("local_path")
            stream = source["stream"]
            try:
                for sample in tar_file_iterator(stream, handler=handler, select_files=select_files,
                                                rename_files=rename_files):
                    sample["__url__"] = url
                    if local_path is not None:
                        sample["__local_path__"] = local_path
                    yield sample
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
            if eof_value is not None:
                yield eof_value
        except Exception as exn:
            exn.args = (*exn.args, source.get("stream") if isinstance(source, dict) else None, url)
            if handler(exn):
                continue
            break


def group_by_keys(data: Iterable[dict[str, Any]], keys: Callable[[str], tuple[Any, Any]] = base_plus_ext,
                  lcase: bool = True, suffixes: Iterable[str] | None = None,
                  handler: Handler = reraise_exception) -> Iterator[dict[str, Any]]:
    """Gather consecutive files with the same key (and the same ``__url__``) into samples. A repeated extension
    within a sample raises :class:`ValueError` to ``handler``; an ``{}`` (an end-of-shard marker) closes the
    sample being gathered."""
    wanted = None if suffixes is None else set(suffixes)
    current: dict[str, Any] | None = None
    for filesample in data:
        try:
            if filesample == {}:
                if valid_sample(current):
                    yield current  # type: ignore[misc]
                current = None
                continue
            fname, value = filesample["fname"], filesample["data"]
            prefix, suffix = keys(fname)
            if prefix is None:
                continue
            if lcase:
                suffix = suffix.lower()
            url = filesample.get("__url__")
            if current is None or prefix != current["__key__"] or url != current["__url__"]:
                if valid_sample(current):
                    yield current  # type: ignore[misc]
                current = {"__key__": prefix, "__url__": url}
            if suffix in current:
                raise ValueError(f"{fname}: duplicate file name in tar file {suffix} {current.keys()}")
            if wanted is None or suffix in wanted:
                current[suffix] = value
            local_path = filesample.get("__local_path__")
            if local_path is not None:
                current["__local_path__"] = local_path
        except Exception as exn:
            exn.args = (*exn.args, filesample.get("stream"), filesample.get("url"))
            if handler(exn):
                continue
            break
    if valid_sample(current):
        yield current  # type: ignore[misc]
