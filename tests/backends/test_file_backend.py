"""The contract suite for local files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.backends.contract import BackendContract, ContractEnv, put_in_folder
from wds_async.backends.file import FileBackend


class TestFileBackend(BackendContract):
    @pytest.fixture()
    def env(self, tmp_path: Path) -> ContractEnv:
        return ContractEnv(
            make_backend=lambda max_connections=32: FileBackend(),
            url=lambda name: f"file://{tmp_path}/{name}",
            put=put_in_folder(tmp_path),
            dataset_options={},
        )
