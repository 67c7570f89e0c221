"""A warm launcher for the resume tests' children: a process that imports torch, torchdata and wds_async once and
forks each child from there, so a child starts in milliseconds instead of the 1.5-2 s of CPU those imports take.

    python tests/torch/warm.py          (started by tests.torch.children.WarmLauncher)

Requests come on standard input, one JSON line each: ``{"script", "argv", "env", "stderr"}``. For each, the launcher
forks; the child starts a session of its own (so the test can SIGKILL its process group, DataLoader workers
included), points its standard streams at ``/dev/null`` and the ``stderr`` file, takes ``env`` as its whole
environment and runs ``script`` as ``__main__`` with ``argv``, then ends as the interpreter would (non-daemon
threads joined, ``atexit`` handlers run; an exception prints its traceback and exits 1). The launcher answers
``{"pid"}`` at once and ``{"status"}`` (the exit code, ``-9`` for SIGKILL) when the child has ended.

A fork copies the one thread that calls it, so the launcher refuses to start (it answers ``{"refused": why}``)
when the imports left any other thread running; the tests then start each child from nothing, as before.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile


def _threads() -> int:
    return len(os.listdir("/proc/self/task")) if os.path.isdir("/proc/self/task") else 1


def _child(request: dict[str, object]) -> None:
    """In the forked child: become the script (never returns into the launcher's loop)."""
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    err = os.open(str(request["stderr"]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd, target in ((0, null), (1, null), (2, err)):
        os.dup2(target, fd)
    os.close(null)
    os.close(err)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in dict(request["env"]).items()})  # type: ignore[call-overload]
    tempfile.tempdir = None  # looked up again from this environment's TMPDIR, as a fresh interpreter does
    script = str(request["script"])
    sys.argv = [script, *(str(a) for a in request["argv"])]  # type: ignore[attr-defined]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # what `python script` puts first
    runpy.run_path(script, run_name="__main__")
    sys.exit(0)


def main() -> None:
    import torch  # noqa: F401
    import torchdata.stateful_dataloader  # noqa: F401

    import wds_async

    _ = wds_async.WebDataset  # the lazily imported names, and the modules behind them
    out = sys.stdout
    if _threads() != 1:
        out.write(json.dumps({"refused": f"{_threads()} threads after the imports"}) + "\n")
        out.flush()
        return
    out.write(json.dumps({"ready": True}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        out.write(json.dumps({"pid": pid}) + "\n")
        out.flush()
        _, status = os.waitpid(pid, 0)
        out.write(json.dumps({"status": os.waitstatus_to_exitcode(status)}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
