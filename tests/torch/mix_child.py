"""A training-loop stand-in for the mix resume tests: iterate a ``StatefulDataLoader`` over a seeded
``wds.RandomMix`` (or ``wds.RoundRobin``) of WebDataset sources, log each step's keys, checkpoint
``loader.state_dict()`` after every step (atomically), and resume from the checkpoint.

    python tests/torch/mix_child.py CONFIG_JSON

CONFIG keys:
    sources: a list of ``{"urls", "index", "seed", "shuffle", "resampled"}``, one per source
    mix: ``"random"`` (with ``probs``, ``seed``) or ``"round_robin"``; longest; epoch (``.with_epoch(n)``);
        listed (``.listed(n)`` on the mix: batches of n made by the mix, the DataLoader's batch_size None)
    workers, batch, ckpt, log, step_time, pause_at (a step that takes 3 s); snapshot_every (the loader's
        snapshot_every_n_steps: workers send their state every n batches, the loader replays the rest)
    epochs: default 1; ``mix.set_epoch(e)`` before each
    merge: old checkpoints whose ``wds.merge_states`` this process loads (an elastic resume), unless it has a
        checkpoint of its own (``ckpt``) to resume from
    dist: init a gloo process group (under torchrun); runs: several such configs, one after the other
    lockstep: (with dist) a ``dist.barrier()`` after every step's checkpoint, as a DDP step's all-reduce holds the
        ranks together: no rank runs ahead, and a kill finds every rank within a step of the others. Each rank
        then keeps its last two checkpoints (``ckpt`` and ``ckpt.prev``) and a relaunch resumes every rank from
        the newest step all of them saved (``agreed_checkpoint``); lag: ``{"rank", "step"}``, that rank sleeps 3 s
        after that step's barrier, so a kill finds the others a step ahead

Each log line is ``{"step", "epoch", "worker", "keys"}`` (the DataLoader worker that made the batch; 0 without
workers). A key is ``"source/shard/key"``. The parent kills this process (and its workers) with SIGKILL at
some step. RANK / WORLD_SIZE in the environment make it one rank of a job (no process group is needed).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch
from torch.utils.data import get_worker_info
from torchdata.stateful_dataloader import StatefulDataLoader

import wds_async as wds


def key_of(sample: dict) -> str:  # type: ignore[type-arg]
    source, shard = sample["__url__"].rsplit("/", 2)[-2:]
    return f"{source}/{shard}/{sample['__key__']}"


def tagged(batch: list) -> dict:  # type: ignore[type-arg]
    """The collate function: runs in the worker that made the batch, so it can say which one did."""
    info = get_worker_info()
    return {"worker": info.id if info is not None else 0, "keys": batch}


def make_mix(cfg: dict[str, Any]) -> Any:
    sources = []
    for src in cfg["sources"]:
        ds = wds.WebDataset(src["urls"], index=src.get("index"), shardshuffle=True, seed=src["seed"],
                            resampled=src.get("resampled", False), detshuffle=src.get("resampled", False),
                            max_connections=4)
        if src.get("shuffle"):
            ds = ds.shuffle(src["shuffle"], initial=src["shuffle"] // 2, seed=src["seed"] + 100)
        sources.append(ds.map(key_of))
    if cfg["mix"] == "round_robin":
        mix = wds.RoundRobin(sources, longest=cfg.get("longest", False))
    else:
        mix = wds.RandomMix(sources, cfg["probs"], longest=cfg.get("longest", False), seed=cfg["seed"])
    if cfg.get("epoch"):
        mix = mix.with_epoch(cfg["epoch"])
    if cfg.get("listed"):
        mix = mix.listed(cfg["listed"])  # batches made on the mix itself (then the DataLoader's batch_size is None)
    return mix


def own_checkpoint(path: str) -> dict[str, Any] | None:
    return torch.load(path, weights_only=False) if os.path.exists(path) else None


def agreed_checkpoint(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The checkpoint of the newest step every rank saved. A kill finds ranks in lockstep within one step of each
    other, so one rank may have saved step k + 1 and another only k: resuming each from its own newest would give
    the ranks different numbers of steps left (a DDP job would hang). Each rank keeps its last two checkpoints
    and the ranks agree on the smallest newest step, as a job that checkpoints per rank must."""
    import torch.distributed as dist

    kept = {c["step"]: c for c in (own_checkpoint(cfg["ckpt"] + ".prev"), own_checkpoint(cfg["ckpt"])) if c}
    newest = torch.tensor([max(kept, default=0)])
    dist.all_reduce(newest, op=dist.ReduceOp.MIN)
    step = int(newest.item())
    if step == 0:
        return None
    assert step in kept, f"rank {dist.get_rank()}: no checkpoint of step {step} (kept: {sorted(kept)})"
    return kept[step]


def run(cfg: dict[str, Any]) -> None:
    mix = make_mix(cfg)
    step = first = 0
    loader_state = None
    saved = agreed_checkpoint(cfg) if cfg.get("lockstep") else own_checkpoint(cfg["ckpt"])
    if saved is not None:  # this process's own checkpoint first: it may have been resumed elastically
        step, first, loader_state = saved["step"], saved["epoch"], saved["loader"]
    elif cfg.get("merge"):
        mix.load_state_dict(wds.merge_states(torch.load(p, weights_only=False)["loader"] for p in cfg["merge"]))
    loader = StatefulDataLoader(mix, batch_size=None if cfg.get("listed") else cfg.get("batch", 8),
                                num_workers=cfg["workers"], collate_fn=tagged,
                                snapshot_every_n_steps=cfg.get("snapshot_every", 1))
    with open(cfg["log"], "a") as log:
        for epoch in range(first, cfg.get("epochs", 1)):
            mix.set_epoch(epoch)
            if loader_state is not None:
                loader.load_state_dict(loader_state)
                loader_state = None
            for batch in loader:
                step += 1
                log.write(json.dumps({"step": step, "epoch": epoch, **batch}) + "\n")
                log.flush()
                tmp = cfg["ckpt"] + ".tmp"
                torch.save({"step": step, "epoch": epoch, "loader": loader.state_dict()}, tmp)
                if cfg.get("lockstep") and os.path.exists(cfg["ckpt"]):
                    os.replace(cfg["ckpt"], cfg["ckpt"] + ".prev")  # the step the other ranks may not have passed
                os.replace(tmp, cfg["ckpt"])
                # the training step: time for the parent to kill mid-epoch (a long one at step pause_at)
                time.sleep(3.0 if step == cfg.get("pause_at") else cfg.get("step_time", 0.01))
                if cfg.get("lockstep"):
                    import torch.distributed as dist

                    dist.barrier()
                    if cfg.get("lag") and dist.get_rank() == cfg["lag"]["rank"] and step == cfg["lag"]["step"]:
                        time.sleep(3.0)  # this rank falls a step behind: the others log and save the next step
        log.write(json.dumps({"step": step, "done": True}) + "\n")


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("dist"):
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            for one in cfg["runs"]:
                rank = dist.get_rank()
                run({**one, "log": one["log"].format(rank=rank), "ckpt": one["ckpt"].format(rank=rank)})
                dist.barrier()
        finally:
            dist.destroy_process_group()
        return
    run(cfg)


if __name__ == "__main__":
    main()
