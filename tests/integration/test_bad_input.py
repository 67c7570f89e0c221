"""Every bad input gives a clear error naming the URL, within seconds, never a hang or a silent skip."""

from __future__ import annotations

import gzip
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import wds_async as wds
from emustore import StoreProcess
from tests.conftest import write_tar

FAST_RETRY = wds.RetryPolicy(attempts=2, base_delay=0.0, max_delay=0.01, deadline=5)


def _drain(urls: object, **kw: object) -> list[dict]:  # type: ignore[type-arg]
    kw.setdefault("retry", FAST_RETRY)
    return list(wds.WebDataset(urls, **kw))  # type: ignore[arg-type]


def _expect(exc_type: type[BaseException], urls: object, fragment: str, name_in_error: str | None = None,
            **kw: object) -> BaseException:
    started = time.monotonic()
    with pytest.raises(exc_type) as info:
        _drain(urls, **kw)
    assert time.monotonic() - started < 20, "errors must arrive within seconds"
    text = str(info.value)
    assert fragment in text, text
    assert (name_in_error or str(urls)) in text, text
    return info.value


@pytest.fixture()
def good_tar(tmp_path: Path) -> Path:
    return write_tar(tmp_path / "good.tar", [(f"s{i}.txt", b"x" * 700) for i in range(6)])


def test_missing_file(tmp_path: Path) -> None:
    err = _expect(wds.NotFound, str(tmp_path / "missing.tar"), "no such file")
    assert isinstance(err, FileNotFoundError)


def test_brace_pattern_with_missing_members(tmp_path: Path, good_tar: Path) -> None:
    _expect(wds.NotFound, str(tmp_path / "good{,-2}.tar"), "no such file", str(tmp_path / "good-2.tar"),
            deterministic=True)


@pytest.mark.parametrize(("status", "exc"), [(404, wds.NotFound), (403, wds.PermissionDenied),
                                             (500, wds.TransientError)])
def test_http_status(store: StoreProcess, status: int, exc: type[BaseException]) -> None:
    url = store.url("shard-000000.tar", status=status)
    _expect(exc, [url], f"HTTP {status}", url)


def test_http_404_for_missing_object(store: StoreProcess) -> None:
    url = store.url("no-such-shard.tar")
    _expect(wds.NotFound, [url], "HTTP 404", url)


def test_html_page_with_status_200(store: StoreProcess) -> None:
    url = store.url("shard-000000.tar", html=1)
    _expect(wds.ShardFormatError, [url], "not a tar", url)


def test_zero_byte_shard(tmp_path: Path, store: StoreProcess) -> None:
    empty = tmp_path / "empty.tar"
    empty.write_bytes(b"")
    _expect(wds.TruncatedShard, str(empty), "empty")


@pytest.mark.parametrize("cut", ["boundary", "mid-member", "mid-header"])
def test_truncated_tar(tmp_path: Path, good_tar: Path, cut: str) -> None:
    data = good_tar.read_bytes()
    at = {"boundary": 512 + 1024, "mid-member": 512 + 300, "mid-header": 512 + 1024 + 100}[cut]
    path = tmp_path / f"cut-{cut}.tar"
    path.write_bytes(data[:at])
    err = _expect(wds.TruncatedShard, str(path), "")
    assert err.offset is not None  # type: ignore[attr-defined]


def test_truncated_shard_keeps_samples_before_the_error(tmp_path: Path, good_tar: Path) -> None:
    path = tmp_path / "cut.tar"
    path.write_bytes(good_tar.read_bytes()[: 3 * 1536 + 100])
    got: list[str] = []
    with pytest.raises(wds.TruncatedShard):
        for s in wds.WebDataset(str(path)):
            got.append(s["__key__"])
    assert got == ["s0", "s1"]  # s2 is complete but could be followed by more s2 members: not delivered


def test_corrupt_header_checksum(tmp_path: Path, good_tar: Path) -> None:
    data = bytearray(good_tar.read_bytes())
    data[1536 + 10] ^= 0xFF  # inside the third header's name field
    path = tmp_path / "corrupt.tar"
    path.write_bytes(bytes(data))
    _expect(wds.ShardFormatError, str(path), "checksum")


def test_truncated_and_corrupt_gzip(tmp_path: Path, good_tar: Path) -> None:
    gz = gzip.compress(good_tar.read_bytes())
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(gz[: len(gz) // 2])
    _expect(wds.TruncatedShard, str(cut), "")
    bad = tmp_path / "bad.tgz"
    bad.write_bytes(gz[:20] + bytes(b ^ 0x55 for b in gz[20:60]) + gz[60:])
    _expect(wds.ShardFormatError, str(bad), "")


def test_pipe_command_not_found() -> None:
    url = "pipe:definitely-not-a-command-xyz shard.tar"
    err = _expect(wds.NotFound, url, "command not found", url)
    assert "definitely-not-a-command-xyz" in str(err)


def test_pipe_exit_1_includes_stderr() -> None:
    url = "pipe:echo 'disk on fire' >&2; exit 1"
    err = _expect(wds.PipeError, url, "exited with status 1", url)
    assert "disk on fire" in str(err) and err.returncode == 1  # type: ignore[attr-defined]


def test_pipe_killed_by_signal(good_tar: Path) -> None:
    url = f"pipe:cat {good_tar}; kill -9 $$"
    err = _expect(wds.PipeError, url, "killed by signal SIGKILL", url)
    assert err.returncode == -signal.SIGKILL  # type: ignore[attr-defined]


def test_pipe_can_be_forbidden(monkeypatch: pytest.MonkeyPatch, good_tar: Path) -> None:
    monkeypatch.setenv("WDS_ASYNC_NO_PIPE", "1")
    _expect(wds.UrlError, f"pipe:cat {good_tar}", "disabled")


@pytest.fixture()
def silent_server() -> Iterator[str]:
    """Accepts connections on 127.0.0.1 and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    conns: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/shard.tar"
    stop.set()
    thread.join()
    for c in conns:
        c.close()
    sock.close()


def test_server_that_never_answers(silent_server: str) -> None:
    _expect(wds.TransientError, [silent_server], "timed out", silent_server, read_timeout=0.5)


def test_stalled_body_is_detected(store: StoreProcess) -> None:
    url = store.url("shard-000000.tar", stall=30)
    _expect(wds.TransientError, [url], "stalled", url, read_timeout=0.5)


def test_closed_port() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    url = f"http://127.0.0.1:{port}/shard.tar"
    _expect(wds.TransientError, [url], "connection failed", url)


def test_skip_policy_counts_skipped_shards(tmp_path: Path, good_tar: Path) -> None:
    ds = wds.WebDataset([str(good_tar), str(tmp_path / "missing.tar"), str(good_tar)],
                        handler="ignore_and_continue", deterministic=True)
    assert len(list(ds)) == 12
    assert ds.stats()["shards_skipped"] == 1


def test_stop_policy_ends_the_data(tmp_path: Path, good_tar: Path) -> None:
    ds = wds.WebDataset([str(good_tar), str(tmp_path / "missing.tar"), str(good_tar)], handler="warn_and_stop",
                        deterministic=True, max_connections=1)
    assert len(list(ds)) == 6


def test_duplicate_extension_goes_to_the_handler(tmp_path: Path) -> None:
    path = write_tar(tmp_path / "dup.tar", [("a.txt", b"1"), ("a.txt", b"2"), ("b.txt", b"3")])
    with pytest.raises(wds.SampleError, match="repeated extension"):
        _drain(str(path))
    ds = wds.WebDataset(str(path), handler="ignore_and_continue")
    assert [s["__key__"] for s in ds] == ["b"]
    assert ds.stats()["samples_skipped"] == 1


def test_custom_handler_receives_error_with_url(tmp_path: Path) -> None:
    seen: list[BaseException] = []
    missing = str(tmp_path / "gone.tar")
    list(wds.WebDataset([missing], handler=lambda e: seen.append(e) or True))
    assert isinstance(seen[0], wds.NotFound) and seen[0].url == missing  # type: ignore[attr-defined]


def test_errors_pickle_with_context() -> None:
    import pickle

    err = wds.PipeError("boom", url="pipe:x", offset=5, returncode=2, stderr_tail="t")
    back = pickle.loads(pickle.dumps(err))
    assert (back.url, back.offset, back.returncode, str(back)) == ("pipe:x", 5, 2, str(err))
    assert os.fspath  # keep import used


# -- absurd sizes are refused at construction (hardening item 3) ------------------------------------------------------

@pytest.mark.parametrize(("options", "fragment"), [
    ({"part_bytes": 1}, "EngineConfig.part_bytes=1 is out of range"),
    ({"part_bytes": 4096}, "EngineConfig.part_bytes=4096 is out of range"),
    ({"max_buffered_bytes": 1}, "EngineConfig.max_buffered_bytes=1 is out of range"),
    ({"max_sample_bytes": 16}, "EngineConfig.max_sample_bytes=16 is out of range"),
    ({"part_bytes": -1}, "EngineConfig.part_bytes=-1 is out of range"),
])
def test_an_absurd_size_is_refused_before_anything_is_read(store: StoreProcess, options: dict,  # type: ignore[type-arg]
                                                           fragment: str) -> None:
    # part_bytes=1 used to plan one ranged part per byte of the shard, about 1.8 KB of bookkeeping each: 460 MB for
    # this 256 KiB shard, a MemoryError for a large one
    started = time.monotonic()
    with pytest.raises(ValueError, match="To fix") as info:
        wds.WebDataset(store.base_url + "shard-000000.tar", **options)
    assert fragment in str(info.value)
    assert time.monotonic() - started < 20, "refused at construction, within seconds"


def test_the_smallest_part_size_still_reads_every_sample(store: StoreProcess, manifest: dict) -> None:  # type: ignore[type-arg]
    # the floor (32 KiB) is what tests pass to exercise ranged parts on these ~256 KiB shards
    ds = wds.WebDataset(store.base_url + "shard-000000.tar", part_bytes=32 << 10, deterministic=True)
    assert sum(1 for _ in ds) == manifest["shards"][0]["samples"]
    assert ds.stats()["parts"] > 1


# -- credentials in any position never reach an error, a repr or a log line (hardening item 9) ------------------------

_SECRETS = ("hunter2", "SEMISECRET", "FRAGSECRET", "JWTSECRET")


def test_secrets_in_unparsable_positions_never_reach_errors_or_repr(store: StoreProcess) -> None:
    userinfo = store.base_url.replace("http://", "http://user:hunter2@")
    for url, shown in [(userinfo + "gone.tar;sig=SEMISECRET", userinfo.replace("hunter2", "***") + "gone.tar;sig=***"),
                       (store.base_url + "gone.tar#sig=FRAGSECRET&jwt=JWTSECRET",
                        store.base_url + "gone.tar#sig=***&jwt=***")]:
        ds = wds.WebDataset([url], retry=FAST_RETRY)
        assert shown in repr(ds)
        with pytest.raises(wds.NotFound) as info:
            list(ds)
        err = info.value
        text = "\n".join([str(err), repr(err), str(err.url), err.message, repr(ds)])  # type: ignore[attr-defined]
        assert err.url == shown, text  # type: ignore[attr-defined]
        assert "HTTP 404" in text
        for secret in _SECRETS:
            assert secret not in text, (secret, text)


def test_retry_log_lines_carry_no_secret(store: StoreProcess, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    caplog.set_level(logging.DEBUG, logger="wds_async")
    url = store.url("shard-000000.tar", status=500).replace("http://", "http://user:hunter2@") + "#sig=FRAGSECRET"
    with pytest.raises(wds.TransientError) as info:
        _drain([url])
    retried = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert retried, [r.getMessage() for r in caplog.records]  # the retry was logged, naming the shard
    assert all("shard-000000.tar" in line and "user:***@" in line for line in retried), retried
    for line in [*(r.getMessage() for r in caplog.records), str(info.value)]:
        for secret in _SECRETS:
            assert secret not in line, (secret, line)
