"""The loader against the emulated store over TLS, trusted through ``SSL_CERT_FILE`` or ``ca_file``.

aiohttp builds its default SSL context (which reads ``SSL_CERT_FILE``) when it is imported, so the
variable must be in the environment of the process that starts: the trusting reader runs in a child.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import wds_async as wds
from emustore import StoreProcess

SHARD = "shard-000000.tar"
READ = ("import sys, wds_async\n"
        "ds = wds_async.WebDataset(sys.argv[1], nodesplitter=None, workersplitter=None)\n"
        "print(sum(1 for _ in ds))\n")


@pytest.fixture(scope="module")
def tls_store(shard_dir: Path) -> Iterator[StoreProcess]:
    with StoreProcess(shard_dir, https=True) as store:
        yield store


def test_loader_reads_a_tls_store_trusted_by_ssl_cert_file(tls_store: StoreProcess,
                                                          manifest: dict) -> None:  # type: ignore[type-arg]
    env = {**os.environ, "SSL_CERT_FILE": tls_store.ca_file, "PYTHONWARNINGS": "error"}
    out = subprocess.run([sys.executable, "-c", READ, tls_store.base_url + SHARD], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == manifest["shards"][0]["samples"]


def test_loader_trusts_a_ca_file_given_as_a_backend_option(tls_store: StoreProcess,
                                                           manifest: dict) -> None:  # type: ignore[type-arg]
    ds = wds.WebDataset(tls_store.base_url + SHARD, nodesplitter=None, workersplitter=None,
                        backend_options={"ca_file": tls_store.ca_file})
    assert sum(1 for _ in ds) == manifest["shards"][0]["samples"]


def test_loader_without_the_ca_fails_at_once_and_says_what_to_do(tls_store: StoreProcess) -> None:
    ds = wds.WebDataset(tls_store.base_url + SHARD, nodesplitter=None, workersplitter=None)  # default retries
    with pytest.raises(wds.BackendError) as info:
        list(ds)
    assert not isinstance(info.value, wds.TransientError)  # a certificate does not get better by retrying
    message = str(info.value)
    assert "certificate verif" in message and "ca_file" in message and "SSL_CERT_FILE" in message
    assert tls_store.base_url + SHARD in message
    assert ds.stats()["retries"] == 0
