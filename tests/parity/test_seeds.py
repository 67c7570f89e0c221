"""Same seed, same data: every seeded shuffle and resampler of wds_async draws from its random generator exactly
as webdataset 1.0.2 does, so one pipeline built in both libraries over the same shards yields the same
``__key__`` sequence, with 0 DataLoader workers and with 2 (``batch_size=None``), epoch after epoch; and a
checkpoint taken mid-epoch resumes into that same sequence.

Every test here compares against webdataset itself; none encodes an expected order of its own.
"""

from __future__ import annotations

import gc
import multiprocessing
import random
import warnings
from collections.abc import Callable
from typing import Any

import pytest
import webdataset
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

import wds_async
from tests.parity.conftest import write_tar

NSHARDS, PER_SHARD = 9, 6
FORK = multiprocessing.get_context("fork")  # the pipelines hold lambdas: the workers inherit them


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("seeds")
    out = []
    for j in range(NSHARDS):
        members = []
        for i in range(PER_SHARD):
            members += [(f"s{j}_{i}.txt", f"{j} {i}".encode()), (f"s{j}_{i}.cls", str(i).encode())]
        out.append(str(write_tar(root / f"seed-{j:03d}.tar", members)))
    return out


def key(sample: dict[str, Any]) -> str:
    return sample["__key__"]


def quiet(run: Callable[[], Any]) -> Any:
    """``run()`` with webdataset's own warnings silenced: its "shardshuffle=True/None" advice, and the
    ResourceWarning of the shard files it leaves to the garbage collector (collected here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return run()
        finally:
            gc.collect()


def keys(ds: Any, workers: int, epochs: int = 1) -> list[list[str]]:
    """The keys of ``epochs`` passes over ``ds``: directly, or through a DataLoader of ``workers`` processes."""
    if workers == 0:
        return [list(ds) for _ in range(epochs)]
    loader = DataLoader(ds, batch_size=None, num_workers=workers, multiprocessing_context=FORK)
    return [list(loader) for _ in range(epochs)]


def both(build: Callable[[Any], Any], workers: int, epochs: int = 1) -> tuple[list[list[str]], list[list[str]]]:
    """``build(lib)`` run in webdataset and in wds_async: (theirs, ours)."""
    theirs = quiet(lambda: keys(build(webdataset), workers, epochs))
    ours = keys(build(wds_async), workers, epochs)
    return theirs, ours


def dataset(lib: Any, urls: list[str], **kw: Any) -> Any:
    """``lib.WebDataset`` with the arguments both take; ours delivers shard by shard, as webdataset does."""
    if lib is wds_async:
        return wds_async.WebDataset(urls, deterministic=True, **kw)
    return webdataset.WebDataset(urls, **kw)


def tar_samples(lib: Any) -> Any:
    return lib.tarfile_to_samples(deterministic=True) if lib is wds_async else lib.tarfile_to_samples()


def check(theirs: list[list[str]], ours: list[list[str]], urls: list[str], shuffled: bool = True) -> None:
    assert ours == theirs
    for epoch in ours:  # and the comparison is about an order: every sample once, not in shard order
        assert sorted(epoch) == sorted(f"s{j}_{i}" for j in range(len(urls)) for i in range(PER_SHARD))
        if shuffled:
            assert epoch != sorted(epoch, key=lambda k: tuple(map(int, k[1:].split("_"))))


WORKERS = pytest.mark.parametrize("workers", [0, 2], ids=["0-workers", "2-workers"])


# -- the sample shuffle --------------------------------------------------------------------------------------


@WORKERS
@pytest.mark.parametrize("bufsize,initial", [(5, 100), (40, 100), (20, 3)])
@pytest.mark.parametrize("how", ["rng", "seed"])
def test_fluid_shuffle(urls: list[str], workers: int, bufsize: int, initial: int, how: str) -> None:
    def build(lib: Any) -> Any:
        kw = {"rng": random.Random(7)} if how == "rng" else {"seed": 7}
        return dataset(lib, urls, shardshuffle=False).shuffle(bufsize, initial=initial, **kw).map(key)

    # rng=: each pass draws on from the generator (a new order); seed=: each pass starts it again.
    theirs, ours = both(build, workers, epochs=2)
    check(theirs, ours, urls)
    assert (ours[0] == ours[1]) == (how == "seed" or workers > 0)  # a worker gets a fresh copy of the rng


@WORKERS
def test_pipeline_shuffles_of_shards_and_samples(urls: list[str], workers: int) -> None:
    def build(lib: Any) -> Any:
        return lib.DataPipeline(lib.SimpleShardList(urls), lib.shuffle(4, seed=3), lib.split_by_worker,
                                tar_samples(lib), lib.shuffle(15, rng=random.Random(11)), lib.map(key))

    check(*both(build, workers, epochs=2), urls)


def test_shuffle_refuses_seed_and_rng_together() -> None:
    with pytest.raises(ValueError, match="not both"):
        list(wds_async.shuffle(5, seed=1, rng=random.Random(1))(iter(range(3))))


# -- detshuffle ---------------------------------------------------------------------------------------------


@WORKERS
def test_detshuffle_stages(urls: list[str], workers: int) -> None:
    def build(lib: Any) -> Any:
        return lib.DataPipeline(lib.SimpleShardList(urls), lib.detshuffle(5, seed=2), lib.split_by_worker,
                                tar_samples(lib), lib.detshuffle(12, initial=4, seed=9), lib.map(key))

    theirs, ours = both(build, workers, epochs=3)
    check(theirs, ours, urls)
    # In one process the epoch advances with each pass; workers that are not persistent start from epoch 0.
    assert (ours[0] != ours[1]) == (workers == 0)


# -- the shard shuffle of WebDataset ----------------------------------------------------------------------


@WORKERS
@pytest.mark.parametrize("shardshuffle", [True, 3, 7])
@pytest.mark.parametrize("seed", [0, 5])
def test_shardshuffle(urls: list[str], workers: int, shardshuffle: bool | int, seed: int) -> None:
    def build(lib: Any) -> Any:
        return dataset(lib, urls, shardshuffle=shardshuffle, seed=seed).map(key)

    check(*both(build, workers, epochs=2), urls)


@WORKERS
def test_shardshuffle_with_detshuffle_advances_like_webdataset(urls: list[str], workers: int) -> None:
    def build(lib: Any) -> Any:
        return dataset(lib, urls, shardshuffle=4, seed=1, detshuffle=True).map(key)

    theirs, ours = both(build, workers, epochs=3)
    check(theirs, ours, urls)
    assert (ours[0] != ours[1] != ours[2]) == (workers == 0)


@WORKERS
def test_shardshuffle_and_sample_shuffle_together(urls: list[str], workers: int) -> None:
    def build(lib: Any) -> Any:
        return dataset(lib, urls, shardshuffle=5, seed=4).shuffle(10, seed=8).map(key)

    check(*both(build, workers), urls)


def test_set_epoch_is_webdatasets_detshuffle_at_that_epoch(urls: list[str]) -> None:
    """``set_epoch`` (ours alone) seeds the shard shuffle with ``seed + epoch``: webdataset's detshuffle order."""
    theirs = webdataset.WebDataset(urls, shardshuffle=6, seed=3, detshuffle=True).map(key)
    passes = quiet(lambda: [list(theirs) for _ in range(3)])
    ds = wds_async.WebDataset(urls, shardshuffle=6, seed=3, deterministic=True).map(key)
    for epoch in (2, 0, 1):
        ds.set_epoch(epoch)
        assert list(ds) == passes[epoch]
    assert list(ds) == passes[1]  # without detshuffle the epoch stays where set_epoch put it


def test_default_seed_is_drawn_like_webdatasets(urls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``seed=None``: a random seed from the global generator, drawn at construction, as webdataset draws it, or
    ``WDS_SEED`` (a string) when set."""
    def first_order(lib: Any) -> tuple[list[str], float]:
        random.seed(12)
        ds = dataset(lib, urls, shardshuffle=100).map(key)
        after = random.random()  # the constructor drew exactly as many numbers
        return list(ds), after

    theirs, ours = quiet(lambda: first_order(webdataset)), first_order(wds_async)
    assert ours == theirs
    monkeypatch.setenv("WDS_SEED", "77")
    assert quiet(lambda: first_order(webdataset)) == first_order(wds_async)
    assert first_order(wds_async)[0] != ours[0]


# -- resampling ---------------------------------------------------------------------------------------------


@WORKERS
@pytest.mark.parametrize("seed", [0, 21])
def test_resampled_shards(urls: list[str], workers: int, seed: int) -> None:
    def build(lib: Any) -> Any:
        return lib.DataPipeline(lib.ResampledShards(urls, nshards=5, seed=seed, deterministic=True),
                                tar_samples(lib), lib.map(key))

    theirs, ours = both(build, workers, epochs=2)
    assert ours == theirs and len(ours[0]) == 5 * PER_SHARD * max(1, workers)
    assert (ours[0] != ours[1]) == (workers == 0)  # the epoch advances per pass, in one process


@WORKERS
def test_resampled_webdataset_draws_like_resampled_shards(urls: list[str], workers: int) -> None:
    """webdataset's ``WebDataset(resampled=True)`` reads ``ResampledShards(urls)``, split by worker, seeded from the
    clock and the OS; with ``detshuffle=True`` ours takes that pipeline's deterministic seeding, which webdataset
    offers only in the pipeline form: the same draws, whole shards each."""
    def theirs_() -> Any:
        return webdataset.DataPipeline(webdataset.ResampledShards(urls, seed=13, deterministic=True),
                                       webdataset.split_by_worker, webdataset.tarfile_to_samples(),
                                       webdataset.map(key)).with_epoch(40)

    ours_ = wds_async.WebDataset(urls, resampled=True, detshuffle=True, seed=13, deterministic=True
                                 ).map(key).with_epoch(40)
    theirs, ours = quiet(lambda: keys(theirs_(), workers, 2)), keys(ours_, workers, 2)
    assert ours == theirs and len(ours[0]) == 40 * max(1, workers)
    assert (ours[0] != ours[1]) == (workers == 0)


# -- checkpoints resume into the same sequence ---------------------------------------------------------------


def _resume_in_process(make: Callable[[], Any], steps: int) -> tuple[list[str], list[str]]:
    full = list(make())
    ds = make()
    it = iter(ds)
    head = [next(it) for _ in range(steps)]
    state = ds.state_dict()
    it.close()
    again = make()
    again.load_state_dict(state)
    return full, head + list(again)


@pytest.mark.parametrize("steps", [1, 13, 40, 53])
def test_checkpoint_resumes_the_same_sequence(urls: list[str], steps: int) -> None:
    def build(lib: Any) -> Any:
        return dataset(lib, urls, shardshuffle=4, seed=6).shuffle(12, rng=random.Random(5)).map(key)

    full, resumed = _resume_in_process(lambda: build(wds_async), steps)
    assert resumed == full == quiet(lambda: list(build(webdataset)))


@pytest.mark.parametrize("steps", [7, 30])
def test_checkpoint_with_detshuffle_resumes_in_its_epoch(urls: list[str], steps: int) -> None:
    def build(lib: Any) -> Any:
        return dataset(lib, urls, shardshuffle=3, seed=2, detshuffle=True).compose(
            lib.detshuffle(9, seed=4)).map(key)

    theirs = quiet(lambda: build(webdataset))
    reference = quiet(lambda: [list(theirs) for _ in range(2)])
    ds = build(wds_async)
    assert list(ds) == reference[0]
    it = iter(ds)  # epoch 1
    head = [next(it) for _ in range(steps)]
    state = ds.state_dict()
    it.close()
    again = build(wds_async)  # a new process: its epochs would start at 0, the state says 1
    again.load_state_dict(state)
    assert head + list(again) == reference[1]


def test_checkpoint_keeps_the_drawn_seed(urls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A dataset without a seed shuffles with a drawn one; a resume in a process that drew another goes on in
    the saved order."""
    monkeypatch.setenv("WDS_SEED", "1")
    make = lambda: wds_async.WebDataset(urls, shardshuffle=5, deterministic=True).map(key)  # noqa: E731
    full = list(make())
    ds = make()
    it = iter(ds)
    head = [next(it) for _ in range(20)]
    state = ds.state_dict()
    it.close()
    monkeypatch.setenv("WDS_SEED", "2")
    again = make()
    assert list(again) != full
    again.load_state_dict(state)
    assert head + list(again) == full


@pytest.mark.parametrize("steps", [9, 31])
def test_checkpoint_with_two_workers(urls: list[str], steps: int) -> None:
    def build(lib: Any) -> Any:
        return dataset(lib, urls, shardshuffle=3, seed=8).shuffle(10, seed=1).map(key)

    [theirs] = quiet(lambda: keys(build(webdataset), 2))

    def loader() -> StatefulDataLoader:
        return StatefulDataLoader(build(wds_async), batch_size=None, num_workers=2, multiprocessing_context=FORK)

    first = loader()
    it = iter(first)
    head = [next(it) for _ in range(steps)]
    state = first.state_dict()
    del it
    again = loader()
    again.load_state_dict(state)
    assert head + list(again) == theirs


# -- the small differences the docs list ------------------------------------------------------------------


@WORKERS
def test_simple_shard_list_seed(urls: list[str], workers: int) -> None:
    def build(lib: Any) -> Any:
        return lib.DataPipeline(lib.SimpleShardList(urls, seed=17), lib.split_by_worker, tar_samples(lib),
                                lib.map(key))

    check(*both(build, workers, epochs=2), urls)


def test_make_seed_is_webdatasets_for_numbers_and_stable_for_strings() -> None:
    import zlib

    from webdataset.utils import make_seed as theirs

    from wds_async.data.shardlists import make_seed

    for parts in [(0,), (3, 0, 0), (1003, 7, 42), (2**40, -1, 5)]:
        assert make_seed(*parts) == theirs(*parts)
    # a string: its CRC-32, the same in every process (Python's hash of a string is not)
    assert make_seed("77") == zlib.crc32(repr("77").encode()) & 0x7FFFFFFF


def test_wds_seed_with_detshuffle(urls: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``WDS_SEED`` is a string: webdataset's detshuffle fails adding the epoch to it; ours goes on per epoch."""
    monkeypatch.setenv("WDS_SEED", "5")
    with pytest.raises(TypeError):
        quiet(lambda: list(webdataset.WebDataset(urls, shardshuffle=4, detshuffle=True)))
    ds = wds_async.WebDataset(urls, shardshuffle=4, detshuffle=True, deterministic=True).map(key)
    first, second = list(ds), list(ds)
    assert first != second and sorted(first) == sorted(second)
    # epoch 0 is webdataset's shuffle(4, seed="5"), which it reaches without detshuffle
    assert first == quiet(lambda: list(webdataset.WebDataset(urls, shardshuffle=4).map(key)))


def test_state_of_the_old_shard_shuffle_is_refused(urls: list[str]) -> None:
    """A state saved before this version (no seed in it) named items of a shard order shuffled before the split;
    rebuilt with today's order it would resume other shards: refused, not misapplied."""
    make = lambda: wds_async.WebDataset(urls, shardshuffle=5, seed=1, deterministic=True).map(key)  # noqa: E731
    ds = make()
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    it.close()
    del state["source"]["seed"]
    again = make()
    again.load_state_dict(state)
    with pytest.raises(ValueError, match="older wds-async"):
        list(again)
    unshuffled = wds_async.WebDataset(urls, deterministic=True).map(key)  # its plan is the same in both versions
    it = iter(unshuffled)
    head = [next(it) for _ in range(4)]
    state = unshuffled.state_dict()
    it.close()
    del state["source"]["seed"]
    again = wds_async.WebDataset(urls, deterministic=True).map(key)
    again.load_state_dict(state)
    assert head + list(again) == list(unshuffled)


@pytest.mark.parametrize("lib", [webdataset, wds_async], ids=["webdataset", "wds_async"])
def test_shuffle_takes_a_handler(urls: list[str], lib: Any) -> None:
    def run() -> list[str]:
        ds = dataset(lib, urls, shardshuffle=False).shuffle(8, seed=2, handler=lib.warn_and_continue).map(key)
        return list(ds)

    assert quiet(run) == quiet(lambda: list(dataset(lib, urls, shardshuffle=False).shuffle(8, seed=2).map(key)))
