"""Synthetic WebDataset shards, byte-for-byte reproducible from a seed.

    python -m benchmarks.make_shards OUTDIR --shards 16 --shard-size 16MiB --sample-size 100KiB [--seed 0] [--gz]

Sizes are binary here: ``K``/``M``/``G``, with or without ``i`` and ``B``, are powers of 1024, so ``16MB``
means 16 MiB as in the recorded benchmark runs (wds-async's own options read ``MB`` as 10**6; write ``MiB``).

Each shard ``{prefix}-{shard:06d}.tar`` holds samples keyed ``s{shard:06d}_{index:06d}`` (no dot, so
the WebDataset key is the whole name) with three members: ``KEY.bin`` (random bytes, ``sample_bytes``
+-20%), ``KEY.cls`` (an integer in ASCII) and ``KEY.json`` (``shard``, ``index``, ``cls`` and the
``sha1`` of the .bin bytes). The .bin lengths differ, as real payloads do, so batching them takes a
``collation_fn`` that pads or crops (README, "Using it"). Samples are added while the shard stays within
``shard_bytes`` (at least one per shard), so a shard may be slightly smaller than asked and, by the tar
record padding, at most 10 KiB larger.

``OUTDIR/manifest.json`` records the parameters, each shard's name, byte size and sample count, and
``expected_samples``: a reader that sees every sample exactly once sees that many distinct keys.
Generation is skipped when the manifest matches the parameters and the files are intact.

Shard ``i`` depends only on ``(seed, i)`` and the sizes, never on ``n_shards``; headers carry
mtime 0, uid/gid 0 and empty owner names, and gzip headers carry mtime 0 and no file name.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import sys
import tarfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from wds_async.node import parse_bytes

__all__ = ["MANIFEST", "main", "make_shards", "parse_size"]

MANIFEST = "manifest.json"
_FORMAT = "wds-async-synthetic/1"  # bump when the bytes a seed produces change
_BLOCK = tarfile.BLOCKSIZE
def parse_size(text: str) -> int:
    """``"16MiB"``, ``"100KiB"``, ``"1.5GB"`` or ``"4096"`` in bytes, by the README's one rule: KB/MB/GB are powers
    of 1000, KiB/MiB/GiB powers of 1024 (the same reading as every size option of the library)."""
    return parse_bytes(text, "size")


def make_shards(outdir: str | os.PathLike[str], n_shards: int = 16, shard_bytes: int = 16 << 20,
                sample_bytes: int = 100 << 10, seed: int = 0, gz: bool = False,
                prefix: str = "shard") -> list[Path]:
    """Write (or reuse) the shards in ``outdir`` and return their paths in shard order."""
    return _make(Path(outdir), n_shards, shard_bytes, sample_bytes, seed, gz, prefix)[0]


def _make(outdir: Path, n_shards: int, shard_bytes: int, sample_bytes: int, seed: int, gz: bool,
          prefix: str) -> tuple[list[Path], bool]:
    if n_shards < 1 or shard_bytes < 1 or sample_bytes < 1:
        raise ValueError("n_shards, shard_bytes and sample_bytes must be positive")
    if not prefix or "/" in prefix or os.sep in prefix:
        raise ValueError(f"prefix must be a plain file name prefix, got {prefix!r}")
    params = {"n_shards": n_shards, "shard_bytes": shard_bytes, "sample_bytes": sample_bytes,
              "seed": seed, "gz": gz, "prefix": prefix}
    suffix = ".tar.gz" if gz else ".tar"
    paths = [outdir / f"{prefix}-{i:06d}{suffix}" for i in range(n_shards)]
    if _reusable(outdir, params):
        return paths, True

    outdir.mkdir(parents=True, exist_ok=True)
    (outdir / MANIFEST).unlink(missing_ok=True)
    stale = re.compile(re.escape(prefix) + r"-\d{6}\.tar(\.gz)?")
    keep = {p.name for p in paths}
    for old in outdir.iterdir():
        if stale.fullmatch(old.name) and old.name not in keep:
            old.unlink()

    shards = []
    for i, path in enumerate(paths):
        samples = _write_shard(path, i, shard_bytes, sample_bytes, seed, gz)
        shards.append({"name": path.name, "bytes": path.stat().st_size, "samples": samples})
    expected = sum(s["samples"] for s in shards)
    manifest = {
        "format": _FORMAT,
        "params": params,
        "key_format": "s{shard:06d}_{index:06d}",
        "extensions": ["bin", "cls", "json"],
        "shards": shards,
        "n_shards": n_shards,
        "total_bytes": sum(s["bytes"] for s in shards),
        "total_members": 3 * expected,
        "expected_samples": expected,
    }
    _write_atomic(outdir / MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode())
    return paths, False


def _reusable(outdir: Path, params: dict[str, Any]) -> bool:
    try:
        manifest = json.loads((outdir / MANIFEST).read_text())
        return bool(manifest["format"] == _FORMAT and manifest["params"] == params and all(
            (outdir / s["name"]).stat().st_size == s["bytes"] for s in manifest["shards"]))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _plan_sizes(rng: np.random.Generator, shard_bytes: int, sample_bytes: int) -> list[int]:
    """The .bin sizes of one shard: add samples while the archive stays within shard_bytes."""
    sizes: list[int] = []
    used = 2 * _BLOCK  # the end-of-archive blocks
    while True:
        n = max(1, int(sample_bytes * rng.uniform(0.8, 1.2)))
        # .bin header + padded data, then .cls and .json: a header and one data block each
        cost = _BLOCK + -(-n // _BLOCK) * _BLOCK + 4 * _BLOCK
        if sizes and used + cost > shard_bytes:
            return sizes
        sizes.append(n)
        used += cost


def _write_shard(path: Path, shard: int, shard_bytes: int, sample_bytes: int, seed: int, gz: bool) -> int:
    rng = np.random.default_rng([seed, shard])
    sizes = _plan_sizes(rng, shard_bytes, sample_bytes)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as raw:
        out: BinaryIO = raw
        if gz:  # level 1: random bytes do not compress, and level 9 is ten times slower
            out = gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=raw, mtime=0)
        with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT, copybufsize=1 << 20) as tar:
            for index, n in enumerate(sizes):
                key = f"s{shard:06d}_{index:06d}"
                data = rng.bytes(n)
                cls = int(rng.integers(0, 1000))
                meta = {"shard": shard, "index": index, "cls": cls, "sha1": hashlib.sha1(data).hexdigest()}
                _add(tar, f"{key}.bin", data)
                _add(tar, f"{key}.cls", str(cls).encode())
                _add(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode())
        if gz:
            out.close()
    os.replace(tmp, path)
    return len(sizes)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.make_shards", description=__doc__.split("\n")[0])
    p.add_argument("outdir")
    p.add_argument("--shards", type=int, default=16, help="number of shards (default 16)")
    p.add_argument("--shard-size", type=parse_size, default=16 << 20, help="bytes per shard, e.g. 16MiB (MiB = 2**20, MB = 10**6)")
    p.add_argument("--sample-size", type=parse_size, default=100 << 10, help="mean .bin size, e.g. 100KiB (KiB = 2**10, KB = 10**3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gz", action="store_true", help="write .tar.gz shards")
    p.add_argument("--prefix", default="shard", help="shard file name prefix (default 'shard')")
    args = p.parse_args(argv)
    try:
        paths, reused = _make(Path(args.outdir), args.shards, args.shard_size, args.sample_size,
                              args.seed, args.gz, args.prefix)
    except ValueError as exc:
        p.error(str(exc))
    manifest = json.loads((Path(args.outdir) / MANIFEST).read_text())
    verb = "reusing" if reused else "wrote"
    print(f"{verb} {len(paths)} shards, {manifest['total_bytes']} bytes, "
          f"{manifest['expected_samples']} samples in {args.outdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
