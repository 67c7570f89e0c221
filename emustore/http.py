"""What the emulated store's core and its faces share: routed calls, error answers, request bodies.

A face routes a request to a `Call`: the handler that answers it and its kind, `OBJECT`, `META` or
`WRITE`, which decides the knobs that the core applies first (:mod:`emustore.server`). A handler
raises `StoreError` for an error answer; the request's face renders it (S3's XML, GCS's JSON). A body
is read only after ``Expect: 100-continue`` was answered: boto3 and Go clients wait for it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from emustore.knobs import Plan

__all__ = [
    "BODY_CHUNK", "BODY_ERRORS", "CONTINUED", "META", "OBJECT", "WRITE", "Call", "Handler", "StoreError",
    "expects_continue", "int_param", "iso", "method_not_allowed", "not_implemented", "read_body",
    "send_continue",
]

OBJECT, META, WRITE = "object", "meta", "write"  # what a request is, for the knobs (see Call)
BODY_CHUNK = 1 << 20
BODY_ERRORS = (ConnectionError, EOFError, HttpProcessingError, ValueError)  # a body cut or malformed
CONTINUED = "wds-store.continued"  # set on a request once "100 Continue" was sent

Handler = Callable[[web.BaseRequest, Plan], Awaitable[web.StreamResponse]]


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """What a request will do: ``kind`` (OBJECT, META or WRITE) decides which knobs apply."""

    kind: str
    run: Handler


class StoreError(Exception):
    """An error answer; each face renders it (S3 XML, GCS JSON)."""

    def __init__(self, status: int, code: str, message: str, where: str = "",
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code  # S3's error code; GCS's reason follows from the status
        self.message = message
        self.where = where  # S3's <Resource>: the bucket or key the error is about
        self.headers = dict(headers or {})


def method_not_allowed() -> StoreError:
    return StoreError(405, "MethodNotAllowed", "The specified method is not allowed against this resource.",
                      headers={"Allow": "GET, HEAD, PUT, POST, DELETE"})


async def not_implemented(request: web.BaseRequest, plan: Plan) -> web.StreamResponse:
    raise StoreError(501, "NotImplemented", "A header or parameter you provided implies functionality that "
                     "the emulated store does not implement.")


def int_param(query: Mapping[str, str], name: str, default: int | None, low: int, high: int | None) -> int:
    """An integer query parameter in [low, high]; 400 InvalidArgument when malformed or missing."""
    value = query.get(name)
    if value is None and default is not None:
        return default
    if value is None or not value.isdigit() or int(value) < low or (high is not None and int(value) > high):
        raise StoreError(400, "InvalidArgument", f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def iso(mtime_ns: int) -> str:
    """RFC 3339 / ISO 8601 in UTC with milliseconds: ``2024-05-01T12:00:00.000Z``."""
    seconds, ns = divmod(mtime_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns // 1_000_000:03d}Z"


def expects_continue(request: web.BaseRequest) -> bool:
    return request.headers.get("Expect", "").lower() == "100-continue" and request.version >= (1, 1)


async def send_continue(request: web.BaseRequest) -> None:
    """Answer ``Expect: 100-continue`` (boto3 and Go clients wait for it before sending a body)."""
    if expects_continue(request) and CONTINUED not in request:
        request[CONTINUED] = True
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0


async def read_body(request: web.BaseRequest) -> bytes:
    """A small body (XML or JSON), whole."""
    await send_continue(request)
    return await request.read()
