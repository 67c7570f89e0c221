"""Resumable mixes (``wds.RandomMix(..., seed=...)``, ``wds.RoundRobin``) the way training jobs meet them.

A child process (``mix_child.py``) iterates a ``StatefulDataLoader`` over a mix of three WebDataset sources
with uneven sample counts, served by the emulated store, logging every step's keys (``source/shard/key``)
and checkpointing ``loader.state_dict()`` after every step. The parent SIGKILLs it (with its DataLoader
workers) at a random step and resumes it in a fresh process; the keys up to the checkpointed step followed
by the resumed run's must be, as a sequence, those of one uninterrupted run with the same seeds. Further:
a second kill after the first resume, the balanced draws' proportions through a DataLoader, a torchrun job
whose ranks deliver equal sample counts, the same resume of a whole torchrun job (each rank its own sequence),
and an elastic resume (``wds.merge_states``) into another world size.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.conftest import free_port
from tests.torch.children import Launches, checkpointed, lines, run_child, steps
from wds_async.data.plan import shard_order, split_equal

CHILD = str(Path(__file__).with_name("mix_child.py"))
#: Kill points are random but reproducible.
RNG = random.Random(20261125)
PROBS = [0.6, 0.3, 0.1]
NAMES = ["a", "b", "c"]
#: (name, shards, shard bytes): samples of ~3 KiB (three tar members), so 49 / 34 / 19 samples per shard in the
#: small set (294 / 136 / 57 samples) and 399 / 349 / 199 in the big one (3990 / 2094 / 796).
SMALL = [("sa", 6, 150 << 10), ("sb", 4, 105 << 10), ("sc", 3, 60 << 10)]
BIG = [("a", 10, 1200 << 10), ("b", 6, 1050 << 10), ("c", 4, 600 << 10)]
WINDOW, TOLERANCE = 1000, 0.03


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Both sets of three sources on one store: per source its URL pattern, its index, and its keys per shard."""
    root = tmp_path_factory.mktemp("mix")
    for n, (name, shards, size) in enumerate(SMALL + BIG):
        make_shards(root / name, n_shards=shards, shard_bytes=size, sample_bytes=256, seed=40 + n)
    with StoreProcess(root, Knobs(seed=3)) as store:
        sources: dict[str, Any] = {}
        for name, shards, _ in SMALL + BIG:
            manifest = json.loads((root / name / "manifest.json").read_text())
            pattern = store.base_url + f"{name}/shard-{{000000..{shards - 1:06d}}}.tar"
            index = root / f"{name}.index"
            wds.build_index(pattern).save(index)
            keys = [[f"{name}/{s['name']}/s{shard:06d}_{i:06d}" for i in range(s["samples"])]
                    for shard, s in enumerate(manifest["shards"])]
            sources[name] = {"urls": pattern, "index": str(index), "keys": keys}
        yield sources


# -- running the child -------------------------------------------------------------------------------------

def _run(cfg: dict[str, Any], env: dict[str, str] | None = None, kill_at: int | None = None,
         settle: float = 0.0) -> int:
    """Run the child (see :func:`tests.torch.children.run_child`)."""
    return run_child(CHILD, cfg, env, kill_at, settle)


def _batches(log: str, upto: int | None = None) -> list[dict[str, Any]]:
    """The logged batches (``{"step", "worker", "keys"}``) up to step ``upto``."""
    return [line for line in lines(log) if "keys" in line and (upto is None or line["step"] <= upto)]


def _keys(batches: list[dict[str, Any]]) -> list[str]:
    return [k for batch in batches for k in batch["keys"]]


def _config(data: dict[str, Any], tmp: Path, *, names: list[str], shuffle: tuple[int, ...] = (0, 0, 0),
            resampled: tuple[bool, ...] = (False, False, False), index: bool = False, **mix: Any) -> dict[str, Any]:
    sources = [{"urls": data[name]["urls"], "index": data[name]["index"] if index else None, "seed": 7 + 10 * n,
                "shuffle": shuffle[n], "resampled": resampled[n]} for n, name in enumerate(names)]
    return {"sources": sources, "mix": "random", "probs": PROBS, "seed": 1234, "longest": False, "workers": 0,
            "batch": 8, "step_time": 0.005, "ckpt": str(tmp / "run.ckpt"), "log": str(tmp / "run.log"), **mix}


def _reference(cfg: dict[str, Any], tmp: Path) -> list[str]:
    ref = {**cfg, "ckpt": str(tmp / "ref.ckpt"), "log": str(tmp / "ref.log")}
    _run(ref)
    return _keys(_batches(ref["log"]))


def _mismatch(got: list[str], want: list[str]) -> str:
    at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    return (f"{len(got)} keys vs {len(want)} uninterrupted; first difference at {at}: "
            f"{got[at:at + 3]} vs {want[at:at + 3]}")


def _source(key: str) -> int:
    return NAMES.index(key.split("/", 1)[0].removeprefix("s"))


def _check_windows(stream: list[str], end: int | None = None) -> int:
    """Every window of ``WINDOW`` consecutive keys of ``stream[:end]`` holds each source within ``TOLERANCE``
    of its weight; returns how many windows were checked."""
    stream = stream[:end] if end is not None else stream
    counts = [0] * len(PROBS)
    worst = (0.0, -1, -1)
    for i, key in enumerate(stream):
        counts[_source(key)] += 1
        if i >= WINDOW:
            counts[_source(stream[i - WINDOW])] -= 1
        if i >= WINDOW - 1:
            for s, p in enumerate(PROBS):
                off = abs(counts[s] / WINDOW - p)
                if off > worst[0]:
                    worst = (off, i + 1 - WINDOW, s)
    assert worst[0] <= TOLERANCE, (f"the window starting at sample {worst[1]} holds {NAMES[worst[2]]} at a share "
                                   f"{worst[0]:.3f} away from its weight {PROBS[worst[2]]}")
    return max(0, len(stream) - WINDOW + 1)


# -- 1. kill and resume: the uninterrupted sequence -----------------------------------------------------------

S = ["sa", "sb", "sc"]
KILL_CONFIGS = [  # (name, config, when to kill: a random step, the first or last one, or late)
    ("finite-0-workers", {"names": S, "workers": 0}, "random"),
    ("finite-2-workers-late", {"names": S, "workers": 2}, "late"),
    ("finite-2-workers-at-step-1", {"names": S, "workers": 2, "shuffle": (16, 0, 0)}, "first"),
    ("finite-longest-2-workers-shuffle", {"names": S, "workers": 2, "longest": True, "shuffle": (16, 0, 8)}, "random"),
    ("indexed-0-workers-shuffle", {"names": S, "workers": 0, "index": True, "shuffle": (0, 12, 0)}, "random"),
    ("resampled-2-workers-shuffle", {"names": S, "workers": 2, "longest": True, "epoch": 150,
                                     "resampled": (True, True, False), "shuffle": (16, 0, 0)}, "random"),
    # checkpointed after the epoch's last batch: a with_epoch pipeline resumed there yields nothing more
    ("resampled-2-workers-at-the-end", {"names": S, "workers": 2, "epoch": 150, "resampled": (True, True, True)},
     "end"),
    ("listed-on-the-mix-2-workers-shuffle", {"names": S, "workers": 2, "listed": 8, "shuffle": (0, 12, 8)}, "random"),
    ("snapshots-every-5-steps-2-workers-shuffle", {"names": S, "workers": 2, "snapshot_every": 5,
                                                  "shuffle": (16, 0, 8)}, "random"),
    ("round-robin-2-workers-shuffle", {"names": S, "workers": 2, "mix": "round_robin", "longest": True,
                                       "shuffle": (0, 12, 0)}, "random"),
]


def _kill(cfg: dict[str, Any], nsteps: int, when: str) -> int:
    """Run ``cfg`` and SIGKILL it at a step chosen by ``when``; returns the step it was killed at. ``first``: during
    step 1's training step, after its checkpoint (a DataLoader worker may not have delivered anything yet);
    ``end``: during the last step, after its checkpoint (nothing is left to deliver)."""
    if when in ("first", "end"):
        at = 1 if when == "first" else nsteps
        assert _run({**cfg, "pause_at": at}, kill_at=at, settle=0.5) == -9
        return at
    kill_at = RNG.randrange(int(nsteps * 0.8), nsteps - 2) if when == "late" else RNG.randrange(2, nsteps - 3)
    assert _run(cfg, kill_at=kill_at) == -9, "the child finished before it could be killed"
    return kill_at


@pytest.mark.parametrize("name,extra,when", KILL_CONFIGS, ids=[c[0] for c in KILL_CONFIGS])
def test_sigkill_and_resume_continue_the_uninterrupted_sequence(data: Any, tmp_path: Path, name: str,
                                                                extra: dict[str, Any], when: str) -> None:
    cfg = _config(data, tmp_path, **extra)
    reference = _reference(cfg, tmp_path)
    nsteps = steps(str(tmp_path / "ref.log"))
    assert len(set(reference)) > 150 and nsteps > 10
    kill_at = _kill(cfg, nsteps, when)
    saved = checkpointed(cfg)
    assert saved >= 1, "killed before the first checkpoint"
    before = _keys(_batches(cfg["log"], upto=saved))
    resumed_log = str(tmp_path / "resumed.log")
    _run({**cfg, "log": resumed_log})
    after = _batches(resumed_log)
    if when != "end":
        assert after and after[0]["step"] == saved + 1, "the resumed run did not start after the checkpointed step"
    got = before + _keys(after)
    assert got == reference, f"{name}: killed at step {kill_at} (checkpoint {saved}): {_mismatch(got, reference)}"


# -- 2. kill, resume, kill again, resume again ----------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_second_resume_still_continues_the_sequence(data: Any, tmp_path: Path, workers: int) -> None:
    cfg = _config(data, tmp_path, names=S, workers=workers, shuffle=(16, 12, 0), longest=True)
    reference = _reference(cfg, tmp_path)
    nsteps = steps(str(tmp_path / "ref.log"))
    first = RNG.randrange(3, nsteps // 3)
    assert _run(cfg, kill_at=first) == -9
    saved1 = checkpointed(cfg)
    got = _keys(_batches(cfg["log"], upto=saved1))
    second = RNG.randrange(saved1 + 3, 2 * nsteps // 3)
    log2 = str(tmp_path / "resumed1.log")
    assert _run({**cfg, "log": log2}, kill_at=second) == -9, "the first resume finished before it could be killed"
    saved2 = checkpointed(cfg)
    assert saved2 > saved1
    resumed = _batches(log2, upto=saved2)
    assert resumed and resumed[0]["step"] == saved1 + 1
    got += _keys(resumed)
    log3 = str(tmp_path / "resumed2.log")
    _run({**cfg, "log": log3})
    last = _batches(log3)
    assert last and last[0]["step"] == saved2 + 1
    got += _keys(last)
    assert got == reference, f"killed at {first} (checkpoint {saved1}) and {second} (checkpoint {saved2}): " \
        + _mismatch(got, reference)


@pytest.mark.parametrize("when", ["in-epoch-1", "at-epoch-0-end"])
def test_resume_across_epochs_continues_the_sequence(data: Any, tmp_path: Path, when: str) -> None:
    """Two epochs (``mix.set_epoch(e)`` before each): killed in the second, or right after the checkpoint of the
    first epoch's last batch; the resumed run goes on with the same sequence (the second epoch a new one)."""
    cfg = _config(data, tmp_path, names=S, workers=2, shuffle=(16, 0, 8), epochs=2)
    reference = _reference(cfg, tmp_path)
    lines = _batches(str(tmp_path / "ref.log"))
    end0 = max(line["step"] for line in lines if line["epoch"] == 0)
    assert lines[-1]["epoch"] == 1 and lines[-1]["step"] > end0 + 10
    epochs = [_keys([line for line in lines if line["epoch"] == e]) for e in (0, 1)]
    assert epochs[0] != epochs[1], "set_epoch(1) did not change the sequence"
    if when == "at-epoch-0-end":
        assert _run({**cfg, "pause_at": end0}, kill_at=end0, settle=0.5) == -9
    else:
        assert _run(cfg, kill_at=RNG.randrange(end0 + 2, lines[-1]["step"] - 2)) == -9
    saved = checkpointed(cfg)
    if when == "at-epoch-0-end":
        assert saved == end0
    before = _keys(_batches(cfg["log"], upto=saved))
    resumed_log = str(tmp_path / "resumed.log")
    _run({**cfg, "log": resumed_log})
    after = _batches(resumed_log)
    assert after and after[0]["step"] == saved + 1
    got = before + _keys(after)
    assert got == reference, f"{when}: checkpoint {saved} (epoch 0 ends at step {end0}): {_mismatch(got, reference)}"


# -- 3. proportions through the DataLoader ---------------------------------------------------------------------

def test_balanced_proportions_in_every_window_through_2_workers(data: Any, tmp_path: Path) -> None:
    cfg = _config(data, tmp_path, names=NAMES, workers=2, batch=8, step_time=0)
    _run(cfg)
    stream = _keys(_batches(cfg["log"]))
    assert len(stream) > 5000
    assert len(set(stream)) == len(stream), "a sample delivered twice"
    assert _check_windows(stream) > 4000


# -- 4. torchrun: equal samples per rank -------------------------------------------------------------------

def _torchrun(cfg: dict[str, Any], nproc: int, output: Path, timeout: float = 100,
              kill_at: int | list[int] | None = None, logs: list[str] | None = None, settle: float = 0.0) -> int:
    """Launch the child under torchrun (gloo on CPU, 127.0.0.1); kill every process below it on the way out.
    Returns 0; with ``kill_at``, SIGKILLs the whole job (torchrun, its ranks, their DataLoader workers) once
    every log of ``logs`` shows that step (or its own step of a list), and ``settle`` seconds more, and returns
    -9. A launch that fails, or runs past ``timeout`` (before the kill step), fails the test with torchrun's
    output."""
    assert kill_at is None or logs, "a kill needs the logs to watch"
    targets = [] if kill_at is None else kill_at if isinstance(kill_at, list) else [kill_at] * len(logs or [])

    def reached() -> bool:
        return all(steps(log) >= at for log, at in zip(logs or [], targets))

    with Launches(CHILD) as job:
        job.start(["--nproc-per-node", str(nproc), "--master-port", str(free_port())], [json.dumps(cfg)], output)
        try:
            codes = job.wait(timeout, until=reached if targets else None)
        except AssertionError as exc:
            if not targets:
                raise
            raise AssertionError(f"steps logged: {[steps(log) for log in logs or []]}, to be killed at {kill_at}") \
                from exc
        if codes is None:
            time.sleep(settle)
            job.kill(check=True)
            return -9
        assert codes == [0], job.output()
        return 0


def _shares(source: dict[str, Any], seed: int, count: int) -> list[list[str]]:
    """The keys of each process's share of an indexed source's epoch 0 (``wds_async/data/plan.py``): the samples in
    the epoch's shard order, cut into ``count`` equal shares, the last ones padded by wrapping around."""
    keys = source["keys"]
    runs = [[s, 0, len(keys[s])] for s in shard_order(len(keys), seed, 0, True) if keys[s]]
    return [[keys[shard][i] for shard, lo, hi in split_equal(runs, count, p, False) for i in range(lo, hi)]
            for p in range(count)]


@pytest.mark.slow
def test_torchrun_ranks_deliver_equal_counts_and_every_share(data: Any, tmp_path: Path) -> None:
    """2 ranks x 2 workers of indexed sources: the seeded draws are the same on every rank, so both ranks
    deliver the same number of samples (a DDP job cannot hang on a rank that ran out); with ``longest`` the
    ranks deliver every sample of every source, plus the index's padding, each process its own share in order."""
    world, workers = 2, 2
    runs = []
    for longest in (False, True):
        tag = "longest" if longest else "shortest"
        cfg = _config(data, tmp_path, names=S, index=True, workers=workers, longest=longest, step_time=0)
        runs.append({**cfg, "log": str(tmp_path / f"{tag}-{{rank}}.log"), "ckpt": str(tmp_path / f"{tag}-{{rank}}.ckpt")})
    _torchrun({"dist": True, "runs": runs}, world, tmp_path / "torchrun.out")
    count = world * workers
    shares = [_shares(data[name], 7 + 10 * n, count) for n, name in enumerate(S)]
    for run in runs:
        logs = [_batches(run["log"].format(rank=rank)) for rank in range(world)]
        totals = [len(_keys(batches)) for batches in logs]
        assert totals[0] == totals[1] > 100, f"longest={run['longest']}: samples per rank {totals}"
        assert len(logs[0]) == len(logs[1]), f"longest={run['longest']}: steps per rank differ"
        delivered: dict[tuple[int, int, int], list[str]] = {}  # (source, rank, worker) -> keys in order
        for rank, batches in enumerate(logs):
            for batch in batches:
                for key in batch["keys"]:
                    delivered.setdefault((_source(key), rank, batch["worker"]), []).append(key)
        for s in range(len(S)):
            for rank in range(world):
                for worker in range(workers):
                    share = shares[s][rank * workers + worker]
                    got = delivered.get((s, rank, worker), [])
                    if run["longest"]:
                        assert got == share, f"source {S[s]}, rank {rank}, worker {worker}: not its share in order"
                    else:
                        assert got == share[:len(got)], f"source {S[s]}, rank {rank}, worker {worker}: not a prefix"
                        other = delivered.get((s, 1 - rank, worker), [])
                        assert len(got) == len(other), f"source {S[s]}, worker {worker}: ranks drew differently"
            if run["longest"]:
                whole = Counter(k for share in shares[s] for k in share)
                assert set(whole) == {k for shard in data[S[s]]["keys"] for k in shard}
        if not run["longest"]:
            for rank in range(world):
                for worker in range(workers):
                    assert any(len(delivered.get((s, rank, worker), [])) == len(shares[s][rank * workers + worker])
                               for s in range(len(S))), "the shortest mix ended before any source ran out"


@pytest.mark.slow
def test_torchrun_job_sigkilled_mid_epoch_resumes_each_rank_s_sequence(data: Any, tmp_path: Path) -> None:
    """2 ranks x 2 workers of a seeded mix of indexed sources under torchrun, held in lockstep as DDP holds them
    (a barrier after every step): the whole job (torchrun, ranks, DataLoader workers) is SIGKILLed mid-epoch and
    relaunched, each rank resuming from its own ``loader.state_dict()`` of the newest step every rank saved (a kill
    can find one rank a step ahead). Per rank, the keys up to that step followed by the relaunch's are those of
    one uninterrupted torchrun job with the same seeds, and both ranks deliver the same number of samples."""
    world, timeout = 2, 45
    cfg = _config(data, tmp_path, names=S, index=True, workers=2, shuffle=(16, 0, 8), step_time=0.02, lockstep=True)

    def job(tag: str) -> dict[str, Any]:
        return {**cfg, "log": str(tmp_path / f"{tag}-{{rank}}.log"), "ckpt": str(tmp_path / f"{tag}-{{rank}}.ckpt")}

    def per_rank(run: dict[str, Any], key: str) -> list[str]:
        return [run[key].format(rank=rank) for rank in range(world)]

    ref = job("ref")
    _torchrun({"dist": True, "runs": [ref]}, world, tmp_path / "ref.out", timeout=timeout)
    reference = [_keys(_batches(log)) for log in per_rank(ref, "log")]
    nsteps = [steps(log) for log in per_rank(ref, "log")]
    assert nsteps[0] == nsteps[1] > 12 and len(reference[0]) == len(reference[1]) > 100, \
        f"uninterrupted: steps per rank {nsteps}, samples per rank {[len(keys) for keys in reference]}"

    # rank 1 falls a step behind at the kill (it sleeps after that step's barrier), so rank 0 has logged and saved
    # one more step: the relaunch must resume both from the newest step both saved, or the ranks would run different
    # numbers of steps (in CI, a kill that found the ranks so failed the relaunch at its last barrier)
    kill_at = RNG.randrange(3, 2 * nsteps[0] // 3)
    killed = {**job("killed"), "lag": {"rank": 1, "step": kill_at}}
    assert _torchrun({"dist": True, "runs": [killed]}, world, tmp_path / "killed.out", timeout=timeout,
                     kill_at=[kill_at + 1, kill_at], logs=per_rank(killed, "log"), settle=0.5) == -9, \
        "the job finished before it could be killed"

    def newest(ckpt: str) -> int:
        return max(checkpointed({"ckpt": ckpt}), checkpointed({"ckpt": ckpt + ".prev"}))

    ahead = [newest(ckpt) for ckpt in per_rank(killed, "ckpt")]
    assert ahead == [kill_at + 1, kill_at], f"killed at steps {[kill_at + 1, kill_at]}: checkpoints {ahead}"
    saved = [min(ahead)] * world

    resumed = {**killed, "lag": None, "log": str(tmp_path / "resumed-{rank}.log")}
    _torchrun({"dist": True, "runs": [resumed]}, world, tmp_path / "resumed.out", timeout=timeout)
    combined, failures = [], []
    for rank, (before_log, after_log) in enumerate(zip(per_rank(killed, "log"), per_rank(resumed, "log"))):
        after = _batches(after_log)
        if not after or after[0]["step"] != saved[rank] + 1:
            failures.append(f"rank {rank}: the relaunch did not start after checkpoint {saved[rank]} "
                            f"(its first step: {after[0]['step'] if after else None})")
        batches = _batches(before_log, upto=saved[rank]) + after
        got = _keys(batches)
        combined.append(len(got))
        if got != reference[rank]:
            at = next((i for i, (g, w) in enumerate(zip(got, reference[rank])) if g != w), len(got))
            step = [batch["step"] for batch in batches for _ in batch["keys"]][min(at, len(got) - 1)] if got else 0
            failures.append(f"rank {rank}, from step {step} (checkpoint {saved[rank]}): {_mismatch(got, reference[rank])}")
    assert not failures, f"killed at step {kill_at}, checkpoints {saved}:\n" + "\n".join(failures)
    assert combined[0] == combined[1], f"samples per rank, checkpointed and resumed: {combined}"


# -- 5. elastic resume into another world size ------------------------------------------------------------------

def _cutoff(batches: list[dict[str, Any]]) -> int:
    """The position in the flat stream of ``batches`` up to which every worker still had every source: the
    earliest last sample of a source in a worker's stream (0 when a worker had none of some source)."""
    last: dict[tuple[int, int], int] = {}
    workers: set[int] = set()
    at = 0
    for batch in batches:
        workers.add(batch["worker"])
        for key in batch["keys"]:
            last[(batch["worker"], _source(key))] = at
            at += 1
    return min((last.get((w, s), 0) for w in workers for s in range(len(PROBS))), default=0)


ELASTIC = [("into-1-rank", 1, 2, False), ("into-3-ranks", 3, 1, False), ("indexed-into-3-ranks", 3, 1, True)]


@pytest.mark.parametrize("name,new_world,new_workers,index", ELASTIC, ids=[c[0] for c in ELASTIC])
def test_elastic_resume_of_2_ranks_delivers_the_rest_once(data: Any, tmp_path: Path, name: str, new_world: int,
                                                          new_workers: int, index: bool) -> None:
    """Two ranks x 2 workers are killed mid-epoch; ``merge_states`` of their checkpoints is loaded into the
    mix of every process of a job of another world size, which delivers every remaining sample of every
    source exactly once (with an index: plus the padding of the old and the new shares), in the weights'
    proportions while every source still has samples. The new job of one rank is then killed and resumed
    from its own checkpoint, and must deliver what it delivered uninterrupted."""
    base = _config(data, tmp_path, names=NAMES, workers=2, longest=True, shuffle=(0, 16, 0), index=index)
    old = []
    for rank, kill_at in enumerate((RNG.randrange(20, 40), RNG.randrange(20, 40))):
        cfg = {**base, "ckpt": str(tmp_path / f"old{rank}.ckpt"), "log": str(tmp_path / f"old{rank}.log")}
        assert _run(cfg, env={"RANK": str(rank), "WORLD_SIZE": "2"}, kill_at=kill_at) == -9
        old.append(cfg)
    before = [k for cfg in old for k in _keys(_batches(cfg["log"], upto=checkpointed(cfg)))]
    assert len(before) > 200 and len(set(before)) == len(before)
    merged = [cfg["ckpt"] for cfg in old]
    after = []
    windows = 0
    for rank in range(new_world):
        cfg = {**base, "workers": new_workers, "merge": merged, "step_time": 0,
               "ckpt": str(tmp_path / f"new{rank}.ckpt"), "log": str(tmp_path / f"new{rank}.log")}
        _run(cfg, env={"RANK": str(rank), "WORLD_SIZE": str(new_world)} if new_world > 1 else None)
        batches = _batches(cfg["log"])
        stream = _keys(batches)
        after += stream
        windows += _check_windows(stream, _cutoff(batches))
    everything = Counter(k for name in NAMES for shard in data[name]["keys"] for k in shard)
    got = Counter(before + after)
    missing, extra = everything - got, got - everything
    assert not missing, f"{sum(missing.values())} samples lost, e.g. {sorted(missing)[:5]}"
    if index:
        # Each source's old shares padded by at most 2 * 2 - 1 samples, the new ones by new_world * new_workers - 1.
        for s in range(len(NAMES)):
            repeats = sum(n for k, n in extra.items() if _source(k) == s)
            assert repeats <= 3 + new_world * new_workers - 1, f"source {NAMES[s]}: {repeats} samples repeated"
    else:
        assert not extra, f"{sum(extra.values())} samples repeated, e.g. {sorted(extra)[:5]}"
    assert windows > (1000 if new_world == 1 else 300), f"only {windows} windows while every source had samples"
    if new_world == 1:
        # The new job is preempted too: killed, then resumed from its own checkpoint, it goes on as it would have.
        cfg = {**cfg, "step_time": 0.001, "ckpt": str(tmp_path / "again.ckpt"), "log": str(tmp_path / "again.log")}
        nsteps = steps(str(tmp_path / "new0.log"))
        kill_at = RNG.randrange(5, nsteps // 3)
        assert _run(cfg, kill_at=kill_at) == -9
        saved = checkpointed(cfg)
        again = _keys(_batches(cfg["log"], upto=saved))
        _run({**cfg, "log": str(tmp_path / "again-resumed.log")})
        again += _keys(_batches(str(tmp_path / "again-resumed.log")))
        assert again == after, f"the elastically resumed job killed at {kill_at} (checkpoint {saved}): " \
            + _mismatch(again, after)


def test_elastic_resume_from_a_checkpoint_before_some_worker_delivered(data: Any, tmp_path: Path) -> None:
    """A checkpoint of step 1 with 2 workers: worker 0 made the batch, worker 1 had delivered nothing (its mix
    saved no state). Single WebDatasets merge such a process as owing its whole share; a mix must too, and not
    make the new job start afresh, which would deliver the old job's first batches again."""
    base = _config(data, tmp_path, names=S, workers=2, longest=True, pause_at=1)
    old = []
    for rank in range(2):
        cfg = {**base, "ckpt": str(tmp_path / f"old{rank}.ckpt"), "log": str(tmp_path / f"old{rank}.log")}
        assert _run(cfg, env={"RANK": str(rank), "WORLD_SIZE": "2"}, kill_at=1, settle=0.5) == -9
        assert checkpointed(cfg) == 1
        old.append(cfg)
    before = [k for cfg in old for k in _keys(_batches(cfg["log"], upto=1))]
    assert len(before) == 16
    import torch

    wds.merge_states(torch.load(cfg["ckpt"], weights_only=False)["loader"] for cfg in old)
    cfg = {**base, "workers": 0, "merge": [cfg["ckpt"] for cfg in old], "step_time": 0, "pause_at": None,
           "ckpt": str(tmp_path / "new.ckpt"), "log": str(tmp_path / "new.log")}
    _run(cfg)
    got = Counter(before + _keys(_batches(cfg["log"])))
    assert got == Counter(k for name in S for shard in data[name]["keys"] for k in shard)


def test_a_mix_without_a_seed_refuses_to_resume(data: Any) -> None:
    """``seed=None`` draws from the global ``random`` module as webdataset does, which no checkpoint restores:
    loading its state is refused rather than resumed with other draws."""

    def make() -> Any:
        return wds.RandomMix([wds.WebDataset(data[name]["urls"]).map(lambda s: s["__key__"]) for name in S], PROBS)

    mix = make()
    it = iter(mix)
    next(it)
    state = mix.state_dict()
    it.close()
    assert state["source"]["seeded"] is False
    again = make()
    with pytest.raises(ValueError, match="without a seed"):
        again.load_state_dict(state)
        next(iter(again))
