"""Running a training-loop child the way a preempted job meets it, for the resume tests: start it in its own
process group, SIGKILL the group once its log shows a step, and read what it logged and checkpointed.

A child writes one JSON line per step (``{"step": n, ...}``) to ``cfg["log"]`` and checkpoints
``{"step": n, "loader": ...}`` to ``cfg["ckpt"]`` with ``torch.save``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = str(Path(__file__).resolve().parents[2])


def run_child(child: str, cfg: dict[str, Any], env: dict[str, str] | None = None, kill_at: int | None = None,
              settle: float = 0.0) -> int:
    """Run ``child`` with ``cfg``; with ``kill_at``, SIGKILL its process group once its log shows that step (and
    ``settle`` seconds more, for a child that pauses in that step until its checkpoint is written). Returns 0, or
    -9 when killed; a child that fails or runs past 90 s fails the test (and is killed)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": REPO, **(env or {})}
    errors = cfg["log"] + ".stderr"
    with open(errors, "wb") as err:
        proc = subprocess.Popen([sys.executable, child, json.dumps(cfg)], env=full_env, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 90
        while proc.poll() is None and time.monotonic() < deadline:
            if kill_at is not None and steps(cfg["log"]) >= kill_at:
                time.sleep(settle)
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
                return -9
            time.sleep(0.005)
        if proc.poll() is None:
            raise AssertionError(f"child still running after 90 s: {cfg}")
        assert proc.returncode == 0, Path(errors).read_text()[-3000:]
        return 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def lines(log: str) -> list[dict[str, Any]]:
    """The complete lines of a child's log."""
    if not os.path.exists(log):
        return []
    with open(log) as fh:
        return [json.loads(line) for line in fh if line.endswith("\n")]


def steps(log: str) -> int:
    """The last step a child logged."""
    logged = lines(log)
    return int(logged[-1]["step"]) if logged else 0


def checkpointed(cfg: dict[str, Any]) -> int:
    """The step of the child's checkpoint (0: none)."""
    import torch

    return int(torch.load(cfg["ckpt"], weights_only=False)["step"]) if os.path.exists(cfg["ckpt"]) else 0
