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

from collections.abc import Sequence

from ..errors import WdsError

__all__ = ["positive", "shard_urls", "wds_error"]

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
