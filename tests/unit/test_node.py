"""One budget per node: the division rule, its environment variables, explicit caps, real DataLoader workers."""

from __future__ import annotations

import multiprocessing
from collections.abc import Iterator

import pytest
from torch.utils.data import DataLoader, IterableDataset

from wds_async.config import EngineConfig
from wds_async.node import (
    MIN_BUFFERED_BYTES,
    NODE_BUFFERED_BYTES,
    NODE_CONNECTIONS,
    NodeShare,
    local_processes,
    parse_bytes,
    share_config,
)
from wds_async.stats import Stats

MiB = 1 << 20
GiB = 1 << 30


@pytest.fixture(autouse=True)
def _no_launcher_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)


def _share(**kw: object) -> NodeShare:
    return share_config(EngineConfig(), **kw)[1]  # type: ignore[arg-type]


def test_defaults_keep_todays_per_process_settings_up_to_eight_processes() -> None:
    assert (8 * 32, 8 * 256 * MiB) == (NODE_CONNECTIONS, NODE_BUFFERED_BYTES)
    for processes in (1, 2, 8):
        share = _share(processes=processes)
        # autotuned: the ceiling is the process's share of the node's connections
        assert (share.max_connections, share.max_buffered_bytes) == (256 // processes, 256 * MiB)
        fixed = share_config(EngineConfig(max_connections=32), processes=processes)[1]
        assert (fixed.max_connections, fixed.max_buffered_bytes) == (32, 256 * MiB)
    share = _share(processes=64)  # 8 ranks x 8 workers
    assert (share.max_connections, share.max_buffered_bytes) == (4, 32 * MiB)
    assert share.as_dict() == {"processes": 64, "node_connections": 256, "node_buffered_bytes": 2 * GiB,
                               "max_connections": 4, "max_buffered_bytes": 32 * MiB}


def test_floors_win_over_a_budget_split_too_thin() -> None:
    share = _share(processes=1000)
    assert (share.max_connections, share.max_buffered_bytes) == (1, MIN_BUFFERED_BYTES)
    share = _share(processes=3, node_connections=2, node_buffered_bytes=MiB)
    assert (share.max_connections, share.max_buffered_bytes) == (1, 8 * MiB)


def test_config_is_replaced_with_the_share_and_nothing_else_changes() -> None:
    base = EngineConfig(chunk_bytes=MiB // 2, read_timeout=7.0, deterministic=True)
    cfg, share = share_config(base, processes=16)
    assert (cfg.connection_cap, cfg.max_buffered_bytes) == (16, 128 * MiB) == (
        share.max_connections, share.max_buffered_bytes)
    assert cfg.autotune and cfg.connections == 16 and cfg.first_connections == 16
    assert cfg.replace(connection_cap=256, max_buffered_bytes=256 * MiB) == base
    fixed, _ = share_config(base.replace(max_connections=32), processes=16)
    assert (fixed.max_connections, fixed.connection_cap) == (16, 256)
    assert cfg.handoff_bytes == 16 * MiB


def test_a_chosen_node_budget_is_divided_as_given() -> None:
    """Not capped by the per-process defaults: a lone process may use the whole node budget it was given."""
    share = _share(processes=1, node_connections=100, node_buffered_bytes=GiB)
    assert (share.max_connections, share.max_buffered_bytes) == (100, GiB)
    share = _share(processes=4, node_connections=100, node_buffered_bytes=GiB)
    assert (share.max_connections, share.max_buffered_bytes) == (25, GiB // 4)


def test_explicit_per_process_settings_cap_the_share() -> None:
    cfg = EngineConfig(max_connections=10, max_buffered_bytes=64 * MiB)
    both = frozenset({"max_connections", "max_buffered_bytes"})
    _, share = share_config(cfg, processes=1, node_connections=100, node_buffered_bytes=GiB, explicit=both)
    assert (share.max_connections, share.max_buffered_bytes) == (10, 64 * MiB)
    # below the cap the node share applies
    _, share = share_config(cfg, processes=20, node_connections=100, node_buffered_bytes=GiB, explicit=both)
    assert (share.max_connections, share.max_buffered_bytes) == (5, GiB // 20)
    # only the named setting caps; other names in ``explicit`` are ignored
    _, share = share_config(cfg, processes=1, node_connections=100, node_buffered_bytes=GiB,
                            explicit=frozenset({"max_connections", "read_timeout"}))
    assert (share.max_connections, share.max_buffered_bytes) == (10, GiB)
    # an explicit setting below the floor is honoured: the user asked for it
    tiny = EngineConfig(max_buffered_bytes=MiB)
    _, share = share_config(tiny, processes=1, explicit=frozenset({"max_buffered_bytes"}))
    assert share.max_buffered_bytes == MiB
    # an explicit setting above today's default is allowed under the default node budget
    big = EngineConfig(max_connections=64, max_buffered_bytes=512 * MiB)
    _, share = share_config(big, processes=2, explicit=both)
    assert (share.max_connections, share.max_buffered_bytes) == (64, 512 * MiB)


def test_environment_sets_the_node_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_ASYNC_NODE_CONNECTIONS", "16")
    monkeypatch.setenv("WDS_ASYNC_NODE_BUFFERED_BYTES", "64MiB")
    share = _share(processes=8)
    assert share.as_dict() == {"processes": 8, "node_connections": 16, "node_buffered_bytes": 64 * MiB,
                               "max_connections": 2, "max_buffered_bytes": 8 * MiB}
    # arguments win over the environment
    share = _share(processes=1, node_connections=3, node_buffered_bytes=12 * MiB)
    assert (share.node_connections, share.node_buffered_bytes) == (3, 12 * MiB)
    # blank means unset
    monkeypatch.setenv("WDS_ASYNC_NODE_CONNECTIONS", " ")
    assert _share(processes=1).max_connections == 256  # the default node share, the autotuner's ceiling


@pytest.mark.parametrize(("text", "expected"), [
    ("1048576", 1 << 20), ("4GiB", 4 * GiB), ("512MB", 512 * 10**6), ("512mb", 512 * 10**6),
    ("1.5GiB", 3 * GiB // 2), (" 2 gib ", 2 * GiB), ("64Mi", 64 * MiB), ("3k", 3000), ("7B", 7), ("1TiB", 1 << 40),
])
def test_sizes(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "-4", "0", "4 GiBs", "1e9", "0.1B", "12XB", "٣MB", "GiB"])
def test_malformed_buffered_bytes_name_the_variable(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("WDS_ASYNC_NODE_BUFFERED_BYTES", text)
    with pytest.raises(ValueError, match="WDS_ASYNC_NODE_BUFFERED_BYTES"):
        _share(processes=1)


@pytest.mark.parametrize("text", ["lots", "-4", "0", "1.5", "16k", "٣"])
def test_malformed_integer_variables_name_the_variable(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    for name in ("WDS_ASYNC_NODE_CONNECTIONS", "WDS_ASYNC_LOCAL_PROCESSES", "LOCAL_WORLD_SIZE"):
        with monkeypatch.context() as m:
            m.setenv(name, text)
            with pytest.raises(ValueError, match=name):
                _share()


@pytest.mark.parametrize(("name", "value"), [
    ("processes", 0), ("processes", -1), ("processes", True), ("processes", 2.0),
    ("node_connections", 0), ("node_connections", "16"), ("node_buffered_bytes", -1),
    ("node_buffered_bytes", 1.5),
])
def test_invalid_arguments(name: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        _share(**{name: value})


def test_local_processes_outside_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    assert local_processes() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert local_processes() == 4
    assert _share().processes == 4
    monkeypatch.setenv("WDS_ASYNC_LOCAL_PROCESSES", "10")
    assert local_processes() == 10


class _Report(IterableDataset):  # type: ignore[type-arg]
    """Yields, from each DataLoader worker, what that worker sees."""

    def __iter__(self) -> Iterator[tuple[int, int]]:
        yield local_processes(), share_config(EngineConfig())[1].max_connections


@pytest.mark.parametrize(("env", "expected"), [({}, 2), ({"LOCAL_WORLD_SIZE": "3"}, 6),
                                               ({"LOCAL_WORLD_SIZE": "3", "WDS_ASYNC_LOCAL_PROCESSES": "5"}, 5)])
def test_local_processes_in_dataloader_workers(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                                               expected: int) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WDS_ASYNC_NODE_CONNECTIONS", "60")
    loader = DataLoader(_Report(), batch_size=None, num_workers=2,
                        multiprocessing_context=multiprocessing.get_context("fork"))
    assert sorted(tuple(int(v) for v in x) for x in loader) == [(expected, 60 // expected)] * 2


def test_stats_snapshot_carries_the_share() -> None:
    stats = Stats()
    assert stats.snapshot()["node_share"] is None
    stats.node_share = _share(processes=2).as_dict()
    assert stats.snapshot()["node_share"]["processes"] == 2
