"""What the mix tests share: the five datasets' names and shard patterns, how a sample is told apart, and a mix
read in pieces (checkpoint, close, resume in a fresh mix). The fixtures (``mix_data``, ``mix_store``) are in
``tests/data/conftest.py``."""

from __future__ import annotations

import itertools
import json
import pickle
from collections.abc import Callable
from typing import Any

import wds_async as wds
from emustore import StoreProcess

NAMES = "abcde"
N_SHARDS = 4
RETRY = wds.RetryPolicy(attempts=60, base_delay=0.0, max_delay=0.005)

Ident = tuple[str, str]


def pattern(store: StoreProcess, name: str, n: int = N_SHARDS, query: str = "") -> str:
    return store.base_url + f"{name}/{name}-{{000000..{n - 1:06d}}}.tar" + query


def source(store: StoreProcess, name: str, n: int = N_SHARDS, **kw: Any) -> wds.WebDataset:
    return wds.WebDataset(pattern(store, name, n), **kw)


def resampled(store: StoreProcess, name: str, seed: int, n: int = N_SHARDS) -> wds.WebDataset:
    """Dataset ``name`` drawn with replacement, in a seeded order."""
    return wds.WebDataset(pattern(store, name, n), resampled=True, detshuffle=True, seed=seed)


def ident(sample: dict[str, Any]) -> Ident:
    """(shard file name, key): unique over all datasets."""
    return sample["__url__"].rsplit("/", 1)[-1].split("?")[0], sample["__key__"]


def which(sample: Ident) -> str:
    return sample[0][0]


def roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    """A state as a checkpoint file gives it back: through JSON and pickle."""
    text = json.dumps(state)
    restored: dict[str, Any] = pickle.loads(pickle.dumps(json.loads(text)))
    return restored


def in_pieces(make: Callable[[], Any], pieces: list[int]) -> list[Ident]:
    """Read a fresh ``make()`` ``pieces[0]`` items, checkpoint, close; a fresh one loads that state and reads
    ``pieces[1]`` items, ...; the last one reads to the end. The identities of everything read, in order."""
    got: list[Ident] = []
    state: dict[str, Any] | None = None
    for n in [*pieces, None]:
        mix = make()
        if state is not None:
            mix.load_state_dict(state)
        it = iter(mix)
        if n is None:
            got += [ident(s) for s in it]
            return got
        got += [ident(s) for s in itertools.islice(it, n)]
        state = roundtrip(mix.state_dict())
        it.close()
    raise AssertionError("unreachable")


def check_resumes(make: Callable[[], Any], cuts: list[int], at_end: bool = True) -> list[Ident]:
    full = [ident(s) for s in make()]
    assert [ident(s) for s in make()] == full, "the uninterrupted run is not reproducible"
    for k in [*cuts, len(full) - 1, *([len(full)] if at_end else [])]:
        assert in_pieces(make, [k]) == full, f"resumed after {k} of {len(full)} samples"
    if at_end:  # a state saved once the run ended resumes to nothing
        mix = make()
        assert len(list(mix)) == len(full)
        done = make()
        done.load_state_dict(roundtrip(mix.state_dict()))
        assert list(done) == []
    return full
