"""Where this process sits: its rank among the job's processes and its DataLoader worker among the rank's.

Both are read when an epoch is planned, inside the process that iterates (after a DataLoader worker forks or
spawns), never at construction. torch is imported here only when it is installed and only to ask it.
"""

from __future__ import annotations

import os

__all__ = ["node_info", "worker_info"]


def node_info() -> tuple[int, int]:
    """``(rank, world_size)`` from torch.distributed when initialised, else ``RANK``/``WORLD_SIZE``."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:  # pragma: no cover
        pass
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return (int(os.environ.get("RANK", "0")), world) if world > 1 else (0, 1)


def worker_info() -> tuple[int, int]:
    """``(worker_id, num_workers)`` of the current DataLoader worker, ``(0, 1)`` outside one."""
    try:
        from torch.utils.data import get_worker_info
    except ImportError:  # no torch: no DataLoader workers either
        return (0, 1)
    info = get_worker_info()
    return (info.id, info.num_workers) if info is not None else (0, 1)
