"""The service protocol under random and mutated input: hypothesis writes byte streams into a real service's
socket (garbage, frames of random JSON, valid frames with fields mutated, cut, repeated), each on a fresh
connection, and after every one the service must still be running; after all of them it must answer
``status``, serve a well-formed client the same samples as in-process, and have logged no traceback (every
bad input met a clean refusal).

Nothing random can reach the network or the file system beyond validation: random strings carry no ``:``
and no ``/`` (so no scheme and no absolute path), and the URLs of work items come from a fixed list (the
emulated store on 127.0.0.1, an absolute shard path, a missing file, a relative path, a ``pipe:``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import wds_async as wds
from tests.conftest import sample_digest
from tests.service.clients import frame
from wds_async.service import ServiceHandle, service_status, start_service
from wds_async.service.protocol import VERSION, FrameDecoder

#: Seconds a fuzz connection waits for the service's answer before moving on (most inputs are refused at
#: once; an incomplete frame gets no answer until the handshake timeout, which need not be waited for).
ANSWER_WAIT = 0.05


@pytest.fixture(scope="module")
def fuzz_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceHandle]:
    directory = tempfile.mkdtemp(prefix="wds-fuzz-")
    try:
        with start_service(os.path.join(directory, "svc.sock"), ring_bytes=64 << 10, handshake_timeout=2) as svc:
            yield svc
    finally:
        shutil.rmtree(directory, ignore_errors=True)


_TEXT = st.text(st.characters(blacklist_characters=":/", codec="utf-8"), max_size=12)
_SCALARS = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | _TEXT
_JSON = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
                     max_leaves=10)
_TYPES = st.sampled_from(["hello", "status", "open", "ack", "close", "ready", "batch", "end", "error", "", "x"])


def _urls(store_url: str, shard: str) -> st.SearchStrategy[str]:
    return st.sampled_from([store_url, shard, "/nonexistent/shard.tar", "shard.tar", "pipe:true", "file:x.tar", ""])


@st.composite
def _mutated(draw: st.DrawFn, template: dict[str, Any] | list[Any], keys: list[Any]) -> Any:
    """``template`` with up to two of its fields (or of ``keys``) replaced by random JSON, or removed."""
    value = json.loads(json.dumps(template))
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(keys))
        if isinstance(value, dict) and draw(st.booleans()) and key in value:
            del value[key]
        elif isinstance(value, dict):
            value[key] = draw(_JSON)
        else:
            value[key] = draw(_JSON)
    return value


@st.composite
def _message(draw: st.DrawFn, urls: st.SearchStrategy[str], socket_path: str) -> Any:
    """A valid message of each kind the service reads, mutated, or random JSON altogether."""
    item = [0, 0, draw(urls), draw(st.integers(0, 4096)), draw(st.none() | st.integers(4096, 1 << 20)),
            draw(st.none() | st.booleans()), None]
    templates = {
        "hello": {"type": "hello", "version": VERSION, "pid": 1, "socket": socket_path},
        "status": {"type": "status", "version": VERSION},
        "open": {"type": "open", "items": [draw(_mutated(item, list(range(7))))],
                 "settings": draw(_mutated({"deterministic": True, "processes": 1}, ["part_bytes", "chunk_bytes",
                                           "read_timeout", "retry", "processes", "max_buffered_bytes", "bogus"])),
                 "backend_options": None, "cache": None},
        "ack": {"type": "ack", "bytes": draw(st.integers(-1, 1 << 20))},
        "close": {"type": "close"},
    }
    kind = draw(st.sampled_from([*templates, "random"]))
    if kind == "random":
        return draw(st.fixed_dictionaries({"type": _TYPES | _JSON}, optional={"items": _JSON, "extra": _JSON}) | _JSON)
    keys = ["type", "version", "pid", "socket", "items", "settings", "backend_options", "cache", "context", "bytes"]
    return draw(_mutated(templates[kind], keys))


@st.composite
def _streams(draw: st.DrawFn, store_url: str, shard: str, socket_path: str) -> tuple[bool, bytes]:
    """``(hello_first, bytes)``: a few pieces, each a frame of a random message, a frame of random bytes,
    random bytes, or a frame cut short / announcing more than it holds."""
    pieces = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["message", "message", "message", "body", "raw", "cut", "liar", "nested"]))
        if kind == "message":
            pieces.append(frame(json.dumps(draw(_message(_urls(store_url, shard), socket_path))).encode()))
        elif kind == "nested":  # deeper than any JSON parser recursion limit
            depth = draw(st.integers(1, 100_000))
            pieces.append(frame(b"[" * depth + b"]" * depth))
        elif kind == "body":
            pieces.append(frame(draw(st.binary(max_size=64))))
        elif kind == "raw":
            pieces.append(draw(st.binary(min_size=1, max_size=64)))
        elif kind == "cut":
            whole = frame(json.dumps(draw(_message(_urls(store_url, shard), socket_path))).encode())
            pieces.append(whole[:draw(st.integers(0, len(whole) - 1))])
        else:
            pieces.append(struct.pack(">I", draw(st.integers(0, 2**32 - 1))) + draw(st.binary(max_size=32)))
    return draw(st.booleans()), b"".join(pieces)


def _exchange(path: str, hello_first: bool, data: bytes) -> None:
    """Send ``data`` on a new connection (after a complete hello when asked), read what comes back for a
    moment, close. Descriptors passed to us are closed at once."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    try:
        sock.connect(path)
        if hello_first:
            sock.sendall(frame(json.dumps({"type": "hello", "version": VERSION, "pid": os.getpid(),
                                            "socket": path}).encode()))
            decoder = FrameDecoder("the service", 64 << 20)
            while not decoder.feed(_recv(sock, 10)):
                pass
        try:
            sock.sendall(data)
        except OSError:
            return  # refused and closed before all of it went: fine
        sock.settimeout(ANSWER_WAIT)
        while _recv(sock, ANSWER_WAIT):
            pass
    except (TimeoutError, ConnectionError):
        pass
    finally:
        sock.close()


def _recv(sock: socket.socket, wait: float) -> bytes:
    sock.settimeout(wait)
    try:
        data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 16, 4)
    except (TimeoutError, ConnectionError):
        return b""
    for fd in fds:
        os.close(fd)
    return data


def test_random_and_mutated_frames_never_take_the_service_down(fuzz_service: ServiceHandle, store: Any,
                                                                 shard_dir: Any, pattern: str) -> None:
    shard = str(shard_dir / "shard-000000.tar")
    path = fuzz_service.socket

    @settings(max_examples=80, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(_streams(store.base_url + "shard-000000.tar", shard, path))
    def one(stream: tuple[bool, bytes]) -> None:
        _exchange(path, *stream)
        assert fuzz_service.process.poll() is None, fuzz_service.stderr_tail()

    one()
    assert service_status(path)["pid"] == fuzz_service.pid
    expected = sample_digest(wds.WebDataset(pattern))
    assert sample_digest(wds.WebDataset(pattern, service=fuzz_service.url)) == expected
    log = fuzz_service.stderr_tail(1 << 20)
    assert "Traceback" not in log, log[-6000:]
