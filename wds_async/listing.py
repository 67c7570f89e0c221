"""Glob URLs (``s3://bkt/train/shard-*.tar``, ``gs://...``, ``az://...``, local paths) expanded to the
sorted list of matching objects through each store's list API.

Expansion happens once, when the dataset is constructed, in the main process; every rank and worker then
splits the same list. It runs on a private event loop in a helper thread, so it also works when the
caller already runs an event loop (a notebook).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from typing import Any

from .config import EngineConfig
from .errors import UrlError
from .urls import redact_url, scheme_of

__all__ = ["expand_globs", "is_glob_url"]

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
    from .backends import backend_key
    from .backends.base import has_glob

    return backend_key(url) in LISTABLE and has_glob(_key_part(url))


async def _expand(urls: list[str], config: EngineConfig, options: Mapping[str, Any],
                  overrides: Mapping[str, Any] | None) -> list[str]:
    from .engine import BackendSet

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
    """Replace every glob URL in ``urls`` by its sorted matches (other URLs pass through unchanged)."""
    if not any(is_glob_url(u) for u in urls):
        return urls
    coro = _expand(urls, config or EngineConfig(), options or {}, overrides)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="wds-async-list") as pool:
        return pool.submit(asyncio.run, coro).result()
