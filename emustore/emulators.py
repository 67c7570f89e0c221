"""Start and stop the local cloud emulators the backend tests talk to, on 127.0.0.1 only.

* S3: ``moto_server`` (moto in server mode);
* GCS: ``gcp-storage-emulator start --in-memory`` (serves one request at a time: keep its tests light);
* Azure: Azurite's ``azurite-blob`` from npm, installed by ``scripts/install.sh`` under ``.servers/``.

Each is a child process on a free port, waited for by polling the port, and terminated (then killed)
afterwards. Used by the backend tests (through ``tests/emulators.py``, which adds the skip-or-fail policy) and by
``benchmarks/cloud.py``. ``PIDS`` maps each running emulator's URL to its process id, so a benchmark
can read the server's CPU time.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"

AZURITE_ACCOUNT = "devstoreaccount1"
# The well-known Azurite development key (public, documented by Azurite; not a secret).
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


#: URL of each running emulator -> its process id.
PIDS: dict[str, int] = {}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"exited with status {proc.returncode}: {log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"not listening on {HOST}:{port} after {timeout:.0f} s: {log.read_text(errors='replace')[-2000:]}")


@contextmanager
def _serve(name: str, argv: Sequence[str], port: int, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run ``argv`` until the block exits; yields ``http://127.0.0.1:PORT``."""
    workdir = Path(tempfile.mkdtemp(prefix=f"wds-{name}-"))
    log = workdir / "log"
    with open(log, "wb") as out:
        try:
            proc = subprocess.Popen(list(argv), cwd=workdir, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
                                    start_new_session=True)
        except OSError as exc:
            raise RuntimeError(f"cannot run {argv[0]}: {exc}") from exc
    url = f"http://{HOST}:{port}"
    try:
        _wait_for_port(port, proc, log)
        PIDS[url] = proc.pid
        yield url
    finally:
        PIDS.pop(url, None)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


def _bin(name: str) -> str | None:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


@contextmanager
def moto_server() -> Iterator[str]:
    exe = _bin("moto_server")
    if exe is None:
        raise RuntimeError("moto_server not found: pip install 'moto[server]'")
    port = free_port()
    with _serve("moto", [exe, "-H", HOST, "-p", str(port)], port, MOTO_ENV) as url:
        yield url


@contextmanager
def gcs_emulator() -> Iterator[str]:
    exe = _bin("gcp-storage-emulator")
    if exe is None:
        raise RuntimeError("gcp-storage-emulator not found: pip install gcp-storage-emulator")
    port = free_port()
    with _serve("gcs", [exe, "start", "--host", HOST, "--port", str(port), "--in-memory"], port) as url:
        yield url


@contextmanager
def azurite() -> Iterator[str]:
    exe = REPO / ".servers" / "node_modules" / ".bin" / "azurite-blob"
    if not exe.exists():
        found = shutil.which("azurite-blob")
        if found is None:
            raise RuntimeError("azurite-blob not found: run scripts/install.sh (npm install azurite under .servers/)")
        exe = Path(found)
    port = free_port()
    argv = [str(exe), "--blobHost", HOST, "--blobPort", str(port), "--inMemoryPersistence", "--disableTelemetry",
            "--skipApiVersionCheck", "--silent"]
    with _serve("azurite", argv, port) as url:
        yield url


def azurite_connection_string(endpoint: str) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};")
