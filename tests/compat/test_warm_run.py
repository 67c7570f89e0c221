"""``WarmLauncher.run`` (``tests/warm.py``), as the third-party tests run their script: each run behaves as
``python SCRIPT ARGS`` under ``subprocess.run(capture_output=True)`` would, and no run sees another's state; and
``ColdRunner.run``, the same call where a launcher refused to start, passes the same checks. (The
resume tests' use of the same launcher, children started and killed by the test, is tested in
``tests/torch/test_children.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.warm import ColdRunner, Runner, WarmLauncher, warm_runner

SCRIPT = textwrap.dedent("""
    import json, os, sys
    import email.message  # preloaded: a change made here must not reach the next run
    seen = getattr(email.message, "_touched_by", None)
    email.message._touched_by = sys.argv[1]
    print(json.dumps({"argv": sys.argv, "path": sys.path[:2], "x": os.environ.get("X"), "name": __name__,
                      "cwd": os.getcwd(), "seen": seen, "hash": hash("abc")}))
    print("on stderr", file=sys.stderr)
    if os.environ.get("RAISE"):
        raise RuntimeError("raised on purpose")
    if os.environ.get("SLEEP"):
        import time
        time.sleep(float(os.environ["SLEEP"]))
    if os.environ.get("LATE"):  # a non-daemon thread that writes after the script's end: the exit waits for it
        import threading, time
        threading.Thread(target=lambda: (time.sleep(0.3), print("late", end=""))).start()
    sys.exit(int(os.environ.get("CODE", "0")))
""")


def _launcher() -> WarmLauncher:
    launcher = WarmLauncher(sys.executable, ["email.message"], {**os.environ, "PYTHONHASHSEED": "7"})
    if launcher.refused:
        pytest.skip(f"the warm launcher refused to start here ({launcher.refused})")
    return launcher


@pytest.fixture(params=["warm", "cold"])
def server(request: pytest.FixtureRequest) -> Iterator[Runner]:
    if request.param == "cold":
        yield ColdRunner(sys.executable)
        return
    launcher = _launcher()
    try:
        yield launcher
    finally:
        launcher.close()


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONHASHSEED": "7", **extra}


@pytest.mark.parametrize("quick", [False, True])
def test_a_run_is_the_script_as_python_would_run_it(server: Runner, tmp_path: Path, quick: bool) -> None:
    import json

    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    extra = tmp_path / "extra"
    done = server.run(str(script), ["first"], _env(X="1", PYTHONPATH=str(extra)), tmp_path / "runs", timeout=60,
                      quick_exit=quick)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["argv"] == [str(script), "first"] and got["name"] == "__main__"
    assert got["path"] == [str(tmp_path), str(extra)]  # the script's folder, then PYTHONPATH
    assert (got["x"], got["cwd"], got["seen"]) == ("1", os.getcwd(), None)
    assert done.stderr == "on stderr\n"
    fresh = subprocess.run([sys.executable, "-c", "print(hash('abc'))"], env=_env(), capture_output=True, text=True)
    assert got["hash"] == int(fresh.stdout)  # the hash seed the server started with

    again = json.loads(server.run(str(script), ["second"], _env(), tmp_path / "runs", timeout=60,
                                  quick_exit=quick).stdout)
    assert again["seen"] is None  # the first run's change to a preloaded module stayed in its own fork
    late = server.run(str(script), ["third"], _env(LATE="1"), tmp_path / "runs", timeout=60, quick_exit=quick)
    assert late.returncode == 0 and late.stdout.endswith("late")


@pytest.mark.parametrize("quick", [False, True])
def test_exit_codes_errors_and_timeouts_come_back(server: Runner, tmp_path: Path, quick: bool) -> None:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    runs = tmp_path / "runs"
    assert server.run(str(script), ["a"], _env(CODE="3"), runs, timeout=60, quick_exit=quick).returncode == 3
    raised = server.run(str(script), ["b"], _env(RAISE="1"), runs, timeout=60, quick_exit=quick)
    assert raised.returncode == 1 and "RuntimeError: raised on purpose" in raised.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        server.run(str(script), ["c"], _env(SLEEP="60"), runs, timeout=1)
    assert server.run(str(script), ["d"], _env(), runs, timeout=60).returncode == 0  # the launcher goes on


def test_a_run_with_another_hash_seed_is_refused(tmp_path: Path) -> None:
    launcher = _launcher()
    try:
        with pytest.raises(ValueError, match="PYTHONHASHSEED"):
            launcher.run(str(tmp_path / "script.py"), [], {**os.environ, "PYTHONHASHSEED": "0"}, tmp_path, timeout=60)
    finally:
        launcher.close()


def test_warm_runner_falls_back_to_starting_each_run_from_nothing(tmp_path: Path) -> None:
    """A preloaded module that leaves a thread running makes the launcher refuse (a fork copies one thread only):
    ``warm_runner`` then gives a :class:`ColdRunner`, whose runs work; a launcher that starts is what it gives
    otherwise."""
    (tmp_path / "threaded_import.py").write_text("import threading, time\n"
                                                 "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n")
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONHASHSEED": "7"}
    cold = warm_runner(sys.executable, ["threaded_import"], env)
    try:
        assert isinstance(cold, ColdRunner)
        done = cold.run(str(script), [], env, tmp_path / "runs", timeout=60)
        assert (done.returncode, done.stdout) == (0, "hello\n"), done.stderr
    finally:
        cold.close()
    warm = warm_runner(sys.executable, ["email.message"], env)
    try:
        if isinstance(warm, ColdRunner):
            pytest.skip("the warm launcher refused to start here")
        assert isinstance(warm, WarmLauncher)
        done = warm.run(str(script), [], env, tmp_path / "runs", timeout=60)
        assert (done.returncode, done.stdout) == (0, "hello\n"), done.stderr
    finally:
        warm.close()
