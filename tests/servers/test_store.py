"""The emulated object store, exercised over real loopback sockets (the shard generator: test_make_shards.py).

One store process serves the module (per-request knobs in the query keep tests independent); tests of
server-wide knobs and of the process lifecycle start their own. Timing checks are lower bounds only.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import psutil
import pytest

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess, check_host, start_store

SHARD = "shard-000000.tar"
SECRET = b"top secret, outside the root"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    make_shards(root, n_shards=2, shard_bytes=1 << 20, sample_bytes=32 << 10)
    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_bytes(SECRET)
    (root / "escape.txt").symlink_to(outside)
    return root


@pytest.fixture(scope="module")
def store(root: Path) -> Iterator[StoreProcess]:
    with StoreProcess(root) as store:
        yield store
    assert store.stderr == "", store.stderr  # no tracebacks from drops, stalls or disconnects


@pytest.fixture(scope="module")
def data(root: Path) -> bytes:
    return (root / SHARD).read_bytes()


async def fetch(url: str, method: str = "GET", **kwargs: object) -> tuple[aiohttp.ClientResponse, bytes]:
    async with aiohttp.ClientSession() as http:
        async with http.request(method, url, **kwargs) as resp:  # type: ignore[arg-type]
            return resp, await resp.read()


async def stats(store: StoreProcess) -> dict[str, object]:
    return json.loads((await fetch(store.url("_stats")))[1])


# -- objects and ranges ---------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_get_full_body(store: StoreProcess, data: bytes) -> None:
    resp, body = await fetch(store.url(SHARD))
    assert resp.status == 200
    assert body == data
    assert resp.headers["Content-Length"] == str(len(data))
    assert resp.headers["Accept-Ranges"] == "bytes"
    assert resp.headers["Content-Type"] == "application/x-tar"
    assert resp.headers["ETag"].startswith('"') and resp.headers["ETag"].endswith('"')
    assert resp.headers["Last-Modified"].endswith("GMT")


@pytest.mark.asyncio
async def test_range_206(store: StoreProcess, data: bytes) -> None:
    resp, body = await fetch(store.url(SHARD), headers={"Range": "bytes=100-1099"})
    assert resp.status == 206
    assert resp.headers["Content-Range"] == f"bytes 100-1099/{len(data)}"
    assert resp.headers["Content-Length"] == "1000"
    assert body == data[100:1100]


@pytest.mark.asyncio
@pytest.mark.parametrize("spec, start", [("bytes={n}-", -10), ("bytes=-10", -10), ("bytes=0-", 0)])
async def test_open_ended_and_suffix_ranges(store: StoreProcess, data: bytes, spec: str, start: int) -> None:
    n = len(data) + start if start < 0 else start
    resp, body = await fetch(store.url(SHARD), headers={"Range": spec.format(n=n)})
    assert resp.status == 206
    assert body == data[n:]
    assert resp.headers["Content-Range"] == f"bytes {len(data) - len(body)}-{len(data) - 1}/{len(data)}"


@pytest.mark.asyncio
async def test_range_end_past_size_is_clipped(store: StoreProcess, data: bytes) -> None:
    resp, body = await fetch(store.url(SHARD), headers={"Range": f"bytes=10-{len(data) * 2}"})
    assert resp.status == 206
    assert body == data[10:]


@pytest.mark.asyncio
@pytest.mark.parametrize("spec", ["bytes={n}-", "bytes={n}-{m}", "bytes=-0"])
async def test_unsatisfiable_range_416(store: StoreProcess, data: bytes, spec: str) -> None:
    resp, _ = await fetch(store.url(SHARD), headers={"Range": spec.format(n=len(data), m=len(data) + 5)})
    assert resp.status == 416
    assert resp.headers["Content-Range"] == f"bytes */{len(data)}"


@pytest.mark.asyncio
@pytest.mark.parametrize("spec", ["bytes=5-2", "items=0-10", "bytes=0-1,5-6", "bytes=x-y"])
async def test_malformed_range_is_ignored(store: StoreProcess, data: bytes, spec: str) -> None:
    resp, body = await fetch(store.url(SHARD), headers={"Range": spec})
    assert resp.status == 200
    assert body == data


@pytest.mark.asyncio
async def test_head(store: StoreProcess, data: bytes) -> None:
    get, _ = await fetch(store.url(SHARD))
    resp, body = await fetch(store.url(SHARD), method="HEAD")
    assert resp.status == 200
    assert body == b""
    assert resp.headers["Content-Length"] == str(len(data))
    assert resp.headers["ETag"] == get.headers["ETag"]
    ranged, _ = await fetch(store.url(SHARD), method="HEAD", headers={"Range": "bytes=0-9"})
    assert ranged.status == 206
    assert ranged.headers["Content-Length"] == "10"


@pytest.mark.asyncio
async def test_missing_is_404(store: StoreProcess) -> None:
    resp, _ = await fetch(store.url("no-such-shard.tar"))
    assert resp.status == 404
    resp, _ = await fetch(store.url("no-such-dir/x.tar"), method="HEAD")
    assert resp.status == 404


@pytest.mark.asyncio
async def test_other_methods_405(store: StoreProcess) -> None:
    resp, body = await fetch(store.url(SHARD), method="PATCH", data=b"x")
    assert resp.status == 405 and b"<Code>MethodNotAllowed</Code>" in body


@pytest.mark.asyncio
async def test_put_writes_through_the_s3_face(store: StoreProcess, root: Path, data: bytes) -> None:
    """PUT is S3's PutObject now (it was a 405): a top-level name is a bucket, so a file there conflicts."""
    resp, body = await fetch(store.url(SHARD), method="PUT", data=b"x")
    assert resp.status == 409 and b"<Code>BucketAlreadyExists</Code>" in body
    assert (root / SHARD).read_bytes() == data


async def raw_get(store: StoreProcess, target: str) -> tuple[int, bytes]:
    """Send the request target verbatim: no client-side normalisation of ``..`` or escapes."""
    assert store.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", store.port)
    try:
        writer.write(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        response = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    return int(response.split(b" ", 2)[1]), response


@pytest.mark.asyncio
@pytest.mark.parametrize("target", [
    "/../secret.txt", "/%2e%2e/secret.txt", "/..%2fsecret.txt", "/%2E%2E%2Fsecret.txt",
    "/../outside0/secret.txt", "//etc/passwd", "/%2fetc%2fpasswd", "/escape.txt", "/.%2fshard-000000.tar",
    "/..%5csecret.txt",
])
async def test_path_traversal_rejected(store: StoreProcess, target: str) -> None:
    status, response = await raw_get(store, target)
    assert 400 <= status < 500
    assert SECRET not in response and b"root:" not in response


@pytest.mark.asyncio
async def test_listing(store: StoreProcess) -> None:
    resp, body = await fetch(store.url("", list=1))
    assert resp.status == 200
    assert json.loads(body) == ["manifest.json", "shard-000000.tar", "shard-000001.tar"]  # no escape.txt
    _, body = await fetch(store.url("", prefix="shard-"))
    assert json.loads(body) == ["shard-000000.tar", "shard-000001.tar"]
    _, body = await fetch(store.url("", prefix="nothing"))
    assert json.loads(body) == []


@pytest.mark.asyncio
async def test_etag_stable_and_tracks_replacement(store: StoreProcess, root: Path) -> None:
    first, _ = await fetch(store.url(SHARD))
    second, _ = await fetch(store.url(SHARD), headers={"Range": "bytes=0-0"})
    assert first.headers["ETag"] == second.headers["ETag"]
    path = root / "replaced.bin"
    path.write_bytes(b"one")
    before, body = await fetch(store.url("replaced.bin"))
    assert body == b"one"
    tmp = root / "replaced.tmp"
    tmp.write_bytes(b"second")
    os.replace(tmp, path)  # how make_shards rewrites a file the server may have mapped
    after, body = await fetch(store.url("replaced.bin"))
    path.unlink()
    assert body == b"second"
    assert after.headers["ETag"] != before.headers["ETag"]


@pytest.mark.asyncio
async def test_empty_file(store: StoreProcess, root: Path) -> None:
    path = root / "empty.bin"
    path.write_bytes(b"")
    try:
        resp, body = await fetch(store.url("empty.bin"))
        ranged, _ = await fetch(store.url("empty.bin"), headers={"Range": "bytes=0-"})
    finally:
        path.unlink()
    assert (resp.status, body, resp.headers["Content-Length"]) == (200, b"", "0")
    assert ranged.status == 416


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


# -- server-wide knobs and the process lifecycle ----------------------------------------------------


@pytest.mark.asyncio
async def test_server_knobs_from_cli(root: Path, data: bytes) -> None:
    with StoreProcess(root, knobs=Knobs(ttfb=0.1, ignore_range=True, seed=3)) as store:
        start = time.monotonic()
        resp, body = await fetch(store.url(SHARD), headers={"Range": "bytes=0-9"})
        elapsed = time.monotonic() - start
        overridden, small = await fetch(store.url(SHARD, ignore_range=0), headers={"Range": "bytes=0-9"})
    assert (resp.status, body) == (200, data)
    assert elapsed >= 0.1 - 0.01
    assert (overridden.status, small) == (206, data[:10])


@pytest.mark.asyncio
async def test_total_bandwidth_is_shared(root: Path) -> None:
    total = 8e6
    names = ["shard-000000.tar", "shard-000001.tar"]
    size = sum((root / n).stat().st_size for n in names)
    with StoreProcess(root, knobs=Knobs(total_bw=total)) as store:
        start = time.monotonic()
        results = await asyncio.gather(*(fetch(store.url(n)) for n in names))
        elapsed = time.monotonic() - start
    assert sum(len(body) for _, body in results) == size
    assert elapsed >= 0.8 * size / total


def test_process_is_gone_after_exit(root: Path) -> None:
    with StoreProcess(root) as store:
        pid = store.pid
        assert pid is not None and psutil.pid_exists(pid)
        assert store.stats()["requests"] == 0
    assert store.returncode == 0  # SIGTERM is a clean shutdown
    assert not psutil.pid_exists(pid)
    assert store.stderr == ""


@pytest.mark.asyncio
async def test_exit_with_a_stalled_response_in_flight(root: Path) -> None:
    store = StoreProcess(root)
    store.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(store.url(SHARD, stall=60)) as resp:
                await resp.content.readexactly(1000)
                await asyncio.to_thread(store.close)
                with pytest.raises(aiohttp.ClientPayloadError):
                    await resp.read()
    finally:
        store.close()
    assert store.returncode is not None
    assert store.pid is not None and not psutil.pid_exists(store.pid)


def test_startup_failure_reports_stderr(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not a directory"):
        with StoreProcess(tmp_path / "missing"):
            pass


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "localhost"])
def test_loopback_hosts_accepted(host: str) -> None:
    assert check_host(host).startswith("127.")


@pytest.mark.parametrize("host", ["0.0.0.0", "::1", "::", "192.168.1.1", "example.com", ""])
def test_other_hosts_refused(host: str, root: Path) -> None:
    with pytest.raises(ValueError, match="refusing"):
        check_host(host)
    with pytest.raises(ValueError):
        StoreProcess(root, host=host)


@pytest.mark.asyncio
async def test_start_store_in_process(root: Path, data: bytes) -> None:
    with pytest.raises(ValueError):
        await start_store(root, host="0.0.0.0")
    runner, port = await start_store(root, knobs=Knobs(seed=0))
    try:
        resp, body = await fetch(f"http://127.0.0.1:{port}/{SHARD}")
    finally:
        await runner.cleanup()
    assert (resp.status, body) == (200, data)


def test_knobs_validate_and_round_trip() -> None:
    for bad in ({"fail_rate": 1.5}, {"drop_rate": -0.1}, {"bw": float("inf")}, {"ttfb": float("nan")},
                {"seed": "x"}):
        with pytest.raises(ValueError):
            Knobs(**bad)  # type: ignore[arg-type]
    knobs = Knobs(ttfb=0.05, bw=20e6, ignore_range=True, seed=4)
    assert knobs.to_args() == ["--ttfb", "0.05", "--bw", "20000000.0", "--ignore-range", "--seed", "4"]
    assert Knobs().to_args() == []


def test_orphaned_store_exits_by_itself(root: Path) -> None:
    """A test run killed with SIGKILL cannot clean up; the store notices it was orphaned and exits."""
    code = ("import sys, time; from emustore import StoreProcess; "
            "s = StoreProcess(sys.argv[1]); s.start(); print(s.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE,
                              cwd=Path(__file__).resolve().parents[2])
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert psutil.pid_exists(pid)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    assert not alive(pid)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # pid 1 may not reap it at once
    except psutil.NoSuchProcess:
        return False


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


# -- https ------------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_https_store_serves_tls_with_its_own_ca(root: Path, data: bytes) -> None:
    import ssl

    with StoreProcess(root, https=True) as store:
        assert store.base_url.startswith("https://127.0.0.1:")
        with open(store.ca_file) as f:  # noqa: ASYNC230 - a small local file, before any request is made
            assert f.read().startswith("-----BEGIN CERTIFICATE-----")
        trusting = ssl.create_default_context(cafile=store.ca_file)
        resp, body = await fetch(store.url(SHARD), ssl=trusting)
        with pytest.raises(aiohttp.ClientConnectorCertificateError):
            await fetch(store.url(SHARD))  # the default trust store does not know the throwaway CA
        assert store.stats()["status"] == {"200": 1}
    assert (resp.status, body) == (200, data)
    assert store.stderr == ""  # a refused handshake is the client's business, not a server traceback
    with pytest.raises(RuntimeError, match="https=True"):
        _ = StoreProcess(root).ca_file


@pytest.mark.asyncio
async def test_if_match_is_honoured(store: StoreProcess, data: bytes) -> None:
    resp, _ = await fetch(store.url(SHARD), method="HEAD")
    etag = resp.headers["ETag"]
    resp, body = await fetch(store.url(SHARD), headers={"If-Match": etag, "Range": "bytes=10-19"})
    assert resp.status == 206 and body == data[10:20]
    resp, _ = await fetch(store.url(SHARD), headers={"If-Match": f'"other", {etag}'})
    assert resp.status == 200
    resp, _ = await fetch(store.url(SHARD), headers={"If-Match": '"not-this-version"'})
    assert resp.status == 412
