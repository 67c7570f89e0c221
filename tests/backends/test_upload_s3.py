"""The upload suite for ``s3://`` (multipart uploads) on moto in server mode, behind a fault proxy."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

import wds_async as wds
from tests.backends.upload_contract import FAST, UploadContract, UploadEnv, make_samples, read_back
from tests.backends.upload_faults import Fault, FaultProxy, faults, query
from tests.emulators import MOTO_ENV
from wds_async.write.sinks import DEFAULT_PART_BYTES, open_sink
from wds_async.write.sinks.s3 import MIN_PART_BYTES, S3Sink

_ERROR = b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>%s</Code><Message>injected</Message></Error>'


def is_part(method: str, path: str) -> bool:
    q = query(path)
    return method == "PUT" and "partNumber" in q and "uploadId" in q


def is_start(method: str, path: str) -> bool:
    return method == "POST" and "uploads" in query(path)


@pytest.fixture(scope="module")
def proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(moto_endpoint) as server:
        yield server


@pytest.fixture()
def bucket(moto_endpoint: str, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    for name, value in MOTO_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)  # what the sinks and readers use
    name = f"wds-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")  # behind the proxy
    client.create_bucket(Bucket=name)
    return name, client


@pytest.fixture()
def up(bucket: tuple[str, Any], proxy: FaultProxy) -> UploadEnv:
    name, client = bucket

    def read(key: str) -> bytes | None:
        try:
            return client.get_object(Bucket=name, Key=key)["Body"].read()  # type: ignore[no-any-return]
        except ClientError:
            return None

    def pending() -> list[str]:
        return [u["Key"] for u in client.list_multipart_uploads(Bucket=name).get("Uploads", [])]

    return UploadEnv(url=lambda key: f"s3://{name}/{key}", read=read, proxy=proxy, is_part=is_part,
                     transient=(503, {"Content-Type": "application/xml"}, _ERROR % b"SlowDown"),
                     broken=(500, {"Content-Type": "application/xml"}, _ERROR % b"InternalError"),
                     part_bytes=MIN_PART_BYTES, pending=pending, memory_parts=13)  # 65 MiB


class TestS3Upload(UploadContract):
    pass


def test_an_object_under_one_part_is_a_single_put(up: UploadEnv) -> None:
    before = up.proxy.requests(is_start)
    samples = make_samples(3, 1000)
    with wds.TarWriter(up.url("small.tar"), mtime=1) as writer:
        for sample in samples:
            writer.write(sample)
    assert up.proxy.requests(is_start) == before and writer.stream.upload_id is None
    assert read_back([up.url("small.tar")]) == [(s["__key__"], s["bin"], s["txt"].encode()) for s in samples]


def test_failure_to_start_the_upload_is_retried(up: UploadEnv) -> None:
    rule = Fault(is_start, which={1}, status=503, body=_ERROR % b"SlowDown")
    with faults(up.proxy, rule):
        sink = open_sink(up.url("restart.tar"), part_bytes=MIN_PART_BYTES, policy=FAST)
        sink.write(bytes(MIN_PART_BYTES + 1))
        sink.close()
    assert rule.failed == 1 and up.read("restart.tar") == bytes(MIN_PART_BYTES + 1) and up.pending() == []


def test_abort_removes_the_pending_upload(up: UploadEnv) -> None:
    sink = open_sink(up.url("gone.tar"), part_bytes=MIN_PART_BYTES)
    sink.write(bytes(3 * MIN_PART_BYTES))
    assert up.pending() == ["gone.tar"]
    sink.abort()
    sink.abort()
    assert up.pending() == [] and up.read("gone.tar") is None
    with pytest.raises(wds.BackendError, match="aborted"):
        sink.write(b"x")


def test_part_sizes_grow_to_fit_ten_thousand_parts(up: UploadEnv) -> None:
    sink = S3Sink(up.url("sizes.tar"), {}, part_bytes=DEFAULT_PART_BYTES)
    sizes = [sink.part_size(n) >> 20 for n in (1, 1000, 1001, 2001, 10_000)]
    assert sizes == [8, 8, 16, 32, 4096]  # MiB; S3 takes parts of up to 5 GiB
    assert sum(sink.part_size(n) for n in range(1, 10_001)) >= 5 << 40  # S3's largest object: 5 TiB
    with pytest.raises(wds.BackendError, match="10000 parts"):
        sink.part_size(10_001)
    with pytest.raises(ValueError, match="5 MiB"):
        S3Sink(up.url("sizes.tar"), {}, part_bytes=1 << 20)


def test_options_reach_the_client(up: UploadEnv, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    before = up.proxy.requests(is_part)
    sink = open_sink(up.url("direct.tar"), options={"s3": {"endpoint_url": moto_endpoint}}, part_bytes=MIN_PART_BYTES)
    sink.write(bytes(MIN_PART_BYTES + 7))
    sink.close()
    assert up.read("direct.tar") == bytes(MIN_PART_BYTES + 7) and up.proxy.requests(is_part) == before
    with pytest.raises(wds.UrlError, match="not known to the s3"):
        open_sink(up.url("x.tar"), options={"s3": {"no_such_option": 1}})
