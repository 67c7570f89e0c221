"""The node service with real processes: a ``wds-async serve`` subprocess and datasets reading through it,
compared with the same datasets read in-process, on the emulated store."""

from __future__ import annotations

import multiprocessing
import os
import socket
import stat
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from torch.utils.data import DataLoader

import wds_async as wds
from tests.conftest import sample_digest, wait_until, write_tar
from wds_async.errors import NotFound, ServiceError
from wds_async.service import ServiceHandle, service_status, start_service
from wds_async.service.paths import default_socket_path


def _keys(ds: Any, **loader: Any) -> Counter:  # type: ignore[type-arg]
    data = ds.to_tuple("__url__", "__key__")
    if loader:
        data = DataLoader(data, batch_size=None, **loader)
    return Counter(tuple(x) for x in data)


def test_same_samples_as_in_process(service: ServiceHandle, pattern: str, manifest: dict) -> None:  # type: ignore[type-arg]
    here = wds.WebDataset(pattern, deterministic=True)
    there = wds.WebDataset(pattern, deterministic=True, service=service.url)
    assert sample_digest(there) == sample_digest(here)
    assert sample_digest(there)[0] == manifest["expected_samples"]
    stats = there.stats()
    assert stats["service"] == service.socket and stats["samples_delivered"] == manifest["expected_samples"]
    assert stats["first_sample_s"] is not None and stats["first_sample_s"] > 0  # stamped through the service too
    # positions are those the engine gives: a checkpoint made through the service means the same bytes
    a = [(s.url, s.offset, s.end, s.item) for s in wds.WebDataset(pattern, deterministic=True)]
    b = [(s.url, s.offset, s.end, s.item) for s in wds.WebDataset(pattern, deterministic=True, service=service.url)]
    assert a == b


def test_dataloader_workers_fork(service: ServiceHandle, pattern: str, manifest: dict) -> None:  # type: ignore[type-arg]
    ctx = multiprocessing.get_context("fork")
    keys = _keys(wds.WebDataset(pattern, service=service.url), num_workers=2, multiprocessing_context=ctx)
    assert keys == _keys(wds.WebDataset(pattern), num_workers=2, multiprocessing_context=ctx)
    assert len(keys) == manifest["expected_samples"] and set(keys.values()) == {1}


def test_index_shares_and_resume_mid_epoch(service: ServiceHandle, pattern: str, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    index = tmp_path / "shards.index"
    wds.build_index(pattern).save(index)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")  # an equal share of rank 1 of 3
    expected = [s["__key__"] for s in wds.WebDataset(pattern, index=str(index), shardshuffle=True, seed=5)]
    ds = wds.WebDataset(pattern, index=str(index), shardshuffle=True, seed=5, service=service.url)
    assert sorted(s["__key__"] for s in ds) == sorted(expected)
    first, state = [], None
    for n, sample in enumerate(ds):
        first.append(sample["__key__"])
        if n == len(expected) // 2:
            state = ds.state_dict()
            break
    again = wds.WebDataset(pattern, index=str(index), shardshuffle=True, seed=5, service=service.url)
    assert state is not None
    again.load_state_dict(state)
    assert sorted(first + [s["__key__"] for s in again]) == sorted(expected)


def test_in_band_errors_meet_the_clients_handler(service: ServiceHandle, store: Any, manifest: dict) -> None:  # type: ignore[type-arg]
    urls = [store.base_url + "shard-000000.tar", store.base_url + "missing.tar", store.base_url + "shard-000001.tar"]
    kept = list(wds.WebDataset(urls, handler=wds.ignore_and_continue, deterministic=True, service=service.url))
    assert len(kept) == manifest["shards"][0]["samples"] + manifest["shards"][1]["samples"]
    assert sample_digest(kept) == sample_digest(wds.WebDataset(urls, handler=wds.ignore_and_continue,
                                                               deterministic=True))
    with pytest.raises(NotFound, match=r"missing\.tar"):
        list(wds.WebDataset(urls, deterministic=True, service=service.url))
    stopped = list(wds.WebDataset(urls, handler=wds.ignore_and_stop, deterministic=True, service=service.url))
    assert sample_digest(stopped) == sample_digest(wds.WebDataset(urls[:1], deterministic=True))


def test_samples_larger_than_half_the_ring(sock_dir: str, tmp_path: Path) -> None:
    big = os.urandom(300 << 10)
    shard = write_tar(tmp_path / "big.tar", [("a.txt", b"x"), ("a.bin", big), ("b.bin", b"small"), ("c.bin", big[:5])])
    with start_service(os.path.join(sock_dir, "svc.sock"), ring_bytes=64 << 10) as svc:
        got = list(wds.WebDataset(str(shard), service=svc.url))
    assert [s["__key__"] for s in got] == ["a", "b", "c"] and got[0]["bin"] == big and got[0]["txt"] == b"x"
    assert got[0]["__local_path__"] == str(shard)  # as in-process: the path that was read


def test_no_service_is_a_clear_error(sock_dir: str, pattern: str) -> None:
    path = os.path.join(sock_dir, "nobody.sock")
    with pytest.raises(ServiceError, match=r"no wds-async service at .*nobody.sock; start one with `wds-async serve"):
        list(wds.WebDataset(pattern, service="unix://" + path))


def test_options_the_service_cannot_run(pattern: str) -> None:
    with pytest.raises(ValueError, match="select_files"):
        wds.WebDataset(pattern, service="unix:///tmp/x.sock", select_files=lambda name: True)
    with pytest.raises(ValueError, match="'auto' or 'unix://PATH'"):
        wds.WebDataset(pattern, service="/tmp/x.sock")


def test_auto_uses_a_service_when_one_answers(sock_dir: str, pattern: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", sock_dir)
    monkeypatch.setenv("WDS_ASYNC_JOB", "auto-test")
    expected = sample_digest(wds.WebDataset(pattern, deterministic=True))
    alone = wds.WebDataset(pattern, deterministic=True, service="auto")
    assert sample_digest(alone) == expected and alone.stats()["service"] == "auto"  # no service: in-process
    with start_service(env={"XDG_RUNTIME_DIR": sock_dir, "WDS_ASYNC_JOB": "auto-test"}) as svc:
        assert svc.socket == default_socket_path() == os.path.join(sock_dir, "wds-async", "service-auto-test.sock")
        monkeypatch.setenv("WDS_ASYNC_SERVICE", "auto")
        served = wds.WebDataset(pattern, deterministic=True)
        assert sample_digest(served) == expected and served.stats()["service"] == svc.socket


def test_permissions_and_namespaces(sock_dir: str, pattern: str, manifest: dict) -> None:  # type: ignore[type-arg]
    env = {"XDG_RUNTIME_DIR": sock_dir}
    with start_service(env={**env, "WDS_ASYNC_JOB": "a"}) as a, \
            start_service(env={**env, "TORCHELASTIC_RUN_ID": "b"}) as b:
        assert a.socket != b.socket and a.pid != b.pid
        assert stat.S_IMODE(os.stat(a.socket).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(a.socket)).st_mode) == 0o700
        for svc in (a, b):
            assert sample_digest(wds.WebDataset(pattern, service=svc.url))[0] == manifest["expected_samples"]
            assert service_status(svc.socket)["pid"] == svc.pid


def test_one_service_per_socket_and_stale_sockets(sock_dir: str) -> None:
    path = os.path.join(sock_dir, "svc.sock")
    with start_service(path) as first:
        with pytest.raises(ServiceError, match="already running"):
            start_service(path, timeout=20)
        assert service_status(path)["pid"] == first.pid
    assert not os.path.exists(path)  # SIGTERM: a clean stop removes the socket
    assert first.process.returncode == 0
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(path)  # a socket file nobody listens on, as a killed service leaves it
    stale.close()
    with start_service(path) as second:
        assert service_status(path)["pid"] == second.pid


def test_sessions_end_with_their_clients(service: ServiceHandle, pattern: str) -> None:
    samples = iter(wds.WebDataset(pattern, service=service.url))
    next(samples)
    assert wait_until(lambda: service.status()["sessions"] == 1, 10)
    samples.close()  # type: ignore[attr-defined]
    assert wait_until(lambda: service.status()["sessions"] == 0, 10)


def test_the_service_fills_and_reads_the_clients_cache(service: ServiceHandle, pattern: str, tmp_path: Path) -> None:
    from wds_async.cache.disk import ShardCache

    cache = tmp_path / "cache"
    expected = sample_digest(wds.WebDataset(pattern, deterministic=True))
    first = wds.WebDataset(pattern, deterministic=True, service=service.url, cache_dir=cache)
    assert sample_digest(first) == expected
    copies = ShardCache(cache).entries()
    assert len(copies) == len(wds.WebDataset(pattern).urls)  # the service wrote every shard while serving it
    stamps = {c.name: c.last_used for c in copies}
    again = wds.WebDataset(pattern, deterministic=True, service=service.url, cache_dir=cache)
    assert sample_digest(again) == expected
    assert all(c.last_used > stamps[c.name] for c in ShardCache(cache).entries())  # every copy was read (a hit)
