"""The emulated store's S3 face, driven by real S3 clients: boto3/s3transfer, s5cmd and the CRT client.

Bucket B, key K is the file ROOT/B/K. One store serves the module over http; tests of server-wide knobs
and of https start their own. Every test works in a bucket of its own. Timing checks are lower bounds,
save one generous upper bound showing that writes skip the time to first byte.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import boto3
import botocore.exceptions
import pytest
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess

DATA = "data"  # the bucket that holds the generated shards
SHARD = "shard-000000.tar"
S5CMD = shutil.which("s5cmd") or str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "s5cmd")
_names = itertools.count()


def s3_client(endpoint: str, *, verify: str | None = None, attempts: int = 3) -> Any:
    """A boto3 S3 client for the store: path style, dummy keys, ``attempts`` tries per call."""
    config = Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": attempts, "mode": "standard"})
    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="x", aws_secret_access_key="x",
                        region_name="us-east-1", verify=verify, config=config)


def error_code(exc: botocore.exceptions.ClientError) -> tuple[str, int]:
    """(S3 error code, HTTP status) of a failed call."""
    return exc.response["Error"]["Code"], exc.response["ResponseMetadata"]["HTTPStatusCode"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("s3root")
    make_shards(root / DATA, n_shards=2, shard_bytes=1 << 20, sample_bytes=32 << 10)
    return root


@pytest.fixture(scope="module")
def store(root: Path) -> Iterator[StoreProcess]:
    with StoreProcess(root) as store:
        yield store
    assert store.stderr == "", store.stderr


@pytest.fixture(scope="module")
def s3(store: StoreProcess) -> Iterator[Any]:
    client = s3_client(store.s3_endpoint)
    yield client
    client.close()


@pytest.fixture
def bucket(s3: Any) -> str:
    """A new, empty bucket for one test."""
    name = f"bucket-{next(_names)}"
    s3.create_bucket(Bucket=name)
    return name


def put_keys(s3: Any, bucket: str, keys: list[str]) -> None:
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())


# -- buckets, objects, ranges -----------------------------------------------------------------------


def test_create_put_get_head(s3: Any, bucket: str, root: Path) -> None:
    body = os.urandom(100_000)
    put = s3.put_object(Bucket=bucket, Key="dir/sub/object.bin", Body=body)
    assert (root / bucket / "dir" / "sub" / "object.bin").read_bytes() == body
    got = s3.get_object(Bucket=bucket, Key="dir/sub/object.bin")
    assert got["Body"].read() == body
    head = s3.head_object(Bucket=bucket, Key="dir/sub/object.bin")
    assert head["ContentLength"] == len(body)
    assert head["ETag"] == got["ETag"] == put["ETag"]
    assert head["LastModified"] == got["LastModified"]
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]
    assert not [p.name for p in (root / bucket / "dir" / "sub").iterdir() if p.name != "object.bin"]  # no temp file


def test_get_range(s3: Any, root: Path) -> None:
    data = (root / DATA / SHARD).read_bytes()
    got = s3.get_object(Bucket=DATA, Key=SHARD, Range="bytes=1000-2999")
    assert got["Body"].read() == data[1000:3000]
    assert got["ContentRange"] == f"bytes 1000-2999/{len(data)}"
    assert got["ResponseMetadata"]["HTTPStatusCode"] == 206
    tail = s3.get_object(Bucket=DATA, Key=SHARD, Range="bytes=-100")
    assert tail["Body"].read() == data[-100:]


def test_if_match_on_get(s3: Any) -> None:
    etag = s3.head_object(Bucket=DATA, Key=SHARD)["ETag"]
    assert s3.get_object(Bucket=DATA, Key=SHARD, IfMatch=etag, Range="bytes=0-9")["ContentLength"] == 10
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.get_object(Bucket=DATA, Key=SHARD, IfMatch='"another-version"')
    assert error_code(info.value) == ("PreconditionFailed", 412)


def test_put_replaces_atomically_with_a_new_etag(s3: Any, bucket: str) -> None:
    first = s3.put_object(Bucket=bucket, Key="k", Body=b"same size")["ETag"]
    second = s3.put_object(Bucket=bucket, Key="k", Body=b"SAME SIZE")["ETag"]
    assert first != second  # even within one clock tick
    assert s3.get_object(Bucket=bucket, Key="k")["Body"].read() == b"SAME SIZE"


def test_missing_key_and_bucket(s3: Any, bucket: str) -> None:
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.get_object(Bucket=bucket, Key="no/such/key")
    assert error_code(info.value) == ("NoSuchKey", 404)
    assert info.value.response["Error"]["Message"]
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.head_object(Bucket=bucket, Key="no/such/key")
    assert error_code(info.value) == ("404", 404)  # HEAD errors have no body
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.get_object(Bucket="no-such-bucket", Key="k")
    assert error_code(info.value) == ("NoSuchBucket", 404)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.list_objects_v2(Bucket="no-such-bucket")
    assert error_code(info.value) == ("NoSuchBucket", 404)
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.head_bucket(Bucket="no-such-bucket")
    assert error_code(info.value)[1] == 404


def test_bucket_calls(s3: Any, bucket: str, root: Path) -> None:
    head = s3.head_bucket(Bucket=bucket)
    assert head["ResponseMetadata"]["HTTPHeaders"]["x-amz-bucket-region"] == "us-east-1"
    assert s3.get_bucket_location(Bucket=bucket)["LocationConstraint"] is None  # us-east-1
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert bucket in names and DATA in names and not any(n.startswith(".") for n in names)
    s3.create_bucket(Bucket=bucket)  # us-east-1: creating a bucket one owns again is fine
    s3.put_object(Bucket=bucket, Key="x", Body=b"x")
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.delete_bucket(Bucket=bucket)
    assert error_code(info.value) == ("BucketNotEmpty", 409)
    s3.delete_object(Bucket=bucket, Key="x")
    s3.delete_bucket(Bucket=bucket)
    assert not (root / bucket).exists()


def test_delete_object_and_objects(s3: Any, bucket: str, root: Path) -> None:
    put_keys(s3, bucket, ["a/b/c.txt", "a/d.txt", "e.txt"])
    s3.delete_object(Bucket=bucket, Key="a/b/c.txt")
    assert not (root / bucket / "a" / "b").exists()  # a folder left empty goes too: no phantom prefix
    s3.delete_object(Bucket=bucket, Key="never-there")  # 204 all the same
    answer = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "a/d.txt"}, {"Key": "e.txt"}]})
    assert sorted(d["Key"] for d in answer["Deleted"]) == ["a/d.txt", "e.txt"]
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


# -- listing --------------------------------------------------------------------------------------------


KEYS = sorted(["a.txt", "b/1.txt", "b/2.txt", "b/c/3.txt", "d+e f.txt", "g/h/i.txt", "z.txt"])


def test_list_v2_pages_through_sorted_keys(s3: Any, bucket: str) -> None:
    put_keys(s3, bucket, KEYS)
    pages = list(s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 2}))
    assert len(pages) == 4
    assert [c["Key"] for page in pages for c in page["Contents"]] == KEYS
    assert [page["KeyCount"] for page in pages] == [2, 2, 2, 1]
    first = pages[0]["Contents"][0]
    assert first["Size"] == len(b"a.txt") and first["StorageClass"] == "STANDARD"
    assert first["ETag"] == s3.head_object(Bucket=bucket, Key="a.txt")["ETag"]
    whole = s3.list_objects_v2(Bucket=bucket)
    assert (whole["KeyCount"], whole["IsTruncated"], whole["MaxKeys"]) == (len(KEYS), False, 1000)


def test_list_v2_prefix_delimiter_start_after(s3: Any, bucket: str) -> None:
    put_keys(s3, bucket, KEYS)
    top = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [c["Key"] for c in top["Contents"]] == ["a.txt", "d+e f.txt", "z.txt"]
    assert [p["Prefix"] for p in top["CommonPrefixes"]] == ["b/", "g/"]
    under_b = s3.list_objects_v2(Bucket=bucket, Prefix="b/", Delimiter="/")
    assert [c["Key"] for c in under_b["Contents"]] == ["b/1.txt", "b/2.txt"]
    assert [p["Prefix"] for p in under_b["CommonPrefixes"]] == ["b/c/"]
    assert [c["Key"] for c in s3.list_objects_v2(Bucket=bucket, Prefix="b/")["Contents"]] == KEYS[1:4]
    assert [c["Key"] for c in s3.list_objects_v2(Bucket=bucket, StartAfter="d")["Contents"]] == KEYS[4:]
    assert "Contents" not in s3.list_objects_v2(Bucket=bucket, Prefix="nothing")


def test_list_pages_count_common_prefixes(s3: Any, bucket: str) -> None:
    put_keys(s3, bucket, KEYS)
    pages = list(s3.get_paginator("list_objects_v2").paginate(
        Bucket=bucket, Delimiter="/", PaginationConfig={"PageSize": 1}))
    names = [(c.get("Key") or c.get("Prefix")) for page in pages
             for c in page.get("Contents", []) + page.get("CommonPrefixes", [])]
    assert names == ["a.txt", "b/", "d+e f.txt", "g/", "z.txt"]


def test_list_v1_markers(s3: Any, bucket: str) -> None:
    put_keys(s3, bucket, KEYS)
    pages = list(s3.get_paginator("list_objects").paginate(Bucket=bucket, PaginationConfig={"PageSize": 3}))
    assert [c["Key"] for page in pages for c in page["Contents"]] == KEYS
    assert pages[0]["NextMarker"] == KEYS[2]
    assert [c["Key"] for c in s3.list_objects(Bucket=bucket, Marker="b/c/3.txt")["Contents"]] == KEYS[4:]


def test_hidden_and_unsafe_names(s3: Any, bucket: str, root: Path, store: StoreProcess) -> None:
    (root / bucket / ".wds-tmp-leftover").write_bytes(b"partial")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.get_object(Bucket=bucket, Key=".wds-tmp-leftover")
    assert error_code(info.value) == ("NoSuchKey", 404)
    for key in (".wds-tmp-x", "a//b", "a/./b"):
        with pytest.raises(botocore.exceptions.ClientError) as info:
            s3.put_object(Bucket=bucket, Key=key, Body=b"x")
        assert error_code(info.value) == ("InvalidArgument", 400), key
    status, _ = asyncio.run(raw_request(store, f"PUT /{bucket}/..%2f..%2fescaped HTTP/1.1", b"x"))
    assert status == 400
    assert not (root.parent / "escaped").exists() and not (root / "escaped").exists()


async def raw_request(store: StoreProcess, line: str, body: bytes = b"") -> tuple[int, bytes]:
    """Send one request line verbatim (no client-side normalisation of the path)."""
    assert store.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", store.port)
    try:
        writer.write(f"{line}\r\nHost: x\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        response = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    return int(response.split(b" ", 2)[1]), response


# -- multipart uploads and transfers ------------------------------------------------------------------


def test_upload_fileobj_multipart_round_trip(s3: Any, bucket: str, store: StoreProcess) -> None:
    data = os.urandom((11 << 20) + 12345)
    config = TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20)
    before = store.stats()
    s3.upload_fileobj(io.BytesIO(data), bucket, "big/object.bin", Config=config)
    after = store.stats()
    assert after["bytes_received"] - before["bytes_received"] == len(data)
    assert after["requests"] - before["requests"] == 1 + 3 + 1  # create, three parts, complete
    assert s3.get_object(Bucket=bucket, Key="big/object.bin")["Body"].read() == data
    out = io.BytesIO()
    s3.download_fileobj(bucket, "big/object.bin", out, Config=config)  # ranged GETs (with If-Match)
    assert out.getvalue() == data
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_abort_leaves_nothing_visible(s3: Any, bucket: str, root: Path, store: StoreProcess) -> None:
    upload = s3.create_multipart_upload(Bucket=bucket, Key="aborted.bin")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="aborted.bin", UploadId=upload, PartNumber=1, Body=b"x" * 1000)
    listed = s3.list_multipart_uploads(Bucket=bucket)["Uploads"]
    assert [(u["Key"], u["UploadId"]) for u in listed] == [("aborted.bin", upload)]
    with urllib.request.urlopen(store.url("", list=1)) as resp:
        assert not [name for name in json.loads(resp.read()) if ".wds-" in name]  # staged parts stay hidden
    s3.abort_multipart_upload(Bucket=bucket, Key="aborted.bin", UploadId=upload)
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert list((root / bucket).iterdir()) == []
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
async def test_aws_chunked_body_is_decoded(store: StoreProcess, s3: Any, bucket: str) -> None:
    """The framing of ``STREAMING-AWS4-HMAC-SHA256-PAYLOAD`` (signed chunks) and a trailing checksum."""
    payload = os.urandom(70_000)
    chunks = [payload[:65536], payload[65536:]]
    framed = b"".join(b"%x;chunk-signature=%s\r\n%s\r\n" % (len(c), b"0" * 64, c) for c in chunks)
    framed += b"0;chunk-signature=" + b"0" * 64 + b"\r\nx-amz-checksum-crc32:AAAAAA==\r\n\r\n"
    headers = {"x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD", "Content-Encoding": "aws-chunked",
               "x-amz-decoded-content-length": str(len(payload)), "x-amz-trailer": "x-amz-checksum-crc32"}
    async with aiohttp.ClientSession() as http:
        async with http.put(store.url(f"{bucket}/chunked.bin"), data=framed, headers=headers) as resp:
            assert resp.status == 200
            assert resp.headers["x-amz-checksum-crc32"] == "AAAAAA=="
        short = {**headers, "x-amz-decoded-content-length": str(len(payload) + 1)}
        async with http.put(store.url(f"{bucket}/short.bin"), data=framed, headers=short) as resp:
            assert resp.status == 400 and b"IncompleteBody" in await resp.read()
        async with http.put(store.url(f"{bucket}/broken.bin"), data=b"zz\r\nxx", headers=headers) as resp:
            assert resp.status == 400
    assert s3.get_object(Bucket=bucket, Key="chunked.bin")["Body"].read() == payload
    assert [c["Key"] for c in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["chunked.bin"]


# -- knobs on the S3 face -----------------------------------------------------------------------------


def test_slow_down_surfaces_without_retries(root: Path) -> None:
    with StoreProcess(root, Knobs(fail_rate=1)) as store:
        client = s3_client(store.s3_endpoint, attempts=1)
        try:
            client.put_object(Bucket=DATA, Key="written.bin", Body=b"writes are never failed")
            with pytest.raises(botocore.exceptions.ClientError) as info:
                client.get_object(Bucket=DATA, Key="written.bin")
        finally:
            client.close()
        counters = store.stats()
    os.unlink(root / DATA / "written.bin")
    assert error_code(info.value) == ("SlowDown", 503)
    assert info.value.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "0"
    assert counters["failed"] == 1 and counters["requests"] == 2


@pytest.mark.asyncio
async def test_max_concurrent_refuses_s3_gets(root: Path) -> None:
    with StoreProcess(root, Knobs(max_concurrent=1)) as store:
        client = s3_client(store.s3_endpoint, attempts=1)
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(store.url(f"{DATA}/{SHARD}", stall=60)) as held:
                    await held.content.readexactly(1000)
                    with pytest.raises(botocore.exceptions.ClientError) as info:
                        await asyncio.to_thread(client.get_object, Bucket=DATA, Key=SHARD)
                    listing = await asyncio.to_thread(client.list_objects_v2, Bucket=DATA)  # never refused
                    held.close()
        finally:
            client.close()
        counters = store.stats()
    assert error_code(info.value) == ("SlowDown", 503)
    assert info.value.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "1"
    assert SHARD in [c["Key"] for c in listing["Contents"]]
    assert counters["throttled"] == 1 and counters["peak_active"] == 1


def test_ttfb_paces_reads_not_writes(root: Path) -> None:
    ttfb = 1.0
    with StoreProcess(root, Knobs(ttfb=ttfb)) as store:
        client = s3_client(store.s3_endpoint)
        try:
            start = time.monotonic()
            client.put_object(Bucket=DATA, Key="fast.bin", Body=b"x")
            wrote = time.monotonic() - start
            start = time.monotonic()
            client.get_object(Bucket=DATA, Key="fast.bin")["Body"].read()
            read = time.monotonic() - start
        finally:
            client.close()
    os.unlink(root / DATA / "fast.bin")
    assert read >= ttfb - 0.01
    assert wrote < ttfb


@pytest.mark.asyncio
async def test_presigned_urls_and_knobs_in_the_query(store: StoreProcess, s3: Any, root: Path) -> None:
    """A presigned GET (what wds-async's S3 backend sends) is served; knobs ride along in its query."""
    data = (root / DATA / SHARD).read_bytes()
    url = s3.generate_presigned_url("get_object", Params={"Bucket": DATA, "Key": SHARD})
    async with aiohttp.ClientSession() as http:
        async with http.get(url, headers={"Range": "bytes=0-99"}) as resp:
            assert (resp.status, await resp.read()) == (206, data[:100])
        start = time.monotonic()
        async with http.get(url + "&ttfb=0.2") as resp:
            assert resp.status == 200 and await resp.read() == data
        assert time.monotonic() - start >= 0.2 - 0.01
        async with http.get(url + "&status=500") as resp:
            assert resp.status == 500
        async with http.get(url + "&bw=fast") as resp:
            assert resp.status == 400 and b"<Code>InvalidArgument</Code>" in await resp.read()
        async with http.get(url + "&response-content-type=text%2Fplain") as resp:
            assert resp.headers["Content-Type"] == "text/plain"


def test_stats_report_cpu_and_bytes(store: StoreProcess) -> None:
    counters = store.stats()
    assert isinstance(counters["cpu_s"], float) and counters["cpu_s"] > 0
    assert isinstance(counters["bytes_received"], int)


# -- other clients --------------------------------------------------------------------------------------


def s5cmd(store: StoreProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_REGION": "us-east-1"}
    if store.https:
        env["AWS_CA_BUNDLE"] = store.ca_file
    return subprocess.run([S5CMD, "--endpoint-url", store.s3_endpoint, *args], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.skipif(not os.access(S5CMD, os.X_OK), reason="the s5cmd binary is not installed")
@pytest.mark.parametrize("https", [False, True], ids=["http", "https"])
def test_s5cmd_lists_and_copies(root: Path, tmp_path: Path, https: bool) -> None:
    data = (root / DATA / SHARD).read_bytes()
    with StoreProcess(root, https=https) as store:
        listing = s5cmd(store, "ls", f"s3://{DATA}/")
        down = s5cmd(store, "cp", f"s3://{DATA}/{SHARD}", str(tmp_path / "down.tar"))
        up = s5cmd(store, "cp", str(tmp_path / "down.tar"), f"s3://{DATA}/copies/{https}.tar")
        buckets = s5cmd(store, "ls")
    assert listing.returncode == 0, listing.stderr
    assert SHARD in listing.stdout and "manifest.json" in listing.stdout
    assert down.returncode == 0, down.stderr
    assert (tmp_path / "down.tar").read_bytes() == data
    assert up.returncode == 0, up.stderr
    assert (root / DATA / "copies" / f"{https}.tar").read_bytes() == data
    assert buckets.returncode == 0 and f"s3://{DATA}" in buckets.stdout
    shutil.rmtree(root / DATA / "copies")


def test_crt_client_of_s3torchconnector(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The AWS CRT client (``/bucket/?list-type=2&delimiter=``, parallel ranged GETs, multipart PUT)."""
    connector = pytest.importorskip("s3torchconnector")
    from s3torchconnector._s3client import S3Client

    for name, value in (("AWS_ACCESS_KEY_ID", "x"), ("AWS_SECRET_ACCESS_KEY", "x"), ("AWS_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    payload = os.urandom(20 << 20)
    with StoreProcess(root) as store:
        config = connector.S3ClientConfig(force_path_style=True)
        dataset = connector.S3MapDataset.from_prefix(f"s3://{DATA}/shard-", region="us-east-1",
                                                     endpoint=store.s3_endpoint, s3client_config=config)
        read = {item.key: item.read() for item in dataset}
        client = S3Client("us-east-1", endpoint=store.s3_endpoint, s3client_config=config)
        writer = client.put_object(DATA, "crt/checkpoint.bin")
        writer.write(payload)
        writer.close()
        back = client.get_object(DATA, "crt/checkpoint.bin").read()
    assert read == {p.name: p.read_bytes() for p in sorted((root / DATA).glob("shard-*"))}
    assert back == payload and (root / DATA / "crt" / "checkpoint.bin").read_bytes() == payload
    shutil.rmtree(root / DATA / "crt")


def payload_hash(request: Any) -> str:
    """The ``x-amz-content-sha256`` of a request botocore is about to send."""
    value = request.headers.get("x-amz-content-sha256", "")
    return value.decode() if isinstance(value, bytes) else str(value)


def test_https_with_aws_chunked_uploads(root: Path) -> None:
    """Over TLS, boto3 streams PutObject and UploadPart bodies as aws-chunked with a trailing checksum."""
    data, big = os.urandom(300_000), os.urandom((5 << 20) + 1)
    sent: list[str] = []
    with StoreProcess(root, https=True) as store:
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
    assert (root / "tls" / "small.bin").read_bytes() == data
    shutil.rmtree(root / "tls")
    assert store.stderr == ""
