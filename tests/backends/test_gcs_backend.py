"""The contract suite for ``gs://`` against gcp-storage-emulator, plus GCS specifics (credentials,
error messages, pagination, Range headers) against a tiny aiohttp stand-in on 127.0.0.1."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import google.auth
import google.auth.credentials
import google.auth.exceptions
import pytest
from aiohttp import web

import wds_async as wds
from tests.backends.contract import BackendContract, ContractEnv
from wds_async.backends.gcs import READ_ONLY_SCOPE, GcsBackend, parse_gs_url
from wds_async.io.backend import ObjectIdentity

SECRET = "SECRET-TOKEN"


@pytest.fixture(scope="module")
def client(gcs_endpoint: str) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    # An explicit endpoint: the per-test env scrub would hide STORAGE_EMULATOR_HOST from a module fixture.
    return storage.Client(project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": gcs_endpoint})


@pytest.fixture()
def bucket(client: Any) -> Any:
    """A fresh bucket per test, so no test sees another's objects."""
    return client.create_bucket(f"wds-{uuid.uuid4().hex[:16]}")


@pytest.fixture()
def emulated(gcs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> str:
    # Set after conftest's autouse scrub; DataLoader workers forked in the test inherit it.
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    return gcs_endpoint


class TestGcsBackend(BackendContract):
    @pytest.fixture()
    def env(self, emulated: str, bucket: Any) -> ContractEnv:
        return ContractEnv(
            make_backend=lambda max_connections=32: GcsBackend(max_connections=max_connections),
            url=lambda name: f"gs://{bucket.name}/{name}",
            put=lambda name, data: bucket.blob(name).upload_from_string(data),
            dataset_options={},
            # gcp-storage-emulator sends neither ETag nor x-goog-generation on downloads and ignores
            # ifGenerationMatch (the real JSON API does both); the request it gets is checked below.
            honours_preconditions=False,
        )


def test_downloads_are_conditional_on_the_generation_seen() -> None:
    backend = GcsBackend(max_connections=1)
    headers: dict[str, str] = {}
    pinned = ObjectIdentity(size=5, generation="1712345678901234")
    target = backend.conditions("https://h/download/storage/v1/b/b/o/k?alt=media", headers, pinned)
    assert target.endswith("?alt=media&ifGenerationMatch=1712345678901234") and "If-Match" not in headers
    assert backend.conditions("https://h/o?alt=media", headers, None) == "https://h/o?alt=media"


# -- against the emulator ---------------------------------------------------------------------------

@pytest.mark.asyncio
async def test_keys_are_percent_encoded(emulated: str, bucket: Any) -> None:
    name = "dir/with space/a+b#?%.bin"
    bucket.blob(name).upload_from_string(b"0123456789")
    url = f"gs://{bucket.name}/{name}"
    backend = GcsBackend()
    try:
        assert backend.credential_source == "emulator"
        async with backend.open(url, start=2, end=7) as stream:
            assert b"".join([c async for c in stream]) == b"23456"
            assert stream.identity.size == 10  # from Content-Range; the emulator sends no generation/ETag
        assert await backend.size(url) == 10
        assert await backend.list(f"gs://{bucket.name}/dir/*/a+b*") == [url]
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_emulator_host_without_scheme(gcs_endpoint: str, bucket: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint.removeprefix("http://"))
    monkeypatch.setattr(google.auth, "default", _must_not_be_called)
    bucket.blob("x.bin").upload_from_string(b"abc")
    backend = GcsBackend()
    try:
        assert backend.endpoint == gcs_endpoint
        async with backend.open(f"gs://{bucket.name}/x.bin") as stream:
            assert b"".join([c async for c in stream]) == b"abc"
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_missing_bucket_is_not_found(emulated: str) -> None:
    backend = GcsBackend()
    try:
        with pytest.raises(wds.NotFound, match="no bucket 'wds-no-such-bucket'"):
            await backend.list("gs://wds-no-such-bucket/train/*.tar")
    finally:
        await backend.aclose()


# -- URL parsing -------------------------------------------------------------------------------------

def test_parse() -> None:
    assert parse_gs_url("gs://bkt/a/b/c.tar") == ("bkt", "a/b/c.tar")
    assert parse_gs_url("gs://my.bucket_1/k?x#y") == ("my.bucket_1", "k?x#y")


@pytest.mark.asyncio
@pytest.mark.parametrize("url", ["gs://", "gs://bucket", "gs://bucket/", "gs:///key.tar", "gs://Bucket/key.tar",
                                 "gs://ab/key.tar", "gs://user:pw@bkt/key.tar", "s3://bkt/key.tar"])
async def test_malformed_url(url: str) -> None:
    backend = GcsBackend(endpoint_url="http://127.0.0.1:9", anonymous=True)
    try:
        for call in (lambda: _read(backend, url), lambda: backend.size(url), lambda: backend.list(url)):
            with pytest.raises(wds.UrlError) as info:
                await call()
            assert "malformed gs:// URL" in str(info.value) and "pw" not in str(info.value)
            assert info.value.url is not None and info.value.url.startswith(url[:5])
    finally:
        await backend.aclose()


# -- against a fake GCS on 127.0.0.1 -----------------------------------------------------------------

class FakeCredentials(google.auth.credentials.Credentials):
    """Starts without a token; refresh() is slow so that concurrent callers pile up behind the lock."""

    def __init__(self) -> None:
        super().__init__()
        self.refresh_threads: list[int] = []

    def refresh(self, request: Any) -> None:
        time.sleep(0.05)
        self.refresh_threads.append(threading.get_ident())
        self.token = SECRET


def _must_not_be_called(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("google.auth.default() must not be called here")


Handler = Callable[[web.Request], web.StreamResponse]


@asynccontextmanager
async def fake_gcs(handler: Handler) -> AsyncIterator[tuple[str, list[web.Request]]]:
    """Serve ``handler`` on 127.0.0.1; yields (base URL, the requests seen)."""
    seen: list[web.Request] = []

    async def record(request: web.Request) -> web.StreamResponse:
        seen.append(request)
        return handler(request)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", record)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", seen
    finally:
        await runner.cleanup()


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message}}, status=status)


async def _read(backend: GcsBackend, url: str, **kw: Any) -> bytes:
    async with backend.open(url, **kw) as stream:
        return b"".join([c async for c in stream])


@pytest.mark.asyncio
async def test_permission_denied_names_the_credentials_not_the_token() -> None:
    message = "svc@p.iam.gserviceaccount.com does not have storage.objects.get access to the Google Cloud object."
    async with fake_gcs(lambda r: _error(403, message)) as (base, seen):
        creds = FakeCredentials()
        backend = GcsBackend(endpoint_url=base, credentials=creds)
        try:
            for call in (lambda: _read(backend, "gs://bkt/private/a.tar"),
                         lambda: backend.size("gs://bkt/private/a.tar"),
                         lambda: backend.list("gs://bkt/private/*.tar")):
                with pytest.raises(wds.PermissionDenied) as info:
                    await call()
                text = str(info.value)
                assert "Google credentials: FakeCredentials" in text and "storage.objects.get access" in text
                assert "gs://bkt/private/" in text and SECRET not in text and SECRET not in repr(info.value)
        finally:
            await backend.aclose()
    assert {r.headers["Authorization"] for r in seen} == {f"Bearer {SECRET}"}
    assert seen[0].raw_path == "/download/storage/v1/b/bkt/o/private%2Fa.tar?alt=media"
    assert seen[1].raw_path == "/storage/v1/b/bkt/o/private%2Fa.tar"


@pytest.mark.asyncio
async def test_error_messages_and_transient_statuses() -> None:
    answers = {"missing": _error(404, "No such object: bkt/missing"), "busy": _error(503, "Backend Error"),
               "slow": web.Response(status=429, text="x" * 100_000)}
    async with fake_gcs(lambda r: answers[r.path.rsplit("/", 1)[1]]) as (base, _):
        backend = GcsBackend(endpoint_url=base, anonymous=True)
        try:
            with pytest.raises(wds.NotFound, match="No such object: bkt/missing"):
                await _read(backend, "gs://bkt/missing")
            with pytest.raises(wds.TransientError, match="Backend Error"):
                await _read(backend, "gs://bkt/busy", start=10)
            with pytest.raises(wds.TransientError) as info:  # a long non-JSON body is not echoed
                await backend.size("gs://bkt/slow")
            assert "xxxx" not in str(info.value)
        finally:
            await backend.aclose()


@pytest.mark.asyncio
async def test_concurrent_opens_refresh_once_in_a_thread() -> None:
    def answer(request: web.Request) -> web.Response:
        headers = {"x-goog-generation": "1700000000000001", "ETag": '"abc"'}
        if "Range" in request.headers:
            return web.Response(status=206, body=b"6789", headers={**headers, "Content-Range": "bytes 6-9/10"})
        return web.Response(body=b"0123456789", headers=headers)

    async with fake_gcs(answer) as (base, seen):
        creds = FakeCredentials()
        backend = GcsBackend(endpoint_url=base, credentials=creds)
        try:
            results = await asyncio.gather(*(_read(backend, f"gs://bkt/o{i}") for i in range(8)))
            assert results == [b"0123456789"] * 8
            async with backend.open("gs://bkt/o", start=6) as stream:
                assert stream.identity.generation == "1700000000000001" and stream.identity.etag == '"abc"'
                assert stream.identity.size == 10
                assert b"".join([c async for c in stream]) == b"6789"
        finally:
            await backend.aclose()
    assert len(creds.refresh_threads) == 1 and creds.refresh_threads[0] != threading.get_ident()
    assert backend.credential_source == "FakeCredentials"
    assert [r.headers.get("Range") for r in seen[-1:]] == ["bytes=6-"]


@pytest.mark.asyncio
async def test_range_headers_are_never_suffix_ranges() -> None:
    async with fake_gcs(lambda r: web.Response(body=b"0123456789")) as (base, seen):
        backend = GcsBackend(endpoint_url=base, anonymous=True)
        try:
            assert await _read(backend, "gs://bkt/o") == b"0123456789"
            assert await _read(backend, "gs://bkt/o", start=3) == b"3456789"  # Range ignored: skipped here
            assert await _read(backend, "gs://bkt/o", start=3, end=5) == b"34"
            assert await _read(backend, "gs://bkt/o", start=0, end=1) == b"0"
        finally:
            await backend.aclose()
    assert [r.headers.get("Range") for r in seen] == [None, "bytes=3-", "bytes=3-4", "bytes=0-0"]
    assert all("Authorization" not in r.headers for r in seen)


@pytest.mark.asyncio
async def test_application_default_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    creds = FakeCredentials()
    scopes_seen: list[Any] = []

    def fake_default(scopes: Any = None, **kwargs: Any) -> tuple[Any, str]:
        scopes_seen.append(scopes)
        return creds, "project"

    monkeypatch.setattr(google.auth, "default", fake_default)
    async with fake_gcs(lambda r: web.Response(body=b"ok")) as (base, seen):
        backend = GcsBackend(endpoint_url=base)
        try:
            assert await _read(backend, "gs://bkt/o") == b"ok"
            assert await _read(backend, "gs://bkt/o") == b"ok"
        finally:
            await backend.aclose()
    assert scopes_seen == [[READ_ONLY_SCOPE]] and len(creds.refresh_threads) == 1
    assert backend.credential_source == "FakeCredentials" and backend.note is None
    assert [r.headers["Authorization"] for r in seen] == [f"Bearer {SECRET}"] * 2


@pytest.mark.asyncio
async def test_no_credentials_falls_back_to_anonymous(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def no_default(**kwargs: Any) -> Any:
        calls.append(1)
        time.sleep(0.05)
        raise google.auth.exceptions.DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_default)
    answer = {"public": lambda: web.Response(body=b"pub"),
              "private": lambda: _error(401, "Anonymous caller does not have access")}
    async with fake_gcs(lambda r: answer[r.path.rsplit("/", 1)[1]]()) as (base, seen):  # a fresh response each
        backend = GcsBackend(endpoint_url=base)
        try:
            assert await asyncio.gather(*(_read(backend, "gs://bkt/public") for _ in range(4))) == [b"pub"] * 4
            with pytest.raises(wds.PermissionDenied) as info:
                await _read(backend, "gs://bkt/private")
        finally:
            await backend.aclose()
    assert len(calls) == 1
    assert backend.credential_source == "anonymous" and backend.note == "no Google credentials found (anonymous)"
    assert "Google credentials: no Google credentials found (anonymous)" in str(info.value)
    assert "Anonymous caller does not have access" in str(info.value)
    assert all("Authorization" not in r.headers for r in seen)


@pytest.mark.asyncio
async def test_refresh_failure_is_permission_denied() -> None:
    class Broken(FakeCredentials):
        def refresh(self, request: Any) -> None:
            raise google.auth.exceptions.RefreshError("invalid_grant: Invalid JWT Signature.")

    backend = GcsBackend(endpoint_url="http://127.0.0.1:9", credentials=Broken())
    try:
        with pytest.raises(wds.PermissionDenied, match=r"could not obtain a Google access token \(Broken\)"):
            await _read(backend, "gs://bkt/o")
    finally:
        await backend.aclose()


@pytest.mark.asyncio
async def test_listing_follows_pages() -> None:
    pages = {
        None: {"items": [{"name": "train/b-001.tar"}, {"name": "train/a.txt"}], "nextPageToken": "p2"},
        "p2": {"items": [{"name": "train/b-000.tar"}], "nextPageToken": "p3"},
        "p3": {"items": [{"name": "train/b-002.tar"}]},
    }
    async with fake_gcs(lambda r: web.json_response(pages[r.query.get("pageToken")])) as (base, seen):
        backend = GcsBackend(endpoint_url=base, anonymous=True)
        try:
            assert await backend.list("gs://bkt/train/b-*.tar") == [
                "gs://bkt/train/b-000.tar", "gs://bkt/train/b-001.tar", "gs://bkt/train/b-002.tar"]
            await backend.list("gs://bkt/train/**/b-*.tar")
        finally:
            await backend.aclose()
    assert [r.query.get("pageToken") for r in seen] == [None, "p2", "p3"] * 2
    assert [r.query["prefix"] for r in seen] == ["train/b-"] * 3 + ["train/"] * 3
    assert [r.query.get("delimiter") for r in seen] == ["/"] * 3 + [None] * 3
    assert all(r.path == "/storage/v1/b/bkt/o" for r in seen)
