"""An interrupt (Ctrl-C) while one of our loop threads starts (the engine's, ``gopen``'s): what it started is
stopped, not left running."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

_CHILD = """
import sys, threading
import wds_async as wds
import wds_async._loop
from wds_async.compat.gopen import gopen

url, thread, when = sys.argv[1:]
wds_async._loop.START_WAIT = 0.2  # the bound on waiting for a thread the interrupt kept from existing
original = threading.Thread.start

def start(self):  # the interrupt, as the signal handler would raise it inside Thread.start()
    if self.name != thread:
        return original(self)
    if when == "after":  # the thread exists and runs
        original(self)
    raise KeyboardInterrupt

def use():  # what starts the thread: the engine at a dataset's first sample, gopen's loop at the open
    if thread == "wds-async-engine":
        return sum(1 for _ in wds.WebDataset(url))
    with gopen(url) as f:
        return len(f.read())

threading.Thread.start = start
try:
    use()
except KeyboardInterrupt:
    print("interrupted", flush=True)
threading.Thread.start = original
print(sorted(t.name for t in threading.enumerate() if t.name == thread), flush=True)
print(use() > 0, flush=True)  # the next use works
"""


def _interrupted(url: str, thread: str, when: str) -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD), url, thread, when], capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.splitlines() == ["interrupted", "[]", "True"], (proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("when", ["after", "before"])
def test_an_interrupt_while_the_engine_starts_stops_it(shard_dir: Path, when: str) -> None:
    _interrupted(str(shard_dir / "shard-000000.tar"), "wds-async-engine", when)


@pytest.mark.parametrize("when", ["after", "before"])
def test_an_interrupt_while_gopen_starts_its_loop_stops_it(store: Any, when: str) -> None:
    _interrupted(store.url("shard-000000.tar"), "wds-async-gopen", when)
