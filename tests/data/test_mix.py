"""RandomMix and RoundRobin over WebDataset sources on real local servers: balanced draws keep every source at its
weight; one engine reads all sources and stops with the mix; schemes mix; faults change nothing; ``seed=None`` draws
as webdataset. Bad input, bad states and failing sources are in ``test_mix_errors.py``, exact resume in
``test_mix_state.py``."""

from __future__ import annotations

import gc
import itertools
import random
import uuid
import warnings
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from emustore import StoreProcess
from tests.conftest import engine_threads, sample_digest, wait_until
from tests.data.mixes import (
    N_SHARDS,
    NAMES,
    RETRY,
    Ident,
    ident,
    in_pieces,
    pattern,
    resampled,
    source,
    which,
)
from tests.emulators import AZURITE_ACCOUNT, AZURITE_KEY, MOTO_ENV


# -- 1. proportions ----------------------------------------------------------------------------------------
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


def test_balanced_draws_hold_every_window_at_its_weight(mix_store: StoreProcess) -> None:
    weights = [0.5, 0.3, 0.15, 0.05]
    mix = wds.RandomMix([resampled(mix_store, name, 60 + i) for i, name in enumerate("abcd")], weights, seed=9)
    got = [ident(s) for s in itertools.islice(mix, 4000)]
    assert len(got) == 4000
    assert _windows(got, "abcd", weights) <= 0.03
    # tighter than that: balanced draws keep each source within a few items of its weight
    assert _windows(got, "abcd", weights, size=200, step=10) <= 0.03


def test_weights_by_shards_and_by_samples(mix_store: StoreProcess) -> None:
    sizes = (1, 2, 3, 4)
    mix = wds.RandomMix([resampled(mix_store, name, 70 + i, n) for i, (name, n) in enumerate(zip("abcd", sizes))],
                        "shards", seed=10)
    assert mix.weights == [1.0, 2.0, 3.0, 4.0]
    got = [ident(s) for s in itertools.islice(mix, 3000)]
    assert _windows(got, "abcd", [1.0, 2.0, 3.0, 4.0]) <= 0.03

    indexed = []
    counts = []
    for name, n in zip("ab", (1, 3)):
        urls = wds.WebDataset(pattern(mix_store, name, n)).urls
        indexed.append(wds.WebDataset(urls, index=wds.build_index(urls)))
        counts.append(float(len(list(wds.WebDataset(urls)))))
    assert wds.RandomMix(indexed, "samples", seed=1).weights == counts


# -- 2. one engine -----------------------------------------------------------------------------------------
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


def test_one_engine_reads_every_source(mix_store: StoreProcess) -> None:
    alone = {name: [ident(s) for s in source(mix_store, name)] for name in NAMES}
    mix = wds.RandomMix([source(mix_store, name) for name in NAMES], [5, 4, 3, 2, 1], longest=True, seed=12)
    during, samples = _threads_while_iterating(mix)
    assert during == 1
    got = [ident(s) for s in samples]
    for name in NAMES:
        assert [s for s in got if which(s) == name] == alone[name]
    stats = mix.stats()
    total = sum(len(v) for v in alone.values())
    assert stats["samples_delivered"] == total == len(got)
    assert stats["shards_done"] == len(NAMES) * N_SHARDS


def test_every_shard_is_requested_once_per_pass(mix_store: StoreProcess) -> None:
    """The first items primed for each source are the ones it reads (none read twice or for nothing), also when
    detshuffle gives every pass another shard order; and each pass is the sources' own next pass."""
    def requests() -> int:
        return int(mix_store.stats()["requests"])

    direct = [source(mix_store, name, shardshuffle=True, seed=3, detshuffle=True) for name in "abc"]
    passes = [[[ident(s) for s in d] for d in direct] for _ in range(3)]
    assert passes[0] != passes[1]
    mix = wds.RandomMix([source(mix_store, name, shardshuffle=True, seed=3, detshuffle=True) for name in "abc"],
                        [5, 1, 0.1], seed=1, longest=True)
    for expected in passes:
        before = requests()
        got = [ident(s) for s in mix]
        assert requests() - before == 3 * N_SHARDS
        assert [[s for s in got if which(s) == name] for name in "abc"] == expected


def test_other_backend_options_get_their_own_engine(mix_store: StoreProcess) -> None:
    options = {"headers": {"X-Mix": "other"}}
    sources = [source(mix_store, name, backend_options=options if name in "ab" else None) for name in NAMES]
    during, samples = _threads_while_iterating(wds.RoundRobin(sources, longest=True))
    assert during == 2
    got = [ident(s) for s in samples]
    assert len(got) == len(set(got)) == sum(len(list(source(mix_store, name))) for name in NAMES)


def test_sources_with_one_cache_dir_read_from_the_cache(mix_store: StoreProcess, tmp_path: Path) -> None:
    def make() -> Any:
        return wds.RandomMix([source(mix_store, name, cache_dir=tmp_path) for name in "abc"], seed=1, longest=True)

    alone = sorted(ident(s) for name in "abc" for s in source(mix_store, name))
    first = make()
    assert sorted(ident(s) for s in first) == alone
    assert first.stats()["cache_fills"] == 3 * N_SHARDS
    again = make()
    assert sorted(ident(s) for s in again) == alone
    assert again.stats()["cache_hits"] == 3 * N_SHARDS


def test_sources_with_one_cache_dir_share_one_engine(mix_store: StoreProcess, tmp_path: Path) -> None:
    mix = wds.RandomMix([source(mix_store, name, cache_dir=tmp_path) for name in "abc"], seed=1, longest=True)
    during, samples = _threads_while_iterating(mix)
    assert len(samples) == sum(len(list(source(mix_store, name))) for name in "abc")
    assert during == 1


# -- 3. schemes ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clouds(mix_data: Path, moto_endpoint: str, gcs_endpoint: str, azurite_endpoint: str) -> dict[str, Any]:
    """Dataset b in a moto S3 bucket, c in a GCS emulator bucket, d in an Azurite container: their URLs and
    the backend options that reach them."""
    import boto3
    from azure.storage.blob import BlobServiceClient
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tests.emulators import azurite_connection_string

    files = {name: sorted((mix_data / name).glob(f"{name}-*.tar")) for name in "bcd"}
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
def test_a_mix_of_schemes_delivers_every_sample_once(mix_store: StoreProcess, mix_data: Path, clouds: dict[str, Any],
                                                     monkeypatch: pytest.MonkeyPatch, shared_options: bool) -> None:
    for key, value in MOTO_ENV.items():
        monkeypatch.setenv(key, value)
    options = clouds["options"]
    urls = {"a": pattern(mix_store, "a"), **clouds["urls"],
            "e": str(mix_data / "e" / f"e-{{000000..{N_SHARDS - 1:06d}}}.tar")}

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


# -- 4. faults -------------------------------------------------------------------------------------------------
def test_faults_give_the_same_mix_as_a_clean_store(mix_store: StoreProcess) -> None:
    def make(query: str) -> Any:
        sources = [wds.WebDataset(pattern(mix_store, name, query=query), retry=RETRY).shuffle(15, seed=i)
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


# -- 5. parity with webdataset -----------------------------------------------------------------------------------
@pytest.mark.parametrize("longest", [False, True])
def test_unseeded_draws_match_webdataset_over_webdatasets(mix_data: Path, mix_store: StoreProcess,
                                                         longest: bool) -> None:
    import webdataset

    def pattern(name: str) -> str:
        return str(mix_data / name / f"{name}-{{000000..{N_SHARDS - 1:06d}}}.tar")

    def seq(samples: Any) -> list[tuple[str, str]]:
        return [(Path(s["__url__"]).name, s["__key__"]) for s in samples]

    probs = [0.5, 0.2, 0.3]
    # Built before the seed: constructing a WebDataset (theirs and ours alike) draws its default shard seed from
    # the global generator.
    ours_sources = [wds.WebDataset(pattern(name)) for name in "abc"]
    remote_sources = [source(mix_store, name) for name in "abc"]
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


def test_retries_leave_the_global_generator_to_the_draws(mix_store: StoreProcess) -> None:
    # An unseeded mix draws its sources from the global generator, as webdataset's does; the engine's retry
    # jitter runs in another thread meanwhile and must not take numbers from it, or a run with a 503 on the way
    # picks other sources than the same run without one.
    def seq(query: str) -> tuple[list[Ident], int]:
        sources = [wds.WebDataset(pattern(mix_store, name, query=query)) for name in "abc"]
        mix = wds.RandomMix(sources, [0.5, 0.2, 0.3])
        random.seed(21)
        return [ident(s) for s in mix], mix.stats()["retries"]

    clean, _ = seq("")
    faulty, retries = seq("?fail_rate=0.3&drop_rate=0.2")
    assert retries > 0  # the faults were met, so the check below means something
    assert faulty == clean
