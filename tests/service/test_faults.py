"""Faults of the node service with real processes: a client killed with SIGKILL, the service killed with
SIGKILL (and restarted, the job resuming from its checkpoint), and a client that stops reading."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from tests.conftest import sample_digest, wait_until
from wds_async.errors import ServiceError
from wds_async.service import ServiceHandle, start_service

CHILD = str(Path(__file__).with_name("client_child.py"))
REPO = str(Path(__file__).resolve().parents[2])


def test_a_killed_client_frees_its_session(service: ServiceHandle, pattern: str, manifest: dict) -> None:  # type: ignore[type-arg]
    child = subprocess.Popen([sys.executable, CHILD, service.socket, pattern], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": REPO})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        assert wait_until(lambda: child.pid in service.status()["clients"], 10)
        samples = iter(wds.WebDataset(pattern, deterministic=True, service=service.url))
        first = next(samples)
        assert wait_until(lambda: service.status()["sessions"] == 2, 10)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        # the service goes on serving the other client, and forgets the dead one
        assert wait_until(lambda: service.status()["clients"] == [os.getpid()], 10)
        rest = list(samples)
        assert sample_digest([first, *rest]) == sample_digest(wds.WebDataset(pattern, deterministic=True))
        assert len(rest) + 1 == manifest["expected_samples"]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
        if child.stdout is not None:
            child.stdout.close()
    assert wait_until(lambda: service.status()["sessions"] == 0, 10)


def test_a_killed_service_raises_and_a_restart_resumes(sock_dir: str, pattern: str) -> None:
    path = os.path.join(sock_dir, "svc.sock")
    expected = Counter(s["__key__"] for s in wds.WebDataset(pattern))
    seen: list[str] = []
    state: dict[str, Any] | None = None
    # a small ring: most of the epoch is still in the service when it dies
    with start_service(path, ring_bytes=64 << 10) as svc:
        ds = wds.WebDataset(pattern, shardshuffle=True, seed=2, service=svc.url)
        with pytest.raises(ServiceError, match=re.escape(f"service at {path} stopped while serving")) as caught:
            for n, sample in enumerate(ds):
                seen.append(sample["__key__"])
                state = ds.state_dict()
                if n == 20:
                    os.kill(svc.pid, signal.SIGKILL)
        assert "restart it" in str(caught.value) and caught.value.url == path
    assert state is not None and 20 < len(seen) < sum(expected.values())
    with start_service(path) as again:  # the dead one's socket file is stale: replaced
        resumed = wds.WebDataset(pattern, shardshuffle=True, seed=2, service=again.url)
        resumed.load_state_dict(state)
        rest = [s["__key__"] for s in resumed]
    assert Counter(seen) + Counter(rest) == expected


@pytest.mark.parametrize("connections,part_bytes", [(1, None), (3, 32 << 10)], ids=["one-connection", "ranged-parts"])
def test_a_client_that_stops_reading_stalls_only_itself(sock_dir: str, pattern: str, manifest: dict,  # type: ignore[type-arg]
                                                        connections: int, part_bytes: int | None) -> None:
    """Few node connections and a client that never reads again: its readers, and the helpers fetching
    ranged parts ahead of them, wait for room in its own budget without holding a connection, so the other
    client still gets every sample."""
    path = os.path.join(sock_dir, "svc.sock")
    with start_service(path, max_connections=connections, ring_bytes=64 << 10) as svc:
        stalled = iter(wds.WebDataset(pattern, max_buffered_bytes=64 << 10, service=svc.url, part_bytes=part_bytes))
        next(stalled)
        results: list[Any] = []
        reader = threading.Thread(target=lambda: results.append(sample_digest(
            wds.WebDataset(pattern, deterministic=True, service=svc.url))), daemon=True)
        reader.start()
        reader.join(120)  # a hang guard only: it ends in about a second
        assert not reader.is_alive(), "the second client starved behind the stalled one"
        assert results == [sample_digest(wds.WebDataset(pattern, deterministic=True))]
        assert results[0][0] == manifest["expected_samples"]
        assert svc.status()["sessions"] == 1  # the stalled one is still there, still not done
        stalled.close()  # type: ignore[attr-defined]


_OTHER_USER = r"""
import json, os, socket, sys
os.setgid(65534); os.setuid(65534)          # nobody
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(path)
except PermissionError:
    print("refused: permission"); sys.exit(0)
try:
    s.sendall(b"\x00\x00\x00\x10" + b'{"type":"hello"}')
except (BrokenPipeError, ConnectionResetError):
    pass  # a refused connection may be closed first: its answer is still there to read
data, fds, _, _ = socket.recv_fds(s, 1 << 16, 4)
message = json.loads(data[4:]) if data else {}
if not data:
    print("refused: closed")
elif message.get("type") == "error" and not fds and "refused this connection" in message["error"]["message"]:
    print("refused: told (" + message["error"]["message"] + ")")
else:
    print("answered")
"""


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to act as another user")
def test_another_user_cannot_connect(sock_dir: str) -> None:
    """The socket's modes stop another user; with them opened up, the service's SO_PEERCRED check still does,
    and tells the refused process why in an error frame (it used to close the connection without a word)."""
    os.chmod(sock_dir, 0o755)  # the test's own temporary parent: let "nobody" reach the service's directory
    with start_service(os.path.join(sock_dir, "run", "svc.sock")) as handle:
        run = [sys.executable, "-c", _OTHER_USER, handle.socket]
        first = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
        assert first.stdout.strip() == "refused: permission", first.stderr
        os.chmod(os.path.dirname(handle.socket), 0o755)
        os.chmod(handle.socket, 0o666)
        second = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
        # refused by the uid check, and told so (no ring passed): "serves its own user (uid 0) only"
        assert second.stdout.startswith("refused: told"), (second.stdout, second.stderr)
        assert f"(uid {os.getuid()}) only" in second.stdout
        assert handle.status()["sessions"] == 0  # and it still serves its own user
