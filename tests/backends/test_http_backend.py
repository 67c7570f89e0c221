"""The contract suite for ``http://`` against the emulated store (emustore) on 127.0.0.1.

The store's plain face serves a folder with Range, ETag and ``If-Match``; plain http(s) has no listing
API, so the glob cases check that ``list()`` refuses and skip (``lists=False``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


#: A fresh process that reads shards over http with the defaults (the builtin client), then a missing shard and a
#: dead port, and reports the samples, the two errors and whether aiohttp was imported.
_NO_AIOHTTP = r"""
import json, socket, sys
import wds_async as wds
from wds_async.backends._errors import client_errors
urls = json.loads(sys.argv[1])
samples = sum(1 for _ in wds.WebDataset(urls, nodesplitter=None, workersplitter=None))
errors = []
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}/shard.tar"  # bound, not listening: refused
for url in (urls[0].rsplit("/", 1)[0] + "/missing.tar", dead):
    try:
        list(wds.WebDataset([url], nodesplitter=None, workersplitter=None))
    except wds.WdsError as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
print(json.dumps({"samples": samples, "errors": errors, "aiohttp": "aiohttp" in sys.modules,
                  "client_errors": [t.__name__ for t in client_errors()]}))
"""


def test_reading_through_the_builtin_client_never_imports_aiohttp(store: StoreProcess, manifest: dict[str, Any]) -> None:
    """aiohttp is most of what a process's first http dataset cost before its first request (about 190 ms on two
    cores); the builtin client, which sends every GET by default, raises its own error types, so a job reading
    shards (and meeting a 404 and a refused connection) never imports it."""
    urls = [store.url(s["name"]) for s in manifest["shards"][:3]]
    out = subprocess.run([sys.executable, "-c", _NO_AIOHTTP, json.dumps(urls)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["samples"] == sum(s["samples"] for s in manifest["shards"][:3])
    missing, refused = got["errors"]
    assert missing.startswith("NotFound") and "missing.tar" in missing, missing
    assert refused.startswith("TransientError") and "connection failed" in refused and "shard.tar" in refused, refused
    assert got["aiohttp"] is False
    assert got["client_errors"] == ["ClientError"]
