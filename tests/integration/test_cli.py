"""The ``wds-async`` command on local shards (the cloud forms run in tests/backends/contract.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "wds_async.cli"]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def test_ls_expands_braces_and_globs(shard_dir: Path) -> None:
    out = _run("ls", str(shard_dir / "shard-{000000..000001}.tar"), str(shard_dir / "shard-00000[67].tar"))
    assert out.returncode == 0, out.stderr
    assert [Path(p).name for p in out.stdout.split()] == [
        "shard-000000.tar", "shard-000001.tar", "shard-000006.tar", "shard-000007.tar"]


def test_ls_reports_a_glob_that_matches_nothing(tmp_path: Path) -> None:
    out = _run("ls", str(tmp_path / "nothing-*.tar"))
    assert out.returncode == 2 and "matched no objects" in out.stderr


def test_verify_reports_good_and_bad_shards(shard_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes((shard_dir / "shard-000000.tar").read_bytes()[:5000])
    out = _run("verify", str(shard_dir / "shard-000000.tar"), str(bad))
    assert out.returncode == 1
    assert "ok   " in out.stdout and "FAIL " in out.stdout and "bad.tar" in out.stdout


def test_bench_prints_the_table(shard_dir: Path) -> None:
    out = _run("bench", str(shard_dir / "shard-{000000..000003}.tar"), "-c", "4", "--vs-webdataset")
    assert out.returncode == 0, out.stderr
    for needle in ("raw download (4 conns)", "wds-async (4 conns)", "webdataset 1 process", "CPU s/GB",
                   "wds-async / raw", "wds-async / webdataset"):
        assert needle in out.stdout
    assert "NO (" not in out.stdout
    assert "\x1b[" not in out.stderr  # stderr is not a terminal: no live status line


def test_bench_progress_shows_a_status_line(shard_dir: Path) -> None:
    out = _run("bench", str(shard_dir / "shard-{000000..000001}.tar"), "-c", "2", "--progress")
    assert out.returncode == 0, out.stderr
    # Each phase is a fresh interpreter that takes well over one 0.25 s poll to start and import.
    assert "raw download (2 conns)" in out.stderr and "wds-async (2 conns)" in out.stderr
    assert "wds-async / raw" in out.stdout


def test_bad_url_is_a_clear_error() -> None:
    out = _run("verify", "ftp://host/x.tar")
    assert out.returncode == 2 and "unknown URL scheme 'ftp'" in out.stderr
