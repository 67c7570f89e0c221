"""``wds-async tune`` end to end against the emulated store: the CLI's table, JSON and PNG, its errors,
and the Python form. Windows are short (0.3 s) and nothing is asserted about speed."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from emustore import StoreProcess
from wds_async.cli.tune.recommend import TuneResult, tune

CLI = [sys.executable, "-m", "wds_async.cli"]
PNG = b"\x89PNG\r\n\x1a\n"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300)


def _shards(store: StoreProcess) -> str:
    # Paced per request (query knobs), so that more readers really do move more bytes.
    return store.base_url + "shard-{000000..000003}.tar?ttfb=0.01&bw=4000000"


def test_tune_cli_writes_table_json_and_png(store: StoreProcess, tmp_path: Path) -> None:
    report, plot = tmp_path / "tune.json", tmp_path / "tune.png"
    out = _run("tune", _shards(store), "--levels", "1,2,4", "--seconds", "0.3", "--full", "--part-bytes", "64KiB",
               "--ranks", "2", "--workers", "3", "--json", str(report), "--plot", str(plot))
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no live display when stderr is not a terminal
    for needle in ("MB/s", "CPU s/GB", "knee:", "WDS_ASYNC_NODE_CONNECTIONS=", "max_connections=",
                   "WDS_ASYNC_NODE_BUFFERED_BYTES="):
        assert needle in out.stdout
    result = json.loads(report.read_text())
    assert result["levels"] == [1, 2, 4]
    assert [m["concurrency"] for m in result["sweep"]] == [1, 2, 4]
    for m in result["sweep"] + result["parts"]:
        assert m["bytes"] > 0 and m["mb_s"] > 0 and m["seconds"] > 0
        assert m["requests"] >= m["completed"] >= 0 and m["errors"] == 0 and m["throttled"] == 0
        assert 0 < m["ttfb_p50_ms"] <= m["ttfb_p99_ms"] and m["cpu_s_per_gb"] > 0
    knee = result["knee"]
    assert knee in (1, 2, 4)
    assert [(m["concurrency"], m["part_bytes"]) for m in result["parts"]] == [(knee, 64 << 10)]
    advice = result["recommendation"]
    assert advice["node_connections"] == knee
    assert advice["process_connections"] == max(1, math.ceil(knee / (2 * 3)))
    assert plot.read_bytes()[:8] == PNG


def test_tune_cli_names_a_missing_object(store: StoreProcess) -> None:
    url = store.base_url + "no-such-shard.tar"
    out = _run("tune", url, "--levels", "1", "--seconds", "0.3")
    assert out.returncode != 0
    assert url in out.stderr and "404" in out.stderr


def test_tune_cli_names_a_dead_store() -> None:
    url = "http://127.0.0.1:1/shard-000000.tar"  # nothing listens on port 1
    out = _run("tune", url, "--levels", "1", "--seconds", "0.3")
    assert out.returncode != 0 and url in out.stderr


def test_plot_without_matplotlib_names_the_extra(store: StoreProcess, tmp_path: Path) -> None:
    code = ("import sys; sys.modules['matplotlib'] = None\n"  # makes `import matplotlib` fail
            "from wds_async.cli.main import main; sys.exit(main(sys.argv[1:]))")
    out = subprocess.run([sys.executable, "-c", code, "tune", _shards(store), "--levels", "1", "--seconds", "0.3",
                          "--plot", str(tmp_path / "x.png")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2
    assert "pip install 'wds-async[tune]'" in out.stderr
    assert not (tmp_path / "x.png").exists()


def test_bad_levels_are_refused(store: StoreProcess) -> None:
    out = _run("tune", _shards(store), "--levels", "1,2", "--max", "0")
    assert out.returncode == 2 and "--max" in out.stderr
    out = _run("tune", _shards(store), "--levels", "4,8", "--max", "2")
    assert out.returncode == 2 and "no level left" in out.stderr


def test_tune_in_python_reports_progress(store: StoreProcess) -> None:
    seen: list[tuple[int, int, str]] = []
    result = tune(_shards(store), levels=[1, 2], seconds=0.3, full=True,
                  progress=lambda done, total, label, rate: seen.append((done, total, label)))
    assert isinstance(result, TuneResult)
    assert result.objects == 4 and [m.concurrency for m in result.sweep] == [1, 2]
    assert result.knee in (1, 2) and result.at_knee.concurrency == result.knee
    assert (2, 2, "2 conns") in seen and all(total == 2 for _, total, _ in seen)
    with pytest.raises(ValueError, match="seconds"):
        tune(_shards(store), levels=[1], seconds=0)
