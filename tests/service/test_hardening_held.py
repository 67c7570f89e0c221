"""The node service against hostile and careless clients, the probes that passed before the hardening and must
keep passing (*held*): malformed frames are answered with clear errors, and killed clients leave no descriptor or
process behind. Each runs against a real ``wds-async serve`` subprocess; the rest of the review's probes are in
``test_hardening.py``."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import wds_async as wds
from tests.conftest import sample_digest, wait_until
from tests.service.clients import case, frame, item, open_request, serves_an_epoch
from tests.service.probe_runner import REPO, probe
from wds_async.service import ServiceHandle, start_service
from wds_async.service.protocol import MAX_REQUEST_FRAME, VERSION

CHILD = str(Path(__file__).with_name("client_child.py"))


# -- malformed frames, killed clients -----------------------------------------------------------------
def _malformed(socket_path: str, url: str) -> list[dict[str, Any]]:
    hello = {"type": "hello", "version": VERSION, "pid": 1, "socket": socket_path}
    first = [
        ("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"), ("huge-length", b"\xff\xff\xff\xff"),
        ("over-request-limit", struct.pack(">I", MAX_REQUEST_FRAME + 1) + b"{}"),
        ("not-json", frame(b"{not json")), ("bad-utf8", frame(b"\xff\xfe{}")), ("array", frame(b"[]")),
        ("string", frame(b'"hello"')), ("no-type", frame({"version": 1})), ("type-not-string", frame({"type": 5})),
        ("nested", frame(b"[" * 100_000 + b"]" * 100_000)), ("empty", frame(b"")), ("nan", frame(b"NaN")),
        ("huge-int", frame(b'{"type":"hello","version":' + b"9" * 5000 + b"}")),
        ("open-first", frame(open_request([]))), ("hello-no-version", frame({**hello, "version": None})),
        ("hello-version-99", frame({**hello, "version": 99})),
        ("hello-other-socket", frame({**hello, "socket": "/elsewhere.sock"})),
        ("hello-pid-string", frame({**hello, "pid": "abc"})), ("hello-pid-negative", frame({**hello, "pid": -5})),
        ("hello-pid-infinite", frame(json.dumps({**hello, "pid": float("inf")}).encode())),
    ]
    after: list[tuple[str, dict[str, Any]]] = [
        ("unknown-type", {"type": "bogus"}), ("second-hello", hello), ("client-ready", {"type": "ready"}),
        ("ack-too-much", {"type": "ack", "bytes": 1 << 40}), ("ack-negative", {"type": "ack", "bytes": -1}),
        ("ack-string", {"type": "ack", "bytes": "12"}), ("ack-float", {"type": "ack", "bytes": 1.5}),
        ("items-not-list", {**open_request([]), "items": "abc"}), ("item-short", open_request([[1, 2]])),
        ("item-negative-start", open_request([item(url, start=-1)])), ("item-reversed", open_request([item(url, 10, 5)])),
        ("item-id-string", open_request([item(url, ident="0")])), ("item-url-int", open_request([[0, 0, 7, 0, None, None, None]])),
        ("item-identity", open_request([item(url, identity={"size": "big"})])),
        ("settings-not-object", open_request([item(url)], settings=[])),
        ("setting-unknown", open_request([item(url)], settings={"bogus": 1})),
        ("setting-string", open_request([item(url)], settings={"part_bytes": "1"})),
        ("retry-bad", open_request([item(url)], settings={"retry": {"attempts": 0}})),
        ("backend-options-not-object", open_request([item(url)], backend_options="x")),
        ("backend-option-unknown", open_request([item(url)], backend_options={"http": {"bogus": 1}})),
        ("pipe-option-cwd", open_request([item("pipe:true")], backend_options={"pipe": {"cwd": "/"}},
                                  context={"cwd": "/", "env": {}})),
        ("cache-relative", open_request([item(url)], cache={"dir": "rel"})),
        ("context-relative", open_request([item("pipe:true")], context={"cwd": "rel", "env": {}})),
    ]
    return [case(name, data) for name, data in first] + [case(name, frame(body), hello=True) for name, body in after]


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
    assert service.process.poll() is None and serves_an_epoch(service, pattern)
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
