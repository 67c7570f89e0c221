"""A soak of random settings, run by hand: every pass must end, with every sample once, or with a clear error.

    python -m tests.soak --seed 0 --trials 150             # passes: liveness, exactly once, clear errors
    python -m tests.soak --mode resume --seed 0 --trials 60  # checkpoints at random points, resumed on fresh objects
    python -m tests.soak --s3 --seed 0 --trials 100          # and a fourth store: the shards on moto (s3://)
    python -m tests.soak --local --seed 0 --trials 100       # and local files and ``pipe:cat`` commands
    python -m tests.soak --mode random --seed 0 --trials 100 # random access: IndexedWebDataset and samplers

Each trial draws a configuration: a single dataset, a ``RandomMix`` or a ``RoundRobin`` of 2-5 sources over the
emulated http store (well behaved; slow: 30 ms to first byte and 3 MB/s per connection; faulty: 503s and bodies cut
short; with ``--s3`` also moto's S3 in server mode, with ``--local`` also the files themselves and ``pipe:cat``
commands), budgets from 64 KiB (below the largest samples) to 32 MiB, 1-3 fixed connections or ``auto``, ranged
parts, arrival order, shuffle buffers, ``resampled`` sources, a missing, truncated or corrupt shard with or without
a handler, DataLoader workers, the node service, a shard cache, and a consumer that leaves after 1, 5 or 30 samples.
After each trial no socket, file, engine thread or child process (a ``pipe:`` command) may be left. A pass that
delivers nothing for 40 s is reported as a hang with every thread's stack, and the soak stops there (the engine's
state is what to look at next). In ``resume`` mode the pieces read between checkpoints (through
``StatefulDataLoader`` when workers are drawn) must equal an uninterrupted pass. Prints one line per trial (``OK``
or ``BAD``); exits 1 if any was bad. In ``random`` mode each trial reads an epoch of ``IndexedWebDataset`` over 1-3
groups of shards (an index built once per store and list, or ``nsamples``) through a ``DataLoader`` (0 or 2 workers,
batches of 1, 7 or 64) and a random, block-shuffle or sequential sampler, with budgets, connections, coalescing,
read-ahead and a cache drawn as above: every sample must come in the sampler's order, each the one streaming gives at
its index (a consumer that leaves after 1 or 3 batches: the batches it took).

``tests/engine/test_matrix.py`` runs a fixed draw of the same kind of settings in CI; this is the long version,
which found two hangs and an engine stop of a mix, fixed on 2026-11-29 (see docs/design.md, *Mixes*).
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import gc
import json
import os
import random
import shutil
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from emustore.emulators import MOTO_ENV, moto_server

GROUPS = {"small": (6, 96 << 10, 4 << 10), "mid": (4, 400 << 10, 40 << 10), "big": (3, 1 << 20, 300 << 10),
          "one": (1, 64 << 10, 8 << 10)}
SOURCES = 5
HANG_S = 40.0
EPOCH = 20  # samples per resampled source (with_epoch)


def _shards(root: Path) -> dict[tuple[str, int], int]:
    """The groups' shards and three bad ones; the sample count of each group's source."""
    counts = {}
    for group, (n, shard_bytes, sample_bytes) in GROUPS.items():
        for k in range(SOURCES):
            make_shards(root / group / f"s{k}", n_shards=n, shard_bytes=shard_bytes, sample_bytes=sample_bytes,
                        seed=100 + k)
            manifest = json.loads((root / group / f"s{k}" / "manifest.json").read_text())
            counts[(group, k)] = manifest["expected_samples"]
    (root / "bad").mkdir(exist_ok=True)
    good = root / "small" / "s0" / "shard-000000.tar"
    data = good.read_bytes()
    (root / "bad" / "trunc-000000.tar").write_bytes(data[:50000])
    with tarfile.open(good) as tar:
        header = tar.getmembers()[7].offset
    corrupt = bytearray(data)
    corrupt[header:header + 512] = b"\x07" * 512
    (root / "bad" / "corrupt-000000.tar").write_bytes(bytes(corrupt))
    return counts


def _upload(root: Path, endpoint: str) -> str:
    """Every shard under ``root`` into a bucket of the moto server at ``endpoint``; the base URL of the copies. The
    environment then points every S3 client at it (DataLoader workers and the node service, started after, too)."""
    import boto3

    os.environ.update({**MOTO_ENV, "AWS_ENDPOINT_URL_S3": endpoint})
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="soak")
    for path in sorted(root.rglob("*.tar")):
        client.upload_file(str(path), "soak", str(path.relative_to(root)))
    return "s3://soak/"


def _draw(rng: random.Random, resume: bool, s3: bool, local: bool = False) -> dict[str, Any]:
    stores = ["clean", "faulty"] if resume else ["clean", "slow", "faulty"]
    stores += ["s3"] if s3 else []
    stores += ["file", "pipe"] if local else []
    kind = rng.choice(["mix", "mix", "round-robin"] if resume else ["mix", "mix", "round-robin", "single"])
    cfg: dict[str, Any] = dict(
        store=rng.choice(stores), kind=kind,
        groups=[rng.choice(list(GROUPS)) for _ in range(1 if kind == "single" else rng.choice([2, 3, 5]))],
        budget=rng.choice([64 << 10, 256 << 10, 1 << 20, 4 << 20, 32 << 20]), longest=rng.random() < 0.7,
        ordered=resume or rng.random() < 0.8, shuffle=rng.choice([0, 0, 10]), connections=rng.choice(["auto", 1, 3]),
        parts=rng.choice([None, None, 128 << 10]), geometric=rng.random() < 0.5, seed=rng.randrange(1000),
        workers=rng.choice([0, 0, 0, 2]), resampled=rng.random() < 0.2, sleep=rng.choice([0, 0, 0.0005]))
    if resume:
        cfg.update(cuts=sorted(rng.sample(range(1, 60), rng.choice([1, 2, 3]))), bad=None, handled=False,
                   service=False, cache=False)
    else:
        cfg.update(bad=rng.choice([None, None, "nothere", "trunc", "corrupt"]), handled=rng.random() < 0.5,
                   service=rng.random() < 0.15, cache=rng.random() < 0.15,
                   stop=rng.choice([None, None, None, 1, 5, 30]))
        cfg["cache"] = cfg["cache"] and not cfg["service"]
    cfg["index"] = not cfg["resampled"] and rng.random() < 0.3  # shares of samples, cut from the shards' index
    cfg["batch"] = rng.choice([None, None, 3, 8])
    if resume:  # elastic: one checkpoint, its merge loaded into a dataset read by another number of workers
        cfg["elastic"] = (rng.random() < 0.3 and not cfg["resampled"] and not cfg["index"]
                          and (cfg["kind"] == "single" or cfg["longest"]))
        cfg["workers2"] = rng.choice([0, 2, 3]) if cfg["elastic"] else None
    return cfg


class _Indexes:
    """Each store's index of each list of shards, built once (an index records the store's object identities)."""

    def __init__(self) -> None:
        self.built: dict[tuple[str, ...], Any] = {}

    def get(self, urls: list[str]) -> Any:
        key = tuple(urls)
        if key not in self.built:
            self.built[key] = wds.build_index(urls, max_connections=4)
        return self.built[key]


_INDEXES = _Indexes()


def _index_of(urls: list[str], base: str) -> Any:
    """The index of ``urls``; a bad shard's entry is a good shard's (its bytes are missing, cut or corrupt)."""
    good = [u for u in urls if "/bad/" not in u]
    entries = list(_INDEXES.get(good).shards)
    for url in urls:
        if "/bad/" in url:
            entries.append(dataclasses.replace(_INDEXES.get([base + "small/s0/shard-000000.tar"]).shards[0], url=url))
    return wds.ShardIndex(entries)


def _flat(item: Any, cfg: dict[str, Any]) -> list[tuple[int, str]]:
    """The (source, name) pairs of one delivered item: a sample, or a batch of them."""
    return [(int(s), k) for s, k in (item if cfg.get("batch") else [item])]


def _keyed(source: int) -> Callable[[dict[str, Any]], tuple[int, str]]:
    return lambda s: (source, s["__url__"].rsplit("/", 1)[-1] + "/" + s["__key__"])


def _source_urls(cfg: dict[str, Any], i: int, group: str, base: str) -> list[str]:
    """Source ``i``'s shards: its group's, and in the last source the bad shard (if any) half-way."""
    urls = [base + f"{group}/s{i}/shard-{j:06d}.tar" for j in range(GROUPS[group][0])]
    if cfg["bad"] and i == len(cfg["groups"]) - 1:
        urls.insert(len(urls) // 2, base + f"bad/{cfg['bad']}-000000.tar")
    return urls


def _build(cfg: dict[str, Any], base: str, service: str | None, cache: str | None,
           workers: int | None = None) -> Any:
    sources = []
    for i, group in enumerate(cfg["groups"]):
        urls = _source_urls(cfg, i, group, base)
        options: dict[str, Any] = dict(
            max_buffered_bytes=cfg["budget"], max_connections=cfg["connections"], part_bytes=cfg["parts"],
            deterministic=cfg["ordered"], nodesplitter=None, resampled=cfg["resampled"],
            detshuffle=cfg["resampled"], seed=cfg["seed"] + i,
            handler=wds.ignore_and_continue if cfg["handled"] else None)
        if not (cfg["workers"] if workers is None else workers):
            options["workersplitter"] = None
        if service:
            options["service"] = service
        if cache:
            options["cache_dir"] = cache
        if cfg.get("index"):
            options["index"] = _index_of(urls, base)
        ds = wds.WebDataset(urls, **options)
        if cfg["resampled"]:
            ds = ds.with_epoch(EPOCH)
        if cfg["shuffle"]:
            ds = ds.shuffle(cfg["shuffle"], seed=cfg["seed"] + 7 * i)
        sources.append(ds.map(_keyed(i)))
    if cfg["kind"] == "single":
        data = sources[0]
    elif cfg["kind"] == "round-robin":
        data = wds.RoundRobin(sources, longest=cfg["longest"])
    else:
        weights = [0.5 ** i if cfg["geometric"] else 1.0 for i in range(len(sources))]
        data = wds.RandomMix(sources, weights, seed=cfg["seed"], longest=cfg["longest"])
    if cfg.get("batch"):
        data = data.batched(cfg["batch"], collation_fn=list)  # a stage on the mix (or dataset) itself
    return data


class _Watch:
    """Reports a hang (no sample for HANG_S) with every thread's stack, and ends the process."""

    def __init__(self, label: str) -> None:
        self.label, self.last, self.count = label, time.monotonic(), 0
        self._stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def tick(self) -> None:
        self.last, self.count = time.monotonic(), self.count + 1

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            if time.monotonic() - self.last > HANG_S:
                print(f"HANG after {self.count} samples: {self.label}", flush=True)
                faulthandler.dump_traceback(all_threads=True)
                os._exit(3)

    def stop(self) -> None:
        self._stop.set()


def _loader(data: Any, workers: int) -> Any:
    if not workers:
        return data
    from torchdata.stateful_dataloader import StatefulDataLoader
    return StatefulDataLoader(data, batch_size=None, num_workers=workers)


def _pass(cfg: dict[str, Any], counts: dict[tuple[str, int], int], base: str, service: str | None) -> str | None:
    """One pass; what is wrong with it, or None."""
    cache = tempfile.mkdtemp(prefix="soak-cache-") if cfg["cache"] else None
    watch = _Watch(json.dumps(cfg))
    got: list[tuple[int, str]] = []
    error: BaseException | None = None
    stop = cfg.get("stop")
    it = iter(_loader(_build(cfg, base, service if cfg["service"] else None, cache), cfg["workers"]))
    try:
        for item in it:
            got.extend(_flat(item, cfg))
            watch.tick()
            if cfg["sleep"]:
                time.sleep(cfg["sleep"])
            if stop is not None and len(got) >= stop:
                break  # the consumer leaves mid-pass: everything it started must stop and be released
    except Exception as exc:
        error = exc
    finally:
        watch.stop()
        close = getattr(it, "close", None) or getattr(it, "_shutdown_workers", None)
        if close is not None:
            close()  # a DataLoader's workers too: left to the collector (an error's traceback holds the
            # iterator), torch's shutdown waited 5 s per worker inside gc.collect(), and the cache directory
            # below was removed while they still read from it
        del it
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    # With an index and workers, equal shares pad the last ones with the first samples (drop_last=False); the
    # index counts a bad shard's samples too (its entry is a good shard's)
    pads = [(-_index_of(_source_urls(cfg, i, g, base), base).total_samples) % cfg["workers"]
            if cfg.get("index") and cfg["workers"] else 0 for i, g in enumerate(cfg["groups"])]
    twice = len(got) - len(set(got))
    if stop is not None and len(got) >= stop:
        if error is not None:
            return f"error: {type(error).__name__}: {error}"
        return None if cfg["resampled"] or twice <= sum(pads) else "samples twice before the stop"
    whole = cfg["kind"] == "single" or cfg["longest"]
    if cfg["bad"] and not cfg["handled"] and not cfg["resampled"] and whole:
        return None if error is not None and cfg["bad"] in str(error) else f"no error naming the bad shard: {error!r}"
    if error is not None and not (cfg["bad"] and not cfg["handled"] and cfg["bad"] in str(error)):
        return f"error: {type(error).__name__}: {error}"
    if not cfg["resampled"] and twice > sum(pads):
        return f"{twice} samples twice"
    per = [sum(1 for s, _ in got if s == i) for i in range(len(cfg["groups"]))]
    # with_epoch counts what its pipeline delivers: a single dataset's batches when it is batched (as webdataset's)
    per_epoch = EPOCH * (cfg["batch"] if cfg.get("batch") and cfg["kind"] == "single" else 1)
    want = [per_epoch * (cfg["workers"] or 1) if cfg["resampled"] else counts[(g, i)] + pads[i]
            for i, g in enumerate(cfg["groups"])]
    if cfg["bad"] or not whole:
        return None if cfg["bad"] or all(p <= w for p, w in zip(per, want)) else f"per source {per}, at most {want}"
    return None if per == want else f"per source {per}, expected {want}"


def _held() -> tuple[dict[str, str], int, set[int]]:
    """This process's open descriptors (number: what it is), engine threads and child processes (running or not
    reaped: a ``pipe:`` command left behind) now."""
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed meanwhile (the listing's own descriptor among them)
            pass
    return fds, sum(t.name == "wds-async-engine" for t in threading.enumerate()), _children()


def _children() -> set[int]:
    me = str(os.getpid())
    found = set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:  # the parent's pid (fields after the command name: state, ppid, ...)
                found.add(int(pid))
    return found


#: Descriptors a first trial may leave for good: pipes and shared memory of DataLoader workers and torch, and the
#: event loops' own. Sockets and files are what a stopped engine must never leave open.
_PROCESS_WIDE = ("pipe:", "anon_inode:", "/dev/shm/", "/dev/null", "/dev/urandom")


def _leaked(before: tuple[dict[str, str], int, set[int]]) -> str | None:
    """The sockets, files, engine threads and child processes a trial left beyond ``before``, once closes had 2 s
    to finish."""
    deadline = time.monotonic() + 2.0
    while True:
        gc.collect()
        fds, threads, children = _held()
        left = sorted(what for fd, what in fds.items()
                      if before[0].get(fd) != what and not what.startswith(_PROCESS_WIDE))
        extra = sorted(children - before[2])
        if not left and threads <= before[1] and not extra:
            return None
        if time.monotonic() > deadline:
            return f"left open: {left}, {threads - before[1]} engine threads, child processes {extra}"
        time.sleep(0.05)


def _elastic(cfg: dict[str, Any], base: str, watch: _Watch, full: list[tuple[int, str]]) -> str | None:
    """The first piece through ``workers`` and the rest, from the merge of its checkpoint, through ``workers2``:
    every sample of the uninterrupted pass exactly once (the order is the new split's)."""
    cut = cfg["cuts"][0]
    loader = _loader(_build(cfg, base, None, None), cfg["workers"])
    it = iter(loader)
    pieces: list[tuple[int, str]] = []
    while len(pieces) < cut:
        try:
            item = next(it)
        except StopIteration:
            break
        pieces.extend(_flat(item, cfg))
        watch.tick()
    state = loader.state_dict()
    del it, loader
    data = _build(cfg, base, None, None, workers=cfg["workers2"])
    data.load_state_dict(wds.merge_states([state]))
    for item in _loader(data, cfg["workers2"]):
        pieces.extend(_flat(item, cfg))
        watch.tick()
    if sorted(pieces) == sorted(full):
        return None
    twice = len(pieces) - len(set(pieces))
    return (f"elastic: {len(pieces)} samples against {len(full)}, {twice} twice, "
            f"{len(set(full) - set(pieces))} missing")


def _resumed(cfg: dict[str, Any], base: str) -> str | None:
    """An uninterrupted pass against the pieces between checkpoints; what differs, or None."""
    watch = _Watch(json.dumps(cfg))
    try:
        full = []
        for item in _loader(_build(cfg, base, None, None), cfg["workers"]):
            full.extend(_flat(item, cfg))
            watch.tick()
        if cfg.get("elastic") and cfg["cuts"][0] < len(full):
            return _elastic(cfg, base, watch, full)
        pieces: list[tuple[int, str]] = []
        state = None
        for cut in [c for c in cfg["cuts"] if c < len(full)] + [None]:
            loader = _loader(_build(cfg, base, None, None), cfg["workers"])
            if state is not None:
                loader.load_state_dict(state)
            it = iter(loader)
            while cut is None or len(pieces) < cut:
                try:
                    item = next(it)
                except StopIteration:
                    break
                pieces.extend(_flat(item, cfg))  # a batch at a time: the checkpoint falls between batches
                watch.tick()
            if cut is not None:
                state = loader.state_dict()
            del it, loader
    finally:
        watch.stop()
    if pieces == full:
        return None
    at = next((i for i, (a, b) in enumerate(zip(pieces, full)) if a != b), min(len(pieces), len(full)))
    return f"pieces differ from the uninterrupted pass at sample {at} ({len(pieces)} against {len(full)})"


def _draw_random(rng: random.Random, s3: bool, local: bool) -> dict[str, Any]:
    stores = ["clean", "slow", "faulty"] + (["s3"] if s3 else []) + (["file"] if local else [])  # no ranges on pipe:
    return dict(
        store=rng.choice(stores), groups=rng.sample(list(GROUPS), rng.choice([1, 2, 3])),
        source=rng.choice([0, 1, 2]), budget=rng.choice([64 << 10, 256 << 10, 1 << 20, 32 << 20]),
        connections=rng.choice(["auto", 1, 3]), coalesce=rng.choice([0, 64 << 10, 8 << 20]),
        readahead=rng.choice([0, 2]), sampler=rng.choice(["random", "block", "sequential"]),
        block=rng.choice([1, 4, 16]), batch=rng.choice([1, 7, 64]), workers=rng.choice([0, 0, 2]),
        cache=rng.random() < 0.2, nsamples=rng.random() < 0.2, stop=rng.choice([None, None, 1, 3]),
        bad=rng.choice([None, None, None, "trunc", "corrupt"]), seed=rng.randrange(1000))


def _random_urls(cfg: dict[str, Any], base: str) -> list[str]:
    return [base + f"{group}/s{cfg['source']}/shard-{j:06d}.tar" for group in cfg["groups"]
            for j in range(GROUPS[group][0])]


def _name(sample: dict[str, Any]) -> tuple[str, str]:
    return sample["__url__"].rsplit("/", 3)[-3] + "/" + sample["__url__"].rsplit("/", 1)[-1], sample["__key__"]


def _random(cfg: dict[str, Any], base: str, indexes: _Indexes) -> str | None:
    """An epoch of ``IndexedWebDataset`` through a DataLoader and a sampler: every index once, in the sampler's
    order (batches in order, with workers too), each the sample streaming gives at that index; or, with a
    consumer that leaves, the batches it took."""
    import torch
    from torch.utils.data import DataLoader, RandomSampler, SequentialSampler

    urls = _random_urls(cfg, base)
    expected = [_name(s) for s in wds.WebDataset(urls, nodesplitter=None, workersplitter=None)]
    counts = [sum(1 for _ in wds.WebDataset(url, nodesplitter=None, workersplitter=None)) for url in urls]
    entries = indexes.get(urls).shards if not cfg["nsamples"] else []
    bad = cfg.get("bad")
    if bad:  # a last shard whose index (or count) is a good shard's: the bytes served are truncated or corrupt
        good_url, bad_url = base + "small/s0/shard-000000.tar", base + f"bad/{bad}-000000.tar"
        good = [_name(s) for s in wds.WebDataset(good_url, nodesplitter=None, workersplitter=None)]
        urls, counts = [*urls, bad_url], [*counts, len(good)]
        expected += [_name({"__url__": bad_url, "__key__": key}) for _, key in good]
        if not cfg["nsamples"]:
            entries = [*entries, dataclasses.replace(indexes.get([good_url]).shards[0], url=bad_url)]
    cache = tempfile.mkdtemp(prefix="soak-cache-") if cfg["cache"] else None
    options: dict[str, Any] = dict(max_buffered_bytes=cfg["budget"], max_connections=cfg["connections"],
                                   coalesce_bytes=cfg["coalesce"], readahead=cfg["readahead"], cache_dir=cache)
    if cfg["nsamples"]:
        ds = wds.IndexedWebDataset(urls, nsamples=counts, **options)
    else:
        ds = wds.IndexedWebDataset(urls, index=wds.ShardIndex(entries), **options)
    ds = ds.map(_name)
    if cfg["sampler"] == "random":
        order = list(RandomSampler(range(len(expected)), generator=torch.Generator().manual_seed(cfg["seed"])))
        sampler: Any = RandomSampler(ds, generator=torch.Generator().manual_seed(cfg["seed"]))
    elif cfg["sampler"] == "block":
        sampler = wds.BlockShuffleSampler(ds, block_size=cfg["block"], seed=cfg["seed"], num_replicas=1, rank=0)
        order = list(wds.BlockShuffleSampler(len(expected), block_size=cfg["block"], seed=cfg["seed"],
                                             num_replicas=1, rank=0))
    else:
        sampler, order = SequentialSampler(ds), list(range(len(expected)))
    watch = _Watch(json.dumps(cfg))
    got: list[tuple[str, str]] = []
    error: BaseException | None = None
    loader = DataLoader(ds, batch_size=cfg["batch"], sampler=sampler, num_workers=cfg["workers"],
                        collate_fn=list)
    it = iter(loader)
    try:
        for batches, batch in enumerate(it, 1):
            got.extend(tuple(x) for x in batch)
            watch.tick()
            if cfg["stop"] is not None and batches >= cfg["stop"]:
                break
    except Exception as exc:
        error = exc
    finally:
        watch.stop()
        close = getattr(it, "_shutdown_workers", None)
        if close is not None:
            close()
        del it, loader
        ds.close()
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    want = [expected[i] for i in order]
    if error is not None:
        if not (bad and f"bad/{bad}-000000.tar" in str(error)):
            return f"error: {type(error).__name__}: {error}"
        want = want[:len(got)]  # what came before the error must be right
    elif bad and cfg["stop"] is None:
        return "no error naming the bad shard"
    if cfg["stop"] is not None:
        want = want[:len(got)]
    if got != want:
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        return f"differs from the sampler's order at sample {at} ({len(got)} against {len(want)})"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=("pass", "resume", "random"), default="pass")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--service-connections", type=int, default=4, help="max_connections of the node service")
    p.add_argument("--s3", action="store_true", help="also draw the shards from moto in server mode (s3://)")
    p.add_argument("--local", action="store_true", help="also draw local files and pipe:cat commands")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    bad = 0
    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        root = Path(tmp) / "shards"
        counts = _shards(root)
        knobs = {"clean": Knobs(seed=1, ttfb=0.002), "slow": Knobs(seed=2, ttfb=0.03, bw=3e6),
                 "faulty": Knobs(seed=3, ttfb=0.005, fail_rate=0.08, drop_rate=0.05)}
        stores = {name: StoreProcess(root, k) for name, k in knobs.items()}
        service = None
        bases = {}
        s3 = moto_server() if args.s3 else None
        try:
            for name, store in stores.items():
                bases[name] = store.__enter__().base_url
            if s3 is not None:
                bases["s3"] = _upload(root, s3.__enter__())
            bases["file"] = f"{root}/"
            bases["pipe"] = f"pipe:cat {root}/"
            if args.mode == "pass":
                from wds_async.service import start_service
                service = start_service(os.path.join(tmp, "svc.sock"), max_connections=args.service_connections)
                service.__enter__()
            for trial in range(args.trials):
                cfg = (_draw_random(rng, args.s3, args.local) if args.mode == "random" else
                       _draw(rng, args.mode == "resume", args.s3, args.local))
                started = time.monotonic()
                base = bases[cfg["store"]]
                before = _held()
                try:
                    if args.mode == "random":
                        wrong = _random(cfg, base, _INDEXES)
                    elif args.mode == "resume":
                        wrong = _resumed(cfg, base)
                    else:
                        wrong = _pass(cfg, counts, base, service.url if service else None)
                    wrong = wrong or _leaked(before)
                except Exception as exc:  # a resumed pass has no bad shard: any error is the trial's failure
                    traceback.print_exc()
                    wrong = f"error: {type(exc).__name__}: {exc}"
                bad += wrong is not None
                print("OK " if wrong is None else "BAD", trial, f"{time.monotonic() - started:.2f}s", wrong or "",
                      json.dumps(cfg), flush=True)
        finally:
            if service is not None:
                service.__exit__(None, None, None)
            for store in stores.values():
                store.__exit__(None, None, None)
            if s3 is not None:
                s3.__exit__(None, None, None)
    print(f"{args.trials - bad} of {args.trials} trials passed", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
