"""A training-loop stand-in for the resume tests: iterate a StatefulDataLoader, log each step's keys,
checkpoint ``loader.state_dict()`` after every step (atomically), and resume from the checkpoint.

    python tests/torch/resume_child.py CONFIG_JSON

CONFIG keys: urls, index, workers, shuffle, deterministic, ckpt, log, merge (old checkpoints to merge for
an elastic resume), batch. The parent kills this process (and its workers) with SIGKILL at some step.
RANK / WORLD_SIZE in the environment make it one rank of a job (no process group is needed).
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch
from torchdata.stateful_dataloader import StatefulDataLoader

import wds_async as wds


def key_of(sample: dict) -> str:  # type: ignore[type-arg]
    return f"{sample['__url__'].rsplit('/', 1)[-1]}/{sample['__key__']}"


def keys(batch: list) -> list:  # type: ignore[type-arg]
    return batch


def main() -> None:
    cfg = json.loads(sys.argv[1])
    ds = wds.WebDataset(cfg["urls"], index=cfg.get("index"), shardshuffle=True, seed=3, max_connections=4,
                        deterministic=cfg.get("deterministic", False), drop_last=cfg.get("drop_last", False))
    if cfg.get("shuffle"):
        ds = ds.shuffle(cfg["shuffle"], initial=cfg["shuffle"] // 2)
    ds = ds.map(key_of)
    step = 0
    loader_state = None
    if cfg.get("merge"):
        ds.load_state_dict(wds.merge_states(torch.load(p, weights_only=False)["loader"] for p in cfg["merge"]))
    elif os.path.exists(cfg["ckpt"]):
        saved = torch.load(cfg["ckpt"], weights_only=False)
        step, loader_state = saved["step"], saved["loader"]
    loader = StatefulDataLoader(ds, batch_size=cfg.get("batch", 4), num_workers=cfg["workers"], collate_fn=keys)
    if loader_state is not None:
        loader.load_state_dict(loader_state)
    with open(cfg["log"], "a") as log:
        for batch in loader:
            step += 1
            log.write(json.dumps({"step": step, "keys": batch}) + "\n")
            log.flush()
            tmp = cfg["ckpt"] + ".tmp"
            torch.save({"step": step, "loader": loader.state_dict()}, tmp)
            os.replace(tmp, cfg["ckpt"])
            time.sleep(cfg.get("step_time", 0.01))  # the training step: gives the parent time to kill mid-epoch
        log.write(json.dumps({"step": step, "done": True}) + "\n")


if __name__ == "__main__":
    main()
