"""The resumable range reader: the bytes ``[start, end)`` of one object, whatever the network does.

Every read of shard bytes goes through :class:`RangeReader`: a whole shard, a shard resumed at a saved
offset, the byte range of an index share, one sample re-read to refill a shuffle buffer. It

* opens the source at ``start`` (``end=None``: to the end of the object);
* on a :class:`~wds_async.errors.TransientError` reopens it at the byte reached, after exponential
  backoff with full jitter, until the :class:`~wds_async.config.RetryPolicy` gives up (the count of
  failures restarts whenever an attempt made progress);
* checks the object's identity on every open: against ``expect`` (what an index or checkpoint
  recorded) on the first, against the first open on the others, and raises
  :class:`~wds_async.errors.ObjectChanged` on a conflict rather than splice two versions;
* raises a transient error when a source announced a size and ended short of ``end``.

It yields chunks; it never parses and holds no buffer, so the caller decides when to read the next
chunk (the engine waits on its byte budget between chunks).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from ..config import RetryPolicy
from ..errors import ObjectChanged, Throttled, TransientError
from ..stats import Stats
from ..urls import redact_url
from .backend import Backend, ObjectIdentity, capabilities_of
from .budget import ByteBudget

__all__ = ["RangeReader", "ReadContext"]

log = logging.getLogger("wds_async")


@dataclass(frozen=True)
class ReadContext:
    """What every read of one engine (or one CLI command) shares: made once, handed to each reader whole.

    ``policy``: retries and their deadline. ``stats``: the counters reads add to (requests, bytes, retries,
    throttled answers, open streams, first-byte times). ``budget``: the byte budget that counts each open
    stream's buffer allowance. ``requeue``: awaited before a throttled request is retried (above a limit the
    autotuner lowered, the engine gives its concurrency token back and waits for one; see engine/tokens.py).
    """

    policy: RetryPolicy = field(default_factory=RetryPolicy)
    stats: Stats | None = None
    budget: ByteBudget | None = None
    requeue: Callable[[], Awaitable[None]] | None = None


class RangeReader:
    """Reads ``[start, end)`` of ``url`` through ``backend`` (see the module docstring).

    ``pos`` is the object offset of the next byte :meth:`chunks` will yield; ``identity`` what the first
    open reported (``None`` before it).
    """

    def __init__(self, backend: Backend, url: str, *, start: int = 0, end: int | None = None,
                 expect: ObjectIdentity | None = None, context: ReadContext | None = None,
                 what: str = "the index or checkpoint") -> None:
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"bad byte range [{start}, {end}) for {redact_url(url)}")
        self.backend = backend
        self.url = url
        self.shown = redact_url(url)
        self.start = start
        self.end = end
        self.pos = start
        self.context = context = context if context is not None else ReadContext()
        self.policy, self.stats = context.policy, context.stats
        self.expect = expect
        self.what = what
        self.requeue = context.requeue
        #: While a stream is open its backend's ``capabilities.buffer_allowance`` (what the transport may buffer
        #: outside the engine's counters) is counted here, so the budget bounds real memory at any concurrency.
        self.budget = context.budget
        capabilities = capabilities_of(backend)
        #: Opens after the first (and the first too, when ``expect`` is given) are conditional on the version
        #: already seen, where the backend can send the condition (``If-Match``, ``ifGenerationMatch``).
        self.conditional = capabilities.conditional_reads
        self.allowance = capabilities.buffer_allowance
        self.identity: ObjectIdentity | None = None
        #: What the first open's stream reported (``ByteStream.info``: e.g. the HTTP status).
        self.info: dict[str, Any] | None = None

    def _check(self, seen: ObjectIdentity) -> None:
        if self.identity is None:
            conflict = self.expect.conflicts_with(seen) if self.expect is not None else None
            if conflict:
                raise ObjectChanged(f"the object is not the version {self.what} recorded ({conflict}); "
                                    "rebuild the index, or start the epoch afresh", url=self.shown, offset=self.pos)
            self.identity = seen
            return
        conflict = self.identity.conflicts_with(seen)
        if conflict:
            raise ObjectChanged(f"the object changed between attempts ({conflict}); refusing to splice two "
                                "versions of one shard", url=self.shown, offset=self.pos)

    def _stop_at(self) -> int | None:
        """Where the read ends: the range's end, else the object's size once an answer said it."""
        if self.end is not None:
            return self.end
        return self.identity.size if self.identity is not None else None

    def _asked(self, start: int) -> int | None:
        """The bytes a request from ``start`` asks for, when the range or the object's size says."""
        end = self._stop_at()
        return None if end is None else end - start

    async def chunks(self) -> AsyncGenerator[bytes, None]:
        """Yield the range's bytes in order, exactly once each, retrying and resuming as needed."""
        failures, first_failure = 0, 0.0
        while self.end is None or self.pos < self.end:
            progress_at_start = self.pos
            opened = time.monotonic()
            try:
                if self.stats is not None:
                    self.stats.requests += 1
                pinned = self.identity or self.expect
                conditional = {"expect": pinned} if pinned is not None and self.conditional else {}
                async with self.backend.open(self.url, start=self.pos, end=self.end, **conditional) as stream:
                    self._check(stream.identity)
                    if self.info is None:
                        self.info = dict(stream.info)
                    first = True
                    if self.stats is not None:
                        self.stats.open_streams += 1
                    if self.budget is not None:
                        self.budget.reserve(self.allowance)
                    try:
                        async for chunk in stream:
                            self.pos += len(chunk)
                            if self.stats is not None:
                                if first:
                                    self.stats.observe_ttfb(time.monotonic() - opened, self._asked(progress_at_start))
                                    first = False
                                self.stats.bytes_read += len(chunk)
                            yield chunk
                    finally:
                        if self.stats is not None:
                            self.stats.open_streams -= 1
                        if self.budget is not None:
                            self.budget.unreserve(self.allowance)
                size = self.identity.size if self.identity is not None else None
                want = self._stop_at()
                if want is not None and self.pos < want and (size is None or self.pos < size):
                    raise TransientError(f"stream ended after {self.pos} of {want} bytes", url=self.shown,
                                         offset=self.pos)
                return
            except TransientError as exc:
                if isinstance(exc, Throttled) and self.stats is not None:
                    self.stats.throttled += 1
                if self.pos > progress_at_start:
                    failures, first_failure = 0, 0.0
                failures += 1
                now = time.monotonic()
                first_failure = first_failure or now
                if failures >= self.policy.attempts or now - first_failure >= self.policy.deadline:
                    raise TransientError(
                        f"gave up after {failures} attempts over {now - first_failure:.1f} s: {exc.message}",
                        url=self.shown, offset=self.pos) from exc
                delay = self.policy.delay(failures)
                log.info("retrying %s at byte %d in %.2f s: %s", self.shown, self.pos, delay, exc.message)
                if self.stats is not None:
                    self.stats.retries += 1
                await asyncio.sleep(delay)
                if isinstance(exc, Throttled) and self.requeue is not None:
                    await self.requeue()
