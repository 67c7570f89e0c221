"""Hostile and careless clients of the node service, each run in a process of its own by the tests:
``python -m tests.service.probes NAME SOCKET ARGS_JSON``. Each prints JSON lines on stdout (the last one is
its result) and never raises: what the service answered is the result.

* ``frames``: for each case, a new connection, optionally a complete ``hello`` first, then the case's bytes;
  the service's answer (an ``error`` frame, another frame, the connection closed, or nothing).
* ``hold``: ``count`` connections that send nothing (``raw``), a complete ``hello`` (``hello``), or a part of
  a large first frame (``partial``); prints ``ready``, then optionally asks for ``status`` through the real
  client, waits for the answers or for its stdin to close, and reports what each connection got.
* ``truncate``: a client that shrinks its ring (``ftruncate``) and then asks for items.
* ``exhaust``: completes hellos until the service refuses one (or ``limit``), then asks for ``status``.
* ``opens``: a hello, then ``count`` ``open`` frames in one write.
* ``read``: a plain dataset read through the service (in the process's own working directory and
  environment); prints the sample digest or the error.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import sys
import time
from typing import Any

from wds_async.errors import ServiceError
from wds_async.service.protocol import VERSION, FrameDecoder, encode

ANSWER_WAIT = 20.0  # a hang guard: a service that answers does so in milliseconds


def _connect(path: str) -> socket.socket:
    """A connection, retried while the service's backlog is full (a burst of connections outruns accept)."""
    deadline = time.monotonic() + ANSWER_WAIT
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(ANSWER_WAIT)
        try:
            sock.connect(path)
            return sock
        except BlockingIOError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def answer(sock: socket.socket, wait: float = ANSWER_WAIT) -> dict[str, Any]:
    """The first frame the service sends (descriptors passed with it closed), or ``closed`` / ``silent``."""
    decoder = FrameDecoder("the service", 64 << 20)
    deadline = time.monotonic() + wait
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return {"got": "silent"}
        sock.settimeout(left)
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
        except TimeoutError:
            return {"got": "silent"}
        except ConnectionResetError:
            return {"got": "closed"}
        for fd in fds:
            os.close(fd)
        if not data:
            return {"got": "closed"}
        try:
            frames = decoder.feed(data)
        except ServiceError as exc:
            return {"got": "garbage", "message": str(exc)}
        if frames:
            return _describe(frames[0], len(fds))


def _describe(message: dict[str, Any], fds: int = 0) -> dict[str, Any]:
    out: dict[str, Any] = {"got": message.get("type"), "fds": fds}
    if message.get("type") == "error":
        error = message.get("error") or {}
        out["error_type"] = error.get("type")
        out["message"] = error.get("message")
        out["url"] = error.get("url")
    return out


def hello(sock: socket.socket, path: str) -> dict[str, Any]:
    """Send ``hello`` and return the answer (a refused connection may be closed before the hello is written:
    its answer is still there to read)."""
    _send(sock, encode({"type": "hello", "version": VERSION, "pid": os.getpid(), "socket": path}))
    return answer(sock)


def _send(sock: socket.socket, data: bytes) -> str | None:
    try:
        sock.sendall(data)
        return None
    except OSError as exc:
        return type(exc).__name__


def probe_frames(path: str, args: dict[str, Any]) -> dict[str, Any]:
    results = []
    for case in args["cases"]:
        sock = _connect(path)
        try:
            first = hello(sock, path) if case.get("hello") else None
            sent = _send(sock, base64.b64decode(case["data"]))
            got = answer(sock, args.get("wait", ANSWER_WAIT))
            results.append({"name": case["name"], "hello": first, "send_error": sent, **got})
        finally:
            sock.close()
    return {"results": results}


def _status_through_client(path: str) -> dict[str, Any]:
    from wds_async.service import service_status

    try:
        return {"status": "answered", "sessions": service_status(path)["sessions"]}
    except ServiceError as exc:
        return {"status": "error", "message": str(exc)}


def probe_hold(path: str, args: dict[str, Any]) -> dict[str, Any]:
    mode, count = args["mode"], args["count"]
    socks, first = [], []
    for _ in range(count):
        sock = _connect(path)
        socks.append(sock)
        if mode == "hello":
            first.append(hello(sock, path))
        elif mode == "partial":
            announced, sent = args["announced"], args["sent"]
            _send(sock, struct.pack(">I", announced) + b"x" * sent)
    print(json.dumps({"ready": len(socks), "first": first[-3:]}), flush=True)
    result: dict[str, Any] = {"opened": len(socks), "first": first[-3:]}
    if args.get("status"):
        result.update(_status_through_client(path))
    if args.get("wait") is not None:
        result["answers"] = [answer(s, args["wait"]) for s in socks[:args.get("answers", 1)]]
    else:
        sys.stdin.read()  # the test closes our stdin when it is done looking at the service
    for sock in socks:
        sock.close()
    return result


def probe_truncate(path: str, args: dict[str, Any]) -> dict[str, Any]:
    sock = _connect(path)
    sock.sendall(encode({"type": "hello", "version": VERSION, "pid": os.getpid(), "socket": path}))
    data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
    ready = FrameDecoder("the service").feed(data)[0]
    fd = fds[0]
    try:
        os.ftruncate(fd, 0)
        truncated = "done"
    except OSError as exc:
        truncated = f"refused: {exc.strerror}"
    sock.sendall(encode({"type": "open", "items": [args["item"]], "settings": {}, "backend_options": None,
                         "cache": None}))
    got = []
    decoder = FrameDecoder("the service", 64 << 20)
    while True:
        try:
            data, more, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
        except (TimeoutError, ConnectionResetError) as exc:
            got.append(type(exc).__name__)
            break
        for extra in more:
            os.close(extra)
        if not data:
            got.append("closed")
            break
        frames = decoder.feed(data)
        for frame in frames:
            got.append(frame["type"])
            if frame.get("span"):
                sock.sendall(encode({"type": "ack", "bytes": frame["span"]}))
        if any(f["type"] in ("end", "error") for f in frames):
            break
    os.close(fd)
    sock.close()
    return {"ring_bytes": ready.get("ring_bytes"), "truncate": truncated, "answers": got}


def probe_exhaust(path: str, args: dict[str, Any]) -> dict[str, Any]:
    """Hellos until one is refused; then connections that send nothing (each holds one descriptor of the
    service until its handshake timeout) until one is refused at once: the service has none left."""
    socks, answers, idle = [], [], 0
    for _ in range(args["limit"]):
        sock = _connect(path)
        socks.append(sock)
        got = hello(sock, path)
        answers.append(got)
        if got["got"] != "ready":
            # A hello its session refused (no descriptor left for the ring) is closed as that session ends, a moment
            # later on a busy machine: wait for it, so the connections below meet a service with no descriptor left,
            # not one that frees a descriptor after them (the status below was then answered; CI, 2026-11-28).
            answer(sock)
            break
    for _ in range(args["limit"]):
        sock = _connect(path)
        socks.append(sock)
        got = answer(sock, 0.5)
        if got["got"] != "silent":
            break
        idle += 1
    result: dict[str, Any] = {"answers": answers, "idle": idle, "last": got, **_status_through_client(path)}
    print(json.dumps({"ready": len(socks)}), flush=True)
    sys.stdin.read()
    for sock in socks:
        sock.close()
    return result


def probe_opens(path: str, args: dict[str, Any]) -> dict[str, Any]:
    sock = _connect(path)
    first = hello(sock, path)
    message = {"type": "open", "items": args.get("items", []), "settings": {}, "backend_options": None,
               "cache": None}
    sent = _send(sock, encode(message) * args["count"])
    got: list[dict[str, Any]] = []
    decoder = FrameDecoder("the service", 64 << 20)
    while len(got) < args["count"] + 1:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
        except (TimeoutError, ConnectionResetError) as exc:
            got.append({"got": type(exc).__name__})
            break
        for fd in fds:
            os.close(fd)
        if not data:
            got.append({"got": "closed"})
            break
        for frame in decoder.feed(data):
            got.append(_describe(frame))
            if frame.get("span"):
                sock.sendall(encode({"type": "ack", "bytes": frame["span"]}))
        if got and got[-1]["got"] == "error":
            break
    sock.close()
    return {"hello": first, "send_error": sent, "answers": got}


def probe_read(path: str, args: dict[str, Any]) -> dict[str, Any]:
    """One dataset read (``urls``, ``kwargs``, ``compare``, ``announce``), or several: ``runs``, a list of
    those, answered with ``{"runs": [result, ...]}`` (one process start for all)."""
    if "runs" in args:
        return {"runs": [probe_read(path, run) for run in args["runs"]]}
    import wds_async as wds
    from tests.conftest import sample_digest

    kwargs = dict(args.get("kwargs", {}))
    if "retry" in kwargs:
        kwargs["retry"] = wds.RetryPolicy(**kwargs["retry"])
    out: dict[str, Any] = {}
    if args.get("compare"):  # the same dataset in-process, in this process's directory and environment
        out["local"] = list(sample_digest(wds.WebDataset(args["urls"], **kwargs)))
    try:
        ds = wds.WebDataset(args["urls"], service="unix://" + path, **kwargs)
        if args.get("announce"):  # the test waits for this line before it lets the service accept again
            print(json.dumps({"ready": "connecting"}), flush=True)
        count, digest = sample_digest(ds)
        return {**out, "count": count, "digest": digest}
    except Exception as exc:  # the result is what the dataset raised
        return {**out, "error_type": type(exc).__name__, "message": str(exc)}


PROBES = {"frames": probe_frames, "hold": probe_hold, "truncate": probe_truncate, "exhaust": probe_exhaust,
          "opens": probe_opens, "read": probe_read}


def main() -> None:
    """``NAME SOCKET ARGS``: ARGS is JSON, or ``@FILE`` holding it."""
    name, path, raw = sys.argv[1], sys.argv[2], sys.argv[3]
    if raw.startswith("@"):
        with open(raw[1:]) as fh:
            raw = fh.read()
    print(json.dumps({"result": PROBES[name](path, json.loads(raw))}), flush=True)


if __name__ == "__main__":
    main()
