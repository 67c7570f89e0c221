"""The emulated object store's per-request knobs (in the query: forced answers, 503s, dropped and stalled bodies,
time to first byte, bandwidth) and its S3-style refusals above ``max_concurrent`` requests in service.

Knobs in the query keep the tests independent on the module's one store process; timing checks are lower bounds
only.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import pytest

from emustore import Knobs, StoreProcess
from tests.servers.plain import SHARD, fetch, stats

# -- per-request knobs ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_ignore_range(store: StoreProcess, data: bytes) -> None:
    resp, body = await fetch(store.url(SHARD, ignore_range=True), headers={"Range": "bytes=0-9"})
    assert resp.status == 200
    assert body == data
    assert "Accept-Ranges" not in resp.headers
    assert "Content-Range" not in resp.headers


@pytest.mark.asyncio
@pytest.mark.parametrize("status", [403, 404, 500])
async def test_forced_status(store: StoreProcess, status: int) -> None:
    resp, body = await fetch(store.url(SHARD, status=status))
    assert resp.status == status
    assert 0 < len(body) < 100


@pytest.mark.asyncio
async def test_html_error_page(store: StoreProcess) -> None:
    resp, body = await fetch(store.url(SHARD, html=1))
    assert resp.status == 200
    assert resp.content_type == "text/html"
    assert body.startswith(b"<html") and len(body) < 1000


@pytest.mark.asyncio
async def test_fail_rate_one_is_503(store: StoreProcess) -> None:
    resp, body = await fetch(store.url(SHARD, fail_rate=1))
    assert resp.status == 503
    assert resp.reason == "Slow Down"
    assert resp.headers["Retry-After"] == "0"
    assert b"SlowDown" in body


async def read_until_error(url: str) -> tuple[int, int, BaseException | None]:
    """Status, bytes received and the error that ended the body (None for a complete body)."""
    received = 0
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            try:
                async for chunk in resp.content.iter_any():
                    received += len(chunk)
            except aiohttp.ClientPayloadError as exc:
                return resp.status, received, exc
            return resp.status, received, None


@pytest.mark.asyncio
async def test_drop_rate_one_gives_short_body(store: StoreProcess, data: bytes) -> None:
    status, received, error = await read_until_error(store.url(SHARD, drop_rate=1))
    assert status == 200
    assert isinstance(error, aiohttp.ClientPayloadError)
    assert received < len(data)


@pytest.mark.asyncio
async def test_seeded_drop_is_reproducible(store: StoreProcess) -> None:
    cuts = [(await read_until_error(store.url(SHARD, drop_rate=1, seed=7)))[1] for _ in range(2)]
    assert cuts[0] == cuts[1]
    other = (await read_until_error(store.url(SHARD, drop_rate=1, seed=8)))[1]
    assert other != cuts[0]


@pytest.mark.asyncio
async def test_drop_applies_to_ranges(store: StoreProcess) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(store.url(SHARD, drop_rate=1), headers={"Range": "bytes=1000-200999"}) as resp:
            assert resp.status == 206
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()


@pytest.mark.asyncio
async def test_ttfb(store: StoreProcess) -> None:
    async with aiohttp.ClientSession() as http:
        start = time.monotonic()
        async with http.get(store.url(SHARD, ttfb=0.2)) as resp:
            headers_at = time.monotonic() - start
            await resp.read()
    assert headers_at >= 0.2 - 0.01  # libuv timers may fire up to a tick early


@pytest.mark.asyncio
async def test_bandwidth_cap(store: StoreProcess, data: bytes) -> None:
    bw = 4e6
    start = time.monotonic()
    _, body = await fetch(store.url(SHARD, bw=bw))
    elapsed = time.monotonic() - start
    assert body == data
    assert elapsed >= 0.8 * len(data) / bw


@pytest.mark.asyncio
async def test_stall_pauses_after_half_the_body(store: StoreProcess, data: bytes) -> None:
    half = len(data) // 2
    received = 0
    half_at = past_half_at = 0.0
    async with aiohttp.ClientSession() as http:
        async with http.get(store.url(SHARD, stall=0.3)) as resp:
            async for chunk in resp.content.iter_any():
                received += len(chunk)
                if received >= half and not half_at:
                    half_at = time.monotonic()
                if received > half and not past_half_at:
                    past_half_at = time.monotonic()
    assert received == len(data)
    assert past_half_at - half_at >= 0.3 - 0.05  # slack for the first half arriving late


@pytest.mark.asyncio
async def test_bad_query_is_400(store: StoreProcess) -> None:
    for query in ({"tffb": 1}, {"bw": "fast"}, {"fail_rate": 2}, {"total_bw": 1e6}, {"status": 99},
                  {"ignore_range": "maybe"}, {"stall": "nan"}):
        resp, body = await fetch(store.url(SHARD, **query))
        assert resp.status == 400, (query, body)


@pytest.mark.asyncio
async def test_stats_counts(store: StoreProcess, data: bytes) -> None:
    before = await stats(store)
    await fetch(store.url(SHARD))
    await fetch(store.url(SHARD, fail_rate=1))
    await fetch(store.url("missing.tar"))
    await read_until_error(store.url(SHARD, drop_rate=1))
    after = await stats(store)
    assert after["requests"] == before["requests"] + 4  # type: ignore[operator]
    assert after["failed"] == before["failed"] + 1  # type: ignore[operator]
    assert after["dropped"] == before["dropped"] + 1  # type: ignore[operator]
    assert after["bytes_sent"] >= before["bytes_sent"] + len(data)  # type: ignore[operator]
    old: dict[str, int] = before["status"]  # type: ignore[assignment]
    new: dict[str, int] = after["status"]  # type: ignore[assignment]
    assert {k: n - old.get(k, 0) for k, n in new.items() if n != old.get(k, 0)} == {"200": 2, "404": 1, "503": 1}
    assert after["active"] == 0


@pytest.mark.asyncio
async def test_64_concurrent_streams(store: StoreProcess, data: bytes) -> None:
    url = store.url(SHARD, stall=1.0)

    async def get(http: aiohttp.ClientSession) -> bytes:
        async with http.get(url, headers={"Range": "bytes=0-131071"}) as resp:
            return await resp.read()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        tasks = [asyncio.ensure_future(get(http)) for _ in range(64)]
        try:
            peak = 0
            while peak < 64 and not all(t.done() for t in tasks):
                _, body = await fetch(store.url("_stats"))
                peak = max(peak, json.loads(body)["active"])
                await asyncio.sleep(0.05)
            bodies = await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
    assert peak == 64
    assert all(b == data[:131072] for b in bodies)


@pytest.mark.asyncio
async def test_client_disconnect_mid_stream_is_quiet(store: StoreProcess) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.get(store.url(SHARD, bw=1e6)) as resp:
            await resp.content.readexactly(1000)
            resp.close()
    await asyncio.sleep(0.3)  # the server notices; the module fixture then checks its stderr
    assert (await stats(store))["active"] == 0


# -- max_concurrent: S3-style refusals above N requests in service ----------------------------------


async def _hold(http: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    """A GET whose response has started and then stalls (the body's first bytes are read)."""
    resp = await http.get(url)
    await resp.content.readexactly(1000)
    return resp


async def _settle(store: StoreProcess) -> dict[str, object]:
    """The counters once every request has left the server (a disconnect is noticed asynchronously)."""
    for _ in range(250):
        counters = await stats(store)
        if counters["active"] == 0:
            return counters
        await asyncio.sleep(0.02)
    raise AssertionError(f"requests still active: {counters}")


def _is_slow_down(resp: aiohttp.ClientResponse, body: bytes) -> bool:
    return (resp.status == 503 and resp.headers.get("Retry-After") == "1" and body.startswith(b"<?xml")
            and b"<Code>SlowDown</Code>" in body and b"Please reduce your request rate." in body)


@pytest.mark.asyncio
async def test_max_concurrent_refuses_requests_beyond_the_limit(root: Path) -> None:
    with StoreProcess(root, knobs=Knobs(max_concurrent=3)) as store:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
            held = [await _hold(http, store.url(SHARD, stall=60)) for _ in range(3)]
            try:
                assert (await stats(store))["active"] == 3
                refused = [await fetch(store.url(SHARD)), await fetch(store.url("missing.tar")),
                           await fetch(store.url(SHARD), "HEAD")]
                listing, names = await fetch(store.url("", list=""))  # listing is not an object request
            finally:
                for resp in held:
                    resp.close()
        counters = await _settle(store)
        after, body = await fetch(store.url(SHARD))  # room again
    assert all(_is_slow_down(resp, body) for resp, body in refused[:2])
    assert refused[2][0].status == 503 and refused[2][0].headers["Retry-After"] == "1"
    assert listing.status == 200 and SHARD in json.loads(names)
    assert (after.status, len(body)) == (200, (root / SHARD).stat().st_size)
    assert counters["throttled"] == 3 and counters["peak_active"] == 3
    assert counters["requests"] == 3 + 3 + 1
    assert counters["status"]["503"] == 3  # type: ignore[index]
    assert store.stderr == ""


@pytest.mark.asyncio
async def test_max_concurrent_under_overlapping_paced_requests(root: Path, data: bytes) -> None:
    """16 clients at once against a limit of 4: whatever overlaps, never more than 4 are served."""
    part = 256 << 10
    with StoreProcess(root, knobs=Knobs(max_concurrent=4)) as store:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

            async def get() -> tuple[aiohttp.ClientResponse, bytes]:
                async with http.get(store.url(SHARD, bw=1e6), headers={"Range": f"bytes=0-{part - 1}"}) as resp:
                    return resp, await resp.read()

            answers: list[tuple[aiohttp.ClientResponse, bytes]] = []
            for _ in range(5):  # overlap is what the test needs, not a timing it asserts: repeat until seen
                answers += await asyncio.gather(*(get() for _ in range(16)))
                if any(resp.status == 503 for resp, _ in answers):
                    break
        counters = await _settle(store)
    served = [body for resp, body in answers if resp.status == 206]
    refused = [(resp, body) for resp, body in answers if resp.status != 206]
    assert refused and all(_is_slow_down(resp, body) for resp, body in refused)
    assert all(body == data[:part] for body in served) and len(served) >= 4
    assert counters["throttled"] == len(refused) and counters["requests"] == len(answers)
    assert counters["peak_active"] == 4  # type: ignore[operator]
    assert store.stderr == ""


@pytest.mark.asyncio
async def test_max_concurrent_as_a_query_parameter(store: StoreProcess) -> None:
    async with aiohttp.ClientSession() as http:
        held = await _hold(http, store.url(SHARD, stall=60))
        try:
            refused, body = await fetch(store.url(SHARD, max_concurrent=1))
            allowed, _ = await fetch(store.url(SHARD, max_concurrent=2), headers={"Range": "bytes=0-9"})
        finally:
            held.close()
    await _settle(store)
    assert _is_slow_down(refused, body)
    assert allowed.status == 206
    for bad in ("-1", "x", "1.5"):
        resp, _ = await fetch(store.url(SHARD, max_concurrent=bad))
        assert resp.status == 400


def test_max_concurrent_knob_validates() -> None:
    for bad in (-1, 1.5, True, "4"):
        with pytest.raises(ValueError, match="max_concurrent"):
            Knobs(max_concurrent=bad)  # type: ignore[arg-type]
    assert Knobs(max_concurrent=4).to_args() == ["--max-concurrent", "4"]
