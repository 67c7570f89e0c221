"""Fixtures of the node service tests: a short socket directory (Unix socket paths are limited to 107
bytes, and pytest's tmp_path can be long) and a service subprocess started on it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from wds_async.service import ServiceHandle, start_service


@pytest.fixture
def sock_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="wds-svc-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def service(sock_dir: str) -> Iterator[ServiceHandle]:
    """A service with a small ring (256 KiB), so the 2 MiB test epoch wraps it several times."""
    with start_service(os.path.join(sock_dir, "run", "svc.sock"), ring_bytes=256 << 10) as handle:
        yield handle
