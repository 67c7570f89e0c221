"""The resume tests' launcher (tests/torch/children.py): a child forked from the warm launcher behaves as one
started from nothing: its own environment and arguments, its failures reported, its process group killed."""

from __future__ import annotations

import json
import os
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from tests.torch import children
from tests.torch.children import run_child

SCRIPT = textwrap.dedent('''
    import json, os, sys, tempfile, time
    import wds_async
    cfg = json.loads(sys.argv[1])
    wds_async._test_mark = getattr(wds_async, "_test_mark", 0) + 1  # a fresh process sees 1
    if cfg.get("fail"):
        raise RuntimeError("the child failed on purpose")
    pids = [os.getpid()]
    if cfg.get("grandchild"):
        pid = os.fork()
        if pid == 0:
            time.sleep(60)
            os._exit(0)
        pids.append(pid)
    with open(cfg["log"], "a") as log:
        for step in range(1, cfg.get("steps", 1) + 1):
            log.write(json.dumps({"step": step, "rank": os.environ.get("RANK"), "argv": sys.argv[1:],
                                  "mark": wds_async._test_mark, "name": __name__, "pids": pids,
                                  "hash": hash("wds-async"), "tmp": tempfile.gettempdir()}) + "\\n")
            log.flush()
            time.sleep(cfg.get("step_time", 0))
''')


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "child.py"
    path.write_text(SCRIPT)
    return str(path)


def _lines(log: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.fixture(params=["warm", "cold"])
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "cold":
        monkeypatch.setenv("WDS_TEST_COLD_CHILDREN", "1")
    elif children._warm() is None:
        pytest.skip(f"the warm launcher refused to start here ({children.refusal()}): children start cold")
    return str(request.param)


def test_a_child_runs_as_main_with_its_arguments_and_environment(script: str, tmp_path: Path, mode: str) -> None:
    for n in range(2):  # the second child starts as fresh as the first
        cfg = {"log": str(tmp_path / f"{mode}{n}.log")}
        assert run_child(script, cfg, env={"RANK": str(n)}) == 0
        (line,) = _lines(Path(cfg["log"]))
        assert line["rank"] == str(n) and line["argv"] == [json.dumps(cfg)]
        assert line["name"] == "__main__" and line["mark"] == 1
        # its temporary files (a killed child's pymp-* folders) go to the module's folder, removed after it
        assert line["tmp"] == children.child_tmpdir() != tempfile.gettempdir()


def test_a_failing_child_fails_the_test_with_its_traceback(script: str, tmp_path: Path, mode: str) -> None:
    with pytest.raises(AssertionError, match="the child failed on purpose"):
        run_child(script, {"log": str(tmp_path / "fail.log"), "fail": True})


def test_a_killed_child_takes_its_process_group_with_it(script: str, tmp_path: Path, mode: str) -> None:
    cfg = {"log": str(tmp_path / "kill.log"), "steps": 1000, "step_time": 0.01, "grandchild": True}
    assert run_child(script, cfg, kill_at=3) == -9
    lines = _lines(Path(cfg["log"]))
    assert 3 <= len(lines) < 1000
    pids = lines[0]["pids"]
    assert isinstance(pids, list) and len(pids) == 2
    deadline = time.monotonic() + 10
    while (alive := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive, f"still running after the kill: {alive}"


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for whoever inherited it to reap it does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_consecutive_children_hash_strings_differently(script: str, tmp_path: Path, mode: str) -> None:
    """As children started from nothing do: a killed run and its resume must not share an order of a set of
    strings by accident."""
    seen = []
    for n in range(3):
        cfg = {"log": str(tmp_path / f"{mode}-hash{n}.log"), "hash": True}
        run_child(script, cfg)
        seen.append(_lines(Path(cfg["log"]))[0]["hash"])
    assert seen[0] != seen[1] and seen[1] != seen[2]


def test_the_launchers_end_with_their_module() -> None:
    launcher = children._warm()
    if launcher is None:
        pytest.skip(f"the warm launcher refused to start here ({children.refusal()})")
    launchers = list(children._launchers)
    assert len(launchers) == 2
    folder = children.child_tmpdir()
    os.mkdir(os.path.join(folder, "pymp-left-by-a-killed-worker"))
    children.close_warm_launcher()
    assert all(launcher.proc.poll() is not None for launcher in launchers if launcher is not None)
    assert not os.path.exists(folder)  # the children's temporary folder goes with them
    assert not os.environ.get("WDS_TEST_COLD_CHILDREN")


def test_an_answer_read_with_the_one_before_is_not_lost(tmp_path: Path) -> None:
    """A child that ends at once: its exit code can reach the test in the same read as its pid."""
    launcher = children._warm()
    if launcher is None:
        pytest.skip(f"the warm launcher refused to start here ({children.refusal()})")
    script = tmp_path / "quick.py"
    script.write_text("pass\n")
    launcher.send({"script": str(script), "argv": [], "env": dict(os.environ), "stderr": str(tmp_path / "err")})
    time.sleep(1.0)  # both answers are written by now
    first = launcher._answer(5)
    assert first is not None and "pid" in first
    assert launcher._answer(5) == {"status": 0}
