"""Where DataLoader workers' autotuners stand: a ``map`` function that tags each sample with its worker's id and
concurrency, and the first such tag per worker (the level it started at). Importable by spawned workers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.utils.data import get_worker_info


def with_level(sample: Any) -> tuple[int, int]:
    """(worker id, that worker's concurrency now), read in the worker while the sample passes a ``map`` stage."""
    info = get_worker_info()
    assert info is not None
    return info.id, info.dataset.stats()["concurrency"]


def first_levels(tagged: Iterable[tuple[int, int]]) -> dict[int, int]:
    """Each worker's level at its first tagged sample."""
    first: dict[int, int] = {}
    for worker, level in tagged:
        first.setdefault(int(worker), int(level))
    return first
