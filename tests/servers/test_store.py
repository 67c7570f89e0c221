"""The emulated object store's objects over real loopback sockets: whole bodies, ranges, HEAD, listings, ETags,
conditional requests, path safety and TLS.

The store process of the module (``tests/servers/conftest.py``) serves them all. Per-request knobs are in
test_store_knobs.py, server-wide knobs and the process's lifecycle in test_store_process.py, the S3 and GCS faces in
test_store_s3.py and test_store_gcs.py, the shard generator in test_make_shards.py.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import aiohttp
import pytest

from emustore import StoreProcess
from tests.servers.plain import SECRET, SHARD, fetch

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
