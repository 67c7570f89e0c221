"""Peer runner: ``gsutil -m cp`` of every shard once, over the GCS JSON API, into the job's workdir.

Runs with the interpreter of gsutil's own virtual environment (``VENVS["gsutil"]``: gsutil pins
google-auth and friends). gsutil is pointed at the store by a boto config file written here
(``BOTO_CONFIG``, so no user or system config is read)::

    [Credentials]  gs_json_host = 127.0.0.1, gs_json_port = PORT      (nothing else: anonymous)
    [Boto]         https_validate_certificates = True, ca_certificates_file = CA
    [GSUtil]       prefer_api = json, parallel_process_count = P, parallel_thread_count = T (P x T = C),
                   sliced_object_download_threshold = 0, software_update_check_period = 0,
                   disable_analytics_prompt = True, state_dir = WORKDIR/state

Measured: ``gsutil -m cp URL... WORKDIR/data/`` with the job's ``gs://`` URLs as arguments (gsutil's
start-up is in the measured time: it is one process). Not ``cp -I`` (URLs on stdin): since gsutil 5.36
that copies only the first two (GoogleCloudPlatform/gsutil issue 1908). When the URLs would not fit on a
command line, a folder whose every object is in the job is named by ``FOLDER/*`` instead.

Unmeasured, before: ``gsutil ls -l FOLDER/*`` gives every object's size (afterwards each file must have
that size, or the run is an error), and ``gsutil stat`` of one shard shows which hashes the store's
metadata carries. gsutil checks every download against the object's MD5 when it has one, else its
CRC32C, which is slow in pure Python: with crcmod's C extension missing, gsutil's default
``check_hashes = if_fast_else_fail`` refuses such objects. The settings say which applied.

gsutil's JSON API client only speaks https (``gslib/gcs_json_api.py``: ``self.http_base = 'https://'``;
``gs_json_host``/``gs_json_port`` set only the host and port), so an ``http://`` endpoint is an error
that says so. No credentials are configured, so gsutil sends anonymous requests and never asks a
metadata server or token endpoint for one (credential variables and proxies are removed from its
environment).
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import urllib.parse
from pathlib import Path
from typing import Any

try:  # run as a script (its folder is first on sys.path), or imported as part of the package
    from _common import Timer, filesystem, run
except ImportError:
    from ._common import Timer, filesystem, run

INSTALL = ("pip install gsutil==5.38 in its own virtual environment (wds-async bench --peers gsutil "
           "builds it: wds_async.cli.bench.peers.VENVS['gsutil'])")
HTTP_ONLY_HTTPS = ("gsutil cannot reach an http:// endpoint: its GCS JSON API client builds every URL "
                   "as 'https://' + gs_json_host + ':' + gs_json_port (gslib/gcs_json_api.py sets "
                   "http_base = 'https://' with no setting to change it); run the store with --https")

# Variables that could make gsutil look for credentials, a proxy or another config than ours.
_DROP_PREFIXES = ("CLOUDSDK_", "GCE_", "GS_", "GOOGLE_", "BOTO_")
_DROP = {"http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY",
         "OAUTH2_CLIENT_ID", "OAUTH2_CLIENT_SECRET", "AWS_CREDENTIAL_FILE"}


def gsutil_binary() -> str:
    """The gsutil of this interpreter's environment; never one on PATH (a Cloud SDK's gsutil is a wrapper
    that brings gcloud's configuration and credentials, and not the pinned version)."""
    beside = Path(sys.executable).parent / "gsutil"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise RuntimeError(f"gsutil is not installed next to {sys.executable}: {INSTALL}")


def crcmod_compiled() -> bool | None:
    """Whether crcmod's C extension loads in this interpreter (gsutil's crc32c speed); None: no crcmod."""
    try:
        from crcmod.crcmod import _usingExtension  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    return bool(_usingExtension)


def split_connections(connections: int) -> tuple[int, int]:
    """(processes, threads) with processes x threads = connections: as many processes as there are
    CPUs (gsutil's own default on Linux), but only a divisor of ``connections``."""
    cpus = os.cpu_count() or 1
    processes = max(p for p in range(1, min(cpus, connections) + 1) if connections % p == 0)
    return processes, connections // processes


def write_config(path: Path, job: dict[str, Any], state: Path, processes: int, threads: int) -> None:
    config = configparser.ConfigParser(interpolation=None)
    config["Credentials"] = {}
    config["Boto"] = {"https_validate_certificates": "True"}
    config["GSUtil"] = {
        "prefer_api": "json",
        "parallel_process_count": str(processes),
        "parallel_thread_count": str(threads),
        "sliced_object_download_threshold": "0",  # one stream per object: connections = P x T
        "software_update_check_period": "0",  # no update check (it would go to the internet)
        "disable_analytics_prompt": "True",
        "state_dir": str(state),
    }
    endpoint = job.get("endpoint")
    if endpoint:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme != "https":
            raise RuntimeError(HTTP_ONLY_HTTPS)
        if parts.path.strip("/"):
            raise RuntimeError(f"gsutil's gs_json_host takes a host and port, not a path: {endpoint}")
        config["Credentials"]["gs_json_host"] = parts.hostname or "127.0.0.1"
        config["Credentials"]["gs_json_port"] = str(parts.port or 443)
    if job.get("ca_file"):
        config["Boto"]["ca_certificates_file"] = str(job["ca_file"])
    with open(path, "w") as fh:
        config.write(fh)


def tool_env(boto_config: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP and not k.startswith(_DROP_PREFIXES)}
    env["BOTO_CONFIG"] = str(boto_config)  # the only config boto reads when set
    env["HOME"] = str(home)  # no ~/.boto, ~/.gsutil or ~/.config/gcloud of the user's
    env["CLOUDSDK_CONFIG"] = str(home / "gcloud")
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["GCE_METADATA_HOST"] = env["GCE_METADATA_IP"] = "127.0.0.1:9"  # should anything ask: a closed port
    env["NO_GCE_CHECK"] = "True"
    env["PYTHONWARNINGS"] = "ignore"
    return env


def split(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "gs" or not parts.netloc or not parts.path.strip("/"):
        raise ValueError(f"not a gs://BUCKET/OBJECT URL: {url}")
    return parts.netloc, parts.path.lstrip("/")


def sizes(exe: str, urls: list[str], env: dict[str, str]) -> tuple[dict[str, int], dict[str, set[str]]]:
    """Every object's size from ``gsutil ls -l FOLDER/*`` (unmeasured; a missing object is an error),
    and every object listed in each folder."""
    wanted = set(urls)
    found: dict[str, int] = {}
    listed: dict[str, set[str]] = {}
    for folder in sorted({url.rsplit("/", 1)[0] for url in urls}):
        proc = subprocess.run([exe, "ls", "-l", folder + "/*"], env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True)
        if proc.returncode != 0 and "matched no objects" not in proc.stderr:
            raise RuntimeError(f"gsutil ls -l {folder}/* failed (exit {proc.returncode}): "
                               f"{' | '.join(proc.stderr.strip().splitlines()[-4:])[-1500:]}")
        listed[folder] = set()
        for line in proc.stdout.splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[0].isdigit() and fields[2].startswith("gs://"):
                listed[folder].add(fields[2])
                if fields[2] in wanted:
                    found[fields[2]] = int(fields[0])
    missing = [u for u in urls if u not in found]
    if missing:
        raise RuntimeError(f"{len(missing)} of {len(urls)} objects are not in the store "
                           f"(gsutil ls does not list them), e.g. {missing[0]}")
    return found, listed


def object_hashes(exe: str, url: str, env: dict[str, str]) -> set[str]:
    """Which of ``md5``/``crc32c`` the store's metadata gives for ``url`` (from ``gsutil stat``)."""
    proc = subprocess.run([exe, "stat", url], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"gsutil stat {url} failed (exit {proc.returncode}): "
                           f"{' | '.join(proc.stderr.strip().splitlines()[-4:])[-1500:]}")
    found = set()
    for line in proc.stdout.splitlines():
        name, _, value = line.strip().partition(":")
        if name in ("Hash (md5)", "Hash (crc32c)") and value.strip():
            found.add("md5" if "md5" in name else "crc32c")
    return found


def hash_check(in_store: set[str], crc_compiled: bool | None) -> str:
    """In words: how gsutil (default ``check_hashes = if_fast_else_fail``) validated the downloads."""
    crc = ("crcmod C extension compiled" if crc_compiled else
           "crcmod C extension NOT compiled (pure-Python CRC32C)" if crc_compiled is False else "crcmod missing")
    if "md5" in in_store:
        how = "each download checked against the object's MD5 (hashlib)"
    elif "crc32c" in in_store:
        how = "each download checked against the object's CRC32C"
    else:
        how = "no hash in the store's metadata, so nothing checked"
    return f"check_hashes=if_fast_else_fail (default): {how}; {crc}"


_MAX_ARGS = 256 << 10  # bytes of URLs on one command line (Linux allows 2 MiB of arguments and environment)


def sources(urls: list[str], listed: dict[str, set[str]]) -> list[str]:
    """The cp sources: the URLs themselves, or ``FOLDER/*`` for whole folders when they are too many."""
    if sum(len(u) + 1 for u in urls) <= _MAX_ARGS:
        return urls
    out: list[str] = []
    by_folder: dict[str, list[str]] = {}
    for url in urls:
        by_folder.setdefault(url.rsplit("/", 1)[0], []).append(url)
    for folder, mine in by_folder.items():
        out += [folder + "/*"] if set(mine) == listed.get(folder) else mine
    if sum(len(u) + 1 for u in out) > _MAX_ARGS:
        raise RuntimeError(f"{len(urls)} URLs do not fit on gsutil's command line and are not whole folders "
                           "(cp -I, which reads them from stdin, copies only two since gsutil 5.36)")
    return out


def measure(job: dict[str, Any]) -> dict[str, Any]:
    urls: list[str] = list(job.get("gs_urls") or [])
    if not urls:
        raise RuntimeError("the job has no gs:// URLs (gs_urls): the store must serve its GCS JSON face")
    if len(set(urls)) != len(urls):
        raise ValueError("the job names a shard twice")
    names = [split(url)[1].rsplit("/", 1)[-1] for url in urls]
    if len(set(names)) != len(names):
        raise ValueError("gsutil cp of many objects into one folder keeps only file names, and two shards share one")
    connections = int(job["connections"])
    processes, threads = split_connections(connections)

    work = Path(job["workdir"])
    home, state, data = work / "home", work / "state", work / "data"
    for folder in (home, state, data):
        folder.mkdir(parents=True, exist_ok=True)
    boto_config = work / "boto.cfg"
    write_config(boto_config, job, state, processes, threads)  # an http endpoint stops here
    exe = gsutil_binary()
    env = tool_env(boto_config, home)
    want, listed = sizes(exe, urls, env)

    hashes_in_store = object_hashes(exe, urls[0], env)
    argv = [exe, "-m", "cp", *sources(urls, listed), str(data) + "/"]
    log = work / "gsutil.log"
    with open(log, "w") as out, Timer() as timer:
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-6:])
        raise RuntimeError(f"gsutil exited {proc.returncode}: {tail[-1500:]}")

    total = 0
    for url, name in zip(urls, names):
        target = data / name
        got = target.stat().st_size if target.exists() else None
        if got != want[url]:
            raise RuntimeError(f"{url}: gsutil wrote {'nothing' if got is None else f'{got} bytes'}, "
                               f"the object has {want[url]}")
        total += got
    expected = (job.get("expected") or {}).get("bytes")
    if expected is not None and total != expected:
        raise RuntimeError(f"copied {total} bytes, the job expects {expected}")

    hashes = hash_check(hashes_in_store, crcmod_compiled())
    settings = (f"gsutil {version()} -m cp URL... DIR/: parallel_process_count={processes} x "
                f"parallel_thread_count={threads}, sliced downloads off, JSON API over https "
                f"(CA {'from the job' if job.get('ca_file') else 'system'}), anonymous; {hashes}; "
                f"start-up included; files to {filesystem(str(work))}")
    return {"bytes": total, "samples": None, "seconds": timer.seconds, "cpu_s": timer.cpu_s,
            "settings": settings}


def version() -> str:
    try:
        from importlib.metadata import version as dist_version

        return dist_version("gsutil")
    except Exception:  # only a label
        return "?"


if __name__ == "__main__":
    run(measure)
