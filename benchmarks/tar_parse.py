"""Micro benchmark of ``TarParser``: an in-memory tar fed in fixed-size chunks, plain and gzipped.

Run ``python benchmarks/tar_parse.py``; it prints MB/s of decompressed tar bytes (best of
``--repeat`` runs). The gzip figure is bounded by zlib, so a zlib-only baseline is printed beside it.
"""

from __future__ import annotations

import argparse
import gzip
import io
import os
import sys
import tarfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from wds_async.engine.tarstream import TarParser


def build_tar(total: int, member: int) -> bytes:
    """About ``total`` bytes of tar holding ``member``-byte files of random (incompressible) content."""
    payload = os.urandom(member + 4096)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for i in range(max(1, total // member)):
            info = tarfile.TarInfo(f"sample{i:07d}.{'jpg' if i % 2 else 'cls'}")
            info.size = member
            start = i % 4096
            tar.addfile(info, io.BytesIO(payload[start : start + member]))
    return buf.getvalue()


def time_parser(data: bytes, chunk: int, repeat: int) -> tuple[float, int]:
    """Best wall time to feed ``data`` in ``chunk``-byte pieces and close; and the member count."""
    chunks = [data[i : i + chunk] for i in range(0, len(data), chunk)]
    best, count = float("inf"), 0
    for _ in range(repeat):
        parser = TarParser(url="bench://")
        count = 0
        t0 = time.perf_counter()
        for piece in chunks:
            count += len(parser.feed(piece))
        parser.close()
        best = min(best, time.perf_counter() - t0)
    return best, count


def time_zlib(data: bytes, chunk: int, repeat: int) -> float:
    """Best wall time of bare incremental gzip decompression with the same chunking."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        gz = zlib.decompressobj(31)
        for i in range(0, len(data), chunk):
            gz.decompress(data[i : i + chunk])
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--member-kb", type=int, default=100)
    ap.add_argument("--chunk-kb", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    raw = build_tar(args.size_mb * 1_000_000, args.member_kb * 1000)
    chunk = args.chunk_kb * 1024
    mb = len(raw) / 1e6

    seconds, count = time_parser(raw, chunk, args.repeat)
    print(f"tar : {mb:.1f} MB, {count} members, {args.chunk_kb} KiB chunks: {mb / seconds:8.0f} MB/s")

    comp = gzip.compress(raw, compresslevel=1)
    seconds, count = time_parser(comp, chunk, args.repeat)
    base = time_zlib(comp, chunk, args.repeat)
    print(
        f"gzip: {mb:.1f} MB ({len(comp) / 1e6:.1f} MB compressed), {count} members: "
        f"{mb / seconds:8.0f} MB/s (zlib alone {mb / base:.0f} MB/s)"
    )


if __name__ == "__main__":
    main()
