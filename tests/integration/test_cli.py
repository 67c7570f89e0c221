"""The ``wds-async`` command, run through its installed entry point, on local shards and over the emulated
store on 127.0.0.1 (the cloud forms of ``ls`` and ``bench`` also run in tests/backends/contract.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from emustore import StoreProcess
from wds_async.cli.bench.run import _best_raw

#: The console script pip installed beside this interpreter (``python -m wds_async.cli`` where there is none).
_SCRIPT = Path(sys.executable).with_name("wds-async")
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "wds_async.cli"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=300, env=env)


def _one_line_error(out: subprocess.CompletedProcess[str], *fragments: str) -> None:
    """Exit status 2, nothing on stdout, and exactly one line on stderr holding every fragment."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert out.stdout == "", out.stdout
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wds-async"), out.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


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
                   "wds-async / raw", "wds-async / webdataset", "raw: the faster of two passes"):
        assert needle in out.stdout
    assert "NO (" not in out.stdout
    assert "\x1b[" not in out.stderr  # stderr is not a terminal: no live status line


def test_bench_workers_rows_read_every_sample_once_through_dataloader_workers(shard_dir: Path,
                                                                              tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.json"
    out = _run("bench", str(shard_dir / "shard-{000000..000003}.tar"), "-c", "4", "--no-auto", "--workers", "2",
               "--json", str(rows_file))
    assert out.returncode == 0, out.stderr
    assert "wds-async, 2 workers" in out.stdout and "wds-async, 2 workers, tensors" in out.stdout
    assert "samples cross pickled" in out.stdout and "batches cross as shared-memory tensors" in out.stdout
    rows = {row["name"]: row for row in json.loads(rows_file.read_text())}
    one = rows["wds-async (4 conns)"]
    for name, tensors in (("wds-async, 2 workers", False), ("wds-async, 2 workers, tensors", True)):
        pool = rows[name]
        assert pool["workers"] == 2 and pool["tensors"] is tensors and pool["exactly_once"] == "yes"
        assert pool["samples"] == pool["unique"] == one["samples"] and pool["bytes"] == one["bytes"]
        assert pool["keys_digest"] == one["keys_digest"]  # the same (url, key) names as the one process read
        assert pool["concurrency_reason"] == "summed over 2 DataLoader workers"
        # The workers' CPU (they parse every byte) is in the row's.
        assert 0 < pool["workers_cpu_s"] < pool["cpu_s"] and pool["peak_above_baseline"] >= 0


def test_bench_workers_without_torch_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    import wds_async.data._torch as torch_side
    from wds_async.cli.bench.command import _check_options

    args = argparse.Namespace(workers=2, ca_file=None, json=None, plot=None)
    assert _check_options(args) is None
    monkeypatch.setattr(torch_side, "HAVE_TORCH", False)
    problem = _check_options(args)
    assert problem is not None and "--workers" in problem and "torch is not installed" in problem


def test_bench_progress_shows_a_status_line(shard_dir: Path) -> None:
    out = _run("bench", str(shard_dir / "shard-{000000..000001}.tar"), "-c", "2", "--progress")
    assert out.returncode == 0, out.stderr
    # Each phase is drawn as it starts, however quickly it ends (a raw phase no longer imports torch).
    assert "raw download (2 conns)" in out.stderr and "wds-async (2 conns)" in out.stderr
    assert "wds-async / raw" in out.stdout


def test_bad_url_is_a_clear_error() -> None:
    out = _run("verify", "ftp://host/x.tar")
    _one_line_error(out, "unknown URL scheme 'ftp'", "ftp://host/x.tar")


# --- ls ----------------------------------------------------------------------------------------------------

def test_ls_unknown_scheme_is_one_line_error() -> None:
    _one_line_error(_run("ls", "ftp://h/x.tar"), "unknown URL scheme 'ftp'", "url=ftp://h/x.tar")


@pytest.mark.parametrize("pattern", ["https://127.0.0.1:9/train-*.tar", "http://127.0.0.1:9/d/train-00[0-3].tar"])
def test_ls_refuses_an_http_glob(pattern: str) -> None:
    _one_line_error(_run("ls", pattern), "http(s) has no listing", "{000..099}", pattern)


def test_ls_http_query_is_no_glob(store: StoreProcess) -> None:
    """A ``?`` starts an http query: such a URL is listed as written, not refused as a glob."""
    url = store.url("shard-000000.tar", ttfb=0)
    assert "?" in url
    out = _run("ls", url)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [url]


def test_ls_json_lines(shard_dir: Path) -> None:
    out = _run("ls", "--json", str(shard_dir / "shard-00000[01].tar"))
    assert out.returncode == 0, out.stderr
    assert [json.loads(line) for line in out.stdout.splitlines()] == [
        {"url": str(shard_dir / "shard-000000.tar")}, {"url": str(shard_dir / "shard-000001.tar")}]


def test_ls_long_json_over_http(store: StoreProcess, shard_dir: Path, pattern: str) -> None:
    out = _run("ls", "-l", "--json", pattern)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    names = sorted(p.name for p in shard_dir.glob("shard-*.tar"))
    assert rows == [{"url": store.url(n), "size": (shard_dir / n).stat().st_size} for n in names]


def test_ls_long_of_a_missing_object_names_it(store: StoreProcess) -> None:
    missing = store.base_url + "no-such-shard.tar"
    out = _run("ls", "-l", store.url("shard-000000.tar"), missing)
    _one_line_error(out, missing)


def test_ls_progress_goes_to_stderr_only(shard_dir: Path) -> None:
    out = _run("ls", "-l", "--progress", str(shard_dir / "shard-*.tar"))
    assert out.returncode == 0, out.stderr
    names = sorted(p.name for p in shard_dir.glob("shard-*.tar"))
    assert [line.split() for line in out.stdout.splitlines()] == [
        [str((shard_dir / n).stat().st_size), str(shard_dir / n)] for n in names]
    assert "sizes" in out.stderr and "\x1b[" in out.stderr


# --- verify ------------------------------------------------------------------------------------------------

def test_verify_a_glob_reports_one_line_per_shard(shard_dir: Path, manifest: dict) -> None:  # type: ignore[type-arg]
    out = _run("verify", str(shard_dir / "shard-*.tar"))
    assert out.returncode == 0, out.stderr
    expected = [f"ok   {shard_dir / s['name']}: {s['samples']} samples, {s['bytes']} bytes"
                for s in manifest["shards"]]
    assert out.stdout.splitlines() == expected
    assert f"verified {len(expected)} shards: {len(expected)} ok, 0 failed" in out.stderr


def test_verify_json_lines(shard_dir: Path, tmp_path: Path, manifest: dict) -> None:  # type: ignore[type-arg]
    bad = tmp_path / "bad.tar"
    bad.write_bytes((shard_dir / "shard-000000.tar").read_bytes()[:5000])
    missing = tmp_path / "missing.tar"
    out = _run("verify", "--json", "-q", str(shard_dir / "shard-00000{0,1}.tar"), str(bad), str(missing))
    assert out.returncode == 1
    assert out.stderr == ""  # -q: no summary
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [set(r) for r in rows] == [{"url", "ok", "samples", "bytes", "error", "error_type"}] * 4
    for row, shard in zip(rows[:2], manifest["shards"][:2], strict=True):
        assert row == {"url": str(shard_dir / shard["name"]), "ok": True, "samples": shard["samples"],
                       "bytes": shard["bytes"], "error": None, "error_type": None}
    assert rows[2]["url"] == str(bad) and rows[2]["ok"] is False and rows[2]["error_type"] == "TruncatedShard"
    assert str(bad) in rows[2]["error"] and rows[2]["bytes"] == 5000
    assert rows[3]["ok"] is False and rows[3]["error_type"] == "NotFound" and str(missing) in rows[3]["error"]


def test_verify_over_http_names_the_failing_url(store: StoreProcess, manifest: dict) -> None:  # type: ignore[type-arg]
    good, gone = store.url("shard-000001.tar"), store.url("shard-000002.tar", status=404)
    out = _run("verify", good, gone)
    assert out.returncode == 1
    lines = out.stdout.splitlines()
    shard = manifest["shards"][1]
    assert lines[0] == f"ok   {good}: {shard['samples']} samples, {shard['bytes']} bytes"
    assert lines[1].startswith(f"FAIL {gone}: ") and "404" in lines[1]
    assert len(lines) == 2


def test_verify_progress_never_touches_stdout(shard_dir: Path) -> None:
    """With --progress the bar is drawn (stderr counts as a terminal), and stdout holds only the results: rich
    would otherwise redirect stdout into the display on stderr."""
    out = _run("verify", "--progress", "-c", "2", str(shard_dir / "shard-*.tar"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == len(list(shard_dir.glob("shard-*.tar"))) and all(x.startswith("ok   ") for x in lines)
    assert "\x1b" not in out.stdout
    assert "verifying" in out.stderr and "\x1b[" in out.stderr


@pytest.fixture(scope="module")
def s3_env(shard_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The environment that points an S3 client at the emulated store's S3 face, which serves a bucket ``data``
    holding four of the shards (dummy keys; nothing leaves 127.0.0.1)."""
    root = tmp_path_factory.mktemp("s3root")
    (root / "data").mkdir()
    for i in range(4):
        shutil.copy(shard_dir / f"shard-{i:06d}.tar", root / "data")
    with StoreProcess(root) as store:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "GOOGLE_", "AZURE_"))}
        env.update(AWS_ENDPOINT_URL_S3=store.s3_endpoint, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                   AWS_DEFAULT_REGION="us-east-1")
        yield env


def test_verify_an_s3_glob_lists_it(s3_env: dict[str, str], manifest: dict) -> None:  # type: ignore[type-arg]
    out = _run("verify", "--json", "s3://data/shard-*.tar", env=s3_env)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["url"], r["samples"]) for r in rows] == [
        (f"s3://data/{s['name']}", s["samples"]) for s in manifest["shards"][:4]]


# --- bench -------------------------------------------------------------------------------------------------

def test_bench_unknown_scheme_fails_before_any_phase() -> None:
    started = time.monotonic()
    out = _run("bench", "ftp://h/x.tar", "-c", "2")
    _one_line_error(out, "unknown URL scheme 'ftp'", "ftp://h/x.tar")
    assert time.monotonic() - started < 60  # no phase ran (each is an interpreter of its own)


def test_bench_http_glob_and_missing_file_fail_before_any_phase(shard_dir: Path, tmp_path: Path) -> None:
    _one_line_error(_run("bench", "https://127.0.0.1:9/x-*.tar"), "http(s) has no listing")
    missing = tmp_path / "missing.tar"
    _one_line_error(_run("bench", str(shard_dir / "shard-000000.tar"), str(missing)), "no such file", str(missing))


def test_bench_a_shard_that_fails_in_a_phase_is_one_line(shard_dir: Path, tmp_path: Path) -> None:
    """The raw phase reads the truncated shard happily; the loader phase fails in its own interpreter, and
    its error comes back as one line naming the URL and offset (it used to be an exception group's traceback)."""
    bad = tmp_path / "bad.tar"
    bad.write_bytes((shard_dir / "shard-000000.tar").read_bytes()[:5000])
    out = _run("bench", str(bad), "-c", "1", "--no-auto")
    assert out.returncode == 2, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wds-async: error: "), out.stderr
    assert f"url={bad}" in lines[0] and "offset=" in lines[0]
    assert "Traceback" not in out.stderr and "wds-async / raw" not in out.stdout


def test_bench_takes_the_faster_of_its_two_raw_passes() -> None:
    """A slow first raw pass (a store still warming up) must not flatter every ratio against it: the baseline is
    the faster pass, whichever it was, and both rates are kept."""
    first = {"name": "raw download (4 conns)", "bytes": 100e6, "wall_s": 2.0, "first_s": 0.4}
    again = {"name": "raw download (4 conns) (again)", "bytes": 100e6, "wall_s": 1.0, "first_s": 0.1}
    best = _best_raw(first, again)
    assert (best["wall_s"], best["first_s"], best["name"]) == (1.0, 0.1, "raw download (4 conns)")
    assert best["runs_mb_s"] == [50.0, 100.0]
    assert _best_raw(again, first)["wall_s"] == 1.0
