"""The node service against hostile and careless clients: every probe of the hardening review, each run in a
process of its own (:mod:`tests.service.probes`) against a real ``wds-async serve`` subprocess.

Each test names what it guards; those marked *held* passed before the hardening and must keep passing (more of them
in ``test_hardening_held.py``)."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from tests.conftest import sample_digest, wait_until
from tests.service.clients import case, digest, item, open_request, serves_an_epoch
from tests.service.probe_runner import HeldProbe, probe
from wds_async.config import EngineConfig
from wds_async.errors import ServiceError
from wds_async.service import ServiceHandle, service_status, start_service
from wds_async.service.limits import HANDSHAKE_TIMEOUT
from wds_async.service.protocol import MAX_REQUEST_FRAME, encode

CHILD = str(Path(__file__).with_name("client_child.py"))


# -- 2: the shared-memory ring ------------------------------------------------------------------------------
def test_a_client_that_shrinks_its_ring_cannot_kill_the_service(service: ServiceHandle, store: Any,
                                                                 pattern: str) -> None:
    """It used to: the service's next write into the mapping of a truncated memfd died of SIGBUS."""
    result = probe("truncate", service.socket, {"item": item(store.base_url + "shard-000000.tar")})
    assert result["truncate"] == "refused: Operation not permitted", result  # the seals: its size is fixed
    assert result["answers"][-1] == "end", result  # and the items were served
    assert service.process.poll() is None
    assert serves_an_epoch(service, pattern)


# -- 3: sizes and other settings ----------------------------------------------------------------------------
def test_absurd_settings_are_refused_by_name_and_reach_no_engine(sock_dir: str, store: Any, pattern: str) -> None:
    """part_bytes=1 drove the service to 16 GB; every client setting is checked as EngineConfig checks it."""
    url = store.base_url + "shard-000000.tar"
    bad = {"part_bytes": 1, "chunk_bytes": 0, "max_sample_bytes": -5, "handoff_max_bytes": "16MiB",
           "read_timeout": float("nan"), "deterministic": "yes", "processes": 0, "bogus": 1}
    cases = [case(name, encode(open_request([item(url)], settings={name: value})), hello=True)
             for name, value in bad.items()]
    with start_service(os.path.join(sock_dir, "svc.sock"), ring_bytes=256 << 10) as svc:
        results = probe("frames", svc.socket, {"cases": cases})["results"]
        for name, got in zip(bad, results):
            assert got["got"] == "error" and got["error_type"] == "ServiceError", (name, got)
            assert name in got["message"] and svc.socket in got["message"], (name, got)
            assert got["url"] == svc.socket
        stats = svc.status()["stats"]
        assert stats["requests"] == 0 and stats["bytes_read"] == 0  # nothing of a refused open was run
        assert svc.process.poll() is None and serves_an_epoch(svc, pattern)


# -- 4: descriptors and connections -------------------------------------------------------------------------
def test_out_of_descriptors_refuses_clearly_and_keeps_serving(sock_dir: str, pattern: str) -> None:
    """It used to exit: accept() failed with EMFILE and took the accept loop, then the service, down."""
    with start_service(os.path.join(sock_dir, "svc.sock"), ring_bytes=256 << 10, handshake_timeout=600) as svc:
        soft, hard = resource.prlimit(svc.pid, resource.RLIMIT_NOFILE)
        in_use = len(os.listdir(f"/proc/{svc.pid}/fd"))
        resource.prlimit(svc.pid, resource.RLIMIT_NOFILE, (in_use + 8, hard))  # room for about 4 clients
        try:
            with HeldProbe("exhaust", svc.socket, {"limit": 40}) as held:
                result = held.finish()
        finally:
            resource.prlimit(svc.pid, resource.RLIMIT_NOFILE, (soft, hard))
        answers = result["answers"]
        assert [a["got"] for a in answers[:-1]] == ["ready"] * (len(answers) - 1) and len(answers) > 1, answers
        for refusal in (answers[-1], result["last"]):  # a hello refused, a connection refused at accept
            assert refusal["got"] == "error" and "file descriptors" in refusal["message"], result
        assert result["status"] == "error" and "file descriptors" in result["message"], result  # told, via the client
        assert "refused" in result["message"] and "stopped while serving" not in result["message"]
        assert svc.process.poll() is None
        assert "file descriptors" in svc.stderr_tail()  # and logged
        assert serves_an_epoch(svc, pattern)


def test_connections_per_user_are_capped_and_the_refused_client_is_told(sock_dir: str, pattern: str) -> None:
    with start_service(os.path.join(sock_dir, "svc.sock"), ring_bytes=256 << 10, max_clients=4) as svc:
        with HeldProbe("hold", svc.socket, {"mode": "hello", "count": 4, "status": True}) as held:
            with pytest.raises(ServiceError, match=r"refused this connection.*--max-clients") as refused:
                service_status(svc.socket)
            assert "stopped while serving" not in str(refused.value) and refused.value.url == svc.socket
            result = held.finish()
        assert [f["got"] for f in result["first"]] == ["ready"] * 3
        assert result["status"] == "error" and "the most this service takes per user (4)" in result["message"]
        assert wait_until(lambda: service_status(svc.socket)["open_connections"] == 1, 10)  # this status itself
        assert serves_an_epoch(svc, pattern)
        assert "connections of uid" in svc.stderr_tail()


def _enough_descriptors(connections: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2 * connections + 1024:
        pytest.skip(f"the hard descriptor limit ({hard}) is too low for {connections} connections to the service")
    if soft != resource.RLIM_INFINITY and soft < connections + 256:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, connections + 1024), hard))


@pytest.mark.parametrize("mode", ["raw", "hello"])
def test_800_idle_connections_do_not_stop_the_service(sock_dir: str, pattern: str, mode: str) -> None:
    """*Held*: 800 idle connections, either idle handshakes (they time out later) or established idle
    sessions (they count against the per-user cap of 1024, which admits them)."""
    _enough_descriptors(800)
    with start_service(os.path.join(sock_dir, "svc.sock"), ring_bytes=64 << 10, handshake_timeout=600) as svc:
        with HeldProbe("hold", svc.socket, {"mode": mode, "count": 800}) as held:
            assert wait_until(lambda: svc.status()["open_connections"] == 801, 30)
            if mode == "hello":
                assert svc.status()["sessions"] == 800
            assert serves_an_epoch(svc, pattern)
            held.finish()
        assert wait_until(lambda: svc.status()["open_connections"] == 1, 30)


# -- 5: what a client can make the service hold -------------------------------------------------------------
def test_idle_handshakes_time_out(sock_dir: str) -> None:
    """A connection that sends nothing, or dribbles its first frame, is dropped after the handshake timeout
    (it was kept for ever)."""
    assert HANDSHAKE_TIMEOUT == 10.0  # the default the CLI documents
    with start_service(os.path.join(sock_dir, "svc.sock"), handshake_timeout=1) as svc:
        silent = probe("hold", svc.socket, {"mode": "raw", "count": 3, "wait": 30, "answers": 3})
        for got in silent["answers"]:
            assert got["got"] == "error" and "sent no request for 1 s" in got["message"], got
        partial = probe("hold", svc.socket, {"mode": "partial", "count": 1, "announced": 1000, "sent": 10,
                                             "wait": 30})
        assert partial["answers"][0]["got"] == "error", partial
        assert "took over 1 s to send one frame" in partial["answers"][0]["message"]
        assert wait_until(lambda: svc.status()["open_connections"] == 1, 10)


def test_frames_over_the_request_limit_are_refused_before_their_body(service: ServiceHandle) -> None:
    """20 connections announcing 60 MiB frames took the service to 1.27 GB; a client's frame is now at most
    4 MiB, refused from its header."""
    huge = struct.pack(">I", 60 << 20) + b"x" * 1024
    cases = [case(f"first-{n}", huge) for n in range(5)] + [case(f"after-hello-{n}", huge, hello=True)
                                                             for n in range(5)]
    for got in probe("frames", service.socket, {"cases": cases, "wait": 10})["results"]:
        assert got["got"] == "error" and f"more than {MAX_REQUEST_FRAME}" in got["message"], got
    assert service.status()["request_bytes"] == 0


def test_partial_frames_are_counted_in_the_node_budget_and_given_back(sock_dir: str) -> None:
    announced = 3 << 20
    with start_service(os.path.join(sock_dir, "svc.sock"), handshake_timeout=600) as svc:
        args = {"mode": "partial", "count": 3, "announced": announced, "sent": 1 << 20}
        with HeldProbe("hold", svc.socket, args) as held:
            assert wait_until(lambda: svc.status()["request_bytes"] == 3 * (announced + 4), 30)
            assert svc.status()["held_bytes"] >= 3 * announced
            held.finish()
        assert wait_until(lambda: svc.status()["request_bytes"] == 0, 10)


def test_queued_opens_are_bounded(service: ServiceHandle, store: Any) -> None:
    """40 queued opens took the service to 493 MB; one may wait behind the one being served, no more."""
    result = probe("opens", service.socket, {"count": 40, "items": [item(store.base_url + "shard-000000.tar")]})
    assert result["hello"]["got"] == "ready"
    last = result["answers"][-1]
    assert last["got"] == "error" and "'open'" in last["message"] and "'end'" in last["message"], result
    assert wait_until(lambda: service.status()["sessions"] == 0 and service.status()["request_bytes"] == 0, 10)


def test_clients_that_each_claim_the_whole_node_share_it(sock_dir: str, pattern: str) -> None:
    """A client says how many processes share the node; three that each say "one" each got the whole node
    budget (3 x 224 MiB here). Now a session gets its share of what the others leave, at least 8 MiB."""
    node, ring = 256 << 20, 256 << 10
    with start_service(os.path.join(sock_dir, "svc.sock"), ring_bytes=ring, node_buffered_bytes=node) as svc:
        stalled = [iter(wds.WebDataset(pattern, service=svc.url)) for _ in range(3)]
        for samples in stalled:
            next(samples)  # processes=1: each asks for the whole node
        assert svc.status()["sessions"] == 3
        assert svc.status()["held_bytes"] <= node + 2 * ((8 << 20) + ring)
        for samples in stalled:
            samples.close()  # type: ignore[attr-defined]


def test_backend_settings_are_bounded(service: ServiceHandle, store: Any) -> None:
    """Every distinct read_timeout is a set of connection pools; a client cycling through them used to make
    the service keep each for good. At most 16 are kept; unused ones are closed to make room."""
    url = store.base_url + "shard-000000.tar"
    expected = sample_digest(wds.WebDataset(url))
    for timeout in range(40, 60):  # each read to its end: its open is over, its set unused
        assert sample_digest(wds.WebDataset(url, read_timeout=timeout, service=service.url)) == expected
    kept = service.status()["backends"]
    assert len(kept) == 16 and {"connect_timeout": 30.0, "read_timeout": 59, "chunk_bytes": 1 << 20} in kept


# -- 6: pipe: and local paths -------------------------------------------------------------------------------
@pytest.fixture
def two_dirs(tmp_path: Path, shard_dir: Path) -> tuple[Path, Path]:
    """``client/shard.tar`` (shard 0) and a decoy ``service/shard.tar`` (shard 1) for the service's cwd."""
    client, service = tmp_path / "client", tmp_path / "service"
    client.mkdir()
    service.mkdir()
    shutil.copy(shard_dir / "shard-000000.tar", client / "shard.tar")
    shutil.copy(shard_dir / "shard-000001.tar", service / "shard.tar")
    return client, service


def test_pipe_commands_and_relative_paths_are_the_clients(sock_dir: str, two_dirs: tuple[Path, Path]) -> None:
    """`pipe:cat shard.tar` through the service read the service's shard.tar, silently."""
    client, service_dir = two_dirs
    urls = ["pipe:cat shard.tar", 'pipe:cat "$WDS_TEST_SHARD"', "file:shard.tar", "shard.tar"]
    runs = [{"urls": [url] * 4, "kwargs": {"deterministic": True}, "compare": True} for url in urls]
    with start_service(os.path.join(sock_dir, "svc.sock"), cwd=str(service_dir)) as svc:
        results = probe("read", svc.socket, {"runs": runs}, cwd=str(client), env={"WDS_TEST_SHARD": "shard.tar"})
    for url, got in zip(urls, results["runs"]):
        assert got.get("count") and [got["count"], got["digest"]] == got["local"], (url, got)


def test_the_operators_no_pipe_wins_over_the_clients_allow_pipe(sock_dir: str, shard_dir: Path) -> None:
    url = f"pipe:cat {shard_dir / 'shard-000000.tar'}"
    for options in ({"env": {"WDS_ASYNC_NO_PIPE": "1"}}, {"no_pipe": True}):
        with start_service(os.path.join(sock_dir, "svc.sock"), **options) as svc:  # type: ignore[arg-type]
            runs = [{"urls": [url], "kwargs": {"allow_pipe": True}}, {"urls": [str(shard_dir / "shard-000000.tar")]}]
            got, file_read = probe("read", svc.socket, {"runs": runs})["runs"]
            assert got.get("error_type") == "ServiceError", (options, got)
            assert "does not run pipe: commands" in got["message"] and svc.socket in got["message"]
            assert file_read.get("count"), file_read  # the service itself goes on


def test_a_foreign_clients_relative_paths_and_bare_pipes_are_refused(service: ServiceHandle) -> None:
    cases = [case("relative", encode(open_request([item("shard.tar")])), hello=True),
             case("file-relative", encode(open_request([item("file:shard.tar")])), hello=True),
             case("pipe-without-context", encode(open_request([item("pipe:cat shard.tar")])), hello=True)]
    results = probe("frames", service.socket, {"cases": cases})["results"]
    assert "relative path" in results[0]["message"] and "relative path" in results[1]["message"], results
    assert "client's working directory and environment" in results[2]["message"], results


# -- 10: settings honoured, backlog, refusals ---------------------------------------------------------------
def test_the_clients_read_timeout_is_honoured(service: ServiceHandle, store: Any) -> None:
    """The service read with its own 60 s read_timeout whatever the client asked."""
    url = store.base_url + "shard-000000.tar?stall=30"
    got = probe("read", service.socket, {"urls": [url], "kwargs": {"read_timeout": 1,
                                                                   "retry": {"attempts": 1}}})
    assert got.get("error_type") == "TransientError" and "no data for 1 s" in got["message"], got


def test_the_clients_chunk_bytes_is_honoured(service: ServiceHandle, pattern: str) -> None:
    ds = wds.WebDataset(pattern, deterministic=True, config=EngineConfig(chunk_bytes=12345), service=service.url)
    assert sample_digest(ds) == digest(pattern)
    assert {"connect_timeout": 30.0, "read_timeout": 60.0, "chunk_bytes": 12345} in service.status()["backends"]


def test_a_full_listen_backlog_is_retried_within_the_connect_timeout(service: ServiceHandle, pattern: str) -> None:
    """Connecting used to fail at once with EAGAIN when the backlog was full."""
    filler: list[socket.socket] = []
    os.kill(service.pid, signal.SIGSTOP)  # it accepts nothing: the backlog fills
    try:
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect(service.socket)
            except BlockingIOError:
                sock.close()
                break
            filler.append(sock)
        assert len(filler) > 100
        with HeldProbe("read", service.socket, {"urls": pattern, "kwargs": {"deterministic": True},
                                                "announce": True}) as reader:
            time.sleep(1.0)  # it meets the full backlog and retries (it used to fail at once)
            os.kill(service.pid, signal.SIGCONT)
            result = reader.finish()
    finally:
        os.kill(service.pid, signal.SIGCONT)
        for sock in filler:
            sock.close()
    assert (result.get("count"), result.get("digest")) == digest(pattern), result
