"""Resumable mixes (``wds.RandomMix(..., seed=...)``, ``wds.RoundRobin``) the way training jobs meet them, in one
process with its DataLoader workers.

A child process (``mix_child.py``) iterates a ``StatefulDataLoader`` over a mix of three WebDataset sources
with uneven sample counts, served by the emulated store, logging every step's keys (``source/shard/key``)
and checkpointing ``loader.state_dict()`` after every step. The parent SIGKILLs it (with its DataLoader
workers) at a random step and resumes it in a fresh process; the keys up to the checkpointed step followed
by the resumed run's must be, as a sequence, those of one uninterrupted run with the same seeds. Further:
a second kill after the first resume, a resume across epochs, and the balanced draws' proportions through a
DataLoader. Under torchrun: test_mix_torchrun.py.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from tests.torch.children import checkpointed, steps
from tests.torch.mix_jobs import (
    NAMES,
    PROBS,
    S,
    check_windows,
    keys_of,
    logged_batches,
    mismatch,
    mix_config,
    run_mix_child,
    uninterrupted,
)

#: Kill points are random but reproducible.
RNG = random.Random(20261125)


# -- 1. kill and resume: the uninterrupted sequence -----------------------------------------------------------

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
        assert run_mix_child({**cfg, "pause_at": at}, kill_at=at, settle=0.5) == -9
        return at
    kill_at = RNG.randrange(int(nsteps * 0.8), nsteps - 2) if when == "late" else RNG.randrange(2, nsteps - 3)
    assert run_mix_child(cfg, kill_at=kill_at) == -9, "the child finished before it could be killed"
    return kill_at


@pytest.mark.parametrize("name,extra,when", KILL_CONFIGS, ids=[c[0] for c in KILL_CONFIGS])
def test_sigkill_and_resume_continue_the_uninterrupted_sequence(mix_data: Any, tmp_path: Path, name: str,
                                                                extra: dict[str, Any], when: str) -> None:
    cfg = mix_config(mix_data, tmp_path, **extra)
    reference = uninterrupted(cfg, tmp_path)
    nsteps = steps(str(tmp_path / "ref.log"))
    assert len(set(reference)) > 150 and nsteps > 10
    kill_at = _kill(cfg, nsteps, when)
    saved = checkpointed(cfg)
    assert saved >= 1, "killed before the first checkpoint"
    before = keys_of(logged_batches(cfg["log"], upto=saved))
    resumed_log = str(tmp_path / "resumed.log")
    run_mix_child({**cfg, "log": resumed_log})
    after = logged_batches(resumed_log)
    if when != "end":
        assert after and after[0]["step"] == saved + 1, "the resumed run did not start after the checkpointed step"
    got = before + keys_of(after)
    assert got == reference, f"{name}: killed at step {kill_at} (checkpoint {saved}): {mismatch(got, reference)}"


# -- 2. kill, resume, kill again, resume again ----------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_second_resume_still_continues_the_sequence(mix_data: Any, tmp_path: Path, workers: int) -> None:
    cfg = mix_config(mix_data, tmp_path, names=S, workers=workers, shuffle=(16, 12, 0), longest=True)
    reference = uninterrupted(cfg, tmp_path)
    nsteps = steps(str(tmp_path / "ref.log"))
    first = RNG.randrange(3, nsteps // 3)
    assert run_mix_child(cfg, kill_at=first) == -9
    saved1 = checkpointed(cfg)
    got = keys_of(logged_batches(cfg["log"], upto=saved1))
    second = RNG.randrange(saved1 + 3, 2 * nsteps // 3)
    log2 = str(tmp_path / "resumed1.log")
    assert run_mix_child({**cfg, "log": log2}, kill_at=second) == -9, \
        "the first resume finished before it could be killed"
    saved2 = checkpointed(cfg)
    assert saved2 > saved1
    resumed = logged_batches(log2, upto=saved2)
    assert resumed and resumed[0]["step"] == saved1 + 1
    got += keys_of(resumed)
    log3 = str(tmp_path / "resumed2.log")
    run_mix_child({**cfg, "log": log3})
    last = logged_batches(log3)
    assert last and last[0]["step"] == saved2 + 1
    got += keys_of(last)
    assert got == reference, f"killed at {first} (checkpoint {saved1}) and {second} (checkpoint {saved2}): " \
        + mismatch(got, reference)


@pytest.mark.parametrize("when", ["in-epoch-1", "at-epoch-0-end"])
def test_resume_across_epochs_continues_the_sequence(mix_data: Any, tmp_path: Path, when: str) -> None:
    """Two epochs (``mix.set_epoch(e)`` before each): killed in the second, or right after the checkpoint of the
    first epoch's last batch; the resumed run goes on with the same sequence (the second epoch a new one)."""
    cfg = mix_config(mix_data, tmp_path, names=S, workers=2, shuffle=(16, 0, 8), epochs=2)
    reference = uninterrupted(cfg, tmp_path)
    lines = logged_batches(str(tmp_path / "ref.log"))
    end0 = max(line["step"] for line in lines if line["epoch"] == 0)
    assert lines[-1]["epoch"] == 1 and lines[-1]["step"] > end0 + 10
    epochs = [keys_of([line for line in lines if line["epoch"] == e]) for e in (0, 1)]
    assert epochs[0] != epochs[1], "set_epoch(1) did not change the sequence"
    if when == "at-epoch-0-end":
        assert run_mix_child({**cfg, "pause_at": end0}, kill_at=end0, settle=0.5) == -9
    else:
        assert run_mix_child(cfg, kill_at=RNG.randrange(end0 + 2, lines[-1]["step"] - 2)) == -9
    saved = checkpointed(cfg)
    if when == "at-epoch-0-end":
        assert saved == end0
    before = keys_of(logged_batches(cfg["log"], upto=saved))
    resumed_log = str(tmp_path / "resumed.log")
    run_mix_child({**cfg, "log": resumed_log})
    after = logged_batches(resumed_log)
    assert after and after[0]["step"] == saved + 1
    got = before + keys_of(after)
    assert got == reference, f"{when}: checkpoint {saved} (epoch 0 ends at step {end0}): {mismatch(got, reference)}"


# -- 3. proportions through the DataLoader ---------------------------------------------------------------------

def test_balanced_proportions_in_every_window_through_2_workers(mix_data: Any, tmp_path: Path) -> None:
    cfg = mix_config(mix_data, tmp_path, names=NAMES, workers=2, batch=8, step_time=0)
    run_mix_child(cfg)
    stream = keys_of(logged_batches(cfg["log"]))
    assert len(stream) > 5000
    assert len(set(stream)) == len(stream), "a sample delivered twice"
    assert check_windows(stream) > 4000


def test_a_mix_without_a_seed_refuses_to_resume(mix_data: Any) -> None:
    """``seed=None`` draws from the global ``random`` module as webdataset does, which no checkpoint restores:
    loading its state is refused rather than resumed with other draws."""

    def make() -> Any:
        return wds.RandomMix([wds.WebDataset(mix_data[name]["urls"]).map(lambda s: s["__key__"]) for name in S], PROBS)

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
