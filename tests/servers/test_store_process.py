"""The emulated object store as a process: server-wide knobs from its command line, a bandwidth shared by all
its connections, the hosts it may listen on, how it starts, reports a failed start and ends (with its parent too).

Each test starts a store of its own; timing checks are lower bounds only.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil
import pytest

from emustore import Knobs, StoreProcess, check_host, start_store
from tests.servers.plain import SHARD, fetch

# -- server-wide knobs and the process lifecycle ----------------------------------------------------


@pytest.mark.asyncio
async def test_server_knobs_from_cli(root: Path, data: bytes) -> None:
    with StoreProcess(root, knobs=Knobs(ttfb=0.1, ignore_range=True, seed=3)) as store:
        start = time.monotonic()
        resp, body = await fetch(store.url(SHARD), headers={"Range": "bytes=0-9"})
        elapsed = time.monotonic() - start
        overridden, small = await fetch(store.url(SHARD, ignore_range=0), headers={"Range": "bytes=0-9"})
    assert (resp.status, body) == (200, data)
    assert elapsed >= 0.1 - 0.01
    assert (overridden.status, small) == (206, data[:10])


@pytest.mark.asyncio
async def test_total_bandwidth_is_shared(root: Path) -> None:
    total = 8e6
    names = ["shard-000000.tar", "shard-000001.tar"]
    size = sum((root / n).stat().st_size for n in names)
    with StoreProcess(root, knobs=Knobs(total_bw=total)) as store:
        start = time.monotonic()
        results = await asyncio.gather(*(fetch(store.url(n)) for n in names))
        elapsed = time.monotonic() - start
    assert sum(len(body) for _, body in results) == size
    assert elapsed >= 0.8 * size / total


def test_process_is_gone_after_exit(root: Path) -> None:
    with StoreProcess(root) as store:
        pid = store.pid
        assert pid is not None and psutil.pid_exists(pid)
        assert store.stats()["requests"] == 0
    assert store.returncode == 0  # SIGTERM is a clean shutdown
    assert not psutil.pid_exists(pid)
    assert store.stderr == ""


@pytest.mark.asyncio
async def test_exit_with_a_stalled_response_in_flight(root: Path) -> None:
    store = StoreProcess(root)
    store.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(store.url(SHARD, stall=60)) as resp:
                await resp.content.readexactly(1000)
                await asyncio.to_thread(store.close)
                with pytest.raises(aiohttp.ClientPayloadError):
                    await resp.read()
    finally:
        store.close()
    assert store.returncode is not None
    assert store.pid is not None and not psutil.pid_exists(store.pid)


def test_startup_failure_reports_stderr(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="not a directory"):
        with StoreProcess(tmp_path / "missing"):
            pass


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "localhost"])
def test_loopback_hosts_accepted(host: str) -> None:
    assert check_host(host).startswith("127.")


@pytest.mark.parametrize("host", ["0.0.0.0", "::1", "::", "192.168.1.1", "example.com", ""])
def test_other_hosts_refused(host: str, root: Path) -> None:
    with pytest.raises(ValueError, match="refusing"):
        check_host(host)
    with pytest.raises(ValueError):
        StoreProcess(root, host=host)


@pytest.mark.asyncio
async def test_start_store_in_process(root: Path, data: bytes) -> None:
    with pytest.raises(ValueError):
        await start_store(root, host="0.0.0.0")
    runner, port = await start_store(root, knobs=Knobs(seed=0))
    try:
        resp, body = await fetch(f"http://127.0.0.1:{port}/{SHARD}")
    finally:
        await runner.cleanup()
    assert (resp.status, body) == (200, data)


def test_knobs_validate_and_round_trip() -> None:
    for bad in ({"fail_rate": 1.5}, {"drop_rate": -0.1}, {"bw": float("inf")}, {"ttfb": float("nan")},
                {"seed": "x"}):
        with pytest.raises(ValueError):
            Knobs(**bad)  # type: ignore[arg-type]
    knobs = Knobs(ttfb=0.05, bw=20e6, ignore_range=True, seed=4)
    assert knobs.to_args() == ["--ttfb", "0.05", "--bw", "20000000.0", "--ignore-range", "--seed", "4"]
    assert Knobs().to_args() == []


def test_orphaned_store_exits_by_itself(root: Path, tmp_path: Path) -> None:
    """A test run killed with SIGKILL cannot clean up; the store notices it was orphaned and exits. (What the killed
    parent cannot remove, its store's folder of port file and stderr, goes to ``tmp_path``, not to ``/tmp``.)"""
    code = ("import sys, time; from emustore import StoreProcess; "
            "s = StoreProcess(sys.argv[1]); s.start(); print(s.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code, str(root)], stdout=subprocess.PIPE,
                              cwd=Path(__file__).resolve().parents[2], env={**os.environ, "TMPDIR": str(tmp_path)})
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline())
        assert psutil.pid_exists(pid)
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    assert not alive(pid)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE  # pid 1 may not reap it at once
    except psutil.NoSuchProcess:
        return False
