"""Run peers beside wds-async on the same shards: each in a fresh process with its own client.

:func:`run_peers` is what ``wds-async bench --peers`` calls after its own phases. For each peer it
finds the interpreter (this one, or the peer's virtual environment), prepares the peer's own copy of
the samples when it reads another format (once per dataset: the copy is kept in the store, under
``s3://BUCKET/_peers/NAME/FINGERPRINT``), then runs the peer's runner once per mode and turns the
runner's JSON into a table row. A peer that is not installed, cannot be built or fails gets a row that
says why; nothing is dropped.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

from . import PEERS, VENVS, Peer
from ._venv import VenvError, ensure_venv

__all__ = ["PeerJob", "run_peers", "store_urls"]

_FORMAT = "peers/1"  # bump when a converted copy's layout changes
READY = "_wds_async_ready"
Status = Callable[[str, float], None]


def store_urls(urls: list[str], endpoint: str | None) -> dict[str, list[str] | None]:
    """The same objects as each peer scheme names them: ``s3``, ``gs`` (the emulated store serves its
    GCS JSON face on the same endpoint) and ``http`` (path-style object URLs on the endpoint)."""
    parsed = [urllib.parse.urlsplit(u) for u in urls]
    if any(p.scheme != "s3" or not p.netloc or not p.path.strip("/") for p in parsed):
        raise ValueError("bench --peers reads s3://BUCKET/KEY shard URLs (the peers are S3 and GCS clients); "
                         "serve the shards from an S3-compatible store and pass their s3:// URLs")
    out: dict[str, list[str] | None] = {"s3": urls, "gs": None, "http": None}
    if endpoint:
        base = endpoint.rstrip("/")
        out["gs"] = [f"gs://{p.netloc}{p.path}" for p in parsed]
        out["http"] = [f"{base}/{p.netloc}{p.path}" for p in parsed]
    return out


class PeerJob:
    """What every peer of one bench run shares: the shards, the store, the expected result."""

    def __init__(self, urls: list[str], *, connections: int, endpoint: str | None, ca_file: str | None,
                 expected_samples: int | None, expected_digest: str | None, timeout: float = 1800,
                 status: Status | None = None, log: Callable[[str], None] | None = None) -> None:
        self.urls = urls
        self.connections = connections
        self.endpoint = endpoint
        self.ca_file = ca_file
        self.expected_samples = expected_samples
        self.expected_digest = expected_digest
        self.timeout = timeout
        self.status = status
        self.log = log or (lambda text: print(text, file=sys.stderr, flush=True))
        self.names = store_urls(urls, endpoint)
        # Our own requests (sizes, the one-time copy for a conversion) trust the same CA as the peers.
        self.options = {"ca_file": ca_file} if ca_file else None
        self.sizes = _sizes(urls, self.options)
        self.total_bytes = sum(self.sizes)

    # -- the environment a runner starts with -------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("AWS_ACCESS_KEY_ID", "wds-async-bench")
        env.setdefault("AWS_SECRET_ACCESS_KEY", "wds-async-bench")
        env.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        env["PYTHONWARNINGS"] = "ignore"
        env.pop("PYTHONPATH", None)  # a peer's venv must not see our packages
        if self.endpoint:
            env["AWS_ENDPOINT_URL_S3"] = env["AWS_ENDPOINT_URL"] = self.endpoint
        if self.ca_file:
            for name in ("AWS_CA_BUNDLE", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
                env[name] = self.ca_file
        return env

    def dataset_url(self, peer: Peer) -> str:
        """Where ``peer``'s converted copy of these shards lives in the store."""
        h = hashlib.sha256(json.dumps([_FORMAT, peer.name, self.urls, self.sizes]).encode()).hexdigest()[:16]
        bucket = urllib.parse.urlsplit(self.urls[0]).netloc
        return f"s3://{bucket}/_peers/{peer.name}/{h}"

    # -- one peer --------------------------------------------------------------------------------------

    def run(self, name: str) -> list[dict[str, Any]]:
        """One row per mode of peer ``name`` (one row with ``error`` when it cannot run at all)."""
        peer = PEERS[name]
        try:
            python = self._python(peer)
            dataset = self._prepare(peer, python) if peer.prepare else None
        except _Unavailable as exc:
            return [self._row(peer, peer.modes[0], {"error": str(exc)}, 0.0)]
        rows = []
        for mode in peer.modes:
            started = time.monotonic()
            result = self._runner(peer, python, {"action": "run", "mode": mode, "dataset": dataset})
            rows.append(self._row(peer, mode, result, time.monotonic() - started))
        return rows

    def _python(self, peer: Peer) -> str:
        if peer.venv is None:
            if peer.imports and importlib.util.find_spec(peer.imports) is None:
                raise _Unavailable(f"not installed here: {peer.install}")
            return sys.executable
        try:
            return str(ensure_venv(peer.venv, VENVS[peer.venv], log=self.log))
        except VenvError as exc:
            raise _Unavailable(f"its environment could not be built: {exc}") from None

    def _prepare(self, peer: Peer, python: str) -> str:
        dataset = self.dataset_url(peer)
        if _exists(f"{dataset}/{READY}", self.options):
            return dataset
        self.log(f"{peer.name}: converting the shards to its format once, into {dataset}")
        with tempfile.TemporaryDirectory(prefix="wds-peers-src-") as source:
            _download(self.urls, source, self.connections, self.options)
            result = self._runner(peer, python, {"action": "prepare", "mode": "defaults", "dataset": dataset,
                                                 "source_dir": source})
        if result.get("error"):
            raise _Unavailable(f"preparing its copy failed: {result['error']}")
        if not _exists(f"{dataset}/{READY}", self.options):
            raise _Unavailable(f"its prepare step did not write {dataset}/{READY}")
        return dataset

    def _runner(self, peer: Peer, python: str, extra: dict[str, Any]) -> dict[str, Any]:
        label = f"{peer.name} {extra['action'] if extra['action'] != 'run' else extra['mode']}"
        with tempfile.TemporaryDirectory(prefix=f"wds-peer-{peer.name}-", dir=_scratch_root()) as workdir:
            job = {"peer": peer.name, "connections": self.connections, "urls": self.names["s3"],
                   "gs_urls": self.names["gs"], "http_urls": self.names["http"], "endpoint": self.endpoint,
                   "ca_file": self.ca_file, "workdir": os.path.join(workdir, "work"),
                   "expected": {"samples": self.expected_samples, "bytes": self.total_bytes}, **extra}
            os.makedirs(job["workdir"])
            job_file = os.path.join(workdir, "job.json")
            with open(job_file, "w") as fh:
                json.dump(job, fh)
            err_file = os.path.join(workdir, "stderr")
            with open(err_file, "w") as err, subprocess.Popen(
                    [python, peer.script, job_file], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=err, text=True, env=self.env(), cwd=workdir, start_new_session=True) as proc:
                started = time.monotonic()
                out = self._wait(proc, label, started)
            stderr = Path(err_file).read_text(errors="replace")
        lines = [ln for ln in (out or "").strip().splitlines() if ln.startswith("{")]
        if out is None:
            return {"error": f"timed out after {self.timeout:.0f} s"}
        if not lines:
            tail = " | ".join(stderr.strip().splitlines()[-3:])
            return {"error": f"runner exited {proc.returncode} without a result: {tail[-600:]}"}
        result: dict[str, Any] = json.loads(lines[-1])
        result["tree_rss"] = self.tree_rss
        if proc.returncode != 0 and not result.get("error"):
            result["error"] = f"runner exited {proc.returncode}"
        return result

    def _wait(self, proc: subprocess.Popen[str], label: str, started: float) -> str | None:
        """Wait for the runner; meanwhile sample its process tree's memory (``tree_rss``) 4 times a second."""
        self.tree_rss = 0
        while True:
            self.tree_rss = max(self.tree_rss, _tree_rss(proc.pid))
            try:
                out, _ = proc.communicate(timeout=0.25)
                return out
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - started
                if elapsed >= self.timeout:
                    _kill_group(proc)
                    return None
                if self.status is not None:
                    self.status(label, elapsed)

    def _row(self, peer: Peer, mode: str, result: dict[str, Any], wall: float) -> dict[str, Any]:
        name = peer.name if len(peer.modes) == 1 else f"{peer.name} ({mode})"
        row: dict[str, Any] = {"name": name, "peer": peer.name, "kind": peer.kind, "mode": mode,
                               "what": peer.what, "settings": result.get("settings", ""),
                               "error": result.get("error"), "process_s": wall}
        if row["error"]:
            return row
        seconds = float(result["seconds"])
        nbytes = result.get("bytes") or self.total_bytes
        samples = result.get("samples")
        # Memory: the larger of the runner's own report (its peak RSS, or its largest waited child's) and
        # the PSS summed over its process tree, sampled 4 times a second (what DataLoader workers hold together).
        row.update(bytes=nbytes, samples=samples, wall_s=seconds, cpu_s=float(result["cpu_s"]),
                   peak_rss=max(int(result.get("peak_rss") or 0), int(result.get("tree_rss") or 0)),
                   mb_s=nbytes / seconds / 1e6,
                   samples_s=samples / seconds if samples is not None else None,
                   cpu_s_per_gb=float(result["cpu_s"]) / (nbytes / 1e9) if nbytes else None)
        row["exactly_once"] = self._exactly_once(peer, result)
        row["connections"] = int(result.get("connections") or self.connections)
        return row

    def _exactly_once(self, peer: Peer, result: dict[str, Any]) -> str:
        if peer.kind == "raw":
            got = result.get("bytes")
            return "yes" if got == self.total_bytes else f"NO ({got} of {self.total_bytes} bytes)"
        samples, digest = result.get("samples"), result.get("keys_digest")
        if self.expected_samples is None or self.expected_digest is None:
            return "?"
        if samples != self.expected_samples:
            return f"NO ({samples} of {self.expected_samples} samples)"
        return "yes" if digest == self.expected_digest else "NO (other samples)"


class _Unavailable(Exception):
    """A peer that cannot run here; the message is the table's reason."""


def _scratch_root() -> str | None:
    """Where runners write their copies: RAM (/dev/shm) when it has room, so no peer pays for a disk."""
    shm = "/dev/shm"
    try:
        free = shutil.disk_usage(shm).free
    except OSError:
        return None
    return shm if free > 4 << 30 else None


def _tree_rss(pid: int) -> int:
    """Bytes resident in process ``pid`` and all its descendants now (0 once it is gone): the sum of their
    PSS (shared pages split between the sharers, so forked workers' common torch is not counted 8 times),
    or of their RSS where PSS cannot be read."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss
        except (psutil.Error, AttributeError):
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
    return total


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.communicate()


def _run(coro: Any) -> Any:
    from ...._loop import run_private

    return run_private(lambda: coro)


def _sizes(urls: list[str], options: dict[str, Any] | None) -> list[int]:
    """Every shard's size, through the loader's own backends (so the same credentials and endpoint)."""
    from ....config import EngineConfig
    from ....io import BackendSet

    async def sizes() -> list[int]:
        backends = BackendSet(EngineConfig(), options=options)
        try:
            out = []
            for url in urls:
                size = await backends.for_url(url).size(url)
                if size is None:
                    raise ValueError(f"{url}: the store gives no size for this object (is it there?)")
                out.append(size)
            return out
        finally:
            await backends.aclose()

    return _run(sizes())  # type: ignore[no-any-return]


def _exists(url: str, options: dict[str, Any] | None) -> bool:
    from ....config import EngineConfig
    from ....errors import NotFound
    from ....io import BackendSet

    async def probe() -> bool:
        backends = BackendSet(EngineConfig(), options=options)
        try:
            return await backends.for_url(url).size(url) is not None
        except NotFound:
            return False
        finally:
            await backends.aclose()

    return _run(probe())  # type: ignore[no-any-return]


def _create(path: str) -> BinaryIO:
    return open(path, "wb")


def _download(urls: list[str], folder: str, connections: int, options: dict[str, Any] | None) -> None:
    """Copy the shards into ``folder`` (their file names), for a peer's one-time conversion."""
    from asyncio import TaskGroup

    from ....io.rawread import raw_backends

    async def copy_all() -> None:
        pending = iter(urls)
        async with raw_backends(connections, options) as backends:

            async def worker() -> None:
                for url in pending:
                    path = os.path.join(folder, url.rstrip("/").rsplit("/", 1)[-1])
                    # Creating and closing (flushing) the file can block on the disk: both in a thread.
                    fh = await asyncio.to_thread(_create, path)
                    try:
                        async with backends.for_url(url).open(url) as stream:
                            async for chunk in stream:
                                fh.write(chunk)
                    finally:
                        await asyncio.to_thread(fh.close)

            async with TaskGroup() as group:
                for _ in range(min(connections, len(urls))):
                    group.create_task(worker())

    _run(copy_all())


def run_peers(urls: list[str], names: list[str], *, connections: int, endpoint: str | None,
              ca_file: str | None, expected_samples: int | None, expected_digest: str | None,
              timeout: float = 1800, status: Status | None = None) -> list[dict[str, Any]]:
    """Rows for each named peer (see :class:`PeerJob`)."""
    job = PeerJob(urls, connections=connections, endpoint=endpoint, ca_file=ca_file,
                  expected_samples=expected_samples, expected_digest=expected_digest, timeout=timeout,
                  status=status)
    rows: list[dict[str, Any]] = []
    for name in names:
        rows += job.run(name)
    return rows
