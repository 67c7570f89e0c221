"""``scripts/clean.sh`` and ``scripts/demo.sh --clean``: what the demo leaves in a checkout, removed on request."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A stand-in checkout: the scripts, and what commands 1 and 2 leave behind."""
    shutil.copytree(SCRIPTS, tmp_path / "scripts")
    for folder in (".bench/shards", ".venv/bin", ".servers/node_modules"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "file").write_bytes(b"x" * 1000)
    (tmp_path / "README.md").write_text("kept\n")
    return tmp_path


def _run(checkout: Path, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(checkout / "scripts" / script), *args], capture_output=True, text=True,
                          timeout=60, cwd="/", check=False)


def test_clean_removes_the_bench_folder_only(checkout: Path) -> None:
    done = _run(checkout, "clean.sh")
    assert done.returncode == 0, done.stderr
    assert "removed .bench/" in done.stdout
    assert not (checkout / ".bench").exists()
    assert (checkout / ".venv/bin/file").exists() and (checkout / ".servers").exists()
    assert (checkout / "README.md").read_text() == "kept\n"
    again = _run(checkout, "clean.sh")
    assert again.returncode == 0 and "nothing to remove" in again.stdout


def test_demo_clean_all_also_removes_venv_and_servers(checkout: Path) -> None:
    done = _run(checkout, "demo.sh", "--clean", "--all")  # never reaches the install: --clean comes first
    assert done.returncode == 0, done.stderr
    assert not any((checkout / p).exists() for p in (".bench", ".venv", ".servers"))
    assert (checkout / "README.md").exists() and (checkout / "scripts/demo.sh").exists()


def test_clean_rejects_unknown_arguments(checkout: Path) -> None:
    done = _run(checkout, "clean.sh", "--everything")
    assert done.returncode == 2 and "unknown argument" in done.stderr
    assert (checkout / ".bench").exists()
