"""``wds-async cat``, run through its installed entry point: members and samples of one shard, field contents,
JSON lines, raw bytes, over a local path and the emulated store on 127.0.0.1, and its errors. Members are
checked against Python's tarfile, samples against webdataset 1.0.2."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from emustore import StoreProcess
from tests.conftest import N_SHARDS, write_tar
from tests.integration.test_cli import CLI, _one_line_error, _run

SHARD = "shard-000003.tar"


def _members(path: Path) -> list[tuple[int, int, str]]:
    with tarfile.open(path) as tf:
        return [(m.offset, m.size, m.name) for m in tf.getmembers() if m.isfile()]


@pytest.fixture(scope="module")
def fields_tar(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Samples with a one-line text, a several-line text, binary bytes, and one sample lacking ``txt``."""
    blob = bytes(range(256)) * 2
    return write_tar(tmp_path_factory.mktemp("cat") / "fields.tar", [
        ("a.txt", "héllo wörld\n".encode()), ("a.bin", blob), ("a.json", b'{"x": 1,\n "y": 2}\n'),
        ("b.bin", b"\x00\x01\x02"), ("b.json", b"{}"),
    ])


def test_members_match_tarfile(shard_dir: Path) -> None:
    out = _run("cat", str(shard_dir / SHARD))
    assert out.returncode == 0, out.stderr
    got = [(int(o), int(s), n) for o, s, n in (line.split(None, 2) for line in out.stdout.splitlines())]
    assert got == _members(shard_dir / SHARD)


def test_members_as_json_lines_over_http(store: StoreProcess, shard_dir: Path) -> None:
    out = _run("cat", "--json", store.url(SHARD))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows == [{"name": n, "size": s, "offset": o} for o, s, n in _members(shard_dir / SHARD)]


def test_samples_match_webdataset(shard_dir: Path) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import webdataset

        theirs = [(s["__key__"], {k: len(v) for k, v in s.items() if not k.startswith("__")})
                  for s in webdataset.WebDataset(str(shard_dir / SHARD), shardshuffle=False)]
    out = _run("cat", "--samples", "--json", str(shard_dir / SHARD))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert [(r["key"], r["fields"]) for r in rows] == theirs
    first_offsets = {}
    for offset, _, name in _members(shard_dir / SHARD):
        first_offsets.setdefault(name.split(".", 1)[0], offset)
    assert [r["offset"] for r in rows] == [first_offsets[r["key"]] for r in rows]
    text = _run("cat", "--samples", str(shard_dir / SHARD)).stdout.splitlines()
    assert [line.split() for line in text] == [
        [str(r["offset"]), r["key"], *(f"{k}={n}" for k, n in r["fields"].items())] for r in rows]


def test_keys_print_text_as_text_and_bytes_as_a_summary(fields_tar: Path) -> None:
    out = _run("cat", "--keys", "txt,json,bin", str(fields_tar))
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "           0  a  txt=14 bin=512 json=18",
        "    txt: héllo wörld",
        "    json:",
        '      {"x": 1,',
        '       "y": 2}',
        "    bin: <512 bytes: 00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f ...>",
        "        3072  b  bin=3 json=2",
        "    txt: (none)",
        "    json: {}",
        "    bin: <3 bytes: 00 01 02>",
    ]


def test_keys_as_json(fields_tar: Path) -> None:
    out = _run("cat", "--keys", "TXT, bin", "--json", str(fields_tar))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert rows[0]["content"] == {"txt": "héllo wörld\n", "bin": {"bytes": 512, "head": bytes(range(16)).hex()}}
    assert rows[1]["content"] == {"txt": None, "bin": {"bytes": 3, "head": "000102"}}
    raw = _run("cat", "--keys", "bin", "--json", "--raw", str(fields_tar))
    import base64

    contents = [json.loads(line)["content"]["bin"] for line in raw.stdout.splitlines()]
    assert [base64.b64decode(c["base64"]) for c in contents] == [bytes(range(256)) * 2, b"\x00\x01\x02"]


def test_raw_writes_the_bytes_and_nothing_else(shard_dir: Path) -> None:
    out = subprocess.run([*CLI, "cat", "-n", "1", "--keys", "bin", "--raw", str(shard_dir / SHARD)],
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr
    with tarfile.open(shard_dir / SHARD) as tf:
        first_bin = next(m for m in tf.getmembers() if m.name.endswith(".bin"))
        assert out.stdout == tf.extractfile(first_bin).read()  # type: ignore[union-attr]


def test_limit_stops_early(shard_dir: Path) -> None:
    out = _run("cat", "-n", "2", str(shard_dir / SHARD))
    assert out.returncode == 0, out.stderr
    assert [line.split()[2] for line in out.stdout.splitlines()] == [n for _, _, n in _members(shard_dir / SHARD)[:2]]
    assert len(_run("cat", "--samples", "-n", "3", str(shard_dir / SHARD)).stdout.splitlines()) == 3


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """``cat | head``: far more output than a pipe buffers, and the reader leaves after one line."""
    many = write_tar(tmp_path / "many.tar", [(f"sample{i:05d}.txt", b"x") for i in range(4000)])
    script = " ".join(f"'{part}'" for part in [*CLI, "cat", str(many)]) + " | head -n 1; echo \"${PIPESTATUS[0]}\""
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    lines = out.stdout.splitlines()
    assert lines[0].split()[2] == "sample00000.txt" and lines[1] == "0"
    assert out.stderr == "", out.stderr


def test_a_damaged_shard_prints_what_it_read_then_the_error(shard_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.tar"
    bad.write_bytes((shard_dir / SHARD).read_bytes()[:30000])
    out = _run("cat", str(bad))
    assert out.returncode == 1
    good = [m for m in _members(shard_dir / SHARD) if m[0] + 512 + m[1] <= 30000]
    assert [line.split()[2] for line in out.stdout.splitlines()] == [n for _, _, n in good]
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and f"url={bad}" in lines[0] and "offset=" in lines[0] and "re-upload" in lines[0]


def test_errors_are_one_line(shard_dir: Path, tmp_path: Path, store: StoreProcess) -> None:
    missing = tmp_path / "missing.tar"
    _one_line_error(_run("cat", str(missing)), "no such file", str(missing))
    _one_line_error(_run("cat", str(shard_dir / "shard-*.tar")), "cat reads one shard", f"names {N_SHARDS}",
                    "wds-async ls")
    _one_line_error(_run("cat", "ftp://h/x.tar"), "unknown URL scheme 'ftp'")
    _one_line_error(_run("cat", "--raw", str(shard_dir / SHARD)), "--raw needs --keys")
    gone = store.url(SHARD, status=404)
    _one_line_error(_run("cat", gone), "404", gone)
