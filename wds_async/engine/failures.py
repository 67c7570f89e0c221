"""What an error looks like when it leaves the engine: one exception of our tree, never a group.

The engine runs in ``asyncio.TaskGroup``\\ s, which wrap what their tasks raise in an ``ExceptionGroup``
(nested, one level per group). :func:`translate` turns whatever reached the engine's edge into the one
exception a user should see:

* a group is flattened to its leaves, the most meaningful one is kept (an error of our tree first, then a
  ``MemoryError``, then anything else; ``ChannelClosed`` and cancellations are never chosen while another
  leaf exists) and the others are named in its notes (``add_note``);
* a :class:`~wds_async.errors.WdsError` passes unchanged;
* a ``MemoryError`` stays a ``MemoryError`` (callers and handlers test for it) with the shard's URL and
  what to lower in its message; the original is its ``__cause__``;
* any other ``OSError`` becomes :class:`~wds_async.errors.BackendError`, any other ``Exception``
  :class:`~wds_async.errors.EngineError` (a bug, or a user callback's error), the original chained;
* a ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, cancellation) passes unchanged.
"""

from __future__ import annotations

import asyncio

from ..errors import BackendError, EngineError, WdsError
from .channel import ChannelClosed

__all__ = ["leaves", "pick", "translate"]

_GROUP = BaseExceptionGroup

#: What to do about running out of memory, said in every translated MemoryError.
_MEMORY_HINT = ("lower max_buffered_bytes, max_sample_bytes or the number of DataLoader workers, or give the "
                "process more memory")


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``, depth first, with exception groups flattened (``[exc]`` for a leaf)."""
    if not isinstance(exc, _GROUP):
        return [exc]
    out: list[BaseException] = []
    for inner in exc.exceptions:
        out.extend(leaves(inner))
    return out


def _rank(exc: BaseException) -> int:
    if isinstance(exc, WdsError):
        return 0
    if isinstance(exc, MemoryError):
        return 1
    if isinstance(exc, Exception) and not isinstance(exc, ChannelClosed):
        return 2
    return 3 if not isinstance(exc, asyncio.CancelledError) else 4


def pick(exc: BaseException) -> BaseException:
    """The leaf of an exception group that says most (see the module docstring), the other leaves named in
    its notes; ``exc`` itself when it is no group."""
    if not isinstance(exc, _GROUP):
        return exc
    found = leaves(exc)
    chosen = min(found, key=_rank)  # min is stable: the first leaf of the best rank
    for other in found:
        if other is not chosen and hasattr(chosen, "add_note"):  # (3.11+)
            chosen.add_note(f"also raised alongside it: {type(other).__name__}: {other}")
    return chosen


def translate(exc: BaseException, *, url: str | None = None, offset: int | None = None) -> BaseException:
    """The exception to deliver for ``exc``, raised while reading ``url`` (already redacted) when known."""
    exc = pick(exc)
    if isinstance(exc, WdsError) or not isinstance(exc, Exception):
        return exc
    where = f" while reading {url}" + (f" at offset {offset}" if offset is not None else "") if url else ""
    new: BaseException
    if isinstance(exc, MemoryError):
        if url and url in str(exc):
            return exc  # translated already
        new = MemoryError(f"out of memory{where}: {_MEMORY_HINT}")
    elif isinstance(exc, OSError):
        new = BackendError(f"{type(exc).__name__}{where}: {exc}", url=url, offset=offset)
    else:
        new = EngineError(f"unexpected {type(exc).__name__}{where}: {exc}", url=url, offset=offset)
    new.__cause__ = exc
    return new
