"""The one serial reader of one shard: bytes in archive order -> tar members -> samples.

Every reader of shard bytes goes through here: the engine's item loop (one work item at a time per reader task),
``wds-async cp`` (copying and resharding), the indexer, ``cat`` and ``verify``. Two pieces:

* :class:`ShardParse` is sans-IO. It owns the :class:`~wds_async.engine.tarstream.TarParser` and the grouper of
  one work item (a whole shard, or the byte range ``[start, end)`` of one) and knows how the item must end:
  a whole archive must reach its end marker (:meth:`TarParser.close`); a range of an uncompressed shard must end
  exactly at ``end`` on a member boundary, or the index that named the range does not describe the shard; a
  compressed shard is inflated from byte 0 and its members outside ``[start, end)`` are dropped, reading
  stopping once a member at or past ``end`` appears (:attr:`ShardParse.done`).
* :func:`read_shard` is the async driver: it pulls chunks from any source with ``chunks()`` (a
  :class:`~wds_async.io.reader.RangeReader`, or a :class:`~wds_async.engine.parts.PartedRead` for ranged parts),
  feeds them, and yields ``(chunk, samples)`` per chunk, then ``(b"", last samples)`` once the item's end was
  checked. Hooks let the engine wait for room in its byte budget before each read and write each chunk to the
  shard cache as it passes; the generator holds no task group, so it may be closed early at any ``yield``.

A grouper is anything with ``push(members) -> list``, ``finish() -> list`` and ``pending_bytes``:
:class:`~wds_async.engine.grouping.Grouper` (webdataset's rules, the default), ``cp``'s grouper that keeps member
names as written, or :class:`MemberList` (``cat``: the members themselves).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from ..config import RetryPolicy
from ..errors import TruncatedShard, WdsError
from ..io.backend import Backend
from ..io.reader import RangeReader, ReadContext
from ..urls import redact_url
from .grouping import Grouper
from .tarstream import Member, TarParser

__all__ = ["ChunkSource", "GrouperLike", "MemberList", "ShardParse", "raise_error", "read_shard", "shard_samples"]


class ChunkSource(Protocol):
    """What :func:`read_shard` reads: an object whose ``chunks()`` yields the item's bytes in order."""

    def chunks(self) -> AsyncGenerator[bytes, None]: ...


class GrouperLike(Protocol):
    """Members in, complete units out (samples, or the members themselves); bytes held counted."""

    pending_bytes: int

    def push(self, members: Sequence[Member]) -> list[Any]: ...

    def finish(self) -> list[Any]: ...


def raise_error(error: WdsError) -> None:
    """The ``on_error`` of a grouper whose caller wants a bad sample to end the shard (cp, index, verify)."""
    raise error


class MemberList:
    """A grouper that groups nothing: each member comes out as it was parsed (``wds-async cat``'s listing)."""

    pending_bytes = 0

    def push(self, members: Sequence[Member]) -> list[Any]:
        return list(members)

    def finish(self) -> list[Any]:
        return []


class ShardParse:
    """The parser, grouper and end rules of one work item (see the module docstring). Sans-IO."""

    def __init__(self, shown: str, *, start: int = 0, end: int | None = None, ranged: bool = True,
                 grouper: GrouperLike | None = None, max_member_bytes: int | None = None) -> None:
        self.shown = shown
        self.start, self.end, self.ranged = start, end, ranged
        self.parser = TarParser(url=shown, start_offset=start if ranged else 0, max_member_bytes=max_member_bytes)
        self.grouper: GrouperLike = grouper if grouper is not None else Grouper(shown, raise_error)
        #: An item of a compressed shard that starts late or ends early: members outside the range are dropped.
        self.filtered = not ranged and (start > 0 or end is not None)
        #: Set once a filtered item has seen a member at or past its end: read no further.
        self.done = False

    @property
    def pending_bytes(self) -> int:
        """Bytes the parser and grouper hold that have not come out as samples yet."""
        return self.parser.pending_bytes + self.grouper.pending_bytes

    def feed(self, chunk: bytes) -> list[Any]:
        """The samples that ``chunk`` completes."""
        members = self.parser.feed(chunk)
        if self.filtered:
            lo, hi = self.start, self.end
            if hi is not None and any(m.offset >= hi for m in members):
                self.done = True
            members = [m for m in members if lo <= m.offset and (hi is None or m.offset < hi)]
        return self.grouper.push(members)

    def finish(self) -> list[Any]:
        """Check that the item ended where it must (see the module docstring); the last samples."""
        if self.done:
            pass  # the rest of a compressed archive is not wanted, so its end is not checked
        elif self.end is None or not self.ranged:
            self.parser.close()
        elif not self.parser.at_boundary or self.parser.offset != self.end:
            raise TruncatedShard(
                f"the range [{self.start}, {self.end}) did not end at a member boundary (stopped at "
                f"{self.parser.offset}); the index does not describe this shard", url=self.shown,
                offset=self.parser.offset)
        return self.grouper.finish()


async def read_shard(source: ChunkSource, parse: ShardParse, *,
                     before_read: Callable[[], Awaitable[None]] | None = None,
                     on_chunk: Callable[[bytes], Awaitable[None]] | None = None,
                     ) -> AsyncGenerator[tuple[bytes, list[Any]], None]:
    """Yield ``(chunk, samples)`` for every chunk of ``source``, then ``(b"", last)`` after the end checks.

    ``before_read()`` is awaited before each read (the engine waits for room in its byte budget there);
    ``on_chunk(chunk)`` is awaited for each chunk before it is parsed (the shard cache's fill). A format error
    raises after the samples before it were yielded; closing the generator early closes the source's stream.
    """
    async with aclosing(source.chunks()) as chunks:
        it = chunks.__aiter__()
        while True:
            if before_read is not None:
                await before_read()
            try:
                chunk = await it.__anext__()
            except StopAsyncIteration:
                break
            if on_chunk is not None:
                await on_chunk(chunk)
            yield chunk, parse.feed(chunk)
            if parse.done:
                break
    yield b"", parse.finish()


async def shard_samples(backend: Backend, url: str, *, policy: RetryPolicy | None = None,
                        on_bytes: Callable[[int], None] | None = None,
                        grouper: GrouperLike | None = None) -> AsyncGenerator[list[Any], None]:
    """Yield the samples of the whole shard ``url`` (webdataset's grouping; a repeated extension is a
    :class:`~wds_async.errors.SampleError`), in the non-empty lists each chunk completes: what ``verify``,
    ``cat`` and resharding read. ``grouper``: another grouper (:class:`MemberList` for the members themselves).
    ``on_bytes(n)`` is called for every chunk read."""
    reader = RangeReader(backend, url, context=ReadContext(policy or RetryPolicy()))
    parse = ShardParse(redact_url(url), grouper=grouper)
    async with aclosing(read_shard(reader, parse)) as reads:
        async for chunk, samples in reads:
            if on_bytes is not None and chunk:
                on_bytes(len(chunk))
            if samples:
                yield samples
