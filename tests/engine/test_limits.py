"""Memory safety and clean errors: ``max_sample_bytes`` refuses a member from its tar header before its bytes
are buffered, what reaches the user is one exception of our tree (never an ``ExceptionGroup``), a
``MemoryError`` stays one and names the shard, and shards without samples raise :class:`EmptyShards`.

The memory tests run a fresh interpreter under ``RLIMIT_AS`` against a loopback HTTP server (in this
process) whose tar announces a huge member and then streams zeros."""

from __future__ import annotations

import builtins
import io
import json
import subprocess
import sys
import tarfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import wds_async as wds
from tests.conftest import write_tar
from wds_async.engine.failures import translate
from wds_async.engine.tarstream import TarParser

MiB, GiB = 1 << 20, 1 << 30
ROOT = Path(__file__).resolve().parents[2]


def _header(name: str, size: int, fmt: int = tarfile.GNU_FORMAT) -> bytes:
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(format=fmt)


# -- a loopback server: a header announcing `size` bytes, then `zeros` bytes of zeros --------------------------

#: path -> (announced member size, bytes of zeros actually sent after the header)
ROUTES = {"/huge.tar": (8 * GiB, 4 * GiB), "/mid.tar": (640 * MiB, 640 * MiB + 1536)}


class _ZerosHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # (the stdlib's name)
        route = ROUTES.get(self.path)
        if route is None:
            self.send_error(404)
            return
        size, zeros = route
        head = _header("big/000.bin", size)
        self.send_response(200)  # no Range support announced: one stream, no ranged parts
        self.send_header("Content-Length", str(len(head) + zeros))
        self.end_headers()
        block = bytes(MiB)
        try:
            self.wfile.write(head)
            for start in range(0, zeros, MiB):
                self.wfile.write(block[: min(MiB, zeros - start)])
        except (BrokenPipeError, ConnectionResetError):  # the client stopped reading: what we want
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def zeros_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ZerosHandler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# The child caps its address space at what it uses after import plus ``headroom`` and reports what it raised.
CHILD = r"""
import json, resource, sys, time
import wds_async as wds
[getattr(wds, name) for name in wds.__all__]  # load every export (torch too) before the cap is measured
url, headroom, kwargs = json.loads(sys.argv[1])
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
vm, rss = (int(status[k].split()[0]) * 1024 for k in ("VmSize", "VmRSS"))
resource.setrlimit(resource.RLIMIT_AS, (vm + headroom, vm + headroom))
from benchmarks.peakmem import PeakMemory  # anonymous memory: ru_maxrss also counts file-backed pages (torch's
mem = PeakMemory()                         # libraries), evicted and faulted back in as the machine's load goes
started = time.perf_counter()
out = {"raised": None}
try:
    for _ in wds.WebDataset(url, nodesplitter=None, workersplitter=None, **kwargs):
        pass
except BaseException as e:
    out = {"raised": type(e).__name__, "message": str(e), "group": "ExceptionGroup" in type(e).__name__,
           "url": getattr(e, "url", None), "offset": getattr(e, "offset", None), "key": getattr(e, "key", None),
           "cause": type(e.__cause__).__name__ if e.__cause__ is not None else None}
out["seconds"] = time.perf_counter() - started
out["rss_growth"] = mem.stop()
print(json.dumps(out))
"""


def _child(url: str, headroom: int, **kwargs: object) -> dict:  # type: ignore[type-arg]
    out = subprocess.run([sys.executable, "-c", CHILD, json.dumps([url, headroom, kwargs])], capture_output=True,
                         text=True, timeout=110, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_a_header_announcing_8_gib_fails_before_memory_grows(zeros_server: str) -> None:
    # 1 GiB of address space above what the interpreter holds after import: buffering the announced member
    # (or the 4 GiB of zeros actually sent) would die of MemoryError long before the stream ends.
    url = zeros_server + "/huge.tar"
    r = _child(url, GiB)
    assert r["raised"] == "SampleTooLarge", r
    assert (r["url"], r["offset"], r["key"]) == (url, 0, "big/000"), r
    assert "8589934592" in r["message"] and "max_sample_bytes" in r["message"] and url in r["message"], r
    assert r["rss_growth"] < 256 * MiB, r


def test_a_memory_error_is_a_memory_error_naming_the_url(zeros_server: str) -> None:
    # A 640 MiB member is allowed (max_sample_bytes raised), its bytes fit in the 1 GiB of headroom, but
    # joining them into one bytes object needs 640 MiB more: the engine runs out of memory in our own code.
    url = zeros_server + "/mid.tar"
    r = _child(url, GiB, max_sample_bytes=16 * GiB)
    assert r["raised"] == "MemoryError" and not r["group"], r
    assert url in r["message"] and "max_sample_bytes" in r["message"], r
    assert r["cause"] == "MemoryError", r


# -- the limit, in process -------------------------------------------------------------------------------------

def _collect() -> tuple[list[BaseException], Callable[[BaseException], bool]]:
    seen: list[BaseException] = []

    def handler(exc: BaseException) -> bool:
        seen.append(exc)
        return True

    return seen, handler


def test_a_member_over_the_limit_fails_its_shard_and_the_handler_decides(tmp_path: Path) -> None:
    big = write_tar(tmp_path / "big.tar", [("a.txt", b"x"), ("b.bin", bytes(3 * MiB)), ("c.txt", b"y")])
    good = write_tar(tmp_path / "good.tar", [("d.txt", b"d"), ("e.txt", b"e")])
    with pytest.raises(wds.SampleTooLarge) as info:
        list(wds.WebDataset([str(big)], max_sample_bytes=MiB, nodesplitter=None, workersplitter=None))
    err = info.value
    assert (err.url, err.key, err.member, err.size, err.limit) == (str(big), "b", "b.bin", 3 * MiB, MiB)
    assert err.offset == 1024 and f"offset={err.offset}" in str(err) and "key=b" in str(err)

    seen, handler = _collect()
    ds = wds.WebDataset([str(big), str(good)], handler=handler, max_sample_bytes=MiB, deterministic=True,
                        nodesplitter=None, workersplitter=None)
    # The shard ends at the refused member, like any shard error: nothing of it after the error's chunk.
    assert [s["__key__"] for s in ds] == ["d", "e"]
    assert [type(e) for e in seen] == [wds.SampleTooLarge] and ds.stats()["shards_skipped"] == 1


def test_a_sample_whose_fields_sum_past_the_limit_fails_its_shard(tmp_path: Path) -> None:
    part = bytes(600 << 10)
    shard = write_tar(tmp_path / "sum.tar", [("s0.x", b"0"), ("s1.x", part), ("s1.y", part), ("s2.x", b"2")])
    seen, handler = _collect()
    ds = wds.WebDataset([str(shard)], handler=handler, max_sample_bytes=MiB,
                        nodesplitter=None, workersplitter=None)
    assert [s["__key__"] for s in ds] == ["s0"]
    (err,) = seen
    assert isinstance(err, wds.SampleTooLarge)
    assert (err.url, err.key, err.member, err.size, err.offset) == (str(shard), "s1", "s1.y", 2 * len(part), 1024)
    # Each member alone is under the limit: the same shard passes with a limit above the sample's sum.
    keys = [s["__key__"] for s in wds.WebDataset([str(shard)], max_sample_bytes=2 * MiB, nodesplitter=None,
                                                    workersplitter=None)]
    assert keys == ["s0", "s1", "s2"]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
@pytest.mark.parametrize("split", [False, True])
def test_the_parser_refuses_from_the_header_alone(fmt: int, split: bool) -> None:
    size = 9 * GiB if fmt != tarfile.USTAR_FORMAT else 8 * GiB - 1  # ustar's size field stops below 8 GiB
    head = _header("k/x.bin", size, fmt)
    parser = TarParser(url="u://s.tar", max_member_bytes=GiB)
    with pytest.raises(wds.SampleTooLarge) as info:
        if split:  # the header arrives in pieces: the general path, not the one-chunk fast path
            for i in range(0, len(head), 100):
                parser.feed(head[i : i + 100])
        else:
            parser.feed(head)
    assert (info.value.size, info.value.member, info.value.offset, info.value.url) == (size, "k/x.bin", 0, "u://s.tar")
    assert parser.pending_bytes < 512
    with pytest.raises(wds.SampleTooLarge):  # a parser that raised stays failed
        parser.feed(bytes(512))
    # Without a limit the same header is accepted and the parser waits for the data.
    assert TarParser().feed(head) == []


def test_config_validates_and_webdataset_passes_max_sample_bytes(tmp_path: Path) -> None:
    assert wds.EngineConfig().max_sample_bytes == GiB
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_sample_bytes"):
            wds.EngineConfig(max_sample_bytes=bad)  # type: ignore[arg-type]
    shard = write_tar(tmp_path / "a.tar", [("a.txt", b"a")])
    assert wds.WebDataset([str(shard)], max_sample_bytes=5 * MiB).config.max_sample_bytes == 5 * MiB


# -- one exception of our tree, never a group ------------------------------------------------------------------

def test_a_foreign_exception_becomes_an_engine_error_naming_the_shard(tmp_path: Path) -> None:
    shard = write_tar(tmp_path / "a.tar", [("a.txt", b"a")])

    def rename(name: str) -> str:
        raise KeyError(name)

    with pytest.raises(wds.EngineError) as info:
        list(wds.WebDataset([str(shard)], rename_files=rename, nodesplitter=None, workersplitter=None))
    assert isinstance(info.value.__cause__, KeyError) and info.value.url == str(shard)
    assert str(shard) in str(info.value) and "KeyError" in str(info.value)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="exception groups are new in Python 3.11")
def test_groups_are_unwrapped_to_the_most_meaningful_leaf() -> None:
    ExceptionGroup = builtins.ExceptionGroup  # (a bare name would not resolve on 3.10)
    ours = wds.TransientError("reset", url="u://a.tar", offset=7)
    group = ExceptionGroup("outer", [ExceptionGroup("inner", [ValueError("bug")]), ours])
    got = translate(group, url="u://a.tar")
    assert got is ours and any("ValueError: bug" in note for note in got.__notes__)

    memory = translate(ExceptionGroup("g", [MemoryError()]), url="u://b.tar", offset=3)
    assert type(memory) is MemoryError and "u://b.tar" in str(memory) and "offset 3" in str(memory)
    assert isinstance(memory.__cause__, MemoryError)

    foreign = translate(ExceptionGroup("g", [ZeroDivisionError("x")]), url="u://c.tar")
    assert isinstance(foreign, wds.EngineError) and isinstance(foreign.__cause__, ZeroDivisionError)
    assert isinstance(translate(ConnectionResetError("rst"), url="u://d.tar"), wds.BackendError)
    assert isinstance(translate(KeyboardInterrupt()), KeyboardInterrupt)


# -- shards without samples -----------------------------------------------------------------------------------

def _empty_tar(path: Path) -> Path:
    buf = io.BytesIO()
    tarfile.open(fileobj=buf, mode="w").close()
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("make", [lambda p: (p.write_bytes(bytes(10240)), p)[1], _empty_tar],
                         ids=["10240-zero-bytes", "tarfile-empty"])
def test_a_shard_of_only_zero_blocks(tmp_path: Path, make) -> None:  # type: ignore[no-untyped-def]
    empty = make(tmp_path / "empty.tar")
    assert set(empty.read_bytes()) == {0}
    with pytest.raises(wds.EmptyShards) as info:
        list(wds.WebDataset([str(empty)], nodesplitter=None, workersplitter=None))
    assert isinstance(info.value, ValueError) and (info.value.url, info.value.shards) == (str(empty), 1)
    # A valid (empty) archive, as for webdataset 1.0.2: no error without the check, none beside a full shard.
    assert list(wds.WebDataset([str(empty)], empty_check=False, nodesplitter=None, workersplitter=None)) == []
    good = write_tar(tmp_path / "good.tar", [("a.txt", b"a")])
    ds = wds.WebDataset([str(empty), str(good)], nodesplitter=None, workersplitter=None)
    assert [s["__key__"] for s in ds] == ["a"]
