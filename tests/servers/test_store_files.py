"""The emulated store's file lookup (``emustore.objects.Files.lookup``): a path with no symlink on it is served
without resolving it; a symlink anywhere on the path is resolved, and served only where it stays inside the root."""

from __future__ import annotations

from pathlib import Path

import pytest

from emustore.objects import Files


@pytest.fixture
def files(tmp_path: Path) -> Files:
    root = tmp_path / "root"
    (root / "bucket" / "deep").mkdir(parents=True)
    (root / "bucket" / "deep" / "k.tar").write_bytes(b"nested")
    (root / "top.tar").write_bytes(b"top")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.tar").write_bytes(b"secret")
    (root / "leak").symlink_to(outside)  # a folder that leads out
    (root / "bucket" / "leak.tar").symlink_to(outside / "secret.tar")  # a file that leads out
    (root / "alias").symlink_to(root / "bucket")  # a folder that stays inside
    (root / "bucket" / "alias.tar").symlink_to(root / "top.tar")  # a file that stays inside
    return Files(root)


def _body(files: Files, path: str) -> bytes | None:
    found = files.lookup(path)
    return None if found is None else bytes(found.view)


def test_plain_paths_are_served(files: Files) -> None:
    assert _body(files, "/top.tar") == b"top"
    assert _body(files, "/bucket/deep/k.tar") == b"nested"


def test_symlinks_that_stay_inside_are_served(files: Files) -> None:
    assert _body(files, "/alias/deep/k.tar") == b"nested"
    assert _body(files, "/bucket/alias.tar") == b"top"


def test_symlinks_that_lead_out_are_refused(files: Files) -> None:
    assert _body(files, "/leak/secret.tar") is None
    assert _body(files, "/bucket/leak.tar") is None


def test_missing_and_folder_paths_are_not_objects(files: Files) -> None:
    assert _body(files, "/bucket/nothing.tar") is None
    assert _body(files, "/nowhere/k.tar") is None
    assert _body(files, "/bucket/deep") is None
    assert _body(files, "/top.tar/inside") is None  # a file used as a folder
