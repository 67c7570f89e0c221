"""Shards that exercise webdataset's naming rules, shared by the differential tests; the plain ``shards`` of the
drop-in name tests (``test_names.py``, ``test_names_fields_and_caches.py``)."""

from __future__ import annotations

import gzip
import io
import tarfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

LONG = "d" * 60 + "/" + "e" * 70  # a member path longer than 100 characters


def tricky_members(shard: int) -> list[tuple[str, bytes]]:
    """Members with dots in directory names, upper-case extensions, directories, multi-part extensions and
    long names; consecutive members of one key form one sample."""
    out: list[tuple[str, bytes]] = []
    for i in range(6):
        key = f"s{shard}_{i}"
        out += [
            (f"{key}.txt", f"text {shard} {i}".encode()),
            (f"{key}.CLS", str(i).encode()),
            (f"{key}.seg.png", bytes([i]) * 7),
            (f"{key}.json", b'{"a": %d}' % i),
        ]
    out += [
        ("dir.with.dots/sample.one.txt", b"dotted"),
        ("dir.with.dots/sample.one.JSON", b"[1]"),
        (f"{LONG}/k.txt", b"long"),
        (f"{LONG}/k.bin", b"\x00\x01"),
        ("a/b/c.x.y.z", b"multi"),
    ]
    return out


def write_tar(path: Path, members: Iterable[tuple[str, bytes]], gz: bool = False) -> Path:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            tf.addfile(info, io.BytesIO(data))
    raw = buf.getvalue()
    path.write_bytes(gzip.compress(raw, mtime=0) if gz else raw)
    return path


@pytest.fixture(scope="session")
def tricky_shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("tricky")
    paths = [write_tar(root / "t-000.tar", tricky_members(0)),
             write_tar(root / "t-001.tgz", tricky_members(1), gz=True),
             write_tar(root / "t-002.tar.gz", tricky_members(2), gz=True)]
    return [str(p) for p in paths]


def reference(urls: list[str], build: Any = None) -> list[Any]:
    """What webdataset 1.0.2 yields for ``urls`` (in shard order), warnings of its own silenced."""
    import webdataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = webdataset.WebDataset(urls, shardshuffle=False, nodesplitter=None)
        if build is not None:
            ds = build(ds)
        return list(ds)


def ours(urls: list[str], build: Any = None, **kw: Any) -> list[Any]:
    import wds_async

    ds = wds_async.WebDataset(urls, deterministic=True, **kw)
    if build is not None:
        ds = build(ds)
    return list(ds)


def strip_local(samples: Iterator[Any]) -> list[Any]:
    """webdataset adds ``__local_path__`` for local files; compare without it."""
    return [{k: v for k, v in s.items() if k != "__local_path__"} if isinstance(s, dict) else s for s in samples]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three plain shards; keys sort in tar order, and every sample has the same four fields."""
    root = tmp_path_factory.mktemp("names")
    paths = []
    for j in range(3):
        members: list[tuple[str, bytes]] = []
        for i in range(12):
            key = f"s{j}_{i:03d}"
            members += [(f"{key}.txt", f"text {j} {i}".encode()), (f"{key}.cls", str(i % 5).encode()),
                        (f"{key}.png", bytes([j, i]) * 3), (f"{key}.json", b'{"i": %d}' % i)]
        paths.append(str(write_tar(root / f"n-{j:03d}.tar", members)))
    return paths
