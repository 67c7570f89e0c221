"""The contract suite for ``http://`` against the emulated store (emustore) on 127.0.0.1.

The store's plain face serves a folder with Range, ETag and ``If-Match``; plain http(s) has no listing
API, so the glob cases check that ``list()`` refuses and skip (``lists=False``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from emustore import Knobs, StoreProcess
from tests.backends.contract import BackendContract, ContractEnv
from wds_async.backends.http import HttpBackend


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, StoreProcess]]:
    root = tmp_path_factory.mktemp("http-store")
    with StoreProcess(root, Knobs()) as store:
        yield root, store


class TestHttpBackend(BackendContract):
    @pytest.fixture()
    def env(self, served: tuple[Path, StoreProcess]) -> ContractEnv:
        root, store = served
        prefix = f"t{uuid.uuid4().hex[:12]}"  # a folder per test, as the cloud suites use a bucket per test

        def put(name: str, data: bytes) -> None:
            path = root / prefix / name
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".wds-tmp-{path.name}")  # the store maps files: never rewrite one in place
            tmp.write_bytes(data)
            os.replace(tmp, path)

        return ContractEnv(
            make_backend=lambda max_connections=32: HttpBackend(max_connections=max_connections),
            url=lambda name: f"{store.base_url}{prefix}/{name}",
            put=put,
            dataset_options={},
            lists=False,
        )
