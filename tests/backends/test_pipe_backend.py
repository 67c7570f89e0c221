"""The contract suite for ``pipe:cat PATH``.

A command's output has no size, no ranges and no listing (``sized``, ``ranged`` and ``lists`` are off:
the suite checks the answers a pipe gives instead), and a missing file is the command's failure, a
:class:`~wds_async.errors.PipeError` with ``cat``'s stderr, rather than NotFound (which a pipe raises
only when the command itself does not exist).
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

import wds_async as wds
from tests.backends.contract import BackendContract, ContractEnv, put_in_folder
from wds_async.backends.pipe import PipeBackend


class TestPipeBackend(BackendContract):
    @pytest.fixture()
    def env(self, tmp_path: Path) -> ContractEnv:
        return ContractEnv(
            make_backend=lambda max_connections=32: PipeBackend(),
            url=lambda name: f"pipe:cat {shlex.quote(str(tmp_path / name))}",
            put=put_in_folder(tmp_path),
            dataset_options={},
            lists=False,
            sized=False,
            ranged=False,
            missing=wds.PipeError,
        )
