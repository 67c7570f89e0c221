"""What the CLI commands share: turning arguments into checked URLs, reading one shard, finding the error.

:func:`shard_urls` is the one path from command-line patterns to URLs (``ls``, ``verify``, ``cat``,
``bench``): braces expanded, every URL checked before anything is read (a known scheme, a host for
http(s), a command for ``pipe:``), an http(s) glob refused with a pointer to brace patterns, and globs
of listable stores expanded through their list APIs. Each problem is a
:class:`~wds_async.errors.UrlError` naming the URL.

:func:`read_members` streams one shard through the loader's own pieces (a
:class:`~wds_async.io.reader.RangeReader`, so retries and resume are the engine's, into a
:class:`~wds_async.engine.tarstream.TarParser`); :func:`read_samples` groups those members by webdataset's
rules (:class:`~wds_async.engine.grouping.Grouper`). Both end with an error, never quietly, when the shard is
truncated or is not a tar.

:func:`positive` is the argparse type of counts. :func:`wds_error` finds the
:class:`~wds_async.errors.WdsError` inside what a TaskGroup raised, so that a bad input is one line of
error, not an exception group's traceback.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Any

from ..config import RetryPolicy
from ..engine.grouping import Grouper
from ..engine.tarstream import Member, TarParser
from ..errors import WdsError
from ..urls import redact_url

__all__ = ["positive", "read_members", "read_samples", "shard_urls", "wds_error"]

def positive(text: str) -> int:
    """An argparse ``type``: an integer of at least 1."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def wds_error(exc: BaseException) -> WdsError | None:
    """``exc`` when it is a WdsError, else the first WdsError among an exception group's leaves, else None."""
    from ..engine.failures import leaves

    return next((e for e in leaves(exc) if isinstance(e, WdsError)), None)


def shard_urls(patterns: Sequence[str]) -> list[str]:
    """The shard URLs that ``patterns`` name, checked and with globs listed (see the module docstring)."""
    from ..io import validate_url
    from ..io.listing import expand_globs
    from ..urls import expand_urls

    urls = expand_urls(list(patterns))
    for url in urls:
        validate_url(url)
    return expand_globs(urls)  # refuses an http(s) glob (listing.check_not_http_glob) before listing any


async def read_members(backend: Any, url: str, *, policy: RetryPolicy | None = None,
                       on_bytes: Callable[[int], None] | None = None) -> AsyncGenerator[list[Member], None]:
    """Yield the members of ``url`` in archive order, in the lists each chunk completes. ``on_bytes(n)`` is
    called for every chunk read. Raises :class:`~wds_async.errors.ShardFormatError` (truncated, not a tar)
    after the last good member; closing the generator early closes the stream."""
    from ..io.reader import RangeReader

    reader = RangeReader(backend, url, policy=policy or RetryPolicy())
    parser = TarParser(url=redact_url(url))
    async with aclosing(reader.chunks()) as chunks:
        async for chunk in chunks:
            if on_bytes is not None:
                on_bytes(len(chunk))
            members = parser.feed(chunk)
            if members:
                yield members
    parser.close()


def _raise(error: WdsError) -> None:
    raise error


async def read_samples(backend: Any, url: str, *, policy: RetryPolicy | None = None,
                       on_bytes: Callable[[int], None] | None = None,
                       grouper: Any = None) -> AsyncGenerator[list[Any], None]:
    """Yield the samples of ``url`` (webdataset's grouping; a repeated extension is a
    :class:`~wds_async.errors.SampleError`), in the lists each chunk completes. ``grouper``: another object
    with ``push(members)`` and ``finish()`` (``cp``'s, which keeps member names as they are)."""
    grouper = grouper if grouper is not None else Grouper(redact_url(url), _raise)
    async with aclosing(read_members(backend, url, policy=policy, on_bytes=on_bytes)) as members:
        async for batch in members:
            samples = grouper.push(batch)
            if samples:
                yield samples
    last = grouper.finish()
    if last:
        yield last
