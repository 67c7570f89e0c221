"""The contract suite for s3:// against moto in server mode, plus S3-specific checks."""

from __future__ import annotations

import re
import uuid

import boto3
import pytest

import wds_async as wds
from tests.backends.contract import BackendContract, ContractEnv, make_shard
from tests.emulators import MOTO_ENV
from wds_async.backends.s3 import S3Backend


@pytest.fixture()
def s3_env(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {**MOTO_ENV, "AWS_ENDPOINT_URL_S3": moto_endpoint}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def _bucket(endpoint: str) -> tuple[str, object]:
    name = f"wds-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=name)
    return name, client


class TestS3Backend(BackendContract):
    @pytest.fixture()
    def env(self, s3_env: dict[str, str], moto_endpoint: str) -> ContractEnv:
        bucket, client = _bucket(moto_endpoint)
        return ContractEnv(
            make_backend=lambda max_connections=32: S3Backend(max_connections=max_connections),
            url=lambda name: f"s3://{bucket}/{name}",
            put=lambda name, data: client.put_object(Bucket=bucket, Key=name, Body=data),  # type: ignore[attr-defined]
            dataset_options={},
        )


def test_explicit_endpoint_option(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in MOTO_ENV.items():
        monkeypatch.setenv(name, value)
    bucket, client = _bucket(moto_endpoint)
    client.put_object(Bucket=bucket, Key="a-000000.tar", Body=make_shard(0))  # type: ignore[attr-defined]
    ds = wds.WebDataset(f"s3://{bucket}/a-*.tar", backend_options={"endpoint_url": moto_endpoint})
    assert [s["__key__"] for s in ds][:2] == ["s000_000", "s000_001"]


@pytest.mark.asyncio
async def test_403_names_the_credential_source_not_the_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """moto does not verify signatures, so a loopback server answers as S3 does to a bad signature."""
    from aiohttp import web

    for name, value in MOTO_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "WRONG-SECRET-VALUE")

    async def deny(request: web.Request) -> web.Response:
        return web.Response(status=403, content_type="application/xml",
                            text="<Error><Code>SignatureDoesNotMatch</Code><Message>no</Message></Error>")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", deny)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    backend = S3Backend(endpoint_url=f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(wds.PermissionDenied) as info:
            async with backend.open("s3://bkt/x.tar") as stream:
                async for _ in stream:
                    pass
        text = str(info.value)
        assert "SignatureDoesNotMatch" in text and "AWS credentials: env" in text
        assert "s3://bkt/x.tar" in text
        assert "WRONG-SECRET-VALUE" not in text and "X-Amz-Signature" not in text
    finally:
        await backend.aclose()
        await runner.cleanup()


def test_missing_credentials_explain_what_to_set(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    with pytest.raises(wds.PermissionDenied, match="no AWS credentials found"):
        list(wds.WebDataset(["s3://some-bucket/x.tar"]))


def test_missing_bucket_and_key(s3_env: dict[str, str], moto_endpoint: str) -> None:
    with pytest.raises(wds.NotFound, match=re.escape("s3://no-such-bucket-xyz/x.tar")):
        list(wds.WebDataset(["s3://no-such-bucket-xyz/x.tar"]))
    bucket, _ = _bucket(moto_endpoint)
    with pytest.raises(wds.NotFound, match="NoSuchKey"):
        list(wds.WebDataset([f"s3://{bucket}/missing.tar"]))


@pytest.mark.parametrize("url", ["s3://", "s3://bucket-only", "s3:///key"])
def test_malformed_s3_urls(url: str, s3_env: dict[str, str]) -> None:
    with pytest.raises(wds.UrlError, match=r"names no bucket|no object in it"):
        list(wds.WebDataset([url]))
