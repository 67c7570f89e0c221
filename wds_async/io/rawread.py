"""Raw reads through the loader's own backends, bytes counted and thrown away.

What ``wds-async bench`` (its raw phase) and ``wds-async tune`` measure: the same backends, sessions
and connection pools the engine uses, with nothing on top (no tar parsing, no byte budget, no
retries: a failed request raises, so the caller sees and counts every 503).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from ..config import EngineConfig
from .registry import BackendSet

__all__ = ["drain", "raw_backends"]


@asynccontextmanager
async def raw_backends(connections: int, options: dict[str, Any] | None = None) -> AsyncIterator[BackendSet]:
    """A ``BackendSet`` whose pools allow ``connections`` requests at once, closed on exit."""
    backends = BackendSet(EngineConfig(max_connections=connections), options=options)
    try:
        yield backends
    finally:
        await backends.aclose()


async def drain(backends: BackendSet, url: str, *, start: int = 0, end: int | None = None,
                on_chunk: Callable[[int], None] | None = None) -> int:
    """Read ``[start, end)`` of ``url`` to the end; return the byte count. ``on_chunk(n)`` is called
    for every chunk as it arrives (the first call marks the time to first byte)."""
    total = 0
    async with backends.for_url(url).open(url, start=start, end=end) as stream:
        async for chunk in stream:
            total += len(chunk)
            if on_chunk is not None:
                on_chunk(len(chunk))
    return total
