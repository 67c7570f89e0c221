"""wds_async.compat.wids against the wids package itself on the emulated store: the same samples for the same
indices, from a list or a JSON descriptor, with an index (ranged reads, no whole shard) or without (whole shards
into the cache, as wids does); its samplers give wids' permutations."""

from __future__ import annotations

import json
import random
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from emustore import Knobs, StoreProcess
from tests.data.test_indexed import _write
from wds_async import wids as ours

wids = pytest.importorskip("wids")

N_SHARDS, PER_SHARD = 4, 30


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StoreProcess, list[str], Path]]:
    root = tmp_path_factory.mktemp("wids")
    _write(root, n_shards=N_SHARDS, per_shard=PER_SHARD)
    with StoreProcess(root, Knobs()) as store:
        urls = [store.base_url + p.name for p in sorted(root.glob("shard-*.tar"))]
        (root / "http-index.jsonl").write_bytes(wds.build_index(urls).dumps())
        desc = {"wids_version": 1, "name": "t", "wds_async_index": "http-index.jsonl",
                "shardlist": [{"url": Path(u).name, "nsamples": PER_SHARD} for u in urls]}
        (root / "dataset.json").write_text(json.dumps(desc))
        (root / "plain.json").write_text(json.dumps({k: v for k, v in desc.items() if k != "wds_async_index"}))
        yield store, urls, root


def _sent(store: StoreProcess) -> int:
    with urllib.request.urlopen(store.base_url + "_stats") as answer:
        return int(json.load(answer)["bytes_sent"])


def _values(sample: dict[str, Any]) -> dict[str, Any]:
    """A wids sample with its field streams read (both sides give io.BytesIO)."""
    return {k: (type(v).__name__, v.getvalue()) if hasattr(v, "getvalue") else v for k, v in sample.items()}


def _reference(urls: list[str], tmp_path: Path) -> Any:
    return wids.ShardListDataset([{"url": u, "nsamples": PER_SHARD} for u in urls], cache_dir=str(tmp_path / "ref"),
                                 transformations=[])


def test_same_samples_as_wids_with_an_index_and_no_whole_shard(served: Any, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    store, urls, root = served
    ref = _reference(urls, tmp_path)
    indices = [random.Random(0).randrange(len(ref)) for _ in range(200)]
    expected = [ref[i] for i in indices]
    before = _sent(store)
    ds = ours.ShardListDataset(store.base_url + "dataset.json", transformations=[])
    assert ds.index is not None and len(ds) == len(ref) == N_SHARDS * PER_SHARD
    got = [s for lo in range(0, 200, 50) for s in ds.__getitems__(indices[lo:lo + 50])]
    assert [_values(s) for s in got] == [_values(s) for s in expected]
    shard_bytes = sum(p.stat().st_size for p in root.glob("shard-*.tar"))
    assert _sent(store) - before < shard_bytes  # sample ranges, not whole shards
    assert set(got[0]) == {".bin", ".txt", "__key__", "__dataset__", "__index__", "__shard__", "__shardindex__"} | (
        {".json"} if ".json" in got[0] else set())


def test_without_an_index_whole_shards_go_to_the_cache(served: Any, tmp_path: Path) -> None:
    store, urls, _ = served
    ref = _reference(urls, tmp_path)
    ds = ours.ShardListDataset(store.base_url + "plain.json", transformations=[], cache_dir=str(tmp_path / "c"))
    assert ds.index is None
    order = list(range(len(ds)))
    random.Random(1).shuffle(order)
    assert [_values(ds[i]) for i in order[:40]] == [_values(ref[i]) for i in order[:40]]
    assert len(list((tmp_path / "c").glob("*"))) >= N_SHARDS  # the copies
    again = ours.ShardListDataset(store.base_url + "plain.json", transformations=[], cache_dir=str(tmp_path / "c"))
    before = _sent(store)  # after reading the descriptor
    assert [_values(s) for s in again.__getitems__(order[40:])] == [_values(ref[i]) for i in order[40:]]
    assert _sent(store) == before  # the layout is learned from the copies, the samples read from them


def test_transformations_and_bad_descriptors(served: Any, tmp_path: Path) -> None:
    _, urls, root = served
    ds = ours.ShardListDataset([{"url": u, "nsamples": PER_SHARD} for u in urls], index=root / "http-index.jsonl")
    assert ds[0][".txt"] == "sample 0"  # "PIL": wds-async's decoder, as wids decodes text
    assert ds.add_transform(lambda s: s["__key__"])[1] == "s0_00001"
    bad = tmp_path / "v2.json"
    bad.write_text(json.dumps({"wids_version": 2, "shardlist": [{"url": urls[0], "nsamples": 1}]}))
    with pytest.raises(ValueError, match="'wids_version' must be 1"):
        ours.ShardListDataset(str(bad))
    wrong = [{"url": u, "nsamples": PER_SHARD + 1} for u in urls]
    with pytest.raises(ValueError, match="the shard list says 31 samples but the index holds 30"):
        ours.ShardListDataset(wrong, index=root / "http-index.jsonl")
    with pytest.raises(ValueError, match="needs 'nsamples'"):
        ours.ShardListDataset([{"url": urls[0]}])


@pytest.mark.parametrize("epoch", [0, 1, 2])
def test_chunked_samplers_give_wids_permutations(served: Any, tmp_path: Path, epoch: int) -> None:
    _, urls, _ = served
    ref = _reference(urls, tmp_path)
    for kw in ({"chunksize": 7, "seed": 3}, {"chunksize": 50, "shufflefirst": True}, {"shuffle": False}):
        a, b = ours.ChunkedSampler(ref, **kw), wids.ChunkedSampler(ref, **kw)  # type: ignore[arg-type]
        a.set_epoch(epoch)
        b.set_epoch(epoch)
        assert list(a) == list(b) and len(a) == len(b)
    shares = []
    for rank in range(3):  # explicit ranks are honoured (wids falls back to one process without torch.distributed)
        mine = ours.DistributedChunkedSampler(ref, num_replicas=3, rank=rank, chunksize=9, seed=1)
        assert len(mine) == 40
        theirs = wids.ChunkedSampler(ref, dslength_per_replica=40, num_samples=(40 * rank, 40 * rank + 40),
                                     chunksize=9, seed=1)
        mine.set_epoch(epoch)
        theirs.set_epoch(epoch)
        shares.append(list(mine))
        assert shares[-1] == list(theirs)
    assert sorted(i for share in shares for i in share) == list(range(len(ref)))
    a2, b2 = ours.ShardListSampler(ref, seed=5), wids.wids.ShardListSampler(ref, seed=5)
    for _ in range(2):
        assert list(a2) == list(b2)


def test_chunked_sampler_order_is_read_ahead_with_the_same_samples(served: Any) -> None:
    store, _, _ = served
    ds = ours.ShardListDataset(store.base_url + "dataset.json", transformations=[])
    plain = ours.ShardListDataset(store.base_url + "dataset.json", transformations=[])
    sampler = ours.ChunkedSampler(ds, chunksize=16, seed=2, shufflefirst=True)
    assert ds._order is sampler and plain._order is None
    order = list(ours.ChunkedSampler(plain, chunksize=16, seed=2, shufflefirst=True))
    got = [s for lo in range(0, len(order), 10) for s in ds.__getitems__(order[lo:lo + 10])]
    assert ds._proc is not None and ds._proc.ahead is not None
    assert [_values(s) for s in got] == [_values(plain[i]) for i in order]
