"""Mixes and single datasets over a matrix of settings drawn from a fixed seed, on the emulated http store.

Every pass must end: with every sample exactly once (a mix that ends with its first source to run out: none twice,
none from elsewhere), or with an error naming the shard at fault. Settings that rarely meet in the other tests meet
here: budgets below one sample, one to three fixed connections, ranged parts, a store that answers 503 and cuts
bodies short, shuffle buffers, arrival order, and a missing, truncated or corrupt shard with and without a handler.
Two hangs of a mix were found by a longer run of this generator (2026-11-29): a connection pool capped at
``max_connections`` held whole by readers waiting for room, and a source's next item queued for a token behind
helpers of ranged parts (both have their own tests in test_mix_hangs.py).
"""

from __future__ import annotations

import random
import shutil
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess

#: name: (shards, shard bytes, sample bytes); "big" samples are larger than the smallest budgets.
GROUPS = {"small": (6, 96 << 10, 4 << 10), "mid": (4, 400 << 10, 40 << 10), "big": (3, 1 << 20, 300 << 10),
          "one": (1, 64 << 10, 8 << 10)}
SOURCES = 5
CASES = 24


@dataclass(frozen=True)
class Case:
    store: str
    kind: str                 # "mix", "round-robin" or "single"
    groups: tuple[str, ...]   # one per source
    budget: int
    longest: bool
    ordered: bool
    shuffle: int
    connections: int | str
    parts: int | None
    geometric: bool           # weights 1, 1/2, 1/4, ... (else equal)
    bad: str | None           # a shard of the last source that is missing, truncated or corrupt
    handled: bool             # warn_and_continue instead of raising
    seed: int


def _cases() -> list[Case]:
    rng = random.Random(20261129)
    cases = []
    for _ in range(CASES):
        kind = rng.choice(["mix", "mix", "round-robin", "single"])
        count = 1 if kind == "single" else rng.choice([2, 3, 5])
        cases.append(Case(
            store=rng.choice(["clean", "faulty"]), kind=kind,
            groups=tuple(rng.choice(list(GROUPS)) for _ in range(count)),
            budget=rng.choice([64 << 10, 256 << 10, 1 << 20, 4 << 20, 32 << 20]), longest=rng.random() < 0.7,
            ordered=rng.random() < 0.8, shuffle=rng.choice([0, 0, 10]), connections=rng.choice(["auto", 1, 3]),
            parts=rng.choice([None, None, 128 << 10]), geometric=rng.random() < 0.5,
            bad=rng.choice([None, None, "nothere", "trunc", "corrupt"]), handled=rng.random() < 0.5,
            seed=rng.randrange(1000)))
    return cases


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, StoreProcess]]:
    root = tmp_path_factory.mktemp("matrix")
    for group, (n, shard_bytes, sample_bytes) in GROUPS.items():
        for k in range(SOURCES):
            make_shards(root / group / f"s{k}", n_shards=n, shard_bytes=shard_bytes, sample_bytes=sample_bytes,
                        seed=100 + k)
    (root / "bad").mkdir()
    good = root / "small" / "s0" / "shard-000000.tar"
    data = good.read_bytes()
    (root / "bad" / "trunc-000000.tar").write_bytes(data[:50000])  # ends inside a member's header
    with tarfile.open(good) as tar:
        header = tar.getmembers()[7].offset
    corrupt = bytearray(data)
    corrupt[header:header + 512] = b"\x07" * 512  # a header whose checksum field is not octal
    (root / "bad" / "corrupt-000000.tar").write_bytes(bytes(corrupt))
    with StoreProcess(root, Knobs(seed=1, ttfb=0.002)) as clean, \
            StoreProcess(root, Knobs(seed=3, ttfb=0.005, fail_rate=0.08, drop_rate=0.05)) as faulty:
        yield {"clean": clean, "faulty": faulty, "root": root}  # type: ignore[dict-item]
    shutil.rmtree(root, ignore_errors=True)


def _keyed(source: int) -> Any:
    return lambda sample: (source, sample["__url__"].rsplit("/", 1)[-1] + "/" + sample["__key__"])


def _expected(root: Path, group: str, k: int, source: int) -> set[tuple[int, str]]:
    urls = sorted(str(p) for p in (root / group / f"s{k}").glob("shard-*.tar"))
    return {(source, Path(s["__local_path__"]).name + "/" + s["__key__"])
            for s in wds.WebDataset(urls, nodesplitter=None, workersplitter=None)}


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c.kind}-{len(c.groups)}-{c.connections}-{c.seed}")
def test_every_pass_ends_with_every_sample_once_or_a_clear_error(stores: dict[str, Any], case: Case) -> None:
    store, root = stores[case.store], stores["root"]
    handler = wds.warn_and_continue if case.handled else None
    sources, expected = [], []
    for i, group in enumerate(case.groups):
        n = GROUPS[group][0]
        urls = [store.base_url + f"{group}/s{i}/shard-{j:06d}.tar" for j in range(n)]
        if case.bad and i == len(case.groups) - 1:
            urls.insert(len(urls) // 2, store.base_url + f"bad/{case.bad}-000000.tar")
        ds = wds.WebDataset(urls, handler, max_buffered_bytes=case.budget, max_connections=case.connections,
                            part_bytes=case.parts, deterministic=case.ordered, nodesplitter=None, workersplitter=None)
        if case.shuffle:
            ds = ds.shuffle(case.shuffle, seed=case.seed)
        sources.append(ds.map(_keyed(i)))
        expected.append(_expected(root, group, i, i))
    data: Any
    if case.kind == "single":
        data = sources[0]
    elif case.kind == "round-robin":
        data = wds.RoundRobin(sources, longest=case.longest)
    else:
        weights = [0.5 ** i if case.geometric else 1.0 for i in range(len(sources))]
        data = wds.RandomMix(sources, weights, seed=case.seed, longest=case.longest)
    got: list[tuple[int, str]] = []
    errors: list[BaseException] = []

    def consume() -> None:
        try:
            got.extend(data)
        except Exception as exc:  # judged below
            errors.append(exc)

    thread = threading.Thread(target=consume, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), f"the pass hung after {len(got)} samples ({case})"
    assert len(got) == len(set(got)), "a sample came twice"
    whole = case.kind == "single" or case.longest  # else the mix ends with the first source to run out
    from_bad = {x for x in got if x[1].startswith(f"{case.bad}-")} if case.bad else set()
    for i, want in enumerate(expected):
        seen = {x for x in got if x[0] == i} - from_bad
        assert seen <= want, f"source {i} delivered samples it does not hold"
        if whole and not errors:  # an error ends the pass where it is raised
            assert seen == want, f"source {i}: {len(seen)} of {len(want)} samples"
    if case.bad and not case.handled and whole:
        assert len(errors) == 1 and f"bad/{case.bad}-000000.tar" in str(errors[0]), (
            f"expected an error naming the bad shard, got {errors!r}")
    else:
        assert not errors, f"unexpected error: {errors[0]!r}"
