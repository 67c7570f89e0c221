"""Exact mid-epoch resume, the way a preempted training job meets it: a child process checkpoints
``StatefulDataLoader.state_dict()`` after every step, is killed with SIGKILL (with its DataLoader workers)
at a random step, and a fresh process resumes from the checkpoint. The keys it logged up to the
checkpointed step plus those of the resumed run must be the epoch exactly once.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.torch.children import checkpointed, lines, run_child

CHILD = str(Path(__file__).with_name("resume_child.py"))
REPO = str(Path(__file__).resolve().parents[2])
#: Kill points are random but reproducible; 20 of them in all across the configurations below.
RNG = random.Random(20261123)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("resume")
    make_shards(root / "plain", n_shards=7, shard_bytes=48 << 10, sample_bytes=2 << 10, seed=5)
    make_shards(root / "gz", n_shards=4, shard_bytes=48 << 10, sample_bytes=2 << 10, seed=6, gz=True)
    with StoreProcess(root, Knobs(seed=1)) as store:
        plain = store.base_url + "plain/shard-{000000..000006}.tar"
        index = root / "plain.index"
        wds.build_index(plain).save(index)
        yield {"plain": plain, "gz": store.base_url + "gz/shard-{000000..000003}.tar.gz", "index": str(index),
               "root": root}


def _run(cfg: dict[str, Any], env: dict[str, str] | None = None, kill_at: int | None = None) -> int:
    """Run the child (see :func:`tests.torch.children.run_child`)."""
    return run_child(CHILD, cfg, env, kill_at)


def _delivered(log: str, upto: int | None = None) -> list[str]:
    return [k for line in lines(log) if "keys" in line and (upto is None or line["step"] <= upto)
            for k in line["keys"]]


def _reference(cfg: dict[str, Any], tmp: Path) -> list[str]:
    ref = {**cfg, "ckpt": str(tmp / "ref.ckpt"), "log": str(tmp / "ref.log")}
    _run(ref)
    return _delivered(ref["log"])


CONFIGS = [  # (name, config, number of kill points)
    ("0-workers", {"workers": 0}, 3),
    ("2-workers-shuffle", {"workers": 2, "shuffle": 30}, 4),
    ("index-2-workers-shuffle", {"workers": 2, "shuffle": 20, "index": True}, 4),
    ("deterministic", {"workers": 0, "deterministic": True}, 3),
    ("tar.gz-2-workers", {"workers": 2, "gz": True}, 3),
    ("index-0-workers-shuffle", {"workers": 0, "shuffle": 16, "index": True}, 3),
]


@pytest.mark.parametrize("name,extra,kills", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_sigkill_and_resume_deliver_the_epoch_exactly_once(data: Any, tmp_path: Path, name: str,
                                                            extra: dict[str, Any], kills: int) -> None:
    cfg: dict[str, Any] = {"urls": data["gz" if extra.get("gz") else "plain"], "workers": extra["workers"],
                           "shuffle": extra.get("shuffle", 0), "deterministic": extra.get("deterministic", False),
                           "index": data["index"] if extra.get("index") else None}
    reference = _reference(cfg, tmp_path)
    assert len(reference) > 30
    nsteps = -(-len(reference) // 4) if cfg["workers"] == 0 else len(reference) // 4
    for n in range(kills):
        kill_at = RNG.randrange(1, max(2, nsteps - 1))
        run = {**cfg, "ckpt": str(tmp_path / f"{n}.ckpt"), "log": str(tmp_path / f"{n}.log")}
        assert _run(run, kill_at=kill_at) == -9, "the child finished before it could be killed"
        saved = checkpointed(run)
        before = _delivered(run["log"], upto=saved)
        resumed_log = str(tmp_path / f"{n}.resumed.log")
        _run({**run, "log": resumed_log})
        after = _delivered(resumed_log)
        got = before + after
        counts = Counter(got)
        assert Counter(reference) == counts, (
            f"{name}: killed at step {kill_at} (checkpoint {saved}): "
            f"missing {sorted((Counter(reference) - counts).elements())[:5]}, "
            f"extra {sorted((counts - Counter(reference)).elements())[:5]}")
        if cfg["deterministic"]:
            assert got == reference, "deterministic delivery resumed in another order"


@pytest.mark.parametrize("index", [False, True], ids=["shards", "index"])
def test_elastic_resume_from_4_ranks_into_2(data: Any, tmp_path: Path, index: bool) -> None:
    """Four ranks x 2 workers are killed at different steps; two ranks x 1 worker load the merged states
    and deliver the rest of the epoch: every sample once (plus, with an index, only padding repeats)."""
    base = {"urls": data["plain"], "index": data["index"] if index else None, "batch": 2}
    old = []
    for rank in range(4):
        cfg = {**base, "workers": 2, "ckpt": str(tmp_path / f"old{rank}.ckpt"), "log": str(tmp_path / f"old{rank}.log")}
        assert _run(cfg, env={"RANK": str(rank), "WORLD_SIZE": "4"}, kill_at=2 + rank) == -9
        old.append(cfg)
    got = [k for cfg in old for k in _delivered(cfg["log"], upto=checkpointed(cfg))]
    merged = [cfg["ckpt"] for cfg in old]
    for rank in range(2):
        cfg = {**base, "workers": 1, "merge": merged, "ckpt": str(tmp_path / f"new{rank}.ckpt"),
               "log": str(tmp_path / f"new{rank}.log")}
        _run(cfg, env={"RANK": str(rank), "WORLD_SIZE": "2"})
        got += _delivered(cfg["log"])
    manifest = json.loads((data["root"] / "plain" / "manifest.json").read_text())
    counts = Counter(got)
    assert len(counts) == manifest["expected_samples"], "samples lost in the elastic resume"
    repeats = sum(counts.values()) - len(counts)
    if index:
        assert repeats < 8 + 2, f"{repeats} repeats: more than the padding of the old (8) and new (2) shares"
    else:
        assert repeats == 0


def test_state_from_another_dataset_is_refused(data: Any) -> None:
    ds = wds.WebDataset(data["plain"])
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    it.close()
    other = wds.WebDataset(data["gz"])
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="another dataset"):
        next(iter(other))
    with pytest.raises(ValueError, match="not from one epoch"):
        wds.merge_states([state, {"wds_async": 1, "source": {**state["source"], "epoch": 5}}])
    with pytest.raises(ValueError, match="are missing"):
        wds.merge_states([{"wds_async": 1, "source": {**state["source"], "processes": [0, 2, 0, 1]}}])


def test_resume_with_re_signed_urls(data: Any) -> None:
    """A checkpoint names shards by position and the URL without its query (a signature that expired), so the
    resumed job may pass freshly signed URLs; the index built from the old URLs still matches them."""
    old = [u + "?ttfb=0" for u in wds.expand_urls(data["plain"])]
    new = [u + "?ttfb=0.001" for u in wds.expand_urls(data["plain"])]  # same objects, another query string
    index = wds.build_index(old)

    def make(urls: list[str]) -> Any:
        ds = wds.WebDataset(urls, index=index, shardshuffle=True, seed=1, deterministic=True)
        return ds.shuffle(10, seed=2).map(lambda s: s["__key__"])

    full = list(make(old))
    ds = make(old)
    it = iter(ds)
    head = [next(it) for _ in range(25)]
    state = ds.state_dict()
    it.close()
    assert "ttfb" not in repr(state)
    again = make(new)
    again.load_state_dict(state)
    assert head + list(again) == full
