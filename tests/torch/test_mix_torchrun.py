"""Resumable mixes under torchrun (see test_mix_resume.py for the single process): ranks deliver equal sample counts
and every share, a whole job SIGKILLed mid-epoch resumes each rank's sequence, and an elastic resume
(``wds.merge_states``) into another world size delivers the rest exactly once.
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
from tests.conftest import free_port
from tests.torch.children import Launches, checkpointed, steps
from tests.torch.mix_jobs import (
    CHILD,
    NAMES,
    PROBS,
    S,
    check_windows,
    keys_of,
    logged_batches,
    mismatch,
    mix_config,
    run_mix_child,
    source_of,
)
from wds_async.data.plan import shard_order, split_equal

#: Kill points are random but reproducible.
RNG = random.Random(20261125)


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
def test_torchrun_ranks_deliver_equal_counts_and_every_share(mix_data: Any, tmp_path: Path) -> None:
    """2 ranks x 2 workers of indexed sources: the seeded draws are the same on every rank, so both ranks
    deliver the same number of samples (a DDP job cannot hang on a rank that ran out); with ``longest`` the
    ranks deliver every sample of every source, plus the index's padding, each process its own share in order."""
    world, workers = 2, 2
    runs = []
    for longest in (False, True):
        tag = "longest" if longest else "shortest"
        cfg = mix_config(mix_data, tmp_path, names=S, index=True, workers=workers, longest=longest, step_time=0)
        runs.append({**cfg, "log": str(tmp_path / f"{tag}-{{rank}}.log"),
                     "ckpt": str(tmp_path / f"{tag}-{{rank}}.ckpt")})
    _torchrun({"dist": True, "runs": runs}, world, tmp_path / "torchrun.out")
    count = world * workers
    shares = [_shares(mix_data[name], 7 + 10 * n, count) for n, name in enumerate(S)]
    for run in runs:
        logs = [logged_batches(run["log"].format(rank=rank)) for rank in range(world)]
        totals = [len(keys_of(batches)) for batches in logs]
        assert totals[0] == totals[1] > 100, f"longest={run['longest']}: samples per rank {totals}"
        assert len(logs[0]) == len(logs[1]), f"longest={run['longest']}: steps per rank differ"
        delivered: dict[tuple[int, int, int], list[str]] = {}  # (source, rank, worker) -> keys in order
        for rank, batches in enumerate(logs):
            for batch in batches:
                for key in batch["keys"]:
                    delivered.setdefault((source_of(key), rank, batch["worker"]), []).append(key)
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
                assert set(whole) == {k for shard in mix_data[S[s]]["keys"] for k in shard}
        if not run["longest"]:
            for rank in range(world):
                for worker in range(workers):
                    assert any(len(delivered.get((s, rank, worker), [])) == len(shares[s][rank * workers + worker])
                               for s in range(len(S))), "the shortest mix ended before any source ran out"


@pytest.mark.slow
def test_torchrun_job_sigkilled_mid_epoch_resumes_each_rank_s_sequence(mix_data: Any, tmp_path: Path) -> None:
    """2 ranks x 2 workers of a seeded mix of indexed sources under torchrun, held in lockstep as DDP holds them
    (a barrier after every step): the whole job (torchrun, ranks, DataLoader workers) is SIGKILLed mid-epoch and
    relaunched, each rank resuming from its own ``loader.state_dict()`` of the newest step every rank saved (a kill
    can find one rank a step ahead). Per rank, the keys up to that step followed by the relaunch's are those of
    one uninterrupted torchrun job with the same seeds, and both ranks deliver the same number of samples."""
    world, timeout = 2, 45
    cfg = mix_config(mix_data, tmp_path, names=S, index=True, workers=2, shuffle=(16, 0, 8), step_time=0.02,
                     lockstep=True)

    def job(tag: str) -> dict[str, Any]:
        return {**cfg, "log": str(tmp_path / f"{tag}-{{rank}}.log"), "ckpt": str(tmp_path / f"{tag}-{{rank}}.ckpt")}

    def per_rank(run: dict[str, Any], key: str) -> list[str]:
        return [run[key].format(rank=rank) for rank in range(world)]

    ref = job("ref")
    _torchrun({"dist": True, "runs": [ref]}, world, tmp_path / "ref.out", timeout=timeout)
    reference = [keys_of(logged_batches(log)) for log in per_rank(ref, "log")]
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
        after = logged_batches(after_log)
        if not after or after[0]["step"] != saved[rank] + 1:
            failures.append(f"rank {rank}: the relaunch did not start after checkpoint {saved[rank]} "
                            f"(its first step: {after[0]['step'] if after else None})")
        batches = logged_batches(before_log, upto=saved[rank]) + after
        got = keys_of(batches)
        combined.append(len(got))
        if got != reference[rank]:
            at = next((i for i, (g, w) in enumerate(zip(got, reference[rank])) if g != w), len(got))
            step = [batch["step"] for batch in batches for _ in batch["keys"]][min(at, len(got) - 1)] if got else 0
            failures.append(f"rank {rank}, from step {step} (checkpoint {saved[rank]}): "
                            f"{mismatch(got, reference[rank])}")
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
            last[(batch["worker"], source_of(key))] = at
            at += 1
    return min((last.get((w, s), 0) for w in workers for s in range(len(PROBS))), default=0)


ELASTIC = [("into-1-rank", 1, 2, False), ("into-3-ranks", 3, 1, False), ("indexed-into-3-ranks", 3, 1, True)]


@pytest.mark.parametrize("name,new_world,new_workers,index", ELASTIC, ids=[c[0] for c in ELASTIC])
def test_elastic_resume_of_2_ranks_delivers_the_rest_once(mix_data: Any, tmp_path: Path, name: str,
                                                          new_world: int, new_workers: int, index: bool) -> None:
    """Two ranks x 2 workers are killed mid-epoch; ``merge_states`` of their checkpoints is loaded into the
    mix of every process of a job of another world size, which delivers every remaining sample of every
    source exactly once (with an index: plus the padding of the old and the new shares), in the weights'
    proportions while every source still has samples. The new job of one rank is then killed and resumed
    from its own checkpoint, and must deliver what it delivered uninterrupted."""
    base = mix_config(mix_data, tmp_path, names=NAMES, workers=2, longest=True, shuffle=(0, 16, 0), index=index)
    old = []
    for rank, kill_at in enumerate((RNG.randrange(20, 40), RNG.randrange(20, 40))):
        cfg = {**base, "ckpt": str(tmp_path / f"old{rank}.ckpt"), "log": str(tmp_path / f"old{rank}.log")}
        assert run_mix_child(cfg, env={"RANK": str(rank), "WORLD_SIZE": "2"}, kill_at=kill_at) == -9
        old.append(cfg)
    before = [k for cfg in old for k in keys_of(logged_batches(cfg["log"], upto=checkpointed(cfg)))]
    assert len(before) > 200 and len(set(before)) == len(before)
    merged = [cfg["ckpt"] for cfg in old]
    after = []
    windows = 0
    for rank in range(new_world):
        cfg = {**base, "workers": new_workers, "merge": merged, "step_time": 0,
               "ckpt": str(tmp_path / f"new{rank}.ckpt"), "log": str(tmp_path / f"new{rank}.log")}
        run_mix_child(cfg, env={"RANK": str(rank), "WORLD_SIZE": str(new_world)} if new_world > 1 else None)
        batches = logged_batches(cfg["log"])
        stream = keys_of(batches)
        after += stream
        windows += check_windows(stream, _cutoff(batches))
    everything = Counter(k for name in NAMES for shard in mix_data[name]["keys"] for k in shard)
    got = Counter(before + after)
    missing, extra = everything - got, got - everything
    assert not missing, f"{sum(missing.values())} samples lost, e.g. {sorted(missing)[:5]}"
    if index:
        # Each source's old shares padded by at most 2 * 2 - 1 samples, the new ones by new_world * new_workers - 1.
        for s in range(len(NAMES)):
            repeats = sum(n for k, n in extra.items() if source_of(k) == s)
            assert repeats <= 3 + new_world * new_workers - 1, f"source {NAMES[s]}: {repeats} samples repeated"
    else:
        assert not extra, f"{sum(extra.values())} samples repeated, e.g. {sorted(extra)[:5]}"
    assert windows > (1000 if new_world == 1 else 300), f"only {windows} windows while every source had samples"
    if new_world == 1:
        # The new job is preempted too: killed, then resumed from its own checkpoint, it goes on as it would have.
        cfg = {**cfg, "step_time": 0.001, "ckpt": str(tmp_path / "again.ckpt"), "log": str(tmp_path / "again.log")}
        nsteps = steps(str(tmp_path / "new0.log"))
        kill_at = RNG.randrange(5, nsteps // 3)
        assert run_mix_child(cfg, kill_at=kill_at) == -9
        saved = checkpointed(cfg)
        again = keys_of(logged_batches(cfg["log"], upto=saved))
        run_mix_child({**cfg, "log": str(tmp_path / "again-resumed.log")})
        again += keys_of(logged_batches(str(tmp_path / "again-resumed.log")))
        assert again == after, f"the elastically resumed job killed at {kill_at} (checkpoint {saved}): " \
            + mismatch(again, after)


def test_elastic_resume_from_a_checkpoint_before_some_worker_delivered(mix_data: Any, tmp_path: Path) -> None:
    """A checkpoint of step 1 with 2 workers: worker 0 made the batch, worker 1 had delivered nothing (its mix
    saved no state). Single WebDatasets merge such a process as owing its whole share; a mix must too, and not
    make the new job start afresh, which would deliver the old job's first batches again."""
    base = mix_config(mix_data, tmp_path, names=S, workers=2, longest=True, pause_at=1)
    old = []
    for rank in range(2):
        cfg = {**base, "ckpt": str(tmp_path / f"old{rank}.ckpt"), "log": str(tmp_path / f"old{rank}.log")}
        assert run_mix_child(cfg, env={"RANK": str(rank), "WORLD_SIZE": "2"}, kill_at=1, settle=0.5) == -9
        assert checkpointed(cfg) == 1
        old.append(cfg)
    before = [k for cfg in old for k in keys_of(logged_batches(cfg["log"], upto=1))]
    assert len(before) == 16
    import torch

    wds.merge_states(torch.load(cfg["ckpt"], weights_only=False)["loader"] for cfg in old)
    cfg = {**base, "workers": 0, "merge": [cfg["ckpt"] for cfg in old], "step_time": 0, "pause_at": None,
           "ckpt": str(tmp_path / "new.ckpt"), "log": str(tmp_path / "new.log")}
    run_mix_child(cfg)
    got = Counter(before + keys_of(logged_batches(cfg["log"])))
    assert got == Counter(k for name in S for shard in mix_data[name]["keys"] for k in shard)
