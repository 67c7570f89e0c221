"""The emulated store's S3 face, driven by boto3 one call at a time: buckets, objects, ranges, listings, path
safety, server-wide knobs, presigned URLs and the counters.

Bucket B, key K is the file ROOT/B/K. One store serves the module over http (``s3_store``, conftest.py); tests of
server-wide knobs start their own. Every test works in a bucket of its own. Timing checks are lower bounds, save one
generous upper bound showing that writes skip the time to first byte. Multipart and aws-chunked uploads and the
other clients (s5cmd, the CRT client, boto3 over https) are in test_store_s3_transfers.py.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import aiohttp
import botocore.exceptions
import pytest

from emustore import Knobs, StoreProcess
from tests.servers.s3_common import DATA, SHARD, error_code, s3_client


def put_keys(s3: Any, bucket: str, keys: list[str]) -> None:
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=key.encode())


# -- buckets, objects, ranges -----------------------------------------------------------------------


def test_create_put_get_head(s3: Any, bucket: str, s3_root: Path) -> None:
    body = os.urandom(100_000)
    put = s3.put_object(Bucket=bucket, Key="dir/sub/object.bin", Body=body)
    assert (s3_root / bucket / "dir" / "sub" / "object.bin").read_bytes() == body
    got = s3.get_object(Bucket=bucket, Key="dir/sub/object.bin")
    assert got["Body"].read() == body
    head = s3.head_object(Bucket=bucket, Key="dir/sub/object.bin")
    assert head["ContentLength"] == len(body)
    assert head["ETag"] == got["ETag"] == put["ETag"]
    assert head["LastModified"] == got["LastModified"]
    assert got["ResponseMetadata"]["HTTPHeaders"]["x-amz-request-id"]
    assert not [p.name for p in (s3_root / bucket / "dir" / "sub").iterdir() if p.name != "object.bin"]  # no temp file


def test_get_range(s3: Any, s3_root: Path) -> None:
    data = (s3_root / DATA / SHARD).read_bytes()
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


def test_bucket_calls(s3: Any, bucket: str, s3_root: Path) -> None:
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
    assert not (s3_root / bucket).exists()


def test_delete_object_and_objects(s3: Any, bucket: str, s3_root: Path) -> None:
    put_keys(s3, bucket, ["a/b/c.txt", "a/d.txt", "e.txt"])
    s3.delete_object(Bucket=bucket, Key="a/b/c.txt")
    assert not (s3_root / bucket / "a" / "b").exists()  # a folder left empty goes too: no phantom prefix
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


def test_hidden_and_unsafe_names(s3: Any, bucket: str, s3_root: Path, s3_store: StoreProcess) -> None:
    (s3_root / bucket / ".wds-tmp-leftover").write_bytes(b"partial")
    assert s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0
    with pytest.raises(botocore.exceptions.ClientError) as info:
        s3.get_object(Bucket=bucket, Key=".wds-tmp-leftover")
    assert error_code(info.value) == ("NoSuchKey", 404)
    for key in (".wds-tmp-x", "a//b", "a/./b"):
        with pytest.raises(botocore.exceptions.ClientError) as info:
            s3.put_object(Bucket=bucket, Key=key, Body=b"x")
        assert error_code(info.value) == ("InvalidArgument", 400), key
    status, _ = asyncio.run(raw_request(s3_store, f"PUT /{bucket}/..%2f..%2fescaped HTTP/1.1", b"x"))
    assert status == 400
    assert not (s3_root.parent / "escaped").exists() and not (s3_root / "escaped").exists()


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


# -- knobs on the S3 face -----------------------------------------------------------------------------


def test_slow_down_surfaces_without_retries(s3_root: Path) -> None:
    with StoreProcess(s3_root, Knobs(fail_rate=1)) as store:
        client = s3_client(store.s3_endpoint, attempts=1)
        try:
            client.put_object(Bucket=DATA, Key="written.bin", Body=b"writes are never failed")
            with pytest.raises(botocore.exceptions.ClientError) as info:
                client.get_object(Bucket=DATA, Key="written.bin")
        finally:
            client.close()
        counters = store.stats()
    os.unlink(s3_root / DATA / "written.bin")
    assert error_code(info.value) == ("SlowDown", 503)
    assert info.value.response["ResponseMetadata"]["HTTPHeaders"]["retry-after"] == "0"
    assert counters["failed"] == 1 and counters["requests"] == 2


@pytest.mark.asyncio
async def test_max_concurrent_refuses_s3_gets(s3_root: Path) -> None:
    with StoreProcess(s3_root, Knobs(max_concurrent=1)) as store:
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


def test_ttfb_paces_reads_not_writes(s3_root: Path) -> None:
    ttfb = 1.0
    with StoreProcess(s3_root, Knobs(ttfb=ttfb)) as store:
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
    os.unlink(s3_root / DATA / "fast.bin")
    assert read >= ttfb - 0.01
    assert wrote < ttfb


@pytest.mark.asyncio
async def test_presigned_urls_and_knobs_in_the_query(s3_store: StoreProcess, s3: Any, s3_root: Path) -> None:
    """A presigned GET (what wds-async's S3 backend sends) is served; knobs ride along in its query."""
    data = (s3_root / DATA / SHARD).read_bytes()
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


def test_stats_report_cpu_and_bytes(s3_store: StoreProcess) -> None:
    counters = s3_store.stats()
    assert isinstance(counters["cpu_s"], float) and counters["cpu_s"] > 0
    assert isinstance(counters["bytes_received"], int)
