from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from wds_async.data.stages.plain import batched, default_collation_fn, shuffle, to_tuple


def test_shuffle_is_a_permutation_and_mixes() -> None:
    data = list(range(1000))
    out = list(shuffle(iter(data), bufsize=100, initial=10, rng=random.Random(0)))
    assert sorted(out) == data and out != data


def test_shuffle_buffer_grows_to_bufsize() -> None:
    # An item can travel at most about bufsize positions; with bufsize 500 some must move > 100.
    out = list(shuffle(iter(range(5000)), bufsize=500, initial=10, rng=random.Random(1)))
    assert max(abs(i - v) for i, v in enumerate(out)) > 100


def test_to_tuple_alternatives_and_missing() -> None:
    samples = [{"__key__": "a", "png": 1, "cls": 2}, {"__key__": "b", "jpg": 3, "cls": 4}]
    assert list(to_tuple(iter(samples), "jpg;png", "cls")) == [(1, 2), (3, 4)]
    assert list(to_tuple(iter(samples), "cls __key__")) == [(2, "a"), (4, "b")]
    with pytest.raises(ValueError, match="json"):
        list(to_tuple(iter(samples), "json"))
    assert list(to_tuple(iter(samples), "json", handler=lambda e: True)) == []


def test_batched_and_collation() -> None:
    rows = [(i, np.ones(2) * i, torch.tensor([i]), f"k{i}") for i in range(5)]
    batches = list(batched(iter(rows), 2))
    assert len(batches) == 3
    first = batches[0]
    assert first[0].tolist() == [0, 1] and first[1].shape == (2, 2) and first[2].shape == (2, 1)
    assert first[3] == ["k0", "k1"]
    assert len(list(batched(iter(rows), 2, partial=False))) == 2
    assert default_collation_fn([{"a": 1}, {"a": 2}])["a"].tolist() == [1, 2]
    assert list(batched(iter(range(3)), 2, collation_fn=None)) == [[0, 1], [2]]
