"""Glob URLs (``s3://bkt/train/shard-*.tar``, ``gs://...``, ``az://...``, local paths) expanded to the
sorted list of matching objects through each store's list API.

Expansion happens once, when the dataset is constructed, in the main process; every rank and worker then
splits the same list. It runs on a private event loop (:func:`wds_async._loop.run_private`), which moves
to a helper thread when the caller's thread already runs a loop (a notebook), since loops cannot nest.

http(s) has no listing: :func:`check_not_http_glob` turns a ``*`` or ``[`` in an http(s) path into an
error that points to brace patterns (the CLI calls it; a dataset passes such a URL through as written).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..config import EngineConfig
from ..errors import UrlError
from ..urls import redact_url, scheme_of

__all__ = ["check_not_http_glob", "expand_globs", "is_glob_url"]

#: Schemes whose backends can list; for http(s) a ``?`` starts the query, never a wildcard.
LISTABLE = ("file", "s3", "gs", "az", "azure")


def _key_part(url: str) -> str:
    scheme = scheme_of(url)
    if scheme == "file":
        return url[len("file://"):] if url.startswith("file://") else url
    rest = url.split("://", 1)[1]
    return rest.split("/", 1)[1] if "/" in rest else ""


def is_glob_url(url: str) -> bool:
    """True for a URL of a listable scheme whose key contains ``*``, ``?`` or ``[``."""
    from . import backend_key
    from .backend import has_glob

    return backend_key(url) in LISTABLE and has_glob(_key_part(url))


def check_not_http_glob(url: str) -> None:
    """Raise :class:`UrlError` for an http(s) URL whose path holds ``*`` or ``[``: no listing can expand it."""
    from urllib.parse import urlsplit

    from . import backend_key

    if ("*" in url or "[" in url) and backend_key(url) in ("http", "https") and any(
            c in urlsplit(url).path for c in "*["):
        raise UrlError("http(s) has no listing, so a glob cannot be expanded; name the shards with a brace "
                       "pattern such as train-{000..099}.tar", url=redact_url(url))


async def _expand(urls: list[str], config: EngineConfig, options: Mapping[str, Any],
                  overrides: Mapping[str, Any] | None) -> list[str]:
    from . import BackendSet

    backends = BackendSet(config, overrides, options)
    try:
        result: list[str] = []
        for url in urls:
            if not is_glob_url(url):
                result.append(url)
                continue
            matches = await backends.for_url(url).list(url)
            if not matches:
                raise UrlError("the glob pattern matched no objects; check the bucket, prefix and credentials",
                               url=redact_url(url))
            result.extend(matches)
        return result
    finally:
        await backends.aclose()


def expand_globs(urls: list[str], config: EngineConfig | None = None, options: Mapping[str, Any] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> list[str]:
    """Replace every glob URL in ``urls`` by its sorted matches (other URLs pass through unchanged); an http(s)
    URL with a glob is a :class:`UrlError` (see :func:`check_not_http_glob`)."""
    for url in urls:
        check_not_http_glob(url)
    if not any(is_glob_url(u) for u in urls):
        return urls
    from .._loop import run_private

    return run_private(lambda: _expand(urls, config or EngineConfig(), options or {}, overrides))
