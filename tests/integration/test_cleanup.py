"""No leaked thread, task, socket, file descriptor or child process, whatever ends the iteration."""

from __future__ import annotations

import gc
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

import wds_async as wds
from emustore import StoreProcess
from tests.conftest import engine_threads, open_fds, wait_until

_children_before: set[int] = set()


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _baseline() -> tuple[int, int]:
    gc.collect()
    _children_before.clear()
    _children_before.update(_children())  # the store server, multiprocessing's resource tracker, ...
    return open_fds(), len(engine_threads())


def _assert_clean(fds: int, threads: int) -> None:
    assert wait_until(lambda: len(engine_threads()) == threads), "engine thread leaked"
    assert wait_until(lambda: open_fds() <= fds), f"fds leaked: {open_fds()} > {fds}"
    assert wait_until(lambda: _children() <= _children_before), \
        f"child processes left (or zombies): {_children() - _children_before}"


@pytest.fixture()
def slow_pattern(store: StoreProcess) -> str:
    return store.base_url + "shard-{000000..000007}.tar?bw=500000"


def test_break_early(slow_pattern: str) -> None:
    list(wds.WebDataset(slow_pattern.replace("bw=500000", "bw=0")))  # warm imports, pools, executors
    fds, threads = _baseline()
    for i, _ in enumerate(wds.WebDataset(slow_pattern, max_connections=8)):
        if i == 3:
            break
    _assert_clean(fds, threads)


def test_del_and_garbage_collection(slow_pattern: str) -> None:
    fds, threads = _baseline()
    it = iter(wds.WebDataset(slow_pattern, max_connections=8))
    next(it)
    assert len(engine_threads()) == threads + 1
    del it
    gc.collect()
    _assert_clean(fds, threads)


def test_exception_in_user_code(slow_pattern: str) -> None:
    fds, threads = _baseline()
    with pytest.raises(ZeroDivisionError):
        for _ in wds.WebDataset(slow_pattern).map(lambda s: 1 / 0):
            pass
    _assert_clean(fds, threads)


def test_keyboard_interrupt(slow_pattern: str) -> None:
    fds, threads = _baseline()
    with pytest.raises(KeyboardInterrupt):
        for i, _ in enumerate(wds.WebDataset(slow_pattern)):
            if i == 2:
                raise KeyboardInterrupt
    _assert_clean(fds, threads)


def test_engine_error_cleans_up(store: StoreProcess) -> None:
    fds, threads = _baseline()
    with pytest.raises(wds.NotFound):
        list(wds.WebDataset([store.url("shard-000000.tar", bw=500000), store.url("nope.tar")]))
    _assert_clean(fds, threads)


def test_pipe_children_are_killed_on_break(tmp_path: Path, shard_dir: Path) -> None:
    fds, threads = _baseline()
    marker = tmp_path / "pids"
    # Each command streams a shard slowly and records its pid; stopping early must kill them all.
    url = f"pipe:echo $$ >> {marker}; pv -q -L 100000 {shard_dir}/shard-000000.tar 2>/dev/null || " \
          f"(sleep 0.2; cat {shard_dir}/shard-000000.tar; sleep 30)"
    started = time.monotonic()
    for i, _ in enumerate(wds.WebDataset([url] * 4, max_connections=4)):
        if i == 1:
            break
    assert time.monotonic() - started < 10, "stopping must not wait for the commands to finish"
    _assert_clean(fds, threads)
    for pid in marker.read_text().split():
        assert not psutil.pid_exists(int(pid)) or psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE


def test_no_zombies_after_pipe_shards(tmp_path: Path, shard_dir: Path) -> None:
    url = f"pipe:cat {shard_dir}/shard-00000{{0..3}}.tar"
    assert len(list(wds.WebDataset(url))) > 0
    zombies = [p for p in psutil.Process().children(recursive=True) if p.status() == psutil.STATUS_ZOMBIE]
    assert zombies == []


def test_engine_thread_does_not_outlive_interpreter(shard_dir: Path) -> None:
    """A script that leaves an iterator suspended still exits promptly (daemon thread, no hang)."""
    code = (
        "import wds_async as wds\n"
        f"it = iter(wds.WebDataset('pipe:cat {shard_dir}/shard-000000.tar; sleep 60'))\n"
        "next(it)\n"
        "print('ok')\n"
    )
    started = time.monotonic()
    out = subprocess.run([os.sys.executable, "-c", code], capture_output=True, text=True, timeout=30)  # type: ignore[attr-defined]
    assert out.stdout.strip() == "ok", out.stderr
    assert time.monotonic() - started < 15


def test_dataloader_worker_shutdown_kills_pipe_children(tmp_path: Path, shard_dir: Path) -> None:
    """Stopping early with worker processes: each worker closes its engine, so no pipe: command survives."""
    import multiprocessing

    from torch.utils.data import DataLoader

    marker = tmp_path / "pids"
    url = f"pipe:echo $$ >> {marker}; cat {shard_dir}/shard-000000.tar; sleep 60"
    ds = wds.WebDataset([url] * 4, max_connections=2).to_tuple("__key__")
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=multiprocessing.get_context("fork"))
    it = iter(loader)
    for _ in range(3):
        next(it)
    del it
    gc.collect()
    pids = [int(p) for p in marker.read_text().split()]
    assert pids
    assert wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                                      for p in pids), timeout=15), "pipe: commands outlived the DataLoader workers"
