"""``wds-async cp`` with object stores on both ends, against the local emulators (moto server for s3://,
gcp-storage-emulator for gs://, Azurite for az://): copies byte for byte into and out of a bucket and between the two, a
damaged source leaving no object and no pending upload behind, and resharding into a bucket with its
index written there too."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from benchmarks.make_shards import make_shards
from tests.emulators import MOTO_ENV, azurite_connection_string
from tests.integration.test_cli_cp import SHARDS, _samples
from wds_async.cli.main import main


@pytest.fixture()
def s3(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Any]:
    """A fresh bucket, the credentials in the environment as a user has them, and a client to look."""
    import boto3

    for name, value in {**MOTO_ENV, "AWS_ENDPOINT_URL_S3": moto_endpoint}.items():
        monkeypatch.setenv(name, value)
    bucket = f"wds-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    return bucket, client


@pytest.fixture()
def gs(gcs_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh bucket on the emulator (set after conftest's scrub of STORAGE_EMULATOR_HOST)."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": gcs_endpoint})
    return client.create_bucket(f"wds-{uuid.uuid4().hex[:16]}")


@pytest.fixture(scope="module")
def big_shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One shard of ~12 MiB: larger than a sink's 8 MiB part, so it goes up as a multipart upload."""
    root = tmp_path_factory.mktemp("big")
    make_shards(root, n_shards=1, shard_bytes=12 << 20, sample_bytes=256 << 10, seed=3, prefix="big")
    return root / "big-000000.tar"


def _get(client: Any, bucket: str, key: str) -> bytes:
    return client.get_object(Bucket=bucket, Key=key)["Body"].read()  # type: ignore[no-any-return]


def test_local_to_s3_and_back(s3: tuple[str, Any], shard_dir: Path, big_shard: Path, tmp_path: Path) -> None:
    bucket, client = s3
    sources = [str(shard_dir / SHARDS[0]), str(shard_dir / SHARDS[1]), str(big_shard)]
    assert main(["cp", "-q", *sources, f"s3://{bucket}/copy/"]) == 0
    for src in sources:
        assert _get(client, bucket, f"copy/{Path(src).name}") == Path(src).read_bytes()
    assert main(["cp", "-q", f"s3://{bucket}/copy/*.tar", f"{tmp_path}/"]) == 0  # a glob of the bucket
    for src in sources:
        assert (tmp_path / Path(src).name).read_bytes() == Path(src).read_bytes()


def test_a_truncated_source_leaves_no_object_and_no_upload(s3: tuple[str, Any], big_shard: Path, shard_dir: Path,
                                                           tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bucket, client = s3
    cut = tmp_path / "cut.tar"
    cut.write_bytes(big_shard.read_bytes()[: 10 << 20])  # past the first part: an upload was under way
    assert main(["cp", "--json", str(cut), str(shard_dir / SHARDS[0]), f"s3://{bucket}/d/"]) == 1
    assert '"error_type": "TruncatedShard"' in capsys.readouterr().out
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", [])]
    assert keys == [f"d/{SHARDS[0]}"]
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_a_missing_bucket_fails_each_copy_and_a_reshard(s3: tuple[str, Any], shard_dir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"wds-missing-{uuid.uuid4().hex[:8]}"
    shards = str(shard_dir / "shard-{000000..000001}.tar")
    assert main(["cp", "--json", shards, f"s3://{missing}/d/"]) == 1
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["ok"], missing in r["error"]) for r in rows] == [(False, True)] * 2
    assert main(["cp", "-q", "--maxcount", "10", shards, f"s3://{missing}/o-%03d.tar"]) == 1
    captured = capsys.readouterr()
    assert "wds-async cp: error: writing the shards failed" in captured.err and missing in captured.err
    assert captured.out.splitlines()[-1].startswith("FAIL ")  # what the writer had not finished


def test_an_index_that_cannot_be_written_is_exit_1_after_the_copies(s3: tuple[str, Any], shard_dir: Path,
                                                                    tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    missing = f"wds-missing-{uuid.uuid4().hex[:8]}"
    assert main(["cp", "-q", "--index", f"s3://{missing}/i.jsonl", str(shard_dir / SHARDS[0]), f"{tmp_path}/"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("wds-async cp: error: writing the index failed") and missing in err
    assert (tmp_path / SHARDS[0]).read_bytes() == (shard_dir / SHARDS[0]).read_bytes()


def test_s3_to_gs_to_local(s3: tuple[str, Any], gs: Any, shard_dir: Path, tmp_path: Path) -> None:
    bucket, client = s3
    for name in SHARDS[:3]:
        client.put_object(Bucket=bucket, Key=f"src/{name}", Body=(shard_dir / name).read_bytes())
    assert main(["cp", "-q", f"s3://{bucket}/src/shard-{{000000..000002}}.tar", f"gs://{gs.name}/mirror/"]) == 0
    for name in SHARDS[:3]:
        assert gs.blob(f"mirror/{name}").download_as_bytes() == (shard_dir / name).read_bytes()
    assert main(["cp", "-q", f"gs://{gs.name}/mirror/*.tar", f"{tmp_path}/"]) == 0
    for name in SHARDS[:3]:
        assert (tmp_path / name).read_bytes() == (shard_dir / name).read_bytes()


def test_reshard_locally_with_the_index_in_a_bucket(s3: tuple[str, Any], shard_dir: Path, tmp_path: Path) -> None:
    from wds_async.index.format import ShardIndex

    bucket, _ = s3
    assert main(["cp", "-q", "--maxcount", "10", "--index", f"s3://{bucket}/index.jsonl.gz",
                 str(shard_dir / "shard-{000000..000001}.tar"), str(tmp_path / "part-%03d.tar")]) == 0
    index = ShardIndex.load(f"s3://{bucket}/index.jsonl.gz")
    outputs = sorted(tmp_path.glob("part-*.tar"))
    assert [e.url for e in index.shards] == [str(p) for p in outputs] and len(outputs) > 2
    assert index.total_samples == len(_samples([shard_dir / n for n in SHARDS[:2]]))


def test_reshard_into_a_bucket_with_its_index(s3: tuple[str, Any], shard_dir: Path, tmp_path: Path) -> None:
    from wds_async.errors import UrlError
    from wds_async.index.format import ShardIndex
    from wds_async.write.writer import TarWriter

    bucket, client = s3
    try:
        TarWriter(f"s3://{bucket}/probe.tar").close()
    except UrlError as exc:  # issue 12 part 2 brings store writers; until then a reshard cannot write there
        pytest.skip(f"TarWriter does not write to stores yet: {exc}")
    assert main(["cp", "-q", "--maxcount", "10", "--index", f"s3://{bucket}/out/index.jsonl.gz",
                 str(shard_dir / "shard-{000000..000001}.tar"), f"s3://{bucket}/out/part-%03d.tar"]) == 0
    index = ShardIndex.load(f"s3://{bucket}/out/index.jsonl.gz")
    names = [e.url.rsplit("/", 1)[-1] for e in index.shards]
    assert names == [f"part-{i:03d}.tar" for i in range(len(names))] and len(names) > 2
    for name in names:
        (tmp_path / name).write_bytes(_get(client, bucket, f"out/{name}"))
    assert _samples([tmp_path / n for n in names]) == _samples([shard_dir / n for n in SHARDS[:2]])


def test_local_to_azure_and_back(azurite_endpoint: str, monkeypatch: pytest.MonkeyPatch, shard_dir: Path,
                                 big_shard: Path, tmp_path: Path) -> None:
    from azure.storage.blob import BlobServiceClient

    conn = azurite_connection_string(azurite_endpoint)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    container = f"wds{uuid.uuid4().hex[:16]}"
    with BlobServiceClient.from_connection_string(conn) as service:
        service.create_container(container)
        sources = [shard_dir / SHARDS[0], big_shard]  # the big one goes up as several blocks
        assert main(["cp", "-q", *map(str, sources), f"az://{container}/d/"]) == 0
        for src in sources:
            blob = service.get_blob_client(container, f"d/{src.name}")
            assert blob.download_blob().readall() == src.read_bytes()
    assert main(["cp", "-q", f"az://{container}/d/*.tar", f"{tmp_path}/"]) == 0
    for src in sources:
        assert (tmp_path / src.name).read_bytes() == src.read_bytes()
