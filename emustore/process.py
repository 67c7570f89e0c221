"""Run the emulated store (:mod:`emustore.server`) in a child process for tests and benchmarks.

    with StoreProcess(root, Knobs(ttfb=0.05)) as store:
        store.url("shard-000000.tar", bw=20e6)   # per-request knobs as query parameters

    with StoreProcess(root, https=True) as store:     # https://127.0.0.1:PORT/, a throwaway CA
        env = {**os.environ, "SSL_CERT_FILE": store.ca_file}   # for a client process started now

    with StoreProcess(root) as store:                 # ROOT/BUCKET/KEY over the S3 and GCS APIs
        boto3.client("s3", endpoint_url=store.s3_endpoint, config=Config(s3={"addressing_style": "path"}))
        storage.Client(client_options={"api_endpoint": store.gcs_endpoint}, ...)
        store.stats()["bytes_sent"]
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from emustore.server import CA_FILE, Knobs, check_host

if TYPE_CHECKING:
    from typing import Self

__all__ = ["StoreProcess"]

_REPO_ROOT = str(Path(__file__).resolve().parent.parent)


class StoreProcess:
    """Run the store in a child process for the duration of a ``with`` block.

    The child is started with ``sys.executable -m emustore`` from the repository root and is
    terminated (then killed after 3 s) on exit; it also exits by itself if this process dies.

    With ``https=True`` it serves TLS; ``ca_file`` is then the PEM of the CA that signed the server's
    certificate (for 127.0.0.1 and localhost), valid until the store is closed.
    """

    def __init__(self, root: str | os.PathLike[str],
                 knobs: Knobs = Knobs(),  # noqa: B008 - frozen, so one shared default is safe
                 *, host: str = "127.0.0.1",
                 verbose: bool = False, startup_timeout: float = 20.0, https: bool = False) -> None:
        self.root = Path(root)
        self.knobs = knobs
        self.https = https
        self.host = check_host(host)
        self.verbose = verbose
        self.startup_timeout = startup_timeout
        self.port: int | None = None
        self.stderr = ""  # the child's stderr, filled in by close()
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: str | None = None

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def start(self) -> None:
        if self._proc is not None:
            raise RuntimeError("StoreProcess is already started")
        self._tmp = tempfile.mkdtemp(prefix="wds-store-")
        port_file = os.path.join(self._tmp, "port")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [_REPO_ROOT, env.get("PYTHONPATH")]))
        cmd = [sys.executable, "-m", "emustore", "--root", str(self.root), "--host", self.host,
               "--port", "0", "--port-file", port_file, "--exit-with-parent", *self.knobs.to_args()]
        if self.verbose:
            cmd.append("--verbose")
        if self.https:
            cmd += ["--https", "--cert-dir", self._tmp]
        try:
            with open(os.path.join(self._tmp, "stderr"), "wb") as err:
                self._proc = subprocess.Popen(cmd, cwd=_REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=err)
            self.port = self._wait_ready(self._proc, port_file)
        except BaseException:
            self.close()
            raise

    def _wait_ready(self, proc: subprocess.Popen[bytes], port_file: str) -> int:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            rc = proc.poll()
            if rc is not None:
                raise RuntimeError(f"store process exited with status {rc} before it was ready; "
                                   f"stderr:\n{self._read_stderr()}")
            try:
                with open(port_file) as f:
                    return int(f.read())
            except FileNotFoundError:
                time.sleep(0.02)
        raise TimeoutError(f"store process not ready after {self.startup_timeout} s; "
                           f"stderr:\n{self._read_stderr()}")

    def _read_stderr(self) -> str:
        if self._tmp is None:
            return ""
        try:
            with open(os.path.join(self._tmp, "stderr"), errors="replace") as f:
                return f.read()
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after 3 s) and reap it; idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._tmp is not None:
            self.stderr = self._read_stderr()
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("StoreProcess is not running")
        return f"{'https' if self.https else 'http'}://{self.host}:{self.port}/"

    @property
    def s3_endpoint(self) -> str:
        """The S3 endpoint (``endpoint_url``; path-style addressing): ``http(s)://127.0.0.1:PORT``."""
        return self.base_url.rstrip("/")

    @property
    def gcs_endpoint(self) -> str:
        """The GCS JSON API endpoint (``client_options={"api_endpoint": ...}``): the same base URL."""
        return self.base_url.rstrip("/")

    @property
    def ca_file(self) -> str:
        """The CA certificate (PEM) that clients of an https store must trust."""
        if not self.https:
            raise RuntimeError("the store serves plain http: StoreProcess(..., https=True) for TLS")
        if self._tmp is None or self.port is None:
            raise RuntimeError("StoreProcess is not running")
        return os.path.join(self._tmp, CA_FILE)

    def url(self, name: str = "", **query: object) -> str:
        """The URL of ``name``; keyword arguments become per-request knobs, e.g. ``ttfb=0.05``."""
        url = self.base_url + urllib.parse.quote(name.lstrip("/"))
        if query:
            url += "?" + urllib.parse.urlencode({k: _query_value(v) for k, v in query.items()})
        return url

    def stats(self) -> dict[str, Any]:
        """The server's counters (``GET /_stats``), fetched synchronously."""
        context = ssl.create_default_context(cafile=self.ca_file) if self.https else None
        with urllib.request.urlopen(self.url("_stats"), timeout=10, context=context) as resp:
            return json.loads(resp.read())  # type: ignore[no-any-return]


def _query_value(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return repr(value) if isinstance(value, float) else str(value)
