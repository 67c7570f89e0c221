"""Running a training-loop child the way a preempted job meets it, for the resume tests: start it in its own
process group (or under torchrun: :class:`Launches`), SIGKILL it once its log shows a step, and read what it
logged and checkpointed.

A child writes one JSON line per step (``{"step": n, ...}``) to ``cfg["log"]`` and checkpoints
``{"step": n, "loader": ...}`` to ``cfg["ckpt"]`` with ``torch.save``.

:func:`run_child` forks each child from a warm launcher (``tests/warm.py``: a process that made the imports once),
which took the resume tests from 114 s to 46 s; ``WDS_TEST_COLD_CHILDREN=1`` starts every child from nothing instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from tests.warm import WarmLauncher, close_launchers

if TYPE_CHECKING:
    from typing import Self

REPO = str(Path(__file__).resolve().parents[2])


def run_child(child: str, cfg: dict[str, Any], env: dict[str, str] | None = None, kill_at: int | None = None,
              settle: float = 0.0) -> int:
    """Run ``child`` with ``cfg``; with ``kill_at``, SIGKILL its process group once its log shows that step (and
    ``settle`` seconds more, for a child that pauses in that step until its checkpoint is written). Returns 0, or
    -9 when killed; a child that fails or runs past 90 s fails the test (and is killed).

    The child is forked from one of the module's warm launchers (``tests/warm.py``) where they run (its imports
    already made: 1.5-2 s of CPU less per child), else started from nothing; either way in a session of its own,
    with the same environment, whose ``TMPDIR`` is :func:`child_tmpdir`."""
    full_env = {**os.environ, **CHILD_ENV, "TMPDIR": child_tmpdir(), **(env or {})}
    errors = cfg["log"] + ".stderr"
    launcher = _warm()
    if launcher is not None:
        pid = launcher.start(child, [json.dumps(cfg)], full_env, errors)
        ended: Callable[[], int | None] = launcher.ended
    else:
        with open(errors, "wb") as err:
            proc = subprocess.Popen([sys.executable, child, json.dumps(cfg)], env=full_env, start_new_session=True,
                                    stdout=subprocess.DEVNULL, stderr=err)
        pid, ended = proc.pid, proc.poll
    status: int | None = None
    try:
        deadline = time.monotonic() + 90
        while (status := ended()) is None and time.monotonic() < deadline:
            if kill_at is not None and steps(cfg["log"]) >= kill_at:
                time.sleep(settle)
                os.killpg(pid, signal.SIGKILL)
                status = _wait(ended, 10)
                return -9
            time.sleep(0.005)
        if status is None:
            raise AssertionError(f"child still running after 90 s: {cfg}")
        assert status == 0, Path(errors).read_text()[-3000:]
        return 0
    finally:
        if status is None:
            with contextlib.suppress(ProcessLookupError):  # it ended just now
                os.killpg(pid, signal.SIGKILL)
            _wait(ended, 10)


#: What every child's environment adds to the test's (one thread for torch and BLAS, the repository importable).
CHILD_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": REPO}


def _wait(ended: Callable[[], int | None], timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while (status := ended()) is None and time.monotonic() < deadline:
        time.sleep(0.005)
    return status


#: What the resume tests' launchers import once: torch, torchdata and wds_async (with its lazily imported names).
WARM_MODULES = ("torch", "torchdata.stateful_dataloader", "wds_async", "wds_async.data.dataset")


def _launcher(hash_seed: int) -> WarmLauncher:
    """A warm launcher (``tests/warm.py``) for this module's children, with the string hash seed ``hash_seed``."""
    env = {**os.environ, **CHILD_ENV, "PYTHONHASHSEED": str(hash_seed)}
    return WarmLauncher(sys.executable, WARM_MODULES, env, cwd=REPO)


#: The module's two launchers, started at its first child: [] before, [None] where one refused.
_launchers: list[WarmLauncher | None] = []
_turn = [0]
_refused: list[str] = []


def _warm() -> WarmLauncher | None:
    """The launcher of this child, or None (refused, or ``WDS_TEST_COLD_CHILDREN`` set).

    Two launchers with different string hash seeds take turns, so consecutive children, a killed run and the run
    that resumes it above all, never share a seed. Children started from nothing each get a seed of their own,
    and an order that follows a set of strings would differ between them; this keeps the tests able to see
    that."""
    if os.environ.get("WDS_TEST_COLD_CHILDREN"):
        return None
    if not _launchers:
        first = int.from_bytes(os.urandom(4), "big") % (2**32 - 1) + 1  # not the global random: tests seed it
        seeds = (first, first % (2**32 - 1) + 1)  # two different seeds in 1 .. 2**32 - 1
        started = [_launcher(seed) for seed in seeds]
        refused = [launcher.refused for launcher in started if launcher.refused]
        if refused:
            _refused[:] = refused[:1]
            for launcher in started:
                launcher.close()
            _launchers.append(None)
        else:
            _launchers.extend(started)
    if _launchers[0] is None:
        return None
    _turn[0] += 1
    return _launchers[_turn[0] % len(_launchers)]


def refusal() -> str:
    """Why a launcher refused to start ("" if none did)."""
    return _refused[0] if _refused else ""


#: The module's folder for its children's temporary files: [] before the first child.
_tmpdir: list[str] = []


def child_tmpdir() -> str:
    """The ``TMPDIR`` of this module's children and torchrun launches, removed after the module.

    A SIGKILLed job leaves what it had there: its DataLoader workers' ``pymp-*`` folders and torchrun's
    ``torchelastic_*`` folder, about 30 per run of the suite, which used to pile up in the system's temporary
    folder. It is a short path of its own rather than the test's ``tmp_path``: a worker passing a tensor to its
    parent binds a Unix socket in ``TMPDIR/pymp-*/``, and such a path may not be longer than 107 bytes."""
    if not _tmpdir:
        _tmpdir.append(tempfile.mkdtemp(prefix="wds-children-"))
    return _tmpdir[0]


def close_warm_launcher() -> None:
    """Stop the launchers the module's children were forked from and remove their temporary folder (the torch
    tests' conftest, after each module)."""
    close_launchers(_launchers, _tmpdir)


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
        # TMPDIR: torchrun's torchelastic_* folder and the ranks' temporary files (child_tmpdir).
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "PYTHONFAULTHANDLER": "1",
               "TMPDIR": child_tmpdir(),
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
