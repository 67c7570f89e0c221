"""A bucket in another region than the client's: the backend follows the region S3 names and re-signs.

A loopback server answers as S3 does for a bucket "in" eu-west-1: a request whose SigV4 credential
scope (the presigned URL's ``X-Amz-Credential`` or the ``Authorization`` header's ``Credential=``) names
another region gets ``301 PermanentRedirect`` with ``x-amz-bucket-region``, or ``400
AuthorizationHeaderMalformed`` with the region only in the XML body (HEAD: 301/400 with the header and
no body); a request signed for eu-west-1 is served (GET, ranged GET, HEAD, ListObjectsV2).
"""

from __future__ import annotations

import asyncio
import io
import re
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

import pytest
from aiohttp import web

import wds_async as wds
from tests.emulators import MOTO_ENV
from wds_async.backends.s3 import S3Backend, WrongRegion

REGION = "eu-west-1"


def _tar(index: int, samples: int = 4) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tf:
        for i in range(samples):
            payload = f"shard {index} sample {i}".encode() * 50
            info = tarfile.TarInfo(f"s{index}_{i:03d}.txt")
            info.size = len(payload)
            tf.addfile(info, io.BytesIO(payload))
    return buf.getvalue()


OBJECTS = {f"far/shards/shard-{i}.tar": _tar(i) for i in range(3)}
OBJECTS["far/data.bin"] = bytes(range(256)) * 400
OBJECTS["stuck/x.bin"] = b"never served"


def _signed_region(request: web.Request) -> str | None:
    scope = parse_qs(urlsplit(str(request.url)).query).get("X-Amz-Credential", [""])[0]
    if not scope:
        m = re.search(r"Credential=([^,\s]+)", request.headers.get("Authorization", ""))
        scope = m.group(1) if m else ""
    parts = scope.split("/")
    return parts[2] if len(parts) >= 5 else None


@dataclass
class RegionalS3:
    """The server's state: how it refuses (``mode``) and every request it saw as (method, path, region)."""

    mode: str
    seen: list[tuple[str, str, str | None]] = field(default_factory=list)
    endpoint: str = ""

    def refuse(self, request: web.Request, signed: str | None) -> web.Response:
        bucket = request.path.strip("/").split("/")[0]
        region = "us-west-2" if bucket == "stuck" else REGION  # "stuck" names a region that never works
        head = request.method == "HEAD"
        if self.mode == "301":
            body = ("<Error><Code>PermanentRedirect</Code><Message>The bucket you are attempting to access must be "
                    "addressed using the specified endpoint.</Message>"
                    f"<Endpoint>{bucket}.s3.{region}.amazonaws.com</Endpoint><Bucket>{bucket}</Bucket></Error>")
            return web.Response(status=301, headers={"x-amz-bucket-region": region}, content_type="application/xml",
                                text=None if head else body)
        if head:  # S3 answers a HEAD signed for the wrong region with a bare 400 and the header
            return web.Response(status=400, headers={"x-amz-bucket-region": region})
        code = "AuthorizationHeaderMalformed" if "Authorization" in request.headers else \
            "AuthorizationQueryParametersError"
        body = (f"<Error><Code>{code}</Code><Message>the region '{escape(str(signed))}' is wrong; expecting "
                f"'{region}'</Message><Region>{region}</Region><RequestId>R1</RequestId></Error>")
        return web.Response(status=400, content_type="application/xml", text=body)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        signed = _signed_region(request)
        path = request.path.strip("/")
        self.seen.append((request.method, path, signed))
        if signed != REGION or path.startswith("stuck"):
            return self.refuse(request, signed)
        if "list-type" in request.query:
            return self.listing(path, request.query.get("prefix", ""))
        if path == "far/bad-request":
            return web.Response(status=400, content_type="application/xml",
                                text="<Error><Code>InvalidArgument</Code><Message>no</Message></Error>")
        data = OBJECTS.get(path)
        if data is None:
            return web.Response(status=404, content_type="application/xml",
                                text="<Error><Code>NoSuchKey</Code></Error>")
        headers = {"ETag": '"e1"', "Accept-Ranges": "bytes"}
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", request.headers.get("Range", ""))
        if m:
            first = int(m.group(1))
            last = int(m.group(2)) if m.group(2) else len(data) - 1
            headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
            return web.Response(status=206, body=data[first:last + 1], headers=headers)
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        return web.Response(body=data, headers=headers)

    def listing(self, bucket: str, prefix: str) -> web.Response:
        keys = sorted(k.split("/", 1)[1] for k in OBJECTS if k.startswith(f"{bucket}/{prefix}"))
        contents = "".join(f"<Contents><Key>{escape(k)}</Key><Size>{len(OBJECTS[bucket + '/' + k])}</Size>"
                           "</Contents>" for k in keys)
        text = ('<?xml version="1.0" encoding="UTF-8"?><ListBucketResult '
                'xmlns="http://s3.amazonaws.com/doc/2006-03-01/">'
                f"<Name>{bucket}</Name><Prefix>{escape(prefix)}</Prefix><KeyCount>{len(keys)}</KeyCount>"
                f"<MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>{contents}</ListBucketResult>")
        return web.Response(content_type="application/xml", text=text)

    def count(self, method: str, path: str) -> list[str | None]:
        """The regions the requests ``method path`` were signed for, in order."""
        return [region for m, p, region in self.seen if m == method and p == path]


def _serve(state: RegionalS3) -> Iterator[RegionalS3]:
    """Run the server on 127.0.0.1 in a thread of its own, so that sync and async tests can both use it."""
    loop = asyncio.new_event_loop()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.handle)
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    state.endpoint = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
    thread = threading.Thread(target=loop.run_forever, name="regional-s3", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.fixture(params=["301", "400"])
def server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[RegionalS3]:
    for name, value in MOTO_ENV.items():  # credentials, and a client configured for us-east-1
        monkeypatch.setenv(name, value)
    yield from _serve(RegionalS3(mode=request.param))


async def _read(backend: S3Backend, url: str, **kw: int) -> bytes:
    async with backend.open(url, **kw) as stream:
        return b"".join([chunk async for chunk in stream])


@pytest.mark.asyncio
async def test_get_follows_the_bucket_region_once_then_signs_for_it(server: RegionalS3) -> None:
    backend = S3Backend(endpoint_url=server.endpoint)
    try:
        assert await _read(backend, "s3://far/data.bin") == OBJECTS["far/data.bin"]
        assert server.count("GET", "far/data.bin") == ["us-east-1", REGION]  # refused, re-signed, served
        assert backend.bucket_regions == {"far": REGION}
        assert await _read(backend, "s3://far/data.bin") == OBJECTS["far/data.bin"]
        assert server.count("GET", "far/data.bin") == ["us-east-1", REGION, REGION]  # cached: no redirect
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_ranged_get_and_size(server: RegionalS3) -> None:
    data = OBJECTS["far/data.bin"]
    backend = S3Backend(endpoint_url=server.endpoint)
    try:
        assert await _read(backend, "s3://far/data.bin", start=1000, end=5003) == data[1000:5003]
        assert await _read(backend, "s3://far/data.bin", start=70_000) == data[70_000:]
        assert server.count("GET", "far/data.bin") == ["us-east-1", REGION, REGION]
    finally:
        await backend.aclose()
    fresh = S3Backend(endpoint_url=server.endpoint)  # HEAD first: the region comes from the bare 301/400
    try:
        assert await fresh.size("s3://far/data.bin") == len(data)
        assert server.count("HEAD", "far/data.bin") == ["us-east-1", REGION]
        assert await fresh.size("s3://far/data.bin") == len(data)
        assert server.count("HEAD", "far/data.bin") == ["us-east-1", REGION, REGION]
    finally:
        await fresh.aclose()


def test_glob_listing_and_streaming_through_the_dataset(server: RegionalS3) -> None:
    """The SDK lists (its own redirector re-signs ListObjectsV2), the engine streams the listed tars."""
    ds = wds.WebDataset("s3://far/shards/shard-*.tar", backend_options={"s3": {"endpoint_url": server.endpoint}},
                        max_connections=2)
    assert ds.urls == [f"s3://far/shards/shard-{i}.tar" for i in range(3)]
    lists = [region for method, path, region in server.seen if method == "GET" and path == "far"]
    assert lists == ["us-east-1", REGION]
    samples = list(ds)
    assert sorted(s["__key__"] for s in samples) == [f"s{i}_{j:03d}" for i in range(3) for j in range(4)]
    assert all(s["txt"] == f"shard {s['__key__'][1]} sample {int(s['__key__'][3:])}".encode() * 50
               for s in samples)
    for i in range(3):
        assert server.count("GET", f"far/shards/shard-{i}.tar")[-1] == REGION


@pytest.mark.asyncio
async def test_a_region_that_still_fails_is_retried_once_then_raised(server: RegionalS3) -> None:
    """The "stuck" bucket names us-west-2 but refuses that too: one retry, then an error naming the region."""
    backend = S3Backend(endpoint_url=server.endpoint)
    try:
        with pytest.raises(wds.BackendError) as info:
            await _read(backend, "s3://stuck/x.bin")
        assert server.count("GET", "stuck/x.bin") == ["us-east-1", "us-west-2"]  # one retry, no loop
        assert not isinstance(info.value, WrongRegion) and info.value.url == "s3://stuck/x.bin"
        text = str(info.value)
        assert "refused although signed for the region the store names, 'us-west-2'" in text
        assert "X-Amz-Signature" not in text and "testing" not in text
        with pytest.raises(wds.BackendError, match="'us-west-2'"):
            await backend.size("s3://stuck/x.bin")
        assert server.count("HEAD", "stuck/x.bin") == ["us-west-2"]  # the bucket's region is known by now
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_other_400s_are_not_redirects(server: RegionalS3) -> None:
    backend = S3Backend(endpoint_url=server.endpoint, region=REGION)  # configured right: no redirect at all
    try:
        with pytest.raises(wds.BackendError, match="InvalidArgument") as info:
            await _read(backend, "s3://far/bad-request")
        assert not isinstance(info.value, WrongRegion)
        assert server.count("GET", "far/bad-request") == [REGION]
        assert backend.bucket_regions == {}
    finally:
        await backend.aclose()
