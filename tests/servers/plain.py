"""What the tests of the emulated store's plain http face share: the shard they read, a file outside the store's
root that must never be served, and a one-request client."""

from __future__ import annotations

import json

import aiohttp

from emustore import StoreProcess
from tests.servers.roots import SHARD

__all__ = ["SECRET", "SHARD", "fetch", "stats"]

#: The content of ``escape.txt``'s target, a symlink out of the root (``conftest.root``).
SECRET = b"top secret, outside the root"


async def fetch(url: str, method: str = "GET", **kwargs: object) -> tuple[aiohttp.ClientResponse, bytes]:
    """One request on a session of its own: the answer and its whole body."""
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, **kwargs) as resp:  # type: ignore[arg-type]
            return resp, await resp.read()


async def stats(store: StoreProcess) -> dict[str, object]:
    """The store's counters (``GET /_stats``)."""
    return json.loads((await fetch(store.url("_stats")))[1])
