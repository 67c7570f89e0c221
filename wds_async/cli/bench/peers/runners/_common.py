"""What every peer runner shares: reading its job, timing the measured region, printing its result.

A runner is a standalone script, started as ``PYTHON RUNNER.py JOB.json`` by ``wds-async bench --peers``
with the peer's own interpreter (this one, or a virtual environment made for a peer whose pins conflict
with ours). So nothing here imports ``wds_async``; a runner imports this file by path.

The job (JSON):

* ``peer``, ``mode`` (``"defaults"`` or ``"best"``), ``connections`` (the raw tools' concurrency);
* ``urls``: the tar shards as ``s3://BUCKET/KEY`` (``gs_urls``: the same objects as ``gs://``,
  ``http_urls``: as plain http(s) URLs on the store, when it serves them);
* ``endpoint``: the store's base URL (``http(s)://127.0.0.1:PORT``), or null for the real cloud;
  ``ca_file``: the PEM the client must trust for https, or null;
* ``workdir``: a scratch folder the runner may fill (removed afterwards);
* ``dataset``: for a loader that reads its own format, where the converted copy lives (``s3://...``);
* ``expected``: ``{"samples": N, "bytes": B}`` when known;
* ``action``: ``"run"`` (measure), or ``"prepare"`` for a loader that reads its own format: convert
  the tar shards in the local folder ``source_dir`` (the same objects as ``urls``, downloaded once) to
  that format and upload the result under ``dataset``, writing the object ``DATASET/_wds_async_ready``
  last (the orchestrator skips ``prepare`` when that object exists).

The result is the last line of stdout, one JSON object:
``{"bytes", "samples", "seconds", "cpu_s", "peak_rss", "keys_digest", "settings", "error"}``, where
``seconds`` and ``cpu_s`` cover only the measured region (imports, listing and the conversion are not
in it), ``cpu_s`` counts this process and the children it waited for (s5cmd, DataLoader workers), and
``peak_rss`` is the larger of this process's and any waited child's peak resident set, in bytes.
``keys_digest`` is :func:`keys_digest` over every sample's ``SHARD/KEY`` name: equal digests and
counts mean the same samples, each once. A runner whose tool opened more connections at once than the
job's ``connections`` (boto3's TransferManager splits an object into parts on its own) says so in
``"connections"``; its row is then not a candidate for "the fastest raw copy at equal connections".
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing import Self

__all__ = [
    "Timer",
    "epoch_names",
    "filesystem",
    "keys_digest",
    "load_job",
    "own_peak_rss",
    "peak_rss",
    "run",
    "sample_name",
    "stop_workers",
]


def load_job() -> dict[str, Any]:
    """The job the runner was started with (``argv[1]`` is its JSON file)."""
    if len(sys.argv) != 2:
        raise SystemExit(f"usage: {sys.argv[0]} JOB.json")
    with open(sys.argv[1]) as fh:
        return json.load(fh)  # type: ignore[no-any-return]


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def own_peak_rss() -> int:
    """Bytes: this process's peak resident set since it started its program.

    ``VmHWM`` from /proc, not ``ru_maxrss``: Linux carries ``ru_maxrss`` across ``execve``, so a
    process started by a big parent (a benchmark that imported torch) would report the parent's peak.
    """
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def peak_rss() -> int:
    """Bytes: the peak resident set of this process or of the largest child it has waited for."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return max(own_peak_rss(), kids)


class Timer:
    """The measured region: ``with Timer() as t: ...`` then ``t.seconds`` and ``t.cpu_s``."""

    seconds: float = 0.0
    cpu_s: float = 0.0

    def __enter__(self) -> Self:
        self._t0, self._c0 = time.perf_counter(), _cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.perf_counter() - self._t0
        self.cpu_s = _cpu() - self._c0


def sample_name(shard_url: str, key: str) -> str:
    """``SHARD/KEY``: the shard's file name and the sample's WebDataset key."""
    return f"{shard_url.rstrip('/').rsplit('/', 1)[-1]}/{key}"


def keys_digest(names: Iterable[str]) -> str:
    """One hash over the sorted sample names (duplicates included, so a repeat changes it)."""
    h = hashlib.sha256()
    for name in sorted(names):
        h.update(name.encode())
        h.update(b"\n")
    return h.hexdigest()


def run(measure: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Load the job, call ``measure(job)`` and print its result as the last stdout line.

    ``measure`` returns at least ``bytes``, ``samples``, ``seconds`` and ``cpu_s`` (from a
    :class:`Timer`); ``settings`` (what was tuned, in words) and ``keys_digest`` when it has them. An
    exception becomes ``{"error": ...}`` with exit status 1, so the table can say why.
    """
    job = load_job()
    try:
        result = measure(job)
    except BaseException as exc:  # reported, not swallowed: exit status 1
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        print(traceback.format_exc(), file=sys.stderr)
        print(json.dumps({"error": detail[-2000:], "peak_rss": peak_rss()}))
        sys.stdout.flush()
        os._exit(1)  # a peer's stuck threads must not keep the process alive
    result.setdefault("peak_rss", peak_rss())
    result.setdefault("keys_digest", None)
    result.setdefault("settings", "")
    result.setdefault("error", None)
    print(json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # likewise: report and leave, whatever threads a peer left behind


def filesystem(path: str) -> str:
    """``tmpfs (RAM)`` or ``disk (FSTYPE)``: where ``path`` lives, from /proc/mounts."""
    real = os.path.realpath(path)
    best, kind = "", "unknown"
    try:
        with open("/proc/mounts") as fh:
            for line in fh:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) > len(best):
                    best, kind = mount, parts[2]
    except OSError:
        return "unknown filesystem"
    return "tmpfs (RAM)" if kind in ("tmpfs", "ramfs") else f"disk ({kind})"


def stop_workers(iterator: Any) -> None:
    """Join a DataLoader iterator's workers now (their CPU is then counted), also after an error: ``run()``
    leaves with ``os._exit``, and a worker never told the iteration ended can hang the process group."""
    shutdown = getattr(iterator, "_shutdown_workers", None)  # absent without workers
    if shutdown is not None:
        shutdown()


def epoch_names(loader: Any, names_of: Callable[[Any], Iterable[str]]) -> list[str]:
    """One epoch of a DataLoader: the sample names ``names_of(item)`` gives for every item it yields.

    Its workers are joined before this returns (after an error too, see :func:`stop_workers`), so when
    called inside a :class:`Timer` their CPU is counted in the measured region.
    """
    names: list[str] = []
    iterator = iter(loader)
    try:
        for item in iterator:
            names.extend(names_of(item))
    finally:
        stop_workers(iterator)
    return names
