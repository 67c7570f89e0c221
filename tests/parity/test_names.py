"""The webdataset 1.0.2 names wds_async added for drop-in use, run side by side with webdataset on the same input:
the sources, shuffles, samplers and mixes (tarfile_samples, shardspec, DataPipeline.stage, detshuffle,
ResampledShards, resampled, non_empty, MockDataset, rsample, RoundRobin, RandomMix, SimpleShardList(seed=...),
FluidWrapper).

Where the behaviour is deterministic (including draws from a seeded global ``random``) the outputs must be
equal; where it is not, both must agree on what can be asserted (counts, membership). Documented differences
are asserted as such. The field stages and caches are in ``test_names_fields_and_caches.py``; the helpers both
share live in ``names_common.py``, their ``shards`` fixture in ``conftest.py``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import webdataset

import wds_async
from tests.parity.conftest import ours, reference, strip_local
from tests.parity.names_common import LIBS, outcome, quietly

# -- tarfile_samples, shardspec, DataPipeline.stage -------------------------------------------------------


def test_tarfile_samples_is_the_uncurried_stage(shards: list[str]) -> None:
    def run(lib: Any, spec: str) -> list[Any]:
        return strip_local(quietly(lambda: list(lib.DataPipeline(lib.shardspec(spec), lib.tarfile_samples))))

    one = run(wds_async, shards[0])
    assert one == run(webdataset, shards[0]) and len(one) == 12
    both = "::".join(shards[:2])
    got, expected = run(wds_async, both), run(webdataset, both)
    # Many shards in flight: the interleaving is ours, the samples are the same.
    assert sorted(got, key=lambda s: (s["__url__"], s["__key__"])) == expected and len(got) == 24


def test_shardspec_expands_like_webdataset() -> None:
    spec = "a-{000..003}.tar::b-{0..1}.tar"
    assert list(wds_async.shardspec(spec)) == list(webdataset.shardspec(spec))
    assert len(wds_async.shardspec(spec)) == 6
    with pytest.raises(wds_async.UrlError, match="YAML"):
        wds_async.shardspec("sources.yaml")


@LIBS
def test_stage_returns_the_step_object(lib: Any) -> None:
    shards, shuffle = lib.SimpleShardList("x-{0..9}"), lib.detshuffle(3)
    pipeline = lib.DataPipeline(shards, shuffle, lib.non_empty)
    assert pipeline.stage(0) is shards and pipeline.stage(1) is shuffle and pipeline.stage(-1) is lib.non_empty


def test_stage_covers_fluid_steps() -> None:
    pipeline = wds_async.DataPipeline(lambda: iter(range(6))).rsample(1.0).batched(2)
    assert repr(pipeline.stage(2)) == "batched(2)" and list(pipeline) and len(list(pipeline)) == 3


# -- detshuffle -----------------------------------------------------------------------------------------


@LIBS
def test_detshuffle_epoch_advances_per_iteration(lib: Any) -> None:
    # webdataset's own test_detshuffle, run on both.
    d1 = lib.DataPipeline(lib.SimpleShardList("{000000..000999}"), lib.detshuffle(10))
    d2 = lib.DataPipeline(lib.SimpleShardList("{000000..000999}"), lib.detshuffle(10))
    r1, r2 = list(d1), list(d2)
    assert r1 == r2
    r22 = list(d2)
    assert r22 != r2 and list(d1) == r22
    assert d2.stage(1).epoch == 1


@pytest.mark.parametrize("bufsize,initial,seed", [(10, 100, 0), (7, 3, 5), (50, 10, 11), (1, 1, 2)])
def test_detshuffle_order_is_webdatasets(bufsize: int, initial: int, seed: int) -> None:
    def epochs(lib: Any) -> list[list[str]]:
        pipeline = lib.DataPipeline(lib.SimpleShardList("u-{000..120}"), lib.detshuffle(bufsize, initial, seed))
        return [[s["url"] for s in pipeline] for _ in range(3)]

    ours_, theirs = epochs(wds_async), epochs(webdataset)
    assert ours_ == theirs
    assert ours_[0] != ours_[1] or bufsize == 1


def test_detshuffle_in_a_webdataset_matches_and_resumes(shards: list[str]) -> None:
    def build(ds: Any, lib: Any = wds_async) -> Any:
        return ds.compose(lib.detshuffle(8, seed=3)).map(lambda s: s["__key__"])

    full = ours(shards, build)
    assert full == reference(shards, lambda ds: build(ds, webdataset))
    # A checkpoint mid-epoch (the buffer holding items) resumes into the same order, epoch included.
    ds = build(wds_async.WebDataset(shards, deterministic=True))
    it = iter(ds)
    head = [next(it) for _ in range(15)]
    state = ds.state_dict()
    it.close()
    assert state["stages"][0]["state"]["epoch"] == 0 and state["stages"][0]["held"]
    resumed = build(wds_async.WebDataset(shards, deterministic=True))
    resumed.load_state_dict(state)
    assert head + list(resumed) == full


# -- ResampledShards, resampled, non_empty, MockDataset ----------------------------------------------------


def test_resampled_shards_takes_webdatasets_positional_arguments() -> None:
    urls = ["http://example.com/a.tar", "http://example.com/b.tar", "http://example.com/c.tar"]

    def seed() -> int:
        return 1

    for lib in (webdataset, wds_async):
        rs = lib.ResampledShards(urls, 2, 0, seed, False, int(1e6))
        assert (rs.urls, rs.nshards, rs.seed, rs.worker_seed, rs.deterministic, rs.epoch) == (urls, 2, 0, seed, False, -1)
        shards = list(rs)
        assert len(shards) == 2 and {s["url"] for s in shards} <= set(urls) and rs.epoch == 0


@pytest.mark.parametrize("worker_seed,seed", [(lambda: 7, 0), (lambda: 1003, 42)])
def test_resampled_shards_deterministic_draws_are_webdatasets(worker_seed: Callable[[], int], seed: int) -> None:
    urls = [f"u-{i:03d}" for i in range(50)]

    def epochs(lib: Any) -> list[list[str]]:
        rs = lib.ResampledShards(urls, 20, seed, worker_seed, True)
        return [[s["url"] for s in rs] for _ in range(3)]

    ours_ = epochs(wds_async)
    assert ours_ == epochs(webdataset)
    assert ours_[0] != ours_[1]  # the epoch advances on each iteration


def test_resampled_shards_nondeterministic_and_empty() -> None:
    urls = [str(i) for i in range(100000)]
    rs = wds_async.ResampledShards(urls)
    first, second = [next(iter(rs)) for _ in range(2)], [next(iter(rs)) for _ in range(2)]
    assert first != second
    for lib in (webdataset, wds_async):
        with pytest.raises(ValueError):
            lib.ResampledShards(iter([]))
    assert list(wds_async.ResampledShards(iter([]), empty_check=False)) == []


@LIBS
def test_resampled_stage_draws_n_from_its_input(lib: Any) -> None:
    pipeline = lib.DataPipeline(lib.SimpleShardList([f"{i}" for i in range(10)]), lib.resampled(27))
    result = quietly(lambda: [s["url"] for s in pipeline])
    assert len(result) == 27 and set(result) <= {str(i) for i in range(10)}


def test_resampled_of_nothing_raises() -> None:
    with pytest.raises(ValueError, match="nothing"):
        list(wds_async.DataPipeline(lambda: iter([]), wds_async.resampled(3)))


def test_non_empty_matches() -> None:
    def run(lib: Any, source: list[int]) -> Any:
        return outcome(lambda: list(lib.DataPipeline(lambda: iter(source), lambda s: (x * 2 for x in s),
                                                      lib.non_empty)))

    assert run(wds_async, [1, 2, 3]) == run(webdataset, [1, 2, 3]) == [2, 4, 6]
    assert run(wds_async, []) is run(webdataset, []) is ValueError


def test_mock_dataset_matches_and_is_fluid() -> None:
    sample = (True, {"a": 1})
    assert list(wds_async.MockDataset(sample, 193)) == list(webdataset.MockDataset(sample, 193))
    assert all(s is sample for s in wds_async.MockDataset(sample, 3))
    batches = list(wds_async.MockDataset((1, 2.0), 10).batched(4))
    assert [b[0].tolist() for b in batches] == [[1] * 4, [1] * 4, [1] * 2]


# -- rsample --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 1.0])
def test_rsample_draws_like_webdataset(p: float) -> None:
    def run(lib: Any) -> list[int]:
        random.seed(42)
        return list(lib.DataPipeline(lambda: iter(range(500)), lib.rsample(p)))

    got = run(wds_async)
    assert got == run(webdataset)
    assert (len(got) == 0) if p == 0.0 else (len(got) == 500 if p == 1.0 else 0 < len(got) < 500)


def test_rsample_fluid_method_on_webdataset(shards: list[str]) -> None:
    assert len(ours(shards, lambda ds: ds.rsample(1.0))) == 36
    keys = [s["__key__"] for s in ours(shards, lambda ds: ds.rsample(0.5))]
    assert 0 < len(keys) < 36
    with pytest.raises(ValueError, match="within"):
        list(wds_async.DataPipeline(lambda: iter([1])).rsample(1.5))
    # Seeded after construction: webdataset's constructor draws from the global generator itself.
    theirs = quietly(lambda: webdataset.WebDataset(shards, shardshuffle=False, nodesplitter=None, seed=0).rsample(0.5))
    mine = wds_async.WebDataset(shards, deterministic=True).rsample(0.5)
    random.seed(3)
    expected = quietly(lambda: [s["__key__"] for s in theirs])
    random.seed(3)
    assert [s["__key__"] for s in mine] == expected


# -- RoundRobin, RandomMix --------------------------------------------------------------------------------


@pytest.mark.parametrize("longest", [False, True])
def test_round_robin_matches(longest: bool) -> None:
    def run(lib: Any) -> list[Any]:
        return list(lib.RoundRobin([[1, 2], [10], [20, 21, 22], []] if longest else [[1, 2], [10, 11, 12], [20, 21]],
                                   longest=longest))

    got = run(wds_async)
    assert got == run(webdataset)
    assert got == ([1, 10, 20, 2, 21, 22] if longest else [1, 10, 20, 2, 11, 21])
    mixed = wds_async.RoundRobin([np.full(2, 2), np.full(1, 1), np.full(3, 3)], longest=True)
    assert (np.array(list(mixed)) == np.array([2, 1, 3, 2, 3, 3])).all()


def test_round_robin_takes_a_seed_as_random_mix_does_and_its_order_does_not_change() -> None:
    sources = [[1, 2], [10, 11, 12], [20, 21]]
    for mix in (wds_async.RandomMix, wds_async.RoundRobin):  # the same call works with either
        assert len(list(mix(sources, longest=True, seed=7))) == 7
    assert list(wds_async.RoundRobin(sources, seed=7)) == list(wds_async.RoundRobin(sources)) == [1, 10, 20, 2, 11, 21]


@pytest.mark.parametrize("probs,longest", [(None, False), (None, True), ([3, 1], True), ([0.2, 0.5, 0.3], False),
                                           ([1, 0, 1], True)])
def test_random_mix_draws_like_webdataset(probs: list[float] | None, longest: bool) -> None:
    def run(lib: Any) -> list[Any]:
        random.seed(5)
        sources = [range(20), range(100, 110), range(200, 230)][: len(probs) if probs else 3]
        return quietly(lambda: list(lib.RandomMix(sources, probs, longest=longest)))  # webdataset: 0/0 warns

    got = run(wds_async)
    assert got == run(webdataset)
    if longest:
        assert len(got) == sum(len(r) for r in [range(20), range(100, 110), range(200, 230)][: len(probs or [0] * 3)])


def test_mixes_of_pipelines_are_fluid(shards: list[str]) -> None:
    def pipeline() -> Any:
        return wds_async.DataPipeline(wds_async.SimpleShardList(shards[:1]), wds_async.tarfile_samples)

    assert len(list(wds_async.RoundRobin([pipeline(), pipeline()]))) == 24
    assert len(list(wds_async.RandomMix([pipeline(), pipeline()], longest=True).shuffle(10))) == 24
    with pytest.raises(ValueError, match="probabilities"):
        list(wds_async.RandomMix([[1], [2]], [1]))


# -- SimpleShardList(seed=...), FluidWrapper ---------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 17, 12345])
def test_simple_shard_list_seed_orders_as_webdataset(seed: int) -> None:
    urls = [f"u-{i:03d}" for i in range(40)]

    def order(lib: Any, set_after: int | None = None) -> list[list[str]]:
        shards = lib.SimpleShardList(urls, seed=None if set_after is not None else seed)
        pipeline = lib.DataPipeline(shards)
        passes = [[item["url"] for item in pipeline]]
        if set_after is not None:  # webdataset's idiom for a new order per epoch: set the seed on the stage
            pipeline.stage(0).seed = set_after
        passes.append([item["url"] for item in pipeline])
        return passes

    ours_passes, theirs = order(wds_async), order(webdataset)
    assert ours_passes == theirs
    assert ours_passes[0] == ours_passes[1] != urls  # the same order on every pass, as webdataset
    assert order(wds_async, set_after=seed) == order(webdataset, set_after=seed)


def test_fluid_wrapper_gives_the_fluid_methods(shards: list[str]) -> None:
    def run(lib: Any) -> list[str]:
        source = lib.DataPipeline(lib.SimpleShardList(shards), lib.tarfile_samples)
        mixed = lib.FluidWrapper(lib.RoundRobin([source, source])).map(lambda s: s["__key__"]).batched(5, collation_fn=list)
        return quietly(lambda: [key for batch in mixed for key in batch])

    # the engine interleaves samples of the shards in flight as they arrive, so compare the multiset
    assert sorted(run(wds_async)) == sorted(run(webdataset))
    assert len(run(wds_async)) == 2 * 36


# -- webdataset's other top-level names, as attributes of wds_async --------------------------------------

#: webdataset 1.0.2's top-level names that wds-async refuses by name (each with its reason).
REFUSED_AT_TOP = {"LRUCleanup", "MultiShardSample", "tenbin", "torch_audio", "torch_loads", "torch_video"}


def test_every_top_level_name_of_webdataset_is_an_attribute_of_wds_async_or_refused_with_its_reason() -> None:
    """``import wds_async as wds`` in place of ``import webdataset as wds``: ``wds.X`` resolves for every public
    name of webdataset's package (``wds.PipelineStage``, ``wds.getfirst``, ``wds.filters``, ...), and the few not
    provided are an ``AttributeError`` (so ``hasattr`` answers) that says why."""
    names = {n for n in dir(webdataset) if not n.startswith("_")}
    assert {"PipelineStage", "getfirst", "with_epoch", "repeatedly", "filters", "torch_dumps"} <= names
    assert names - REFUSED_AT_TOP <= set(dir(wds_async))  # and dir() lists them
    assert not REFUSED_AT_TOP & set(dir(wds_async))
    for name in sorted(names - REFUSED_AT_TOP):
        assert getattr(wds_async, name) is not None, name
    for name in sorted(REFUSED_AT_TOP):
        assert not hasattr(wds_async, name)
        with pytest.raises(AttributeError, match=f"no attribute '{name}': webdataset.{name} is not provided by "
                                                 f"wds-async: .+"):
            getattr(wds_async, name)
    with pytest.raises(AttributeError, match=r"^module 'wds_async' has no attribute 'no_such_name'$"):
        wds_async.no_such_name  # noqa: B018
    # wds-async's own names come first where webdataset has the same one.
    assert wds_async.WebDataset.__module__.startswith("wds_async.data")
    assert wds_async.cache.__name__ == "wds_async.cache"


@LIBS
def test_a_pipeline_stage_subclass_and_the_small_helpers_run_alike(lib: Any) -> None:
    class Doubling(lib.PipelineStage):  # type: ignore[name-defined,misc]
        def run(self, src: Any) -> Any:
            for x in src:
                yield {"__key__": x["__key__"], "v": x["v"] * 2}

    def source() -> Any:
        return iter([{"__key__": f"k{i}", "v": i} for i in range(5)])

    got = [s["v"] for s in lib.DataPipeline(source, Doubling())]
    assert got == [0, 2, 4, 6, 8]
    assert lib.getfirst({"a.jpg": 1, "b": 2}, "x;b") == 2
    assert list(lib.repeatedly([1, 2], nepochs=2)) == [1, 2, 1, 2]
    # (webdataset 1.0.2's extradatasets.with_epoch and with_length cannot be instantiated: abstract classes.)
