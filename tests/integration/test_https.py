"""The loader against the emulated store over TLS, trusted through ``SSL_CERT_FILE``.

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
from benchmarks.store_process import StoreProcess

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


def test_loader_without_the_ca_names_the_certificate_error(tls_store: StoreProcess) -> None:
    ds = wds.WebDataset(tls_store.base_url + SHARD, nodesplitter=None, workersplitter=None,
                        retry=wds.RetryPolicy(attempts=1))
    with pytest.raises(wds.WdsError) as info:
        list(ds)
    message = str(info.value)
    assert "certificate verify failed" in message
    assert tls_store.base_url + SHARD in message
