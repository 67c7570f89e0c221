"""The emulated store's GCS JSON face, driven by the real google-cloud-storage client (and raw requests).

Bucket B, object O is the file ROOT/B/O; ``generation`` is the file's mtime in ns. One store serves the
module over http; tests of server-wide knobs and of https start their own. Every test that writes does
so in a bucket of its own.
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import google_crc32c
import pytest
import requests
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage

from emustore import Knobs, StoreProcess
from tests.servers.roots import DATA, bucket_root, checked_store

SHARD = "shard-000000.tar"
_names = itertools.count()


def gcs_client(store: StoreProcess) -> storage.Client:
    """A google-cloud-storage client for the store: anonymous, its endpoint, trusting its CA over https."""
    http = None
    if store.https:
        http = requests.Session()
        http.verify = store.ca_file
        http.trust_env = False  # else REQUESTS_CA_BUNDLE in the environment overrides ``verify``
    return storage.Client(project="p", credentials=AnonymousCredentials(), _http=http,
                          client_options={"api_endpoint": store.gcs_endpoint})


def md5_b64(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


def crc32c_b64(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bucket_root(tmp_path_factory, "gcsroot", 3)


@pytest.fixture(scope="module")
def store(root: Path) -> Iterator[StoreProcess]:
    with checked_store(root) as store:
        yield store


@pytest.fixture(scope="module")
def client(store: StoreProcess) -> Iterator[storage.Client]:
    client = gcs_client(store)
    yield client
    client.close()


@pytest.fixture
def bucket(client: storage.Client) -> storage.Bucket:
    """A new, empty bucket for one test."""
    return client.create_bucket(f"bucket-{next(_names)}")


async def raw_get(url: str, **headers: str) -> tuple[aiohttp.ClientResponse, bytes]:
    async with aiohttp.ClientSession() as http:
        async with http.get(url, headers=headers) as resp:
            return resp, await resp.read()


# -- reading ------------------------------------------------------------------------------------------


def test_list_blobs_prefix_pages_delimiter(client: storage.Client, root: Path) -> None:
    shards = sorted(p.name for p in (root / DATA).glob("shard-*"))
    assert [b.name for b in client.list_blobs(DATA, prefix="shard-")] == shards
    assert [b.name for b in client.list_blobs(DATA, prefix="shard-", max_results=2)] == shards[:2]
    pages = list(client.list_blobs(DATA, page_size=2).pages)
    assert [[b.name for b in page] for page in pages] == [["manifest.json", shards[0]], shards[1:]]
    first = next(iter(client.list_blobs(DATA, prefix=SHARD)))
    assert first.size == (root / DATA / SHARD).stat().st_size
    assert first.generation == (root / DATA / SHARD).stat().st_mtime_ns


def test_list_with_delimiter_and_offsets(client: storage.Client, bucket: storage.Bucket) -> None:
    for name in ("a.txt", "d/1.txt", "d/2.txt", "d/e/3.txt", "z.txt"):
        bucket.blob(name).upload_from_string(name)
    top = client.list_blobs(bucket, delimiter="/")
    assert [b.name for b in top] == ["a.txt", "z.txt"]
    assert top.prefixes == {"d/"}
    inner = client.list_blobs(bucket, prefix="d/", delimiter="/")
    assert [b.name for b in inner] == ["d/1.txt", "d/2.txt"] and inner.prefixes == {"d/e/"}
    window = client.list_blobs(bucket, start_offset="d/2", end_offset="z")
    assert [b.name for b in window] == ["d/2.txt", "d/e/3.txt"]


def test_download_whole_and_ranges(client: storage.Client, root: Path) -> None:
    data = (root / DATA / SHARD).read_bytes()
    blob = client.bucket(DATA).blob(SHARD)
    assert blob.download_as_bytes() == data
    assert blob.download_as_bytes(start=100, end=1099) == data[100:1100]  # end is inclusive
    assert blob.download_as_bytes(start=len(data) - 10) == data[-10:]


def test_reload_metadata(client: storage.Client, root: Path) -> None:
    path = root / DATA / "shard-000001.tar"
    data, st = path.read_bytes(), path.stat()
    blob = client.bucket(DATA).blob(path.name)
    blob.reload()
    assert (blob.size, blob.generation, blob.metageneration) == (len(data), st.st_mtime_ns, 1)
    assert blob.md5_hash == md5_b64(data)
    assert blob.crc32c == crc32c_b64(data)
    assert blob.content_type == "application/x-tar"
    assert blob.updated is not None and abs(blob.updated.timestamp() - st.st_mtime) < 0.002
    assert blob.download_as_bytes() == data  # through mediaLink, with generation=


@pytest.mark.parametrize("checksum", ["md5", "crc32c"])
def test_download_checksums_validate(client: storage.Client, root: Path, checksum: str) -> None:
    data = (root / DATA / "shard-000002.tar").read_bytes()
    assert client.bucket(DATA).blob("shard-000002.tar").download_as_bytes(checksum=checksum) == data


@pytest.mark.asyncio
async def test_media_headers(store: StoreProcess, root: Path) -> None:
    data = (root / DATA / SHARD).read_bytes()
    url = f"{store.gcs_endpoint}/download/storage/v1/b/{DATA}/o/{SHARD}?alt=media"
    resp, body = await raw_get(url)
    assert body == data
    assert resp.headers["x-goog-hash"] == f"crc32c={crc32c_b64(data)},md5={md5_b64(data)}"
    assert resp.headers["x-goog-generation"] == str((root / DATA / SHARD).stat().st_mtime_ns)
    assert resp.headers["x-goog-stored-content-length"] == str(len(data))
    assert resp.headers["ETag"].startswith('"')
    ranged, part = await raw_get(f"{store.gcs_endpoint}/storage/v1/b/{DATA}/o/{SHARD}?alt=media", Range="bytes=5-9")
    assert (ranged.status, part, ranged.headers["Content-Range"]) == (206, data[5:10], f"bytes 5-9/{len(data)}")


def test_replaced_object_gets_a_new_generation(client: storage.Client, bucket: storage.Bucket,
                                               root: Path) -> None:
    bucket.blob("v.bin").upload_from_string(b"one")
    old = bucket.get_blob("v.bin")
    assert old is not None
    tmp = root / bucket.name / "v.tmp"
    tmp.write_bytes(b"two")
    os.replace(tmp, root / bucket.name / "v.bin")
    new = bucket.get_blob("v.bin")
    assert new is not None and new.generation != old.generation and new.md5_hash == md5_b64(b"two")
    with pytest.raises(exceptions.NotFound):
        old.download_as_bytes(retry=None)  # its mediaLink names the old generation
    assert new.download_as_bytes() == b"two"


def test_missing_objects_and_buckets(client: storage.Client) -> None:
    blob = client.bucket(DATA).blob("no/such/object")
    with pytest.raises(exceptions.NotFound):
        blob.download_as_bytes()
    with pytest.raises(exceptions.NotFound):
        blob.reload()
    assert not blob.exists()
    assert client.bucket(DATA).get_blob("no/such/object") is None
    with pytest.raises(exceptions.NotFound):
        client.get_bucket("no-such-bucket")
    with pytest.raises(exceptions.NotFound):
        client.bucket("no-such-bucket").blob("x").download_as_bytes()


@pytest.mark.asyncio
async def test_errors_are_gcs_json(store: StoreProcess) -> None:
    resp, body = await raw_get(f"{store.gcs_endpoint}/storage/v1/b/{DATA}/o/missing%2Fobject")
    assert resp.status == 404
    error = json.loads(body)["error"]
    assert error["code"] == 404 and error["message"] == f"No such object: {DATA}/missing/object"
    assert error["errors"][0]["reason"] == "notFound"


def test_generation_preconditions(client: storage.Client, bucket: storage.Bucket) -> None:
    blob = bucket.blob("g.bin")
    blob.upload_from_string(b"first", if_generation_match=0)  # 0: only if absent
    with pytest.raises(exceptions.PreconditionFailed):
        bucket.blob("g.bin").upload_from_string(b"second", if_generation_match=0)
    blob.reload()
    with pytest.raises(exceptions.PreconditionFailed):
        blob.download_as_bytes(if_generation_match=blob.generation + 1)
    assert blob.download_as_bytes(if_generation_match=blob.generation) == b"first"
    bucket.blob("g.bin").upload_from_string(b"third", if_generation_match=blob.generation)
    assert bucket.blob("g.bin").download_as_bytes() == b"third"


# -- writing ------------------------------------------------------------------------------------------


def test_multipart_upload_round_trip(bucket: storage.Bucket, root: Path, store: StoreProcess) -> None:
    data = os.urandom(300_000)
    blob = bucket.blob("dir/sub/x y+z.bin")
    before = store.stats()["bytes_received"]
    blob.upload_from_string(data)  # uploadType=multipart, crc32c in the metadata
    assert (root / bucket.name / "dir" / "sub" / "x y+z.bin").read_bytes() == data
    assert store.stats()["bytes_received"] - before == len(data)
    assert (blob.size, blob.md5_hash, blob.crc32c) == (len(data), md5_b64(data), crc32c_b64(data))
    again = bucket.get_blob("dir/sub/x y+z.bin")  # the name travels as dir%2Fsub%2Fx%20y%2Bz.bin
    assert again is not None and again.download_as_bytes() == data


def test_resumable_uploads_round_trip(bucket: storage.Bucket, root: Path, store: StoreProcess) -> None:
    small, large = os.urandom(1 << 20), os.urandom((9 << 20) + 7)
    before = store.stats()["status"].get("308", 0)
    bucket.blob("unsized.bin", chunk_size=256 << 10).upload_from_file(io.BytesIO(small))  # bytes a-b/*
    bucket.blob("sized.bin", chunk_size=4 << 20).upload_from_file(io.BytesIO(large), size=len(large))
    bucket.blob("empty.bin", chunk_size=256 << 10).upload_from_file(io.BytesIO(b""))
    assert store.stats()["status"]["308"] - before == 4 + 2  # 308 until the last chunk
    assert (root / bucket.name / "unsized.bin").read_bytes() == small
    assert bucket.blob("sized.bin").download_as_bytes() == large
    assert bucket.blob("empty.bin").download_as_bytes() == b""
    assert os.listdir(root / ".wds-uploads") == []  # sessions are gone once complete
    blob = bucket.get_blob("sized.bin")
    assert blob is not None and blob.crc32c == crc32c_b64(large)


@pytest.mark.asyncio
async def test_raw_uploads(store: StoreProcess, bucket: storage.Bucket, root: Path) -> None:
    """What the client library does not send by itself: uploadType=media, a wrong checksum, a session's
    status query and its cancellation."""
    base = f"{store.gcs_endpoint}/upload/storage/v1/b/{bucket.name}/o"
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{base}?uploadType=media&name=m%2Fedia.bin", data=b"media body") as resp:
            meta = await resp.json()
        assert resp.status == 200 and meta["name"] == "m/edia.bin" and meta["md5Hash"] == md5_b64(b"media body")
        boundary = "wds-boundary"
        body = (f"--{boundary}\r\nContent-Type: application/json\r\n\r\n"
                + json.dumps({"name": "bad.bin", "crc32c": crc32c_b64(b"other")})
                + f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\npayload\r\n--{boundary}--")
        headers = {"Content-Type": f"multipart/related; boundary={boundary}"}
        async with http.post(f"{base}?uploadType=multipart", data=body.encode(), headers=headers) as resp:
            assert resp.status == 400 and "crc32c" in (await resp.json())["error"]["message"]
        async with http.post(f"{base}?uploadType=resumable", json={"name": "session.bin"}) as resp:
            session = resp.headers["Location"]
        async with http.put(session, data=b"x" * 10, headers={"Content-Range": "bytes 0-9/*"}) as resp:
            assert (resp.status, resp.headers["Range"]) == (308, "bytes=0-9")
        async with http.put(session, headers={"Content-Range": "bytes */*"}) as resp:
            assert (resp.status, resp.headers["Range"]) == (308, "bytes=0-9")  # a status query
        async with http.delete(session) as resp:
            assert resp.status == 499
        async with http.put(session, headers={"Content-Range": "bytes */*"}) as resp:
            assert resp.status == 404
    assert sorted(p.name for p in (root / bucket.name).rglob("*")) == ["edia.bin", "m"]


def test_delete_objects_and_buckets(client: storage.Client, bucket: storage.Bucket, root: Path) -> None:
    assert bucket.name in [b.name for b in client.list_buckets()]
    bucket.blob("a/b.txt").upload_from_string(b"x")
    with pytest.raises(exceptions.Conflict):
        bucket.delete()
    with pytest.raises(exceptions.Conflict):
        client.create_bucket(bucket.name)
    bucket.blob("a/b.txt").delete()
    assert not (root / bucket.name / "a").exists()
    with pytest.raises(exceptions.NotFound):
        bucket.blob("a/b.txt").delete()
    bucket.delete()
    assert not (root / bucket.name).exists()


# -- knobs on the GCS face ----------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_503_surfaces_as_json(root: Path) -> None:
    with StoreProcess(root, Knobs(fail_rate=1)) as store:
        client = gcs_client(store)
        try:
            blob = client.bucket(DATA).blob(SHARD)
            with pytest.raises(exceptions.ServiceUnavailable):
                blob.reload(retry=None)
            with pytest.raises(exceptions.ServiceUnavailable):
                blob.download_as_bytes(retry=None)
            client.bucket(DATA).blob("written.bin").upload_from_string(b"writes are never failed")
        finally:
            client.close()
        resp, body = await raw_get(f"{store.gcs_endpoint}/storage/v1/b/{DATA}/o/{SHARD}")
        counters = store.stats()
    os.unlink(root / DATA / "written.bin")
    assert resp.status == 503 and resp.headers["Retry-After"] == "0"
    assert json.loads(body)["error"]["code"] == 503
    assert counters["failed"] == counters["requests"] - 1 >= 3  # every request but the upload


@pytest.mark.asyncio
async def test_max_concurrent_refuses_media_not_metadata(root: Path) -> None:
    with StoreProcess(root, Knobs(max_concurrent=1)) as store:
        client = gcs_client(store)
        media = f"{store.gcs_endpoint}/download/storage/v1/b/{DATA}/o/{SHARD}?alt=media"
        try:
            async with aiohttp.ClientSession() as http:
                async with http.get(media + "&stall=60") as held:
                    await held.content.readexactly(1000)
                    refused, body = await raw_get(media)
                    blob = client.bucket(DATA).blob(SHARD)
                    blob.reload(retry=None)  # metadata: never refused
                    with pytest.raises(exceptions.ServiceUnavailable):
                        blob.download_as_bytes(retry=None)
                    held.close()
        finally:
            client.close()
        counters = store.stats()
    assert refused.status == 503 and refused.headers["Retry-After"] == "1"
    assert json.loads(body)["error"]["message"] == "Please reduce your request rate."
    assert counters["throttled"] == 2 and counters["peak_active"] == 1


def test_media_downloads_count_like_plain_gets(client: storage.Client, store: StoreProcess, root: Path) -> None:
    size = (root / DATA / SHARD).stat().st_size
    before = store.stats()
    client.bucket(DATA).blob(SHARD).download_as_bytes()
    after = store.stats()
    assert after["bytes_sent"] - before["bytes_sent"] == size
    assert after["requests"] - before["requests"] == 1


# -- https ---------------------------------------------------------------------------------------------


def test_https(root: Path) -> None:
    data = (root / DATA / SHARD).read_bytes()
    with StoreProcess(root, https=True) as store:
        client = gcs_client(store)
        try:
            assert SHARD in [b.name for b in client.list_blobs(DATA)]
            assert client.bucket(DATA).blob(SHARD).download_as_bytes() == data
            client.bucket(DATA).blob("tls.bin").upload_from_string(b"over tls")
        finally:
            client.close()
    assert (root / DATA / "tls.bin").read_bytes() == b"over tls"
    os.unlink(root / DATA / "tls.bin")
    assert store.stderr == ""
