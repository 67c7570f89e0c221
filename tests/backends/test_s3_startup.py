"""The S3 backend's start-up (issue: time to first sample): its SDK client is built in a thread and shared by the
process, never blocking the event loop, and the first requests to an explicit endpoint are signed without it."""

from __future__ import annotations

import asyncio
import datetime
import threading
from typing import Any

import botocore.auth
import botocore.session
import pytest

from tests.emulators import MOTO_ENV
from wds_async.backends import s3, s3_clients
from wds_async.backends.s3 import S3Backend


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in MOTO_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.mark.asyncio
async def test_backends_with_the_same_settings_share_one_client(aws_env: None) -> None:
    one, two = S3Backend(endpoint_url="http://127.0.0.1:9"), S3Backend(endpoint_url="http://127.0.0.1:9")
    other = S3Backend(endpoint_url="http://127.0.0.1:9", region="eu-west-1")
    assert await one._client(None) is await two._client(None)
    assert await other._client(None) is not await one._client(None)
    assert one.credential_source == "env"
    for backend in (one, two, other):
        await backend.aclose()


@pytest.mark.asyncio
async def test_a_changed_environment_gets_a_client_of_its_own(aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    before = S3Backend(endpoint_url="http://127.0.0.1:9")
    first = await before._client(None)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "another-key")
    after = S3Backend(endpoint_url="http://127.0.0.1:9")
    second = await after._client(None)
    assert second is not first
    assert second._request_signer._credentials.access_key == "another-key"
    assert first._request_signer._credentials.access_key == MOTO_ENV["AWS_ACCESS_KEY_ID"]
    await before.aclose()
    await after.aclose()


@pytest.mark.asyncio
async def test_the_build_runs_in_a_thread_while_the_loop_keeps_running(aws_env: None,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    built_on: list[str] = []
    real = s3_clients.make_client

    def slow_make_client(**kwargs: Any) -> Any:
        built_on.append(threading.current_thread().name)
        release.wait(30)  # a credential chain that takes its time (a metadata service, an assumed role)
        return real(**kwargs)

    monkeypatch.setattr(s3_clients, "make_client", slow_make_client)
    monkeypatch.delenv("AWS_DEFAULT_REGION")  # no region known: no early signature, the request needs the client
    backend = S3Backend(endpoint_url="http://127.0.0.1:7")  # settings no one built yet
    signed = asyncio.ensure_future(backend.resolve("s3://bkt/key.tar", 0, None))
    ticks = 0
    while not built_on or ticks < 20:  # the loop turns while the build waits
        await asyncio.sleep(0.001)
        ticks += 1
    assert not signed.done() and built_on == ["wds-async-s3-client"]
    release.set()
    url, _ = await signed
    assert url.startswith("http://127.0.0.1:7/bkt/key.tar?") and "X-Amz-Signature=" in url
    await backend.aclose()


@pytest.mark.parametrize("region", ["us-east-1", "eu-west-1"])
def test_the_early_signature_is_the_clients(aws_env: None, region: str, monkeypatch: pytest.MonkeyPatch) -> None:
    frozen = datetime.datetime(2026, 11, 25, 12, 0, 0)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: frozen)  # both sign at the same instant
    client, _ = s3.make_client(endpoint_url="http://127.0.0.1:9/", region=region)
    creds = botocore.session.Session().get_credentials()
    for key in ("k", "dir/shard-000001.tar", "a b+c=d&e%f~g:h@i.tar", "ünï/çødé.tar"):
        for method, operation in (("GET", "get_object"), ("HEAD", "head_object")):
            theirs = client.generate_presigned_url(operation, Params={"Bucket": "bkt", "Key": key},
                                                   ExpiresIn=s3.PRESIGN_SECONDS)
            ours = s3._sign_path_style(creds, method, "http://127.0.0.1:9", region, "bkt", key)
            assert ours == theirs


@pytest.mark.asyncio
async def test_first_requests_are_signed_while_the_client_is_built(aws_env: None,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    release = threading.Event()
    real = s3_clients.make_client

    def slow_make_client(**kwargs: Any) -> Any:
        release.wait(30)
        return real(**kwargs)

    monkeypatch.setattr(s3_clients, "make_client", slow_make_client)
    early = S3Backend(endpoint_url="http://127.0.0.1:9", region="sa-east-1")
    url, _ = await early.resolve("s3://bkt/key.tar", 0, None)  # would wait for the client without the early path
    assert "X-Amz-Credential=testing%2F" in url and "%2Fsa-east-1%2Fs3%2F" in url
    assert early.credential_source == "env"
    no_region = S3Backend(endpoint_url="http://127.0.0.1:9", profile=None)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    unknown = S3Backend(endpoint_url="http://127.0.0.1:9")  # no region known: the client signs, so it waits
    assert unknown._early is None and no_region._early is not None
    release.set()
    for backend in (early, no_region, unknown):
        await backend.aclose()


@pytest.mark.asyncio
async def test_downloads_to_an_explicit_endpoint_never_build_the_client(aws_env: None,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Its build is 0.1-0.3 s of CPU under the GIL: built anyway once the first request was out, it slowed a
    short epoch's first second. Only what needs the client (listing, another region) builds it."""
    built: list[dict[str, Any]] = []
    real = s3_clients.make_client

    def counting_make_client(**kwargs: Any) -> Any:
        built.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(s3_clients, "make_client", counting_make_client)
    backend = S3Backend(endpoint_url="http://127.0.0.1:9", region="eu-west-1")
    for n in range(20):
        method = "HEAD" if n % 5 == 0 else "GET"
        url, _ = await backend.resolve(f"s3://bkt/shard-{n:06d}.tar", 0, None, method)
        assert url.startswith(f"http://127.0.0.1:9/bkt/shard-{n:06d}.tar?") and "%2Feu-west-1%2Fs3%2F" in url
    await asyncio.sleep(0.05)
    assert built == [] and backend._clients == {}
    backend.bucket_regions["bkt"] = "ap-south-1"  # a bucket in another region: the client signs for it
    url, _ = await backend.resolve("s3://bkt/x.tar", 0, None)
    assert "%2Fap-south-1%2Fs3%2F" in url and [kw["region"] for kw in built] == ["ap-south-1"]
    await backend.aclose()


@pytest.mark.asyncio
async def test_a_cancelled_wait_for_the_credentials_leaves_them_to_the_next_reader(
        aws_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The credential chain and the SDK client are resolved once per process and shared. A reader cancelled
    while it waits for them (its consumer left) must not cancel the shared answer: a later reader gets it.
    (A cancelled one was kept, and every later S3 read of the process raised CancelledError; found by
    tests/soak.py, whose resolving thread then printed InvalidStateError.)"""
    monkeypatch.setenv("AWS_SESSION_TOKEN", "a-token-for-a-fresh-environment-key")  # futures of their own
    release = threading.Event()  # each resolution waits until the waiter was cancelled
    real_credentials, real_client = botocore.session.Session.get_credentials, s3_clients.make_client

    def held_credentials(self: Any) -> Any:
        release.wait(10)
        return real_credentials(self)

    def held_client(**kwargs: Any) -> Any:
        release.wait(10)
        return real_client(**kwargs)

    monkeypatch.setattr(botocore.session.Session, "get_credentials", held_credentials)
    monkeypatch.setattr(s3_clients, "make_client", held_client)
    for make in (s3_clients.credentials_future, lambda: s3_clients.client_future(endpoint_url="http://127.0.0.1:9")):
        release.clear()
        shared = make()
        waiter = asyncio.ensure_future(asyncio.wrap_future(shared))
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert not shared.cancelled()
        release.set()
        assert await asyncio.wrap_future(shared) is not None
