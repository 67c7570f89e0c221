"""RandomMix and RoundRobin over WebDataset sources on real local servers: a checkpoint resumes exactly (in
pieces, through JSON and pickle, with shuffle buffers in the sources, resampled sources, epochs, ``longest``,
lists, stages and another epoch on the mix) and ``merge_states`` re-splits it; balanced draws keep every source
at its weight; one engine reads all sources and stops with the mix; schemes mix; bad input and bad states are
clear errors; a failing source fails or is skipped by its own handler; faults change nothing; ``seed=None``
draws as webdataset."""

from __future__ import annotations

import gc
import itertools
import json
import pickle
import random
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from benchmarks.make_shards import make_shards
from emustore import Knobs, StoreProcess
from tests.conftest import engine_threads, sample_digest, wait_until
from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, MOTO_ENV

NAMES = "abcde"
N_SHARDS = 4
RETRY = wds.RetryPolicy(attempts=60, base_delay=0.0, max_delay=0.005)

Ident = tuple[str, str]


# -- data -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five datasets a..e (``a/a-000000.tar`` ...), 4 shards of ~40 KiB with ~2 KiB samples each, other bytes
    in each (the keys repeat across datasets: a sample is told by its shard's name and its key)."""
    root = tmp_path_factory.mktemp("mix")
    for i, name in enumerate(NAMES):
        make_shards(root / name, n_shards=N_SHARDS, shard_bytes=40 << 10, sample_bytes=2 << 10, seed=20 + i,
                    prefix=name)
    return root


@pytest.fixture(scope="module")
def served(data: Path) -> Iterator[StoreProcess]:
    with StoreProcess(data, Knobs(seed=11)) as store:
        yield store


def _pattern(store: StoreProcess, name: str, n: int = N_SHARDS, query: str = "") -> str:
    return store.base_url + f"{name}/{name}-{{000000..{n - 1:06d}}}.tar" + query


def _source(store: StoreProcess, name: str, n: int = N_SHARDS, **kw: Any) -> wds.WebDataset:
    return wds.WebDataset(_pattern(store, name, n), **kw)


def ident(sample: dict[str, Any]) -> Ident:
    """(shard file name, key): unique over all datasets."""
    return sample["__url__"].rsplit("/", 1)[-1].split("?")[0], sample["__key__"]


def which(sample: Ident) -> str:
    return sample[0][0]


def _roundtrip(state: dict[str, Any]) -> dict[str, Any]:
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
        state = _roundtrip(mix.state_dict())
        it.close()
    raise AssertionError("unreachable")


def _check_resumes(make: Callable[[], Any], cuts: list[int], at_end: bool = True) -> list[Ident]:
    full = [ident(s) for s in make()]
    assert [ident(s) for s in make()] == full, "the uninterrupted run is not reproducible"
    for k in [*cuts, len(full) - 1, *([len(full)] if at_end else [])]:
        assert in_pieces(make, [k]) == full, f"resumed after {k} of {len(full)} samples"
    if at_end:  # a state saved once the run ended resumes to nothing
        mix = make()
        assert len(list(mix)) == len(full)
        done = make()
        done.load_state_dict(_roundtrip(mix.state_dict()))
        assert list(done) == []
    return full


# -- 1. exact resume -------------------------------------------------------------------------------------
MIXES: dict[str, Callable[[list[Any]], Any]] = {
    "balanced": lambda ds: wds.RandomMix(ds, [0.5, 0.3, 0.2], seed=3),
    "independent": lambda ds: wds.RandomMix(ds, [0.5, 0.3, 0.2], seed=3, draws="independent"),
    "round_robin": lambda ds: wds.RoundRobin(ds),
}


@pytest.mark.parametrize("kind", sorted(MIXES))
def test_resume_equals_the_uninterrupted_run(served: StoreProcess, kind: str) -> None:
    def make() -> Any:
        return MIXES[kind]([_source(served, name) for name in "abc"])

    full = _check_resumes(make, [0, 1, 7, 30])
    assert {which(s) for s in full} == set("abc")
    assert len(set(full)) == len(full)
    # resumed again and again: every piece from the previous piece's checkpoint
    assert in_pieces(make, [5, 20, 1, 13]) == full
    assert in_pieces(make, [0, 0, 9]) == full


def test_resume_before_any_iteration_and_state_of_a_fresh_mix(served: StoreProcess) -> None:
    def make() -> Any:
        return wds.RandomMix([_source(served, name) for name in "abc"], seed=1)

    full = [ident(s) for s in make()]
    fresh = make()
    state = _roundtrip(fresh.state_dict())  # never iterated
    again = make()
    again.load_state_dict(state)
    assert [ident(s) for s in again] == full


def test_resume_with_shuffle_buffers_in_the_sources(served: StoreProcess) -> None:
    def make() -> Any:
        sources = [wds.WebDataset(_pattern(served, name), shardshuffle=True, seed=5 + i).shuffle(20, seed=i)
                   for i, name in enumerate("abc")]
        return wds.RandomMix(sources, [0.4, 0.4, 0.2], seed=8)

    full = _check_resumes(make, [0, 3, 25, 50])
    # the shuffles did shuffle: not in shard order
    a = [s for s in full if which(s) == "a"]
    assert a != sorted(a)
    assert in_pieces(make, [10, 10, 30]) == full


def _resampled(store: StoreProcess, name: str, seed: int, n: int = N_SHARDS) -> wds.WebDataset:
    return wds.WebDataset(_pattern(store, name, n), resampled=True, detshuffle=True, seed=seed)


def test_resume_resampled_sources_with_an_epoch_on_the_mix(served: StoreProcess) -> None:
    def make() -> Any:
        return wds.RandomMix([_resampled(served, name, 40 + i) for i, name in enumerate("abc")],
                             [0.6, 0.3, 0.1], seed=4).with_epoch(150)

    full = _check_resumes(make, [0, 70], at_end=False)  # at the end: see the next test
    assert len(full) == 150 and {which(s) for s in full} == set("abc")
    assert in_pieces(make, [40, 40, 40]) == full


def test_resume_resampled_sources_with_their_own_epochs(served: StoreProcess) -> None:
    def make() -> Any:
        sources = [_resampled(served, name, 50 + i).with_epoch(n) for i, (name, n) in enumerate(zip("abc", (60, 30, 10)))]
        return wds.RandomMix(sources, [0.5, 0.3, 0.2], longest=True, seed=6)

    full = _check_resumes(make, [0, 35, 80], at_end=False)  # at the end: see the next test
    assert len(full) == 100
    assert [sum(which(s) == name for s in full) for name in "abc"] == [60, 30, 10]


@pytest.mark.parametrize("where", ["epoch-on-the-mix", "epochs-on-the-sources", "a-sources-epoch"])
def test_resume_right_after_an_epochs_last_item(served: StoreProcess, where: str) -> None:
    def make() -> Any:
        if where == "epoch-on-the-mix":  # else: epochs on the sources
            return wds.RandomMix([_resampled(served, name, 40 + i) for i, name in enumerate("abc")],
                                 [0.6, 0.3, 0.1], seed=4).with_epoch(150)
        sources = [_resampled(served, name, 50 + i).with_epoch(n) for i, (name, n) in enumerate(zip("abc", (60, 30, 10)))]
        return wds.RandomMix(sources, [0.5, 0.3, 0.2], longest=True, seed=6)

    full = [ident(s) for s in make()]
    # the state right after the mix's last item, or right after source c's 10th item, before the mix learnt
    # that c ran out (the mix goes on with a and b): the rest of the run must follow either way
    k = max(i for i, s in enumerate(full) if which(s) == "c") + 1 if where == "a-sources-epoch" else len(full)
    assert k < len(full) or where != "a-sources-epoch"
    assert in_pieces(make, [k]) == full




@pytest.mark.parametrize("kind", ["balanced", "round_robin"])
def test_resume_longest_after_a_source_ran_out(served: StoreProcess, kind: str) -> None:
    counts = {name: len(list(_source(served, name, n))) for name, n in zip("abc", (4, 1, 2))}

    def make() -> Any:
        sources = [_source(served, name, n) for name, n in zip("abc", (4, 1, 2))]
        if kind == "round_robin":
            return wds.RoundRobin(sources, longest=True)
        return wds.RandomMix(sources, longest=True, seed=2)

    full = _check_resumes(make, [0, 5, counts["b"] * 3 + 2, sum(counts.values()) - 3])
    assert len(full) == len(set(full)) == sum(counts.values())
    # b ran out first; the state after the mix saw that says so, and the resumed mix goes on without it
    last_b = max(i for i, s in enumerate(full) if which(s) == "b")
    assert last_b < len(full) - 10
    mix = make()
    it = iter(mix)
    k = 0
    while (mix.state_dict()["source"] or {}).get("ended") != [1]:
        next(it)  # StopIteration here: no state recorded that b ran out
        k += 1
    it.close()
    assert last_b < k < len(full)
    assert in_pieces(make, [k]) == full
    assert in_pieces(make, [k, 3, 3]) == full


def test_a_mix_pickles_after_it_was_iterated(served: StoreProcess) -> None:
    """DataLoader workers started by spawn or forkserver receive the dataset pickled, maybe after the main process
    looked at a sample."""
    def make() -> Any:
        return wds.RandomMix([_source(served, name) for name in "abc"], seed=5)

    full = [ident(s) for s in make()]
    mix = make()
    assert [ident(s) for s in pickle.loads(pickle.dumps(mix))] == full  # before any iteration: fine
    single = _source(served, "a")
    one: Any = iter(single)
    next(one)
    one.close()
    pickle.dumps(single)  # a WebDataset pickles after an iteration
    it: Any = iter(mix)
    next(it)
    it.close()
    assert [ident(s) for s in pickle.loads(pickle.dumps(mix))] == full


def test_state_is_plain_json(served: StoreProcess) -> None:
    mix = wds.RandomMix([_source(served, name).shuffle(10, seed=1) for name in "ab"], seed=3)
    it: Any = iter(mix)
    next(it)
    state = mix.state_dict()
    it.close()
    assert json.loads(json.dumps(state)) == state
    assert pickle.loads(pickle.dumps(state)) == state


def test_resume_with_a_list_and_a_zero_weight_source(served: StoreProcess) -> None:
    listed = [{"__url__": "list/l-0", "__key__": f"item{i}"} for i in range(100)]

    def with_list() -> Any:  # a list: resumed by counting what it gave
        return wds.RandomMix([_source(served, "a"), listed], [0.5, 0.5], seed=2)

    full = _check_resumes(with_list, [0, 5, 30])
    assert {which(s) for s in full} == {"a", "l"}

    def zero() -> Any:  # b has weight 0: drawn only once a and c ran out
        return wds.RandomMix([_source(served, name) for name in "abc"], [1, 0, 1], longest=True, seed=2)

    full = _check_resumes(zero, [0, 5, 60, 70])
    b = [i for i, s in enumerate(full) if which(s) == "b"]
    assert len(b) == len(list(_source(served, "b"))) and b == list(range(len(full) - len(b), len(full)))


def test_resume_with_stages_on_the_mix_and_another_epoch(served: StoreProcess) -> None:
    def batched() -> Any:
        return wds.RandomMix([_source(served, name) for name in "ab"], seed=2).map(ident).batched(5, collation_fn=list)

    batches = [tuple(map(tuple, batch)) for batch in batched()]
    assert len(batches) > 5
    for k in (0, 1, 3, len(batches) - 1):
        mix = batched()
        it = iter(mix)
        first = [tuple(map(tuple, b)) for b in itertools.islice(it, k)]
        state = _roundtrip(mix.state_dict())
        it.close()
        again = batched()
        again.load_state_dict(state)
        assert first + [tuple(map(tuple, b)) for b in again] == batches, f"resumed after batch {k}"

    def epoch1() -> Any:
        mix = wds.RandomMix([_source(served, name) for name in "ab"], seed=2)
        mix.set_epoch(1)
        return mix

    full = [ident(s) for s in epoch1()]
    assert full != [ident(s) for s in wds.RandomMix([_source(served, name) for name in "ab"], seed=2)]
    mix = epoch1()
    it = iter(mix)
    head = [ident(s) for s in itertools.islice(it, 10)]
    state = _roundtrip(mix.state_dict())
    it.close()
    fresh = wds.RandomMix([_source(served, name) for name in "ab"], seed=2)  # epoch 0: the state says 1
    fresh.load_state_dict(state)
    assert head + [ident(s) for s in fresh] == full


def test_what_cannot_be_checkpointed_says_why(served: StoreProcess, data: Path) -> None:
    mix = wds.RandomMix([_source(served, name) for name in "ab"], seed=2).shuffle(10, seed=1)
    it: Any = iter(mix)
    next(it)
    with pytest.raises(ValueError, match=r"cannot checkpoint shuffle\(10\) while it holds items"):
        mix.state_dict()
    it.close()

    def with_pipeline() -> Any:
        urls = [str(p) for p in sorted((data / "a").glob("a-*.tar"))]
        return wds.RandomMix([wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples()),
                              _source(served, "b")], seed=3)

    assert len(list(with_pipeline())) > 0
    with pytest.raises(ValueError, match="DataPipeline cannot resume"):
        in_pieces(with_pipeline, [7])


def test_an_abandoned_mix_stops_its_engine(served: StoreProcess) -> None:
    wait_until(lambda: not engine_threads())
    before = len(engine_threads())
    mix = wds.RandomMix([_source(served, name) for name in NAMES], seed=1)
    it: Any = iter(mix)
    next(it)
    assert len(engine_threads()) == before + 1
    it.close()
    assert wait_until(lambda: len(engine_threads()) == before)
    for _ in itertools.islice(wds.RoundRobin([_source(served, name) for name in NAMES]), 3):
        pass  # a for loop left early: the generator is dropped, not closed
    assert wait_until(lambda: len(engine_threads()) == before)


def test_each_source_keeps_its_member_rules(served: StoreProcess) -> None:
    """select_files / rename_files of one source apply to its samples only, whichever source leads the engine."""
    for order in ("ab", "ba"):
        sources = {"a": _source(served, "a", select_files=lambda name: not name.endswith(".bin")),
                   "b": _source(served, "b", rename_files=lambda name: name.replace(".bin", ".dat"))}
        fields: dict[str, set[str]] = {"a": set(), "b": set()}
        for s in wds.RoundRobin([sources[n] for n in order], longest=True):
            fields[which(ident(s))].update(k for k in s if not k.startswith("__"))
        assert fields == {"a": {"cls", "json"}, "b": {"cls", "dat", "json"}}, order


@pytest.mark.parametrize("shuffle", [0, 10])
def test_merge_states_resplits_a_mix_for_another_world_size(served: StoreProcess, monkeypatch: pytest.MonkeyPatch,
                                                            shuffle: int) -> None:
    """Two ranks' checkpoints merged into one rank: every sample of every source exactly once (what the old
    ranks' shuffle buffers held is read again by the new one)."""
    def make() -> Any:
        return wds.RandomMix([_source(served, name).shuffle(shuffle, seed=1) for name in "abc"], [0.5, 0.3, 0.2],
                             seed=7, longest=True)

    everything = {ident(s) for name in "abc" for s in _source(served, name)}
    before: list[Ident] = []
    states = []
    for rank, k in ((0, 9), (1, 20)):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
        mix = make()
        it = iter(mix)
        before += [ident(s) for s in itertools.islice(it, k)]
        states.append(_roundtrip(mix.state_dict()))
        it.close()
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    merged = _roundtrip(wds.merge_states(states))
    mix = make()
    mix.load_state_dict(merged)
    after = [ident(s) for s in mix]
    assert len(before) == 29 and len(before) + len(after) == len(everything)
    assert set(before) | set(after) == everything


# -- 2. proportions ----------------------------------------------------------------------------------------
def _windows(got: list[Ident], names: str, weights: list[float], size: int = 1000, step: int = 50) -> float:
    """The largest gap between a source's share of a window and its weight, over every window."""
    total = sum(weights)
    worst = 0.0
    for lo in range(0, len(got) - size + 1, step):
        window = got[lo:lo + size]
        for name, w in zip(names, weights):
            share = sum(which(s) == name for s in window) / size
            worst = max(worst, abs(share - w / total))
    return worst


def test_balanced_draws_hold_every_window_at_its_weight(served: StoreProcess) -> None:
    weights = [0.5, 0.3, 0.15, 0.05]
    mix = wds.RandomMix([_resampled(served, name, 60 + i) for i, name in enumerate("abcd")], weights, seed=9)
    got = [ident(s) for s in itertools.islice(mix, 4000)]
    assert len(got) == 4000
    assert _windows(got, "abcd", weights) <= 0.03
    # tighter than that: balanced draws keep each source within a few items of its weight
    assert _windows(got, "abcd", weights, size=200, step=10) <= 0.03


def test_weights_by_shards_and_by_samples(served: StoreProcess) -> None:
    sizes = (1, 2, 3, 4)
    mix = wds.RandomMix([_resampled(served, name, 70 + i, n) for i, (name, n) in enumerate(zip("abcd", sizes))],
                        "shards", seed=10)
    assert mix.weights == [1.0, 2.0, 3.0, 4.0]
    got = [ident(s) for s in itertools.islice(mix, 3000)]
    assert _windows(got, "abcd", [1.0, 2.0, 3.0, 4.0]) <= 0.03

    indexed = []
    counts = []
    for name, n in zip("ab", (1, 3)):
        urls = wds.WebDataset(_pattern(served, name, n)).urls
        indexed.append(wds.WebDataset(urls, index=wds.build_index(urls)))
        counts.append(float(len(list(wds.WebDataset(urls)))))
    assert wds.RandomMix(indexed, "samples", seed=1).weights == counts


# -- 3. one engine -----------------------------------------------------------------------------------------
def _threads_while_iterating(mix: Any) -> tuple[int, list[dict[str, Any]]]:
    """How many engine threads the mix added while it iterated, and its samples."""
    wait_until(lambda: not engine_threads())  # earlier tests' threads end asynchronously
    before = len(engine_threads())
    it = iter(mix)
    got = [next(it)]
    during = len(engine_threads()) - before
    got += list(it)
    assert wait_until(lambda: len(engine_threads()) == before), "an engine thread outlived the mix"
    return during, got


def test_one_engine_reads_every_source(served: StoreProcess) -> None:
    alone = {name: [ident(s) for s in _source(served, name)] for name in NAMES}
    mix = wds.RandomMix([_source(served, name) for name in NAMES], [5, 4, 3, 2, 1], longest=True, seed=12)
    during, samples = _threads_while_iterating(mix)
    assert during == 1
    got = [ident(s) for s in samples]
    for name in NAMES:
        assert [s for s in got if which(s) == name] == alone[name]
    stats = mix.stats()
    total = sum(len(v) for v in alone.values())
    assert stats["samples_delivered"] == total == len(got)
    assert stats["shards_done"] == len(NAMES) * N_SHARDS


def test_every_shard_is_requested_once_per_pass(served: StoreProcess) -> None:
    """The first items primed for each source are the ones it reads (none read twice or for nothing), also when
    detshuffle gives every pass another shard order; and each pass is the sources' own next pass."""
    def requests() -> int:
        return int(served.stats()["requests"])

    direct = [_source(served, name, shardshuffle=True, seed=3, detshuffle=True) for name in "abc"]
    passes = [[[ident(s) for s in d] for d in direct] for _ in range(3)]
    assert passes[0] != passes[1]
    mix = wds.RandomMix([_source(served, name, shardshuffle=True, seed=3, detshuffle=True) for name in "abc"],
                        [5, 1, 0.1], seed=1, longest=True)
    for expected in passes:
        before = requests()
        got = [ident(s) for s in mix]
        assert requests() - before == 3 * N_SHARDS
        assert [[s for s in got if which(s) == name] for name in "abc"] == expected


def test_other_backend_options_get_their_own_engine(served: StoreProcess) -> None:
    options = {"headers": {"X-Mix": "other"}}
    sources = [_source(served, name, backend_options=options if name in "ab" else None) for name in NAMES]
    during, samples = _threads_while_iterating(wds.RoundRobin(sources, longest=True))
    assert during == 2
    got = [ident(s) for s in samples]
    assert len(got) == len(set(got)) == sum(len(list(_source(served, name))) for name in NAMES)


def test_sources_with_one_cache_dir_read_from_the_cache(served: StoreProcess, tmp_path: Path) -> None:
    def make() -> Any:
        return wds.RandomMix([_source(served, name, cache_dir=tmp_path) for name in "abc"], seed=1, longest=True)

    alone = sorted(ident(s) for name in "abc" for s in _source(served, name))
    first = make()
    assert sorted(ident(s) for s in first) == alone
    assert first.stats()["cache_fills"] == 3 * N_SHARDS
    again = make()
    assert sorted(ident(s) for s in again) == alone
    assert again.stats()["cache_hits"] == 3 * N_SHARDS


def test_sources_with_one_cache_dir_share_one_engine(served: StoreProcess, tmp_path: Path) -> None:
    mix = wds.RandomMix([_source(served, name, cache_dir=tmp_path) for name in "abc"], seed=1, longest=True)
    during, samples = _threads_while_iterating(mix)
    assert len(samples) == sum(len(list(_source(served, name))) for name in "abc")
    assert during == 1


# -- 4. schemes ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clouds(data: Path, moto_endpoint: str, gcs_endpoint: str, azurite_endpoint: str) -> dict[str, Any]:
    """Dataset b in a moto S3 bucket, c in a GCS emulator bucket, d in an Azurite container: their URLs and
    the backend options that reach them."""
    import boto3
    from azure.storage.blob import BlobServiceClient
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tests.emulators import azurite_connection_string

    files = {name: sorted((data / name).glob(f"{name}-*.tar")) for name in "bcd"}
    bucket = f"wds-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1",
                      aws_access_key_id=MOTO_ENV["AWS_ACCESS_KEY_ID"],
                      aws_secret_access_key=MOTO_ENV["AWS_SECRET_ACCESS_KEY"])
    s3.create_bucket(Bucket=bucket)
    for path in files["b"]:
        s3.put_object(Bucket=bucket, Key=f"b/{path.name}", Body=path.read_bytes())
    gcs = storage.Client(project="test", credentials=AnonymousCredentials(),
                         client_options={"api_endpoint": gcs_endpoint})
    gbucket = gcs.create_bucket(f"wds-{uuid.uuid4().hex[:16]}")
    for path in files["c"]:
        gbucket.blob(f"c/{path.name}").upload_from_string(path.read_bytes())
    container = f"wds-{uuid.uuid4().hex[:12]}"
    service = BlobServiceClient.from_connection_string(azurite_connection_string(azurite_endpoint))
    service.create_container(container)
    for path in files["d"]:
        service.get_blob_client(container, f"d/{path.name}").upload_blob(path.read_bytes())
    last = f"{{000000..{N_SHARDS - 1:06d}}}"
    return {
        "urls": {"b": f"s3://{bucket}/b/b-{last}.tar", "c": f"gs://{gbucket.name}/c/c-{last}.tar",
                 "d": f"az://{container}/d/d-{last}.tar"},
        "options": {"s3": {"endpoint_url": moto_endpoint}, "gs": {"endpoint_url": gcs_endpoint, "anonymous": True},
                    "az": {"account_name": AZURITE_ACCOUNT, "account_key": AZURITE_KEY,
                           "blob_endpoint": f"{azurite_endpoint}/{AZURITE_ACCOUNT}"}},
    }


@pytest.mark.parametrize("shared_options", [True, False], ids=["one-options", "own-options"])
def test_a_mix_of_schemes_delivers_every_sample_once(served: StoreProcess, data: Path, clouds: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch, shared_options: bool) -> None:
    for key, value in MOTO_ENV.items():
        monkeypatch.setenv(key, value)
    options = clouds["options"]
    urls = {"a": _pattern(served, "a"), **clouds["urls"],
            "e": str(data / "e" / f"e-{{000000..{N_SHARDS - 1:06d}}}.tar")}

    def source(name: str) -> wds.WebDataset:
        if shared_options:
            return wds.WebDataset(urls[name], backend_options=options)
        scheme = {"b": "s3", "c": "gs", "d": "az"}.get(name)
        return wds.WebDataset(urls[name], backend_options={scheme: options[scheme]} if scheme else None)

    alone = {name: [(s["__key__"], s["bin"]) for s in source(name)] for name in "abcde"}
    assert all(len(v) > 0 for v in alone.values())
    mix = wds.RandomMix([source(name) for name in "abcde"], seed=13, longest=True)
    during, samples = _threads_while_iterating(mix)
    # one engine for all; with options of their own, one per options (http and file have none: they share one)
    assert during == (1 if shared_options else 4)
    got: dict[str, list[tuple[str, bytes]]] = {name: [] for name in "abcde"}
    for s in samples:
        name = s["__url__"].rsplit("/", 1)[-1][0]
        got[name].append((s["__key__"], s["bin"]))
    assert got == alone


# -- 5. errors -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("probs", "match"), [
    ([1, -1, 1], r"weight of dataset 1 is -1.0.*non-negative"),
    ([0, 0, 0], r"all zero"),
    ([1, 1], r"2 weights .* for 3 datasets"),
    ([1, "x", 1], r"must be numbers"),
    (["1", "2", "3"], r"must be numbers"),
    ([1, True, 1], r"must be numbers"),
    ([1, float("nan"), 1], r"weight of dataset 1 is nan"),
    ([1, float("inf"), 1], r"weight of dataset 1 is inf"),
    ("sizes", r"not 'sizes'"),
    ("samples", r"dataset 0 has none"),
])
def test_bad_weights_are_named(served: StoreProcess, probs: Any, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        wds.RandomMix([_source(served, name) for name in "abc"], probs, seed=1)


def test_weights_by_shards_need_webdatasets() -> None:
    with pytest.raises(ValueError, match=r"needs WebDataset sources; dataset 1 is a list"):
        wds.RandomMix([wds.WebDataset(["/nonexistent/x.tar"]), [1, 2]], "shards")
    with pytest.raises(ValueError, match="at least one dataset"):
        wds.RandomMix([])
    with pytest.raises(ValueError, match="draws must be one of"):
        wds.RandomMix([[1]], draws="fair")


def _state_after(mix: Any, n: int) -> dict[str, Any]:
    it = iter(mix)
    for _ in range(n):
        next(it)
    state: dict[str, Any] = mix.state_dict()
    it.close()
    return state


def _load_fails(mix: Any, state: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):  # refused at load, or at the first iteration after it
        mix.load_state_dict(state)
        next(iter(mix))


def test_states_of_another_mix_are_refused(served: StoreProcess) -> None:
    def sources(names: str = "abc") -> list[wds.WebDataset]:
        return [_source(served, name) for name in names]

    state = _state_after(wds.RandomMix(sources(), [2, 1, 1], seed=1), 5)
    _load_fails(wds.RandomMix(sources(), [1, 1, 1], seed=1), state, r"other weights.*\[2\.0, 1\.0, 1\.0\]")
    _load_fails(wds.RandomMix(sources("abd"), [2, 1, 1], seed=1), state, r"other datasets")
    _load_fails(wds.RandomMix(sources(), [2, 1, 1], longest=True, seed=1), state, r"other longest")
    _load_fails(wds.RandomMix(sources(), [2, 1, 1], seed=1, draws="independent"), state, r"other draws")
    rr_state = _state_after(wds.RoundRobin(sources()), 5)
    _load_fails(wds.RandomMix(sources(), seed=1), rr_state, r"other kind of mix.*'round_robin'")
    _load_fails(wds.RandomMix(sources(), seed=1), _state_after(sources()[0], 3), r"not a mix's")
    # the right mix takes it
    ok = wds.RandomMix(sources(), [2, 1, 1], seed=1)
    ok.load_state_dict(state)
    assert len(list(ok)) > 0


def test_state_of_an_unseeded_mix_is_refused(served: StoreProcess) -> None:
    state = _state_after(wds.RandomMix([_source(served, name) for name in "ab"]), 4)
    assert state["source"]["seeded"] is False
    for target in (wds.RandomMix([_source(served, name) for name in "ab"]),
                   wds.RandomMix([_source(served, name) for name in "ab"], seed=1)):
        _load_fails(target, state, r"without a seed.*global random.*seed=")


def test_a_missing_shard_fails_the_mix_naming_its_url(served: StoreProcess) -> None:
    wait_until(lambda: not engine_threads())
    before = len(engine_threads())
    broken = wds.WebDataset([served.url("b/b-000000.tar"), served.url("b/missing-000009.tar")])
    mix = wds.RoundRobin([_source(served, "a"), broken, _source(served, "c")], longest=True)
    with pytest.raises(wds.NotFound, match=r"missing-000009\.tar") as info:
        list(mix)
    assert info.value.url is not None and info.value.url.endswith("b/missing-000009.tar")
    assert wait_until(lambda: len(engine_threads()) == before), "the failed mix left its engine running"
    # the mix fails where b's missing shard is drawn: after b's first shard, as b alone does
    got: list[Ident] = []
    with pytest.raises(wds.NotFound):
        for s in mix:
            got.append(ident(s))
    b_first = [ident(s) for s in wds.WebDataset([served.url("b/b-000000.tar")])]
    assert [s for s in got if which(s) == "b"] == b_first


@pytest.mark.parametrize("weights", [[100, 1], [1, 1], [1, 100]])
def test_a_failing_source_fails_the_mix_where_it_is_drawn(served: StoreProcess, weights: list[int]) -> None:
    """Its item fails on the engine at once (primed), yet the others go on until the mix draws it."""
    stand_in = [{"__url__": "x/x-0", "__key__": "x"}]  # draws as the broken source would: one item, then its error
    expected = [ident(s) for s in wds.RandomMix([_source(served, "a"), stand_in], weights, seed=1, longest=True)]
    before = expected[:expected.index(("x-0", "x"))]
    broken = wds.WebDataset([served.url("b/missing-000007.tar")])
    got: list[Ident] = []
    with pytest.raises(wds.NotFound, match=r"missing-000007\.tar"):
        for s in wds.RandomMix([_source(served, "a"), broken], weights, seed=1, longest=True):
            got.append(ident(s))
            time.sleep(0.001)  # let the failure land first
    assert got == before


@pytest.mark.parametrize("broken_first", [True, False])
def test_a_sources_handler_skips_its_own_errors_only(served: StoreProcess, broken_first: bool) -> None:
    alone = {name: [ident(s) for s in _source(served, name)] for name in "abc"}
    b_urls = [served.url(f"b/b-{i:06d}.tar") for i in range(2)]
    b_good = [ident(s) for s in wds.WebDataset(b_urls)]
    skipping = wds.WebDataset([*b_urls, served.url("b/missing-000009.tar")], handler=wds.warn_and_continue)
    order = [skipping, _source(served, "a"), _source(served, "c")] if broken_first else \
        [_source(served, "a"), _source(served, "c"), skipping]
    got = [ident(s) for s in wds.RandomMix(order, seed=5, longest=True)]
    assert [s for s in got if which(s) == "a"] == alone["a"]
    assert [s for s in got if which(s) == "c"] == alone["c"]
    assert [s for s in got if which(s) == "b"] == b_good

    # the skipping source's handler is not the others': a raising source with a missing shard still raises,
    # whether the engine's group starts with it or with the skipping one
    raising = wds.WebDataset([served.url("c/c-000000.tar"), served.url("c/missing-000008.tar")])
    order = [skipping, _source(served, "a"), raising] if broken_first else [raising, _source(served, "a"), skipping]
    with pytest.raises(wds.NotFound, match=r"missing-000008\.tar"):
        list(wds.RandomMix(order, seed=5, longest=True))


# -- 6. faults -------------------------------------------------------------------------------------------------
def test_faults_give_the_same_mix_as_a_clean_store(served: StoreProcess) -> None:
    def make(query: str) -> Any:
        sources = [wds.WebDataset(_pattern(served, name, query=query), retry=RETRY).shuffle(15, seed=i)
                   for i, name in enumerate("abcd")]
        return wds.RandomMix(sources, [0.4, 0.3, 0.2, 0.1], seed=14, longest=True)

    clean = sample_digest(make(""))
    faulty = make("?drop_rate=0.3&fail_rate=0.3")
    assert sample_digest(faulty) == clean
    assert faulty.stats()["retries"] > 0
    # a checkpoint taken on the faulty store resumes on it to the same stream
    clean_ids = [(s["__key__"], s["__url__"].rsplit("/", 1)[-1]) for s in make("")]
    got = in_pieces(lambda: make("?drop_rate=0.3&fail_rate=0.3"), [40, 40])
    assert [(key, name) for name, key in got] == [(k, u.split("?")[0]) for k, u in clean_ids]


# -- 7. parity with webdataset -----------------------------------------------------------------------------------
@pytest.mark.parametrize("longest", [False, True])
def test_unseeded_draws_match_webdataset_over_webdatasets(data: Path, served: StoreProcess, longest: bool) -> None:
    import webdataset

    def pattern(name: str) -> str:
        return str(data / name / f"{name}-{{000000..{N_SHARDS - 1:06d}}}.tar")

    def seq(samples: Any) -> list[tuple[str, str]]:
        return [(Path(s["__url__"]).name, s["__key__"]) for s in samples]

    probs = [0.5, 0.2, 0.3]
    # Built before the seed: constructing a WebDataset (theirs and ours alike) draws its default shard seed from
    # the global generator.
    ours_sources = [wds.WebDataset(pattern(name)) for name in "abc"]
    remote_sources = [_source(served, name) for name in "abc"]
    with warnings.catch_warnings():
        # webdataset 1.0.2 leaves its shards' files open (webdataset/cache.py opens them without closing): not ours
        warnings.simplefilter("ignore", ResourceWarning)
        theirs_sources = [webdataset.WebDataset(pattern(name), shardshuffle=False) for name in "abc"]
        random.seed(21)
        theirs = seq(webdataset.RandomMix(theirs_sources, probs, longest=longest))
        del theirs_sources
        gc.collect()
    random.seed(21)
    ours = seq(wds.RandomMix(ours_sources, probs, longest=longest))
    assert ours == theirs
    assert {name[0] for name, _ in ours} == set("abc")
    # sources on the emulated store draw the same way
    random.seed(21)
    assert seq(wds.RandomMix(remote_sources, probs, longest=longest)) == theirs


def test_retries_leave_the_global_generator_to_the_draws(served: StoreProcess) -> None:
    # An unseeded mix draws its sources from the global generator, as webdataset's does; the engine's retry
    # jitter runs in another thread meanwhile and must not take numbers from it, or a run with a 503 on the way
    # picks other sources than the same run without one.
    def seq(query: str) -> tuple[list[Ident], int]:
        sources = [wds.WebDataset(_pattern(served, name, query=query)) for name in "abc"]
        mix = wds.RandomMix(sources, [0.5, 0.2, 0.3])
        random.seed(21)
        return [ident(s) for s in mix], mix.stats()["retries"]

    clean, _ = seq("")
    faulty, retries = seq("?fail_rate=0.3&drop_rate=0.2")
    assert retries > 0  # the faults were met, so the check below means something
    assert faulty == clean
