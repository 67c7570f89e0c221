"""Virtual environments for peers whose package pins conflict with ours, made once and reused.

Each lives in ``$WDS_ASYNC_PEERS_DIR/NAME`` (default ``~/.cache/wds-async/peers/NAME``) and is
ready when its ``.ready`` file holds the hash of the requirements it was built from; a changed list or
an interrupted build is rebuilt from scratch. A file lock keeps two benchmarks from building one at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

__all__ = ["VenvError", "ensure_venv", "peers_dir"]


class VenvError(RuntimeError):
    """A peer's environment could not be built; the message names the step and the log file."""


def peers_dir() -> Path:
    """Where peer environments live."""
    configured = os.environ.get("WDS_ASYNC_PEERS_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "wds-async" / "peers"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_venv(name: str, steps: list[list[str]], *, log: Callable[[str], None] | None = None) -> Path:
    """The interpreter of environment ``name`` holding ``steps`` (one pip install per step); built if needed."""
    root = peers_dir()
    root.mkdir(parents=True, exist_ok=True)
    venv = root / name
    want = hashlib.sha256(json.dumps([sys.version_info[:2], steps]).encode()).hexdigest()
    ready = venv / ".ready"
    with open(root / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists() and ready.read_text().strip() == want and _python(venv).exists():
            return _python(venv)
        shutil.rmtree(venv, ignore_errors=True)
        logfile = root / f"{name}.log"
        if log is not None:
            log(f"building the {name!r} peer environment in {venv} (once; log: {logfile})")
        with open(logfile, "w") as out:
            _step([sys.executable, "-m", "venv", str(venv)], out, logfile, "create the venv")
            for reqs in steps:
                _step([str(_python(venv)), "-m", "pip", "install", "--disable-pip-version-check", *reqs],
                      out, logfile, f"pip install {' '.join(reqs)}")
        ready.write_text(want + "\n")
    return _python(venv)


def _step(cmd: list[str], out: object, logfile: Path, what: str) -> None:
    proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # type: ignore[call-overload]
    if proc.returncode != 0:
        tail = logfile.read_text(errors="replace").strip().splitlines()[-5:]
        raise VenvError(f"could not {what} (exit {proc.returncode}); see {logfile}:\n  " + "\n  ".join(tail))
