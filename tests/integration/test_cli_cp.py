"""``wds-async cp``: copies byte for byte (local and over the emulated store on 127.0.0.1), a damaged source
failing alone with nothing half-written left behind, bad input as one line, resharding into new shards that
hold the same samples, the index of what was written, JSON lines and progress on stderr only. Most cases
call ``main()`` in-process; one runs the installed command end to end."""

from __future__ import annotations

import json
import math
import signal
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from emustore import StoreProcess
from tests.conftest import N_SHARDS, wait_until, write_tar
from tests.integration.test_cli import CLI, _run
from wds_async.cli.main import main

SHARDS = [f"shard-{i:06d}.tar" for i in range(N_SHARDS)]


def _leftovers(folder: Path) -> list[str]:
    """Temporary files a copy left behind (there must be none, whatever happened)."""
    return [p.name for p in folder.iterdir() if "partial" in p.name]


def _samples(paths: list[Path]) -> list[tuple[str, dict[str, bytes]]]:
    """Each sample of ``paths`` in order: its key and {member name: bytes} (the order inside one sample is
    the writer's, so it is not compared)."""
    out: list[tuple[str, dict[str, bytes]]] = []
    for path in paths:
        with tarfile.open(path) as tf:
            for m in tf.getmembers():
                if not m.isfile():
                    continue
                base = m.name.rsplit("/", 1)[-1]
                key = m.name[: len(m.name) - len(base)] + base.split(".", 1)[0]
                data = tf.extractfile(m).read()  # type: ignore[union-attr]
                if not out or out[-1][0] != key:
                    out.append((key, {}))
                out[-1][1][m.name] = data
    return out


def _rows(index: Any) -> list[tuple[Any, ...]]:
    """What an index says of each shard that both ways of building one know: name, size, sample ranges."""
    return [(e.url, e.size, e.keys, e.offsets, e.ends) for e in index.shards]


def _stdout_json(text: str) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in text.splitlines()]


def test_copy_local_to_local_is_byte_identical(shard_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"  # created by cp
    assert main(["cp", str(shard_dir / "shard-{000000..000003}.tar"), f"{out}/"]) == 0
    for name in SHARDS[:4]:
        assert (out / name).read_bytes() == (shard_dir / name).read_bytes()
    assert sorted(p.name for p in out.iterdir()) == SHARDS[:4]
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()] == ["ok"] * 4
    assert captured.err.startswith("copied 4 shards: 4 ok, 0 failed;")


def test_copy_over_http_json_lines(store: StoreProcess, pattern: str, shard_dir: Path,
                                   manifest: dict,  # type: ignore[type-arg]
                                   tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cp", "--json", "-c", "3", pattern, str(tmp_path)]) == 0  # an existing folder needs no /
    rows = _stdout_json(capsys.readouterr().out)
    expected = {s["name"]: s for s in manifest["shards"]}
    assert [r["src"] for r in rows] == [store.url(name) for name in SHARDS]  # in source order
    for row, name in zip(rows, SHARDS):
        assert row == {"src": store.url(name), "dst": f"{tmp_path}/{name}", "ok": True,
                       "samples": expected[name]["samples"], "bytes": expected[name]["bytes"], "error": None,
                       "error_type": None}
        assert (tmp_path / name).read_bytes() == (shard_dir / name).read_bytes()


def test_dropped_connections_resume_and_the_copy_is_whole(store: StoreProcess, shard_dir: Path,
                                                          tmp_path: Path) -> None:
    """Bodies cut short at random: the reader resumes at the byte reached; the copy is still exact."""
    urls = [store.url(name, drop_rate=0.3) for name in SHARDS[:3]]
    dropped = store.stats()["dropped"]
    # The store's fault dice are server-wide: a copy of 3 shards sees no cut at all about 1 time in 3, so copy
    # again (checking every copy) until one did (P(none in 12) < 2e-6).
    for attempt in range(12):
        out = tmp_path / str(attempt)
        assert main(["cp", "-q", *urls, f"{out}/"]) == 0
        for name in SHARDS[:3]:  # named after the path: the query is not part of the name
            assert (out / name).read_bytes() == (shard_dir / name).read_bytes()
        if store.stats()["dropped"] > dropped:
            break
    assert store.stats()["dropped"] > dropped


def test_a_truncated_source_fails_alone(shard_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.tar").write_bytes((shard_dir / SHARDS[0]).read_bytes())
    (src / "b.tar").write_bytes((shard_dir / SHARDS[1]).read_bytes()[:70000])  # cut inside a member
    (src / "c.tar").write_bytes((shard_dir / SHARDS[2]).read_bytes())
    out = tmp_path / "out"
    assert main(["cp", "--json", "-c", "2", str(src / "*.tar"), f"{out}/"]) == 1
    rows = {Path(r["src"]).name: r for r in _stdout_json(capsys.readouterr().out)}
    assert rows["a.tar"]["ok"] and rows["c.tar"]["ok"]
    assert not rows["b.tar"]["ok"] and rows["b.tar"]["error_type"] == "TruncatedShard"
    assert "b.tar" in rows["b.tar"]["error"]
    assert sorted(p.name for p in out.iterdir()) == ["a.tar", "c.tar"]  # no b.tar, no temporary file
    assert (out / "c.tar").read_bytes() == (src / "c.tar").read_bytes()


def test_a_source_that_is_not_a_tar_fails_and_leaves_nothing(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"<html>not found</html>\n" * 100)
    assert main(["cp", str(bad), str(tmp_path / "copy.tar")]) == 1
    assert "FAIL" in capsys.readouterr().out
    assert not (tmp_path / "copy.tar").exists() and _leftovers(tmp_path) == []


@pytest.mark.parametrize(("argv", "fragment"), [
    (["ftp://host/a.tar", "{tmp}/out/"], "unknown URL scheme 'ftp'"),
    (["{shards}", "http://127.0.0.1:9/out/"], "cp writes to local paths"),
    (["{shards}", "{tmp}/one.tar"], "names one object and there are 2 source shards"),
    (["--maxcount", "5", "{shards}", "{tmp}/out.tar"], "holds one %-format"),
    (["{shards}", "{tmp}/a.tar/x/"], "cannot create the folder"),
])
def test_bad_input_is_one_line_and_exit_2(argv: list[str], fragment: str, shard_dir: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "a.tar").write_bytes(b"")  # a file where a folder is asked for
    shards = str(shard_dir / "shard-{000000..000001}.tar")
    assert main(["cp", *(a.format(tmp=tmp_path, shards=shards) for a in argv)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("wds-async: error: ") and fragment in lines[0], captured.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("src", "folder", "expected"), [
    ("/data/a.tar", "s3://b/x/", "s3://b/x/a.tar"),
    ("http://h/p/b.tar?sig=1", "gs://b/", "gs://b/b.tar"),
    ("pipe:curl -s https://h/c.tar", "/tmp/out/", "/tmp/out/c.tar"),
    ("s3://b/d.tar", "https://acct.blob.core.windows.net/c/dir/?sv=1&sig=2",
     "https://acct.blob.core.windows.net/c/dir/d.tar?sv=1&sig=2"),
])
def test_a_copy_is_named_after_its_source(src: str, folder: str, expected: str) -> None:
    from wds_async.write.copy import plan_copies

    assert plan_copies([src], folder) == [(src, expected)]


def test_two_sources_with_one_name_are_refused(shard_dir: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / SHARDS[0]).write_bytes((shard_dir / SHARDS[0]).read_bytes())
    assert main(["cp", str(shard_dir / SHARDS[0]), str(other / SHARDS[0]), f"{tmp_path}/out/"]) == 2
    assert "two sources would be copied to one name" in capsys.readouterr().err


def test_reshard_with_maxcount_keeps_every_sample_in_order(shard_dir: Path, manifest: dict,  # type: ignore[type-arg]
                                                           tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    sources = [shard_dir / name for name in SHARDS[:3]]
    total = sum(s["samples"] for s in manifest["shards"][:3])
    assert main(["cp", "--json", "--maxcount", "7", "--index", str(tmp_path / "index.jsonl"),
                 str(shard_dir / "shard-{000000..000002}.tar"), str(tmp_path / "out-%04d.tar")]) == 0
    outputs = sorted(tmp_path.glob("out-*.tar"))
    assert len(outputs) == math.ceil(total / 7)
    assert [len(_samples([p])) for p in outputs] == [7] * (len(outputs) - 1) + [total - 7 * (len(outputs) - 1)]
    assert _samples(outputs) == _samples(sources)
    rows = _stdout_json(capsys.readouterr().out)
    assert [r["samples"] for r in rows] == [s["samples"] for s in manifest["shards"][:3]]
    assert rows[0]["dst"].split(",")[0] == str(outputs[0]) and rows[-1]["dst"].split(",")[-1] == str(outputs[-1])

    from wds_async.index.build import build_index
    from wds_async.index.format import ShardIndex

    assert _rows(ShardIndex.load(tmp_path / "index.jsonl")) == _rows(build_index([str(p) for p in outputs]))


def test_reshard_with_maxsize_over_http(store: StoreProcess, pattern: str, shard_dir: Path, tmp_path: Path) -> None:
    assert main(["cp", "-q", "--maxsize", "100KiB", pattern, str(tmp_path / "big-%03d.tar")]) == 0
    outputs = sorted(tmp_path.glob("big-*.tar"))
    assert len(outputs) > N_SHARDS  # ~256 KiB sources into ~100 KiB shards
    assert _samples(outputs) == _samples([shard_dir / name for name in SHARDS])


def test_reshard_keeps_member_names_and_reports_a_bad_source(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    good = write_tar(tmp_path / "good.tar", [("d/a.JPG", b"jpeg"), ("d/a.seg.Txt", b"text"), ("d/b.JPG", b"j2")])
    twice = write_tar(tmp_path / "twice.tar", [("c.txt", b"1"), ("c.TXT", b"2")])
    assert main(["cp", "--maxcount", "10", str(good), str(twice), str(tmp_path / "o-%d.tar")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("ok   ") and lines[1].startswith("FAIL ") and "repeated extension" in lines[1]
    with tarfile.open(tmp_path / "o-0.tar") as tf:
        assert [(m.name, tf.extractfile(m).read()) for m in tf.getmembers()] == [  # type: ignore[union-attr]
            ("d/a.JPG", b"jpeg"), ("d/a.seg.Txt", b"text"), ("d/b.JPG", b"j2")]


def test_copy_index_matches_an_index_of_the_copies(shard_dir: Path, tmp_path: Path) -> None:
    from wds_async.index.build import build_index
    from wds_async.index.format import ShardIndex

    out = tmp_path / "out"
    assert main(["cp", "-q", "--index", str(tmp_path / "i.jsonl.gz"), str(shard_dir / "shard-00000[0-2].tar"),
                 f"{out}/"]) == 0
    written = ShardIndex.load(tmp_path / "i.jsonl.gz")
    assert _rows(written) == _rows(build_index([str(out / name) for name in SHARDS[:3]]))


def test_progress_goes_to_stderr_only(shard_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cp", "--json", "--progress", str(shard_dir / "shard-{000000..000001}.tar"), f"{tmp_path}/"]) == 0
    captured = capsys.readouterr()
    assert [r["ok"] for r in _stdout_json(captured.out)] == [True, True]  # stdout: the JSON lines, nothing else
    assert "copying" in captured.err and "copied 2 shards" in captured.err


def test_end_to_end_through_the_installed_command(store: StoreProcess, shard_dir: Path, tmp_path: Path) -> None:
    out = _run("cp", "--json", store.base_url + "shard-{000002..000003}.tar", f"{tmp_path}/")
    assert out.returncode == 0, out.stderr
    assert [Path(r["dst"]).name for r in _stdout_json(out.stdout)] == SHARDS[2:4]
    assert "\x1b[" not in out.stderr and out.stderr.startswith("copied 2 shards: 2 ok, 0 failed;")
    for name in SHARDS[2:4]:
        assert (tmp_path / name).read_bytes() == (shard_dir / name).read_bytes()
    assert _leftovers(tmp_path) == []


def test_an_interrupted_copy_leaves_nothing_half_written(store: StoreProcess, shard_dir: Path,
                                                          tmp_path: Path) -> None:
    """Ctrl-C while every shard is half-way (slowed to ~100 kB/s): exit 130, no temporary file left, and
    whatever did complete is whole. The command starts with SIGINT at its default: a test run started in the
    background of a non-interactive shell (``.ci/run &``) ignores SIGINT, children inherit that, and Python keeps
    an ignored SIGINT ignored, so the copy would finish untouched."""
    out = tmp_path / "out"
    proc = subprocess.Popen([*CLI, "cp", "-c", "4", store.base_url + "shard-{000000..000003}.tar?bw=100000",
                             f"{out}/"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert wait_until(lambda: out.is_dir() and bool(_leftovers(out)), timeout=60), proc.stderr
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and _leftovers(out) == []
    for done in out.iterdir():
        assert done.read_bytes() == (shard_dir / done.name).read_bytes()

