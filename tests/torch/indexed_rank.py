"""A torchrun rank reading an ``IndexedWebDataset`` through ``DistributedSampler`` and 2 forked DataLoader workers
(tests/torch/test_indexed_torchrun.py): writes its keys, batch by batch, and its counters to ``OUT/rankR.json``.

    python -m torch.distributed.run --nproc-per-node 2 tests/torch/indexed_rank.py URLS_JSON INDEX OUT
"""

from __future__ import annotations

import json
import os
import sys

from torch.utils.data import DataLoader, DistributedSampler

import wds_async as wds


def main() -> None:
    urls, index, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ds = wds.IndexedWebDataset(urls, index=index)
    sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2, collate_fn=list)
    epochs, counters = [], []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append([[s["__key__"] for s in batch] for batch in loader])
        # The epoch's workers (new processes each epoch) have exited and published their counters a last time.
        stats = ds.stats()
        counters.append({"read_ahead": stats["batches_read_ahead"], "delivered": stats["samples_delivered"],
                         "workers": stats["workers"]})
    with open(os.path.join(out, f"rank{rank}.json"), "w") as fh:
        json.dump({"epochs": epochs, "counters": counters}, fh)


if __name__ == "__main__":
    main()
