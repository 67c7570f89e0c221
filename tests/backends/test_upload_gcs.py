"""The upload suite for ``gs://`` (resumable sessions) on gcp-storage-emulator, behind a fault proxy, plus
the chunk a session persisted only in part."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import wds_async as wds
from tests.backends.upload_contract import FAST, UploadContract, UploadEnv, make_samples, read_back
from tests.backends.upload_faults import Fault, FaultProxy, faults, query
from wds_async.write.sinks import open_sink
from wds_async.write.sinks.gcs import CHUNK_UNIT

_JSON = {"Content-Type": "application/json"}


def _error(status: int, message: str) -> bytes:
    return json.dumps({"error": {"code": status, "message": message}}).encode()


def is_chunk(method: str, path: str) -> bool:
    return method == "PUT" and "upload_id" in query(path)


@pytest.fixture(scope="module")
def proxy(gcs_endpoint: str) -> Iterator[FaultProxy]:
    with FaultProxy(gcs_endpoint) as server:
        yield server


@pytest.fixture()
def bucket(gcs_endpoint: str, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch) -> Any:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)  # what the sinks and readers use
    client = storage.Client(project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": gcs_endpoint})
    return client.create_bucket(f"wds-{uuid.uuid4().hex[:16]}")


@pytest.fixture()
def up(bucket: Any, proxy: FaultProxy) -> UploadEnv:
    from google.api_core.exceptions import NotFound

    def read(name: str) -> bytes | None:
        try:
            return bucket.blob(name).download_as_bytes()  # type: ignore[no-any-return]
        except NotFound:
            return None

    return UploadEnv(url=lambda name: f"gs://{bucket.name}/{name}", read=read, proxy=proxy, is_part=is_chunk,
                     transient=(503, _JSON, _error(503, "injected: backend busy")),
                     broken=(500, _JSON, _error(500, "injected: internal error")), part_bytes=CHUNK_UNIT)


class TestGcsUpload(UploadContract):
    pass


def _persist_a_prefix(cut: list[int]) -> Callable[[dict[str, str], bytes], tuple[dict[str, str], bytes]]:
    """The chunk as far as its first 256 KiB: what a session keeps of a request cut short (the chunk's
    length goes to ``cut``)."""

    def forward(headers: dict[str, str], body: bytes) -> tuple[dict[str, str], bytes]:
        cut.append(len(body))
        start = int(re.match(r"bytes (\d+)-", headers["Content-Range"]).group(1))  # type: ignore[union-attr]
        return {**headers, "Content-Range": f"bytes {start}-{start + CHUNK_UNIT - 1}/*"}, body[:CHUNK_UNIT]

    return forward


@pytest.mark.parametrize("which", [2, 5], ids=["middle-chunk", "final-chunk"])
def test_a_chunk_persisted_in_part_is_resumed_from_there(up: UploadEnv, which: int) -> None:
    part = 2 * CHUNK_UNIT
    samples = make_samples(36, part // 8, seed=5)  # 2.4 MB: 4 full chunks, then a final one over 256 KiB
    cut: list[int] = []
    rule = Fault(is_chunk, which={which}, status=503, headers=_JSON, body=_error(503, "cut"),
                 forward=_persist_a_prefix(cut))
    with faults(up.proxy, rule):
        writer = wds.TarWriter(up.url("resumed.tar"), part_bytes=part, retry=FAST, mtime=1)
        with writer:
            for sample in samples:
                writer.write(sample)
    assert rule.failed == 1 and writer.stream.retries == 1 and cut[0] > CHUNK_UNIT  # persisted in part
    assert read_back([up.url("resumed.tar")]) == [(s["__key__"], s["bin"], s["txt"].encode()) for s in samples]


def test_sizes_and_small_objects(up: UploadEnv) -> None:
    for size in (0, 5, CHUNK_UNIT, 2 * CHUNK_UNIT):  # empty, short, and whole chunks that end the object
        sink = open_sink(up.url(f"size-{size}"), part_bytes=CHUNK_UNIT)
        sink.write(b"z" * size)
        sink.close()
        assert up.read(f"size-{size}") == b"z" * size
    with pytest.raises(ValueError, match="256 KiB"):
        open_sink(up.url("x"), part_bytes=CHUNK_UNIT + 1)
