"""The node service against hostile and careless clients: every probe of the hardening review, each run in a
process of its own (:mod:`tests.service.probes`) against a real ``wds-async serve`` subprocess.

Each test names what it guards; those marked *held* passed before the hardening and must keep passing."""

from __future__ import annotations

import base64
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from tests.conftest import sample_digest, wait_until
from tests.service.probe_runner import REPO, HeldProbe, probe
from wds_async.config import EngineConfig
from wds_async.errors import ServiceError
from wds_async.service import ServiceHandle, service_status, start_service
from wds_async.service.limits import HANDSHAKE_TIMEOUT
from wds_async.service.protocol import MAX_REQUEST_FRAME, VERSION, encode

CHILD = str(Path(__file__).with_name("client_child.py"))


def _frame(body: bytes | dict[str, Any]) -> bytes:
    if isinstance(body, dict):
        return encode(body)
    return struct.pack(">I", len(body)) + body


def _case(name: str, data: bytes, hello: bool = False) -> dict[str, Any]:
    return {"name": name, "data": base64.b64encode(data).decode(), "hello": hello}


def _item(url: str, start: Any = 0, end: Any = None, ident: Any = 0, identity: Any = None) -> list[Any]:
    return [ident, 0, url, start, end, None, identity]


def _open(items: list[Any], **fields: Any) -> dict[str, Any]:
    return {"type": "open", "items": items, "settings": {}, "backend_options": None, "cache": None, **fields}


def _digest(pattern: str) -> tuple[int, str]:
    return sample_digest(wds.WebDataset(pattern, deterministic=True))


def _serves_an_epoch(svc: ServiceHandle, pattern: str) -> bool:
    return sample_digest(wds.WebDataset(pattern, deterministic=True, service=svc.url)) == _digest(pattern)


# -- 2: the shared-memory ring ------------------------------------------------------------------------------
def test_a_client_that_shrinks_its_ring_cannot_kill_the_service(service: ServiceHandle, store: Any,
                                                                 pattern: str) -> None:
    """It used to: the service's next write into the mapping of a truncated memfd died of SIGBUS."""
    result = probe("truncate", service.socket, {"item": _item(store.base_url + "shard-000000.tar")})
    assert result["truncate"] == "refused: Operation not permitted", result  # the seals: its size is fixed
    assert result["answers"][-1] == "end", result  # and the items were served
    assert service.process.poll() is None
    assert _serves_an_epoch(service, pattern)


# -- 3: sizes and other settings ----------------------------------------------------------------------------
def test_absurd_settings_are_refused_by_name_and_reach_no_engine(sock_dir: str, store: Any, pattern: str) -> None:
    """part_bytes=1 drove the service to 16 GB; every client setting is checked as EngineConfig checks it."""
    url = store.base_url + "shard-000000.tar"
    bad = {"part_bytes": 1, "chunk_bytes": 0, "max_sample_bytes": -5, "handoff_max_bytes": "16MiB",
           "read_timeout": float("nan"), "deterministic": "yes", "processes": 0, "bogus": 1}
    cases = [_case(name, encode(_open([_item(url)], settings={name: value})), hello=True)
             for name, value in bad.items()]
    with start_service(os.path.join(sock_dir, "svc.sock"), ring_bytes=256 << 10) as svc:
        results = probe("frames", svc.socket, {"cases": cases})["results"]
        for name, got in zip(bad, results):
            assert got["got"] == "error" and got["error_type"] == "ServiceError", (name, got)
            assert name in got["message"] and svc.socket in got["message"], (name, got)
            assert got["url"] == svc.socket
        stats = svc.status()["stats"]
        assert stats["requests"] == 0 and stats["bytes_read"] == 0  # nothing of a refused open was run
        assert svc.process.poll() is None and _serves_an_epoch(svc, pattern)


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
        assert _serves_an_epoch(svc, pattern)


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
        assert _serves_an_epoch(svc, pattern)
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
            assert _serves_an_epoch(svc, pattern)
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
    cases = [_case(f"first-{n}", huge) for n in range(5)] + [_case(f"after-hello-{n}", huge, hello=True)
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
    result = probe("opens", service.socket, {"count": 40, "items": [_item(store.base_url + "shard-000000.tar")]})
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
    cases = [_case("relative", encode(_open([_item("shard.tar")])), hello=True),
             _case("file-relative", encode(_open([_item("file:shard.tar")])), hello=True),
             _case("pipe-without-context", encode(_open([_item("pipe:cat shard.tar")])), hello=True)]
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
    assert sample_digest(ds) == _digest(pattern)
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
    assert (result.get("count"), result.get("digest")) == _digest(pattern), result


# -- held: malformed frames, killed clients -----------------------------------------------------------------
def _malformed(socket_path: str, url: str) -> list[dict[str, Any]]:
    hello = {"type": "hello", "version": VERSION, "pid": 1, "socket": socket_path}
    first = [
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), ("huge-length", b"\xff\xff\xff\xff"),
        ("over-request-limit", struct.pack(">I", MAX_REQUEST_FRAME + 1) + b"{}"),
        ("not-json", _frame(b"{not json")), ("bad-utf8", _frame(b"\xff\xfe{}")), ("array", _frame(b"[]")),
        ("string", _frame(b'"hello"')), ("no-type", _frame({"version": 1})), ("type-not-string", _frame({"type": 5})),
        ("nested", _frame(b"[" * 100_000 + b"]" * 100_000)), ("empty", _frame(b"")), ("nan", _frame(b"NaN")),
        ("huge-int", _frame(b'{"type":"hello","version":' + b"9" * 5000 + b"}")),
        ("open-first", _frame(_open([]))), ("hello-no-version", _frame({**hello, "version": None})),
        ("hello-version-99", _frame({**hello, "version": 99})),
        ("hello-other-socket", _frame({**hello, "socket": "/elsewhere.sock"})),
        ("hello-pid-string", _frame({**hello, "pid": "abc"})), ("hello-pid-negative", _frame({**hello, "pid": -5})),
        ("hello-pid-infinite", _frame(json.dumps({**hello, "pid": float("inf")}).encode())),
    ]
    after: list[tuple[str, dict[str, Any]]] = [
        ("unknown-type", {"type": "bogus"}), ("second-hello", hello), ("client-ready", {"type": "ready"}),
        ("ack-too-much", {"type": "ack", "bytes": 1 << 40}), ("ack-negative", {"type": "ack", "bytes": -1}),
        ("ack-string", {"type": "ack", "bytes": "12"}), ("ack-float", {"type": "ack", "bytes": 1.5}),
        ("items-not-list", {**_open([]), "items": "abc"}), ("item-short", _open([[1, 2]])),
        ("item-negative-start", _open([_item(url, start=-1)])), ("item-reversed", _open([_item(url, 10, 5)])),
        ("item-id-string", _open([_item(url, ident="0")])), ("item-url-int", _open([[0, 0, 7, 0, None, None, None]])),
        ("item-identity", _open([_item(url, identity={"size": "big"})])),
        ("settings-not-object", _open([_item(url)], settings=[])),
        ("setting-unknown", _open([_item(url)], settings={"bogus": 1})),
        ("setting-string", _open([_item(url)], settings={"part_bytes": "1"})),
        ("retry-bad", _open([_item(url)], settings={"retry": {"attempts": 0}})),
        ("backend-options-not-object", _open([_item(url)], backend_options="x")),
        ("backend-option-unknown", _open([_item(url)], backend_options={"http": {"bogus": 1}})),
        ("pipe-option-cwd", _open([_item("pipe:true")], backend_options={"pipe": {"cwd": "/"}},
                                  context={"cwd": "/", "env": {}})),
        ("cache-relative", _open([_item(url)], cache={"dir": "rel"})),
        ("context-relative", _open([_item("pipe:true")], context={"cwd": "rel", "env": {}})),
    ]
    return [_case(name, data) for name, data in first] + [_case(name, _frame(body), hello=True) for name, body in after]


def test_malformed_frames_are_answered_with_clear_errors(service: ServiceHandle, store: Any, pattern: str) -> None:
    """*Held* (36 kinds then; more now): each answered with a ServiceError naming the socket, on its own
    connection, and the service goes on."""
    cases = _malformed(service.socket, store.base_url + "shard-000000.tar")
    results = probe("frames", service.socket, {"cases": cases})["results"]
    assert len(results) == len(cases) >= 36
    for got in results:
        assert got["got"] == "error" and got["error_type"] == "ServiceError", got
        assert got["url"] == service.socket and got["message"], got
        assert got["hello"] is None or got["hello"]["got"] == "ready", got
    assert service.process.poll() is None and _serves_an_epoch(service, pattern)
    assert "Traceback" not in service.stderr_tail(200_000)  # every one was a clean refusal


def _descendants_by_session(pid: int) -> set[int]:
    """Process ids whose session is that of one of ``pid``'s children (pipe: commands run in their own)."""
    children: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            children.update(int(c) for c in fh.read().split())
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) in children:  # the session id
                found.add(int(entry))
    return found | children


def test_killed_clients_leave_no_descriptor_or_process(sock_dir: str, shard_dir: Path) -> None:
    """*Held*: clients killed with SIGKILL mid-epoch, their pipe: commands still running: the service ends
    their sessions, stops the commands and closes every descriptor they took."""
    shard = shard_dir / "shard-000000.tar"
    with start_service(os.path.join(sock_dir, "svc.sock"), ring_bytes=64 << 10) as svc:
        assert sample_digest(wds.WebDataset(f"pipe:cat {shard}", service=svc.url))[0] > 0
        assert wait_until(lambda: svc.status()["sessions"] == 0, 10)
        baseline = len(os.listdir(f"/proc/{svc.pid}/fd"))
        url = f"pipe:cat {shard} && sleep 120"  # the stream stays open after its samples
        children = [subprocess.Popen([sys.executable, CHILD, svc.socket, url], stdout=subprocess.PIPE,
                                     env={**os.environ, "PYTHONPATH": REPO}) for _ in range(3)]
        try:
            for child in children:
                assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
            assert wait_until(lambda: svc.status()["sessions"] == 3, 10)
            assert len(_descendants_by_session(svc.pid)) >= 3  # the commands run
        finally:
            for child in children:
                child.send_signal(signal.SIGKILL)
                child.wait(10)
                if child.stdout is not None:
                    child.stdout.close()
        assert wait_until(lambda: svc.status()["sessions"] == 0, 10)
        assert wait_until(lambda: not _descendants_by_session(svc.pid), 10)
        assert wait_until(lambda: len(os.listdir(f"/proc/{svc.pid}/fd")) <= baseline, 10), (
            os.listdir(f"/proc/{svc.pid}/fd"), baseline)
