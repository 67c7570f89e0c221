"""``wds.pack_samples``: batches whose bytes cross from DataLoader workers in shared memory, given back whole."""

from __future__ import annotations

import multiprocessing
import pickle
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

import wds_async as wds


def _plain(pattern: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(s["__url__"], s["__key__"]): dict(s) for s in wds.WebDataset(pattern, max_connections=4)}


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_come_back_as_they_were(pattern: str, manifest: dict[str, Any], workers: int) -> None:
    expected = _plain(pattern)
    ds = wds.WebDataset(pattern, max_connections=2).batched(5, collation_fn=wds.pack_samples)
    loader = DataLoader(ds, batch_size=None, num_workers=workers,
                        multiprocessing_context=multiprocessing.get_context("fork") if workers else None)
    got: dict[tuple[str, str], dict[str, Any]] = {}
    for packed in loader:
        assert isinstance(packed, wds.PackedSamples) and 1 <= len(packed) <= 5
        # From a worker the buffer arrives in shared memory (a descriptor crossed, not the bytes); made in this
        # process it is an ordinary tensor.
        assert packed.data.dtype == torch.uint8 and packed.data.is_shared() == bool(workers)
        for sample in packed:
            assert type(sample) is dict and all(type(v) is bytes for k, v in sample.items() if k not in
                                                ("__key__", "__url__", "__local_path__"))
            got[(sample["__url__"], sample["__key__"])] = sample
        assert sum(map(len, (v for s in packed for v in s.values() if isinstance(v, bytes)))) == packed.data.numel()
    assert len(got) == manifest["expected_samples"] == len(expected)
    assert got == expected


def test_values_are_views_of_the_one_buffer(pattern: str) -> None:
    samples = list(wds.WebDataset(pattern, max_connections=2))[:7]
    packed = wds.pack_samples(samples)
    field = next(k for k, v in samples[0].items() if isinstance(v, bytes))
    views = packed.values(field)
    assert [bytes(v.tolist()) for v in views] == [s[field] for s in samples]
    assert all(v.untyped_storage().data_ptr() == packed.data.untyped_storage().data_ptr() for v in views)
    assert packed.values("__key__") == [s["__key__"] for s in samples]
    assert packed[3] == dict(samples[3]) and len(packed) == 7
    with pytest.raises(KeyError, match="sample 0 of the packed batch has no field 'nope'"):
        packed.values("nope")


def test_tuples_and_mixed_values() -> None:
    batch = [(b"abc", "k1", 3, torch.ones(2)), (b"", "k2", 4, torch.zeros(2))]
    packed = wds.pack_samples(batch)
    assert packed.data.numel() == 3
    back = list(packed)
    assert [type(t) for t in back] == [tuple, tuple]
    assert back[0][:3] == (b"abc", "k1", 3) and back[1][:3] == (b"", "k2", 4)
    assert torch.equal(back[0][3], torch.ones(2))
    assert packed.values(2) == [3, 4]
    # It pickles (as the DataLoader's queue does) and comes back equal.
    again = pickle.loads(pickle.dumps(packed))
    assert [t[:3] for t in again] == [t[:3] for t in back]


def test_an_empty_batch_and_a_batch_of_other_things() -> None:
    assert len(wds.pack_samples([])) == 0 and list(wds.pack_samples([])) == []
    with pytest.raises(TypeError, match="sample 1 is a list"):
        wds.pack_samples([{"a": b"x"}, [b"y"]])
    with pytest.raises(TypeError, match="dicts or of tuples; sample 0 is a bytes"):
        wds.pack_samples([b"raw"])


def test_the_training_docs_example_runs(tmp_path: Any) -> None:
    """docs/training.md, "Bytes for the main process": its block, run as written on shards of jpg samples (two
    workers instead of eight), every sample's bytes arriving in the views it names."""
    from pathlib import Path

    from tests.conftest import doc_block

    with wds.ShardWriter(str(tmp_path / "shard-%02d.tar"), maxcount=20) as sink:
        for i in range(70):
            sink.write({"__key__": f"s{i:03d}", "jpg": bytes([i]) * (100 + i), "cls": str(i % 3).encode()})
    code = doc_block(Path(__file__).resolve().parents[2] / "docs" / "training.md",
                     "### Bytes for the main process: pack_samples")
    assert "num_workers=8" in code
    code = code.replace("num_workers=8", "num_workers=2")
    code += "    seen.update(zip(keys, (bytes(j.tolist()) for j in jpgs)))\n    firsts.append(first)\n"
    seen: dict[str, bytes] = {}
    firsts: list[dict[str, Any]] = []
    exec(compile(code, "training.md", "exec"), {"urls": str(tmp_path / "shard-{00..03}.tar"), "seen": seen,
                                                "firsts": firsts})
    assert seen == {f"s{i:03d}": bytes([i]) * (100 + i) for i in range(70)}
    assert firsts and all(f["jpg"] == seen[f["__key__"]] and type(f["jpg"]) is bytes for f in firsts)


def test_pin_memory_pins_the_buffer_and_the_tensors(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``DataLoader(pin_memory=True)``'s pinning thread calls on each batch (torch's ``pin_memory()``, which
    asks an object that has the method) pins the packed buffer and the tensors among the other values, and keeps
    the spans. ``Tensor.pin_memory`` needs an accelerator, so it is recorded here instead (the test below pins for
    real where there is one)."""
    from torch.utils.data._utils.pin_memory import pin_memory

    pinned: list[torch.Tensor] = []

    def record(self: torch.Tensor, device: Any = None) -> torch.Tensor:
        copy = self.clone()
        pinned.append(copy)
        return copy

    monkeypatch.setattr(torch.Tensor, "pin_memory", record)
    batch = [{"__key__": "a", "jpg": b"xyz", "t": torch.ones(2), "n": 1},
             {"__key__": "b", "jpg": b"pq", "t": torch.zeros(2), "n": 2}]
    packed = wds.pack_samples(batch)
    out = pin_memory(packed)
    assert isinstance(out, wds.PackedSamples) and out is not packed
    assert out.data is pinned[-1] and len(pinned) == 3  # the buffer and the two samples' tensors
    tensors = [s["t"] for s in out]
    assert len(tensors) == 2 and tensors[0] is pinned[0] and tensors[1] is pinned[1]
    assert [{k: v for k, v in s.items() if k != "t"} for s in out] == [{k: v for k, v in s.items() if k != "t"}
                                                                        for s in batch]
    assert [bytes(v.tolist()) for v in out.values("jpg")] == [b"xyz", b"pq"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned memory needs an accelerator")
def test_pin_memory_for_real(pattern: str) -> None:
    ds = wds.WebDataset(pattern, max_connections=2).batched(4, collation_fn=wds.pack_samples)
    loader = DataLoader(ds, batch_size=None, num_workers=2, pin_memory=True,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    batches = list(loader)
    assert batches and all(b.data.is_pinned() for b in batches)
    assert sum(len(b) for b in batches) == len(list(wds.WebDataset(pattern, max_connections=2)))
