"""The synthetic shard generator (``benchmarks.make_shards``): contents, manifest, determinism, gzip, reuse of
shards already written, and its size parser."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from benchmarks.make_shards import MANIFEST, make_shards, parse_size


def read_samples(path: Path) -> dict[str, dict[str, bytes]]:
    samples: dict[str, dict[str, bytes]] = {}
    with tarfile.open(path) as tar:
        for member in tar:
            key, ext = member.name.split(".", 1)
            assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (0, 0, 0, "", "")
            f = tar.extractfile(member)
            assert f is not None
            samples.setdefault(key, {})[ext] = f.read()
    return samples


def test_manifest_contents(tmp_path: Path) -> None:
    paths = make_shards(tmp_path, n_shards=3, shard_bytes=256 << 10, sample_bytes=20 << 10, seed=5)
    assert [p.name for p in paths] == ["shard-000000.tar", "shard-000001.tar", "shard-000002.tar"]
    manifest = json.loads((tmp_path / MANIFEST).read_text())
    assert manifest["params"] == {"n_shards": 3, "shard_bytes": 256 << 10, "sample_bytes": 20 << 10,
                                  "seed": 5, "gz": False, "prefix": "shard"}
    keys: list[str] = []
    for shard, (entry, path) in enumerate(zip(manifest["shards"], paths)):
        assert entry["name"] == path.name and entry["bytes"] == path.stat().st_size
        assert entry["bytes"] <= (256 << 10) + 10240  # tar pads to 10 KiB records
        samples = read_samples(path)
        assert len(samples) == entry["samples"] > 1
        for index, (key, sample) in enumerate(samples.items()):
            assert key == f"s{shard:06d}_{index:06d}"
            assert sorted(sample) == ["bin", "cls", "json"]
            meta = json.loads(sample["json"])
            assert meta["sha1"] == hashlib.sha1(sample["bin"]).hexdigest()
            assert (meta["shard"], meta["index"], meta["cls"]) == (shard, index, int(sample["cls"]))
            assert 0.8 * (20 << 10) - 1 <= len(sample["bin"]) <= 1.2 * (20 << 10)
        keys += samples
    assert len(set(keys)) == len(keys) == manifest["expected_samples"]
    assert manifest["total_bytes"] == sum(p.stat().st_size for p in paths)
    assert manifest["total_members"] == 3 * len(keys)


def test_shards_are_deterministic(tmp_path: Path) -> None:
    a = make_shards(tmp_path / "a", n_shards=2, shard_bytes=128 << 10, sample_bytes=10 << 10, seed=1)
    b = make_shards(tmp_path / "b", n_shards=3, shard_bytes=128 << 10, sample_bytes=10 << 10, seed=1)
    c = make_shards(tmp_path / "c", n_shards=2, shard_bytes=128 << 10, sample_bytes=10 << 10, seed=2)
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b[:2]]  # shard i depends on (seed, i)
    assert a[0].read_bytes() != c[0].read_bytes()


def test_gzip_shards(tmp_path: Path) -> None:
    a = make_shards(tmp_path / "a", n_shards=1, shard_bytes=64 << 10, sample_bytes=8 << 10, gz=True)
    b = make_shards(tmp_path / "b", n_shards=1, shard_bytes=64 << 10, sample_bytes=8 << 10, gz=True)
    assert a[0].name == "shard-000000.tar.gz"
    assert a[0].read_bytes() == b[0].read_bytes()
    plain = make_shards(tmp_path / "c", n_shards=1, shard_bytes=64 << 10, sample_bytes=8 << 10)
    assert read_samples(a[0]) == read_samples(plain[0])


def test_reuse_and_regenerate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.make_shards import main

    args = [str(tmp_path), "--shards", "3", "--shard-size", "64KB", "--sample-size", "8KB"]
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("wrote 3 shards")
    stamp = (tmp_path / "shard-000000.tar").stat().st_mtime_ns
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("reusing 3 shards")
    assert (tmp_path / "shard-000000.tar").stat().st_mtime_ns == stamp
    (tmp_path / "shard-000001.tar").write_bytes(b"damaged")
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("wrote")
    assert main([*args[:2], "2", *args[3:]]) == 0  # fewer shards: the stale one is removed
    assert sorted(p.name for p in tmp_path.iterdir()) == [MANIFEST, "shard-000000.tar", "shard-000001.tar"]


@pytest.mark.parametrize("text, expected", [("16MiB", 16 << 20), ("100KB", 100_000), ("100KiB", 100 << 10),
                                            ("4096", 4096), ("1.5GiB", 3 << 29), ("2mb", 2_000_000)])
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_rejects_junk() -> None:
    with pytest.raises(ValueError):
        parse_size("sixteen")
