"""A training loop on a CUDA GPU fed through ``DataLoader(..., pin_memory=True)``: how long the GPU waits for data
with wds-async and with webdataset, over the same shards on the emulated store.

    python -m benchmarks.gpu_feed                      # needs a CUDA GPU; about a minute
    python -m benchmarks.gpu_feed --step-ms 10 --workers 8 --loaders wds-async

The store serves ``--shards`` shards of ``--shard-size`` (samples of ``--sample-size``) with ``--ttfb`` to first
byte and ``--bw`` bytes/s per connection. Each loader is ``WebDataset(urls).map(crop).batched(--batch)`` (the
first ``--crop`` bytes of each sample's ``.bin`` as a uint8 row, and its ``.cls``) through
``DataLoader(ds, batch_size=None, num_workers=--workers, pin_memory=True)``. The loop copies each batch to the
GPU (``non_blocking=True``), adds its bytes to a checksum on the GPU, spins the GPU for ``--step-ms`` (a model
step: ``torch.cuda._sleep``, calibrated against CUDA events) and waits for the step, as a loss read back does.

Checked first: sample dicts come through ``pin_memory=True`` unchanged, and batches torch collates from them
arrive pinned. Checked for every loader (the run fails otherwise): every batch arrives in pinned memory, every sample arrives
exactly once, and the GPU's checksum equals the bytes the shards hold. Reported: samples/s, MB/s of shards, the
time the loop waited in ``next()`` (and for the first batch), and the GPU's busy share of the wall time (steps x
step time / wall). No assertions about speed: figures.
"""

from __future__ import annotations

import argparse
import json
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def crop(sample: dict[str, Any], size: int) -> tuple[Any, int, str]:
    import torch

    data = sample["bin"][:size].ljust(size, b"\0")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), int(sample["cls"]), sample["__key__"]


def collate(rows: list[tuple[Any, int, str]]) -> tuple[Any, Any, list[str]]:
    import torch

    return torch.stack([r[0] for r in rows]), torch.tensor([r[1] for r in rows]), [r[2] for r in rows]


def expected_sum(paths: list[Path], size: int) -> tuple[int, int]:
    """The bytes the loop should add up, and the sample count, read from the shards with tarfile."""
    total, count = 0, 0
    for path in paths:
        with tarfile.open(path) as tar:
            for member in tar:
                if member.name.endswith(".bin"):
                    f = tar.extractfile(member)
                    assert f is not None
                    total += int(np.frombuffer(f.read()[:size], dtype=np.uint8).sum(dtype=np.int64))
                    count += 1
    return total, count


def check_pinned_samples(urls: list[str]) -> str:
    """Sample dicts through ``pin_memory=True``, one by one (``batch_size=None``) and collated by torch
    (``batch_size=8``): the same keys and bytes as without pinning, the collated tensors pinned."""
    import torch

    import wds_async as wds

    def load(**options: Any) -> list[Any]:
        ds = wds.WebDataset(urls, shardshuffle=False).map(lambda s: {**s, "cls": int(s["cls"])})
        return list(torch.utils.data.DataLoader(ds, num_workers=2, **options))

    plain = load(batch_size=None)
    pinned = load(batch_size=None, pin_memory=True)
    if [dict(s) for s in pinned] != [dict(s) for s in plain]:
        raise AssertionError("samples through pin_memory=True differ from the samples without it")
    batches = load(batch_size=8, pin_memory=True)
    if not all(b["cls"].is_pinned() for b in batches):
        raise AssertionError("a collated batch through pin_memory=True is not pinned")
    # Workers take turns per batch, so the collated order interleaves by 8 where the plain one does by 1.
    if sorted(k for b in batches for k in b["__key__"]) != sorted(s["__key__"] for s in plain):
        raise AssertionError("collated batches lost or repeated samples")
    return f"{len(plain)} samples as dicts through pin_memory: equal; {len(batches)} collated batches pinned"


def cycles_per_ms() -> float:
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)  # warm up
    start.record()
    torch.cuda._sleep(20_000_000)
    end.record()
    end.synchronize()
    return 20_000_000 / start.elapsed_time(end)


def run(kind: str, urls: list[str], args: argparse.Namespace, cycles: float) -> dict[str, Any]:
    import functools

    import torch

    if kind == "wds-async":
        import wds_async as wds

        options = {} if args.max_connections == "auto" else {"max_connections": int(args.max_connections)}
        ds: Any = wds.WebDataset(urls, shardshuffle=False, **options)
    else:
        import webdataset

        ds = webdataset.WebDataset(urls, shardshuffle=False)
    ds = ds.map(functools.partial(crop, size=args.crop)).batched(args.batch, collation_fn=collate)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=args.workers, pin_memory=True)
    checksum = torch.zeros((), dtype=torch.int64, device="cuda")
    keys: list[str] = []
    wait = steps = first = 0.0
    unpinned = 0
    started = time.perf_counter()
    it = iter(loader)
    while True:
        t = time.perf_counter()
        batch = next(it, None)
        wait += time.perf_counter() - t
        if batch is None:
            break
        if not steps:
            first = time.perf_counter() - started
        x, _y, names = batch
        unpinned += not x.is_pinned()
        keys.extend(names)
        checksum += x.to("cuda", non_blocking=True).sum(dtype=torch.int64)
        torch.cuda._sleep(int(cycles * args.step_ms))
        torch.cuda.current_stream().synchronize()
        steps += 1
    wall = time.perf_counter() - started
    return {"loader": kind, "samples": len(keys), "distinct": len(set(keys)), "unpinned_batches": unpinned,
            "checksum": int(checksum.item()), "wall_s": wall, "wait_s": wait, "first_batch_s": first, "steps": steps,
            "gpu_busy": steps * args.step_ms / 1000 / wall}


def main(argv: list[str] | None = None) -> int:
    import torch

    from benchmarks.make_shards import make_shards, parse_size
    from emustore import Knobs, StoreProcess

    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_feed", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", type=int, default=32)
    p.add_argument("--shard-size", type=parse_size, default=16 << 20)
    p.add_argument("--sample-size", type=parse_size, default=100 << 10)
    p.add_argument("--ttfb", type=float, default=0.05, help="store seconds to first byte (default 0.05)")
    p.add_argument("--bw", type=float, default=20e6, help="store bytes/s per connection (default 20e6)")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers (default 4)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--crop", type=parse_size, default=64 << 10, help="bytes of each sample sent to the GPU")
    p.add_argument("--step-ms", type=float, default=20.0, help="GPU time per batch (default 20 ms)")
    p.add_argument("--max-connections", default="auto", help="wds-async's max_connections per worker (default auto)")
    p.add_argument("--loaders", default="wds-async,webdataset")
    p.add_argument("--root", default=str(ROOT / ".bench" / "gpu"))
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks.gpu_feed needs a CUDA GPU", file=sys.stderr)
        return 2
    paths = make_shards(args.root, n_shards=args.shards, shard_bytes=args.shard_size,
                        sample_bytes=args.sample_size, seed=7)
    want, count = expected_sum(paths, args.crop)
    cycles = cycles_per_ms()
    print(f"{torch.cuda.get_device_name()}: {cycles / 1e3:.0f} k cycles per ms; {count} samples in {args.shards} "
          f"shards; store {args.ttfb * 1000:.0f} ms to first byte, {args.bw / 1e6:g} MB/s per connection; "
          f"{args.workers} workers, batches of {args.batch}, {args.step_ms:g} ms of GPU per batch")
    results, failed = [], []
    with StoreProcess(args.root, Knobs(ttfb=args.ttfb, bw=args.bw)) as store:
        urls = [store.url(path.name) for path in paths]
        print(check_pinned_samples(urls[:2]))
        for kind in args.loaders.split(","):
            r = run(kind, urls, args, cycles)
            results.append(r)
            ok = r["samples"] == r["distinct"] == count and r["checksum"] == want and not r["unpinned_batches"]
            if not ok:
                failed.append(kind)
            mb = sum(path.stat().st_size for path in paths) / r["wall_s"] / 1e6
            print(f"{kind:10s} {r['samples'] / r['wall_s']:8.0f} samples/s {mb:7.1f} MB/s  wall {r['wall_s']:6.2f} s"
                  f"  waited {r['wait_s']:6.2f} s (first batch {r['first_batch_s']:4.2f})  GPU busy {r['gpu_busy']:5.1%}  "
                  f"{'exactly once, pinned, checksum equal' if ok else 'CHECK FAILED: ' + json.dumps(r)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "expected_checksum": want, "results": results},
                                              indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
