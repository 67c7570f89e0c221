"""What the hardening and fuzz tests of the node service build their probes from: raw frames of its protocol, as
hostile or careless clients send them, and the check that the service still serves an epoch after them."""

from __future__ import annotations

import base64
import struct
from typing import Any

import wds_async as wds
from tests.conftest import sample_digest
from wds_async.service import ServiceHandle
from wds_async.service.protocol import encode

__all__ = ["case", "digest", "frame", "item", "open_request", "serves_an_epoch"]


def frame(body: bytes | dict[str, Any]) -> bytes:
    """A message encoded as the service frames it, or any bytes behind a length prefix."""
    if isinstance(body, dict):
        return encode(body)
    return struct.pack(">I", len(body)) + body


def case(name: str, data: bytes, hello: bool = False) -> dict[str, Any]:
    """A probe's case: ``data`` sent raw (after a hello when ``hello``)."""
    return {"name": name, "data": base64.b64encode(data).decode(), "hello": hello}


def item(url: str, start: Any = 0, end: Any = None, ident: Any = 0, identity: Any = None) -> list[Any]:
    """A work item as an ``open`` carries it."""
    return [ident, 0, url, start, end, None, identity]


def open_request(items: list[Any], **fields: Any) -> dict[str, Any]:
    """An ``open`` message; ``fields`` add to or replace its defaults."""
    return {"type": "open", "items": items, "settings": {}, "backend_options": None, "cache": None, **fields}


def digest(pattern: str) -> tuple[int, str]:
    """``pattern``'s samples as a plain WebDataset reads them: their count and digest."""
    return sample_digest(wds.WebDataset(pattern, deterministic=True))


def serves_an_epoch(svc: ServiceHandle, pattern: str) -> bool:
    """Whether the service delivers ``pattern``'s samples as a plain WebDataset reads them."""
    return sample_digest(wds.WebDataset(pattern, deterministic=True, service=svc.url)) == digest(pattern)
