"""The emulated store's hot path: a GET or HEAD of one mapped object, paced and faulted by its knobs.

`Sender.serve` answers ``If-Match`` and ``If-None-Match``, one ``bytes=`` range (malformed and
multi-range headers get the whole object, as RFC 9110 allows), ``ignore_range``, ``drop_rate`` and
``stall``; its write loop sends memoryview slices of the mapping, paced to ``bw`` by a clock per
response started at the first byte and to ``total_bw`` by one reservation clock that every response
of the server books. It counts ``bytes_sent`` and ``dropped`` for ``/_stats``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Protocol

from aiohttp import web

from emustore.http import StoreError
from emustore.knobs import Plan
from emustore.objects import StoredObject, content_type

__all__ = ["Sender", "Writer", "object_headers", "parse_range"]

_MIN_CHUNK = 64 << 10
_MAX_CHUNK = 256 << 10


class Writer(Protocol):
    """Where :meth:`Sender.send` writes a body's pieces: an aiohttp response, or a fast-path connection."""

    async def write(self, data: memoryview, /) -> None: ...


class _SharedClock:
    """A reservation clock for ``total_bw``: each chunk books the next free slot on one timeline."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self._free_at = 0.0

    def reserve(self, now: float, nbytes: int) -> float:
        self._free_at = max(self._free_at, now) + nbytes / self.rate
        return self._free_at


class Sender:
    """Serves mapped objects for one server; ``total_bw`` (bytes/s, 0 = unlimited) is shared by all."""

    def __init__(self, total_bw: float) -> None:
        self.clock = _SharedClock(total_bw) if total_bw else None
        self.bytes_sent = self.dropped = 0

    async def serve(self, request: web.BaseRequest, obj: StoredObject, plan: Plan,
                    extra: Mapping[str, str] | None = None) -> web.StreamResponse:
        """Answer a GET/HEAD of ``obj`` (ranges, conditions, drops, stalls); ``extra`` adds headers."""
        size = obj.size
        headers = object_headers(obj, request.path)
        if extra:
            headers.update(extra)
        start, end, status = 0, size, 200
        wanted = request.headers.get("If-Match")
        if wanted is not None and wanted.strip() != "*" and obj.etag not in (t.strip() for t in wanted.split(",")):
            raise StoreError(412, "PreconditionFailed",
                             "At least one of the preconditions you specified did not hold")
        unwanted = request.headers.get("If-None-Match")
        if unwanted is not None and (unwanted.strip() == "*" or obj.etag in (t.strip() for t in unwanted.split(","))):
            return web.Response(status=304, headers={"ETag": obj.etag, "Last-Modified": obj.last_modified})
        if not plan.knobs.ignore_range:
            headers["Accept-Ranges"] = "bytes"
            span = parse_range(request.headers.get("Range"), size)
            if isinstance(span, str):  # "unsatisfiable"
                raise StoreError(416, "InvalidRange", "The requested range is not satisfiable",
                                 headers={"Content-Range": f"bytes */{size}"})
            if span is not None:
                start, end, status = span[0], span[1], 206
                headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        resp = web.StreamResponse(status=status, headers=headers)
        resp.content_length = end - start
        cut = None
        if (request.method == "GET" and end > start and plan.knobs.drop_rate
                and plan.rng.random() < plan.knobs.drop_rate):
            cut = start + plan.rng.randrange(end - start)
        stall_at = start + (end - start) // 2 if plan.stall else -1
        try:
            # A client that gave up during the time to first byte (a benchmark ending its window) is
            # gone by the time the headers are written: prepare() raises like a write.
            await resp.prepare(request)
            if request.method == "HEAD" or end == start:
                return resp
            await self.send(resp, obj.view, start, cut if cut is not None else end, plan, stall_at)
        except ConnectionError:
            return resp  # the client went away; aiohttp finishes quietly
        if cut is not None and request.transport is not None:
            self.dropped += 1
            request.transport.close()  # flushes what was written, then FIN: a short body
        return resp

    async def send(self, resp: Writer, view: memoryview, pos: int, stop: int,
                    plan: Plan, stall_at: int) -> None:
        """Write view[pos:stop] paced by a per-response clock started at the first byte."""
        loop = asyncio.get_running_loop()
        bw = plan.knobs.bw
        chunk = int(min(max(bw / 20, _MIN_CHUNK), _MAX_CHUNK)) if bw else _MAX_CHUNK
        t0 = loop.time()
        sent = 0
        while pos < stop:
            if pos == stall_at:
                await asyncio.sleep(plan.stall)
                t0 += plan.stall  # no catch-up burst after the stall
            n = min(chunk, stop - pos)
            if pos < stall_at < pos + n:
                n = stall_at - pos
            slept = False
            if bw:
                delay = t0 + (sent + n) / bw - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    slept = True
            if self.clock is not None:
                delay = self.clock.reserve(loop.time(), n) - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                    slept = True
            await resp.write(view[pos:pos + n])
            pos += n
            sent += n
            self.bytes_sent += n
            if not slept:
                await asyncio.sleep(0)  # write() only yields when the transport is paused


def object_headers(obj: StoredObject, path: str) -> dict[str, str]:
    """The headers every answer with ``obj``'s bytes carries (aiohttp's path and the fast path,
    :mod:`emustore.fastpath`): its ETag, Last-Modified and the Content-Type of its name."""
    return {"ETag": obj.etag, "Last-Modified": obj.last_modified,
            "Content-Type": content_type(path)}


def parse_range(header: str | None, size: int) -> tuple[int, int] | str | None:
    """One ``bytes=`` range as a half-open (start, end); None to serve it all; "unsatisfiable".

    Malformed and multi-range headers are ignored (RFC 9110 allows answering them with 200).
    """
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, sep, last = header[6:].strip().partition("-")
    if not sep or not (first.isdigit() or last.isdigit()):
        return None
    if not first:  # suffix: the last N bytes
        n = int(last)
        if n == 0 or size == 0:
            return "unsatisfiable"
        return max(size - n, 0), size
    if last and not last.isdigit():
        return None
    start = int(first)
    if last and int(last) < start:
        return None  # invalid, so ignored
    if start >= size:
        return "unsatisfiable"
    return start, min(int(last) + 1, size) if last else size
