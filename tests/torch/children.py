"""Running a training-loop child the way a preempted job meets it, for the resume tests: start it in its own
process group (or under torchrun: :class:`Launches`), SIGKILL it once its log shows a step, and read what it
logged and checkpointed.

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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

if TYPE_CHECKING:
    from typing import Self

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


class Launches:
    """torchrun launches of ``script`` in their own sessions; every process seen below them is killed on exit.

    torchrun starts each rank in a session of its own and a rank's DataLoader workers outlive a SIGKILLed
    rank for a few seconds, so killing torchrun's process group is not enough: the descendants are
    recorded while the job runs and killed by pid (psutil checks a pid was not reused).
    """

    def __init__(self, script: str) -> None:
        self.script = script
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.seen: dict[int, psutil.Process] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()

    def start(self, torchrun_args: list[str], script_args: list[str], output: Path) -> subprocess.Popen[bytes]:
        """One torchrun launch (gloo's sockets and the rendezvous on 127.0.0.1), its output into ``output``."""
        # PYTHONFAULTHANDLER: a rank or worker sent SIGABRT by wait() on a hang prints every thread's stack first.
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONFAULTHANDLER": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--master-addr", "127.0.0.1",
               "--local-addr", "127.0.0.1", *torchrun_args, self.script, *script_args]
        with open(output, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append((proc, output))
        return proc

    def wait(self, timeout: float, until: Callable[[], bool] | None = None) -> list[int] | None:
        """Every launch's exit status; or None as soon as ``until()`` holds (checked every 10 ms) while one
        still runs. AssertionError, with the ranks' stacks and the output, if one is still running after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        observed = 0.0
        while any(proc.poll() is None for proc, _ in self.procs) and time.monotonic() < deadline:
            if time.monotonic() - observed > 0.2:
                self._observe()
                observed = time.monotonic()
            if until is not None and until():
                return None
            time.sleep(0.2 if until is None else 0.01)
        if any(proc.poll() is None for proc, _ in self.procs):
            self._dump_stacks()
            raise AssertionError(f"torchrun still running after {timeout:.0f} s (a hang?)\n{self.output(20000)}")
        return [int(proc.returncode) for proc, _ in self.procs]

    def kill(self, check: bool = False) -> None:
        """SIGKILL every launch and every process seen below it; ``check``: assert that none outlives it."""
        self._observe()
        for proc, _ in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        for p in self.seen.values():
            try:
                p.kill()
            except psutil.Error:
                pass
        for proc, _ in self.procs:
            proc.wait(10)
        if check:
            _, alive = psutil.wait_procs(list(self.seen.values()), timeout=10)
            assert not alive, f"processes of the torchrun job outlived SIGKILL: {[p.pid for p in alive]}"

    def _observe(self) -> None:
        for proc, _ in self.procs:
            try:
                for child in psutil.Process(proc.pid).children(recursive=True):
                    self.seen.setdefault(child.pid, child)
            except psutil.Error:
                pass

    def _dump_stacks(self) -> None:
        """Where a hung launch's ranks and DataLoader workers wait: SIGABRT makes each print its threads' stacks
        (faulthandler) into the launch's output."""
        for proc, _ in self.procs:
            if proc.poll() is not None:
                continue
            try:
                below = psutil.Process(proc.pid).children(recursive=True)
            except psutil.Error:
                continue
            proc.send_signal(signal.SIGSTOP)  # torchrun would end the other ranks once the first one dies
            for child in below:  # one at a time, so that their stacks do not interleave in the output
                try:
                    child.send_signal(signal.SIGABRT)
                except psutil.Error:
                    continue
                time.sleep(0.3)
            proc.send_signal(signal.SIGCONT)
        time.sleep(2)

    def output(self, tail: int = 2000) -> str:
        """Each launch's rank tracebacks (torchrun prefixes them with ``[rankN]:``) and its last ``tail`` characters."""
        parts = []
        for _, path in self.procs:
            text = path.read_text(errors="replace")
            ranks = [line for line in text.splitlines() if line.startswith("[rank")][-80:]
            parts.append(f"--- {path.name}:\n" + "\n".join(ranks) + f"\n...\n{text[-tail:]}")
        return "\n".join(parts)


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
