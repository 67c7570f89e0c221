"""IndexedWebDataset against real local servers: random indices equal the streamed samples byte for byte, batches
survive 503s and cut connections, a mismatched index is named, bad input is a clear error."""

from __future__ import annotations

import gc
import json
import os
import random
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from emustore import Knobs, StoreProcess
from tests.conftest import engine_threads, wait_until

N_SHARDS = 6
PER_SHARD = 40
RETRY = wds.RetryPolicy(attempts=60, base_delay=0.0, max_delay=0.005)


def _write(root: Path, seed: int = 0, n_shards: int = N_SHARDS, per_shard: int = PER_SHARD) -> list[Path]:
    """Shards of samples of varied sizes (a .bin, a .txt, every third one a .json) and index.jsonl beside them."""
    rng = random.Random(seed)
    with wds.ShardWriter(str(root / "shard-%06d.tar"), maxcount=per_shard, index=str(root / "index.jsonl"),
                         verbose=0) as out:
        for i in range(n_shards * per_shard):
            sample = {"__key__": f"s{seed}_{i:05d}", "bin": rng.randbytes(rng.randrange(1, 12000)),
                      "txt": f"sample {i}".encode()}
            if i % 3 == 0:
                sample["json"] = json.dumps({"i": i}).encode()
            out.write(sample)
    return sorted(root.glob("shard-*.tar"))


def _plain(sample: Any, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    return {k: v for k, v in sample.items() if k not in skip}


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("indexed")
    _write(root)
    return root


@pytest.fixture(scope="module")
def served(shards: Path) -> Iterator[tuple[StoreProcess, list[str], wds.ShardIndex]]:
    with StoreProcess(shards, Knobs(seed=3)) as store:
        urls = [store.base_url + p.name for p in sorted(shards.glob("shard-*.tar"))]
        yield store, urls, wds.build_index(urls)


def _check_random(ds: wds.IndexedWebDataset, streamed: list[Any], n: int, seed: int = 0, batch: int = 64,
                  skip: tuple[str, ...] = ()) -> None:
    rng = random.Random(seed)
    indices = [rng.randrange(-len(ds), len(ds)) for _ in range(n)]
    got: list[Any] = []
    for lo in range(0, n, batch):
        got += ds.__getitems__(indices[lo:lo + batch])
    assert [_plain(s, skip) for s in got] == [_plain(streamed[i], skip) for i in indices]


def test_local_files_random_indices_equal_the_stream(shards: Path) -> None:
    urls = [str(p) for p in sorted(shards.glob("shard-*.tar"))]
    streamed = list(wds.WebDataset(urls))
    ds = wds.IndexedWebDataset(urls, index=shards / "index.jsonl")
    assert len(ds) == len(streamed) == N_SHARDS * PER_SHARD
    assert "__local_path__" in ds[0] and _plain(ds[0]) == _plain(streamed[0])
    _check_random(ds, streamed, 2000)
    assert _plain(ds[-1]) == _plain(streamed[-1]) and _plain(ds[-len(ds)]) == _plain(streamed[0])


def test_store_random_indices_equal_the_stream_and_neighbours_share_a_request(served: Any) -> None:
    _, urls, index = served
    streamed = list(wds.WebDataset(urls))
    ds = wds.IndexedWebDataset(urls, index=index)
    _check_random(ds, streamed, 2000, seed=1)
    ds.close()
    requests = ds.stats()["requests"] if ds.stats() else None
    fresh = wds.IndexedWebDataset(urls, index=index)
    got = fresh.__getitems__(list(range(10, 30)))  # neighbours in one shard: one ranged request
    assert [_plain(s) for s in got] == [_plain(s) for s in streamed[10:30]]
    assert fresh.stats()["requests"] == 1, requests
    # the same index twice in a batch: equal samples, distinct dicts
    a, b = fresh.__getitems__([5, 5])
    assert _plain(a) == _plain(b) == _plain(streamed[5]) and a is not b
    fresh.close()


def test_a_dataset_dropped_without_close_stops_its_engine(served: Any) -> None:
    # Users build a dataset per evaluation and let it go out of scope: its loop thread, connections and buffered
    # bytes must go with it, not pile up for the rest of the process.
    _, urls, index = served
    before = set(engine_threads())
    ds = wds.IndexedWebDataset(urls, index=index)
    assert len(ds.__getitems__([0, 1, PER_SHARD])) == 3
    started = set(engine_threads()) - before
    assert len(started) == 1
    del ds
    gc.collect()
    assert wait_until(lambda: not any(t.is_alive() for t in started))


def test_getitems_under_503s_and_cut_connections(served: Any) -> None:
    _, urls, index = served
    streamed = list(wds.WebDataset(urls))
    faulty = [u + "?fail_rate=0.3&drop_rate=0.3" for u in urls]
    ds = wds.IndexedWebDataset(faulty, index=index, retry=RETRY)
    _check_random(ds, streamed, 600, seed=2, batch=50, skip=("__url__",))  # the URLs carry the fault knobs
    stats = ds.stats()
    assert stats["retries"] > 0 and stats["throttled"] > 0


def test_index_from_a_url(served: Any, shards: Path) -> None:
    store, urls, _ = served
    (shards / "http-index.jsonl").write_bytes(wds.build_index(urls).dumps())
    ds = wds.IndexedWebDataset(urls, index=store.base_url + "http-index.jsonl")
    assert len(ds) == N_SHARDS * PER_SHARD
    assert _plain(ds[PER_SHARD + 1]) == _plain(list(wds.WebDataset(urls[1]))[1])


def test_a_rewritten_shard_fails_with_object_changed_naming_it(tmp_path: Path) -> None:
    _write(tmp_path)
    with StoreProcess(tmp_path, Knobs()) as store:
        urls = [store.base_url + p.name for p in sorted(tmp_path.glob("shard-*.tar"))]
        ds = wds.IndexedWebDataset(urls, index=wds.build_index(urls))
        assert ds[3]["__key__"] == "s0_00003"
        other = tmp_path / "other"
        other.mkdir()
        _write(other, seed=9)
        os.replace(other / "shard-000002.tar", tmp_path / "shard-000002.tar")
        with pytest.raises(wds.ObjectChanged) as caught:
            ds[2 * PER_SHARD + 1]
        assert "shard-000002.tar" in str(caught.value) or "shard-000002.tar" in (caught.value.url or "")
        assert ds[4]["__key__"] == "s0_00004"  # the other shards still read, on a fresh engine


def test_an_index_of_the_same_sizes_but_other_samples_is_named(tmp_path: Path) -> None:
    """A local index whose offsets do not fall on this shard's samples (same shard count and sizes, other
    keys): the sample's key is checked against the index's."""
    _write(tmp_path)
    index = wds.ShardIndex.load(tmp_path / "index.jsonl")
    entries = [wds.ShardEntry(**{**e.__dict__, "keys": tuple("x" + k for k in e.keys)}) for e in index.shards]
    urls = [str(p) for p in sorted(tmp_path.glob("shard-*.tar"))]
    ds = wds.IndexedWebDataset(urls, index=wds.ShardIndex(entries))
    with pytest.raises(wds.ShardFormatError, match=r"shard-000000\.tar.*index says 'xs0_00007'"):
        ds[7]


def test_an_index_with_another_shard_count_names_the_shard(tmp_path: Path) -> None:
    _write(tmp_path)
    urls = [str(p) for p in sorted(tmp_path.glob("shard-*.tar"))]
    short = wds.ShardIndex(wds.ShardIndex.load(tmp_path / "index.jsonl").shards[:-1])
    with pytest.raises(ValueError, match=rf"no entry for .*shard-{N_SHARDS - 1:06d}\.tar"):
        wds.IndexedWebDataset(urls, index=short)
    with pytest.raises(ValueError, match=r"no entry for .*elsewhere\.tar"):
        wds.IndexedWebDataset([*urls[:2], str(tmp_path / "elsewhere.tar")], index=tmp_path / "index.jsonl")


def test_bad_index_files_and_indices(tmp_path: Path, shards: Path) -> None:
    urls = [str(p) for p in sorted(shards.glob("shard-*.tar"))]
    wids_style = tmp_path / "dataset.json"
    wids_style.write_text(json.dumps({"wids_version": 1, "shardlist": [{"url": urls[0], "nsamples": 40}]}))
    with pytest.raises(ValueError, match="is not a wds-async index"):
        wds.IndexedWebDataset(urls, index=wids_style)
    lines = (shards / "index.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    future = tmp_path / "future.jsonl"
    future.write_text("\n".join([json.dumps({**header, "version": 99}), *lines[1:]]) + "\n")
    with pytest.raises(ValueError, match="version 99 index"):
        wds.IndexedWebDataset(urls, index=future)
    ds = wds.IndexedWebDataset(urls, index=shards / "index.jsonl")
    n = len(ds)
    with pytest.raises(IndexError, match=f"index {n} out of range"):
        ds[n]
    with pytest.raises(IndexError, match=f"index {-n - 1} out of range"):
        ds.__getitems__([0, -n - 1])
    with pytest.raises(TypeError, match="must be integers"):
        ds["3"]  # type: ignore[index]
    with pytest.raises(TypeError, match="must be integers"):
        ds.__getitems__([1.0])  # type: ignore[list-item]
    assert ds[-1]["__key__"] == f"s0_{n - 1:05d}"
    assert [s["__key__"] for s in ds[2:5]] == ["s0_00002", "s0_00003", "s0_00004"]
    with pytest.raises(TypeError, match="index must be"):
        wds.IndexedWebDataset(urls, index=3)  # type: ignore[arg-type]


def test_per_sample_stages(shards: Path) -> None:
    urls = [str(p) for p in sorted(shards.glob("shard-*.tar"))]
    ds = wds.IndexedWebDataset(urls, index=shards / "index.jsonl")
    assert ds.decode().to_tuple("txt", "bin")[3][0] == "sample 3"
    assert ds.map(lambda s: s["__key__"])[7] == "s0_00007"
    assert ds.decode().map_dict(txt=str.upper)[9]["txt"] == "SAMPLE 9"
    assert ds.to_tuple("txt").map_tuple(len).__getitems__([0, 11]) == [(8,), (9,)]
    assert "txt" in ds[0]  # the stages made copies; the original is unchanged
    with pytest.raises(ValueError, match="one item per index"):
        ds.map(lambda s: None)[0]


def test_cache_second_epoch_takes_no_store_bytes(served: Any, tmp_path: Path) -> None:
    store, urls, index = served
    streamed = list(wds.WebDataset(urls))
    ds = wds.IndexedWebDataset(urls, index=index, cache_dir=tmp_path / "cache")

    def sent() -> int:
        with urllib.request.urlopen(store.base_url + "_stats") as answer:
            return int(json.load(answer)["bytes_sent"])

    order = list(range(len(ds)))
    random.Random(4).shuffle(order)
    _check = [_plain(s) for lo in range(0, len(order), 64) for s in ds.__getitems__(order[lo:lo + 64])]
    assert _check == [_plain(streamed[i]) for i in order]
    before = sent()
    again = wds.IndexedWebDataset(urls, index=index, cache_dir=tmp_path / "cache")  # a new process's view
    second = [_plain(s) for lo in range(0, len(order), 64) for s in again.__getitems__(order[lo:lo + 64])]
    assert second == _check
    assert sent() == before


@pytest.mark.parametrize("workers,cached", [(0, False), (2, False), (2, True)])
def test_dataloader_random_order_every_sample_once(served: Any, workers: int, cached: bool, tmp_path: Path) -> None:
    """Workers open their own engines; with a cache both fill it at once (one takes the lock, the other waits)."""
    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, RandomSampler

    _, urls, index = served
    streamed = {s["__key__"]: _plain(s) for s in wds.WebDataset(urls)}
    ds = wds.IndexedWebDataset(urls, index=index, cache_dir=tmp_path / "c" if cached else None)
    loader = DataLoader(ds, batch_size=16, num_workers=workers, collate_fn=list,
                        sampler=RandomSampler(ds, generator=torch.Generator().manual_seed(0)))
    seen = [_plain(s) for batch in loader for s in batch]
    assert sorted(s["__key__"] for s in seen) == sorted(streamed)
    assert all(streamed[s["__key__"]] == s for s in seen)


def _cloud_roundtrip(urls: list[str], local: list[Path], **options: Any) -> None:
    streamed = list(wds.WebDataset([str(p) for p in local]))
    index = wds.build_index(urls)
    ds = wds.IndexedWebDataset(urls, index=index, **options)
    got = _check_random_remote(ds, len(streamed))
    assert [{k: v for k, v in _plain(s).items() if k != "__url__"} for s in got[1]] == [
        {k: v for k, v in _plain(streamed[i]).items() if k not in ("__url__", "__local_path__")} for i in got[0]]


def _check_random_remote(ds: wds.IndexedWebDataset, n: int) -> tuple[list[int], list[Any]]:
    rng = random.Random(5)
    indices = [rng.randrange(n) for _ in range(2000)]
    got: list[Any] = []
    for lo in range(0, len(indices), 100):
        got += ds.__getitems__(indices[lo:lo + 100])
    return indices, got


def _upload(put: Callable[[str, bytes], Any], shards: Path) -> list[Path]:
    local = sorted(shards.glob("shard-*.tar"))
    for p in local:
        put(p.name, p.read_bytes())
    return local


def test_s3_moto(moto_endpoint: str, shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3

    from tests.emulators import MOTO_ENV

    for name, value in {**MOTO_ENV, "AWS_ENDPOINT_URL_S3": moto_endpoint}.items():
        monkeypatch.setenv(name, value)
    bucket = f"wds-{uuid.uuid4().hex[:12]}"
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    local = _upload(lambda name, data: client.put_object(Bucket=bucket, Key=name, Body=data), shards)
    _cloud_roundtrip([f"s3://{bucket}/{p.name}" for p in local], local)


def test_gcs_emulator(gcs_endpoint: str, shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options={"api_endpoint": gcs_endpoint})
    bucket = client.create_bucket(f"wds-{uuid.uuid4().hex[:16]}")
    local = _upload(lambda name, data: bucket.blob(name).upload_from_string(data), shards)
    # gcp-storage-emulator stalls for a second per request beyond a handful at once (its accept backlog fills):
    # a few connections keep it answering; concurrency is exercised against the other stores.
    _cloud_roundtrip([f"gs://{bucket.name}/{p.name}" for p in local], local, max_connections=4)


def test_azurite(azurite_endpoint: str, shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from azure.storage.blob import BlobServiceClient

    from tests.emulators import azurite_connection_string

    conn = azurite_connection_string(azurite_endpoint)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    container = f"wds{uuid.uuid4().hex[:16]}"
    with BlobServiceClient.from_connection_string(conn) as service:
        service.create_container(container)
        client = service.get_container_client(container)
        local = _upload(lambda name, data: client.upload_blob(name, data, overwrite=True), shards)
        _cloud_roundtrip([f"az://{container}/{p.name}" for p in local], local)
