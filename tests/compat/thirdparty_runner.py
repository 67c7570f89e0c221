"""Runs open_clip's or timm's webdataset data path, unchanged, and writes what it delivered as JSON.

Not a test module: ``test_thirdparty.py`` runs it in the third-party venv, once per library, as
``python thirdparty_runner.py LIB CASE SHARD_DIR WORKERS OUT.json`` would (forked from a warm launcher,
``tests/warm.py``, that imported torch and torchvision before). ``LIB`` is ``webdataset`` (whatever
``import webdataset`` finds on the path: 1.0.2 in the venv, or 0.2.86 when the caller puts it first on
``PYTHONPATH``) or ``wds_async`` (``wds_async.install_as_webdataset()`` before open_clip or timm is imported).

Every sample carries its identity in a field the pipeline keeps: open_clip's caption is the sample's key (the
tokenizer below turns it into a tensor of its bytes), timm's class label is the sample's global number. So the JSON
is, per epoch, the batches in delivery order, each a list of identities and the sum of its image pixels.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any

import numpy as np

TEXT_LEN = 32


def tokenizer(texts: Any) -> Any:
    """open_clip's tokenizer contract: a list of strings (or one) -> a tensor of one row per string."""
    import torch

    if isinstance(texts, str):
        texts = [texts]
    rows = [list(t.encode("utf-8")[:TEXT_LEN]) + [0] * (TEXT_LEN - len(t.encode("utf-8")[:TEXT_LEN])) for t in texts]
    return torch.tensor(rows, dtype=torch.int64)


def image_to_tensor(image: Any) -> Any:
    import torch

    return torch.tensor(np.asarray(image, dtype=np.uint8)).permute(2, 0, 1).contiguous()


def untokenize(row: Any) -> str:
    return bytes(int(x) for x in row if int(x)).decode("utf-8")


def seed_everything(seed: int) -> None:
    """What open_clip's and timm's training scripts do before building their loaders."""
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def run_open_clip(case: str, shards: str, nsamples: int, workers: int, epochs: int) -> list[list[Any]]:
    import open_clip_train.data as ocd

    if case in ("openclip-train-ordered", "openclip-resampled"):
        # The one change: open_clip's sample shuffle draws from a clock-seeded generator (its rng is None), so
        # its order differs from run to run under webdataset itself; a buffer of one keeps the stream's order,
        # which is then a function of the seeded shard shuffle alone. A module constant, not code.
        ocd._SAMPLE_SHUFFLE_SIZE = 1
    args = argparse.Namespace(
        train_data=shards, val_data=shards, dataset_resampled=case == "openclip-resampled",
        train_num_samples=nsamples, val_num_samples=nsamples, train_data_upsampling_factors=None, seed=7,
        batch_size=4, workers=workers, world_size=1, distributed=False)
    is_train = case != "openclip-eval"
    seed_everything(args.seed)
    data = ocd.get_wds_dataset(args, image_to_tensor, is_train=is_train, epoch=0, tokenizer=tokenizer)
    out = []
    for epoch in range(epochs):
        data.set_epoch(epoch)
        batches = []
        for images, texts in data.dataloader:
            batches.append([[untokenize(row) for row in texts], int(images.sum())])
        out.append(batches)
    return out


def run_timm(case: str, root: str, workers: int, epochs: int) -> list[list[Any]]:
    import torch
    from timm.data import create_dataset

    is_train = case == "timm-train"
    seed_everything(42)
    dataset = create_dataset("wds/synthetic", root=root, split="train" if is_train else "validation",
                             is_training=is_train, batch_size=4, seed=42, transform=image_to_tensor)
    dataset.set_loader_cfg(num_workers=workers)  # what timm's create_loader does before making the loader
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=workers,
                                         persistent_workers=workers > 0)
    out = []
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        batches = []
        for images, targets in loader:
            batches.append([[int(t) for t in targets], int(images.sum())])
        out.append(batches)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("lib", choices=["webdataset", "wds_async"])
    parser.add_argument("case")
    parser.add_argument("data")
    parser.add_argument("workers", type=int)
    parser.add_argument("out")
    parser.add_argument("--nsamples", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=2)
    opts = parser.parse_args()
    if opts.lib == "wds_async":
        import wds_async

        wds_async.install_as_webdataset()
    import webdataset

    if opts.case.startswith("openclip"):
        result = run_open_clip(opts.case, opts.data, opts.nsamples, opts.workers, opts.epochs)
    else:
        result = run_timm(opts.case, opts.data, opts.workers, opts.epochs)
    with open(opts.out, "w") as f:
        json.dump({"webdataset": webdataset.__file__, "version": webdataset.__version__,
                   "shim": webdataset.__name__.startswith("wds_async"), "epochs": result}, f)


if __name__ == "__main__":
    sys.exit(main())
