"""The contract suite for local files."""

from __future__ import annotations

from pathlib import Path

import pytest
from wds_async.backends.file import FileBackend

from tests.backends.contract import BackendContract, ContractEnv


class TestFileBackend(BackendContract):
    @pytest.fixture()
    def env(self, tmp_path: Path) -> ContractEnv:
        def put(name: str, data: bytes) -> None:
            path = tmp_path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

        return ContractEnv(
            make_backend=lambda max_connections=32: FileBackend(),
            url=lambda name: f"file://{tmp_path}/{name}",
            put=put,
            dataset_options={},
        )
