"""The S3 backend's start-up (issue: time to first sample): its SDK client is built in a thread, started early,
shared by the process, and never blocks the event loop; the credential chain's first resolution happens there."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import botocore.session
import pytest

from tests.emulators import MOTO_ENV
from wds_async.backends import s3
from wds_async.backends.s3 import S3Backend
from wds_async.io import backend_class


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in MOTO_ENV.items():
        monkeypatch.setenv(name, value)


def test_the_registry_warms_the_session_without_asking_for_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    # No AWS variables at all (the suite scrubs them): building a dataset must not probe a metadata service, so
    # the warm-up's throwaway client carries placeholder keys and only loads the SDK's models into the session.
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # were the chain asked anyway, it could not go out
    asked: list[str] = []
    real = botocore.session.Session.get_credentials

    def get_credentials(self: Any) -> Any:
        asked.append(threading.current_thread().name)
        return real(self)

    monkeypatch.setattr(botocore.session.Session, "get_credentials", get_credentials)
    assert backend_class("s3") is S3Backend
    warming = s3.warm_up()  # the one the registry started: once per process and environment
    assert warming.result(timeout=60) is None and s3.warm_up() is warming
    assert (None, s3._aws_env()) in s3._SESSIONS and asked == []


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
    real = s3.make_client

    def slow_make_client(**kwargs: Any) -> Any:
        built_on.append(threading.current_thread().name)
        release.wait(30)  # a credential chain that takes its time (a metadata service, an assumed role)
        return real(**kwargs)

    monkeypatch.setattr(s3, "make_client", slow_make_client)
    backend = S3Backend(endpoint_url="http://127.0.0.1:9", region="ap-south-1")  # settings no one built yet
    signed = asyncio.ensure_future(backend.resolve("s3://bkt/key.tar", 0, None))
    ticks = 0
    while not built_on or ticks < 20:  # the loop turns while the build waits
        await asyncio.sleep(0.001)
        ticks += 1
    assert not signed.done() and built_on == ["wds-async-s3-client"]
    release.set()
    url, _ = await signed
    assert url.startswith("http://127.0.0.1:9/bkt/key.tar?") and "X-Amz-Signature=" in url
    await backend.aclose()
