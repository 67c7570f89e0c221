"""The contract suite for ``http://`` against the emulated store (emustore) on 127.0.0.1.

The store's plain face serves a folder with Range, ETag and ``If-Match``; plain http(s) has no listing
API, so the glob cases check that ``list()`` refuses and skip (``lists=False``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from emustore import Knobs, StoreProcess
from tests.backends.contract import BackendContract, ContractEnv
from wds_async.backends.http import HttpBackend


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, StoreProcess]]:
    root = tmp_path_factory.mktemp("http-store")
    with StoreProcess(root, Knobs()) as store:
        yield root, store


def http_env(served: tuple[Path, StoreProcess], client: str | None = None) -> ContractEnv:
    """The contract's environment on the emulated store, with the backend's default client or the one named."""
    root, store = served
    prefix = f"t{uuid.uuid4().hex[:12]}"  # a folder per test, as the cloud suites use a bucket per test

    def put(name: str, data: bytes) -> None:
        path = root / prefix / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".wds-tmp-{path.name}")  # the store maps files: never rewrite one in place
        tmp.write_bytes(data)
        os.replace(tmp, path)

    options: dict[str, Any] = {} if client is None else {"client": client}
    return ContractEnv(
        make_backend=lambda max_connections=32: HttpBackend(max_connections=max_connections, **options),
        url=lambda name: f"{store.base_url}{prefix}/{name}",
        put=put,
        dataset_options={"backend_options": options} if options else {},
        lists=False,
    )


class TestHttpBackend(BackendContract):
    @pytest.fixture()
    def env(self, served: tuple[Path, StoreProcess]) -> ContractEnv:
        return http_env(served)


class TestHttpBackendThroughAiohttp(BackendContract):
    """The same contract with ``client="aiohttp"``: the path that a proxy from the environment, a redirect or the
    option takes, which the default (the builtin client) no longer exercises."""

    @pytest.fixture()
    def env(self, served: tuple[Path, StoreProcess]) -> ContractEnv:
        return http_env(served, "aiohttp")
