"""Data-parallel training on WebDataset shards, with exact mid-epoch checkpoints.

Index the shards once (the index records every sample's byte range, so each rank and DataLoader
worker can be given exactly the same number of samples, which keeps DDP's collectives in step)::

    wds-async index "https://host/train-{000000..000099}.tar" -o train.index

then run it with torchrun, on one node::

    torchrun --nproc-per-node 4 examples/train_ddp.py "https://host/train-{000000..000099}.tar" \\
        --index train.index --workers 2 --epochs 2 --checkpoint-every 100

or on two (run the same line on each node, with --node-rank 0 and 1)::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr HOST0 --master-port 29500 \\
        examples/train_ddp.py URLS --index train.index

After a preemption, launch it again with ``--resume``: every rank loads its checkpoint and the loader
carries on mid-epoch from the checkpointed step, so the weights see each sample of the epoch exactly
once (the steps run after the last checkpoint are redone). The checkpoint directory must be reachable
from every node (a shared file system), as each rank writes its own files there.

Samples are the synthetic ones of ``python -m benchmarks.make_shards``: a ``.bin`` payload and a
``.cls`` label; the model learns the label from the first bytes of the payload. ``--log-dir`` and
``--die-at-step`` exist for ``tests/torch/test_torchrun.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torchdata.stateful_dataloader import StatefulDataLoader

import wds_async as wds

FEATURES = 16  # bytes of .bin fed to the model
CLASSES = 10


def to_example(sample: dict) -> tuple:
    """A sample dict -> (features, label, key). The key only feeds the --log-dir lines."""
    head = sample["bin"][:FEATURES].ljust(FEATURES, b"\0")
    features = torch.frombuffer(bytearray(head), dtype=torch.uint8).float() / 255
    return features, int(sample["cls"]) % CLASSES, sample["__key__"]


def save_checkpoint(directory: str, rank: int, step: int, state: dict) -> None:
    """Write this rank's checkpoint atomically, then drop its older ones once every rank has saved."""
    path = os.path.join(directory, f"rank{rank}-step{step:09d}.pt")
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)  # a reader sees the old file or the new one, never half of one
    dist.barrier()  # every rank has saved `step`, so no rank needs an older checkpoint any more
    for old in glob.glob(os.path.join(directory, f"rank{rank}-step*.pt")):
        if old != path:
            os.remove(old)


def agreed_checkpoint(directory: str, rank: int, device: torch.device) -> str | None:
    """This rank's checkpoint at the newest step that every rank has saved (a preemption may have
    struck while some ranks had saved step N and others not yet), or None to start afresh."""
    names = glob.glob(os.path.join(directory, f"rank{rank}-step*.pt"))
    steps = [int(name.rsplit("-step", 1)[1].removesuffix(".pt")) for name in names]
    newest = torch.tensor([max(steps, default=-1)], device=device)
    dist.all_reduce(newest, op=dist.ReduceOp.MIN)
    step = int(newest.item())
    return None if step < 0 else os.path.join(directory, f"rank{rank}-step{step:09d}.pt")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("shards", help="shard URLs: a brace pattern, or several joined with ::")
    p.add_argument("--index", required=True, help="the shards' index (wds-async index URLS -o FILE)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--checkpoint-dir", default="checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=100, help="steps between checkpoints (0: never)")
    p.add_argument("--resume", action="store_true", help="continue from the newest checkpoint")
    p.add_argument("--log-dir", help="each rank appends one JSON line per step to LOG_DIR/rank{RANK}.jsonl")
    p.add_argument("--die-at-step", type=int, default=0, help="rank 0 SIGKILLs itself on fetching this step's batch")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.makedirs(args.checkpoint_dir, exist_ok=True)

    torch.manual_seed(0)  # DDP also broadcasts rank 0's initial weights
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.ReLU(), torch.nn.Linear(32, CLASSES)).to(device),
        device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)

    # With an index, the samples (not the shards) are split: every rank and worker gets the same count,
    # the last shares padded by wrapping around, as DistributedSampler does (drop_last=True drops instead).
    ds = wds.WebDataset(args.shards, index=args.index, shardshuffle=True, seed=0).map(to_example)
    loader = StatefulDataLoader(ds, batch_size=args.batch_size, num_workers=args.workers)

    start_epoch, step = 0, 0
    path = agreed_checkpoint(args.checkpoint_dir, rank, device) if args.resume else None
    if path is not None:
        ckpt = torch.load(path, map_location=device, weights_only=False)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])  # the next iteration continues this epoch where it stood
        start_epoch, step = ckpt["epoch"], ckpt["step"]
        print(f"rank {rank}: resuming epoch {start_epoch} after step {step} from {path}", flush=True)

    loss, log = torch.tensor(float("nan")), None
    with contextlib.ExitStack() as stack:  # closes the log, if any, when training ends (or fails)
        if args.log_dir:
            os.makedirs(args.log_dir, exist_ok=True)
            log = stack.enter_context(open(os.path.join(args.log_dir, f"rank{rank}.jsonl"), "a"))
        for epoch in range(start_epoch, args.epochs):
            ds.set_epoch(epoch)  # the shard order of this epoch, the same on every rank
            for features, labels, keys in loader:
                if rank == 0 and step + 1 == args.die_at_step:
                    os.kill(os.getpid(), signal.SIGKILL)  # a preemption, before this step is trained or saved
                loss = torch.nn.functional.cross_entropy(model(features.to(device)), labels.to(device))
                optimizer.zero_grad()
                loss.backward()  # DDP all-reduces the gradients here
                optimizer.step()
                step += 1
                if log is not None:
                    log.write(json.dumps({"epoch": epoch, "step": step, "keys": list(keys)}) + "\n")
                    log.flush()
                if args.checkpoint_every and step % args.checkpoint_every == 0:
                    save_checkpoint(args.checkpoint_dir, rank, step, {
                        "model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch, "step": step, "loader": loader.state_dict()})
            if rank == 0:
                print(f"epoch {epoch} done after step {step}, loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
