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

wds_async._loop.START_WAIT = 0.2  # the bound on waiting for a thread the interrupt kept from existing

started = threading.Event()
original = threading.Thread.start

def start(self):  # the interrupt, as the signal handler would raise it inside Thread.start()
    if self.name != "wds-async-engine":
        return original(self)
    if sys.argv[2] == "after":  # the engine's thread exists and runs
        original(self)
    raise KeyboardInterrupt

threading.Thread.start = start
try:
    next(iter(wds.WebDataset(sys.argv[1])))
except KeyboardInterrupt:
    print("interrupted", flush=True)
threading.Thread.start = original
print(sorted(t.name for t in threading.enumerate() if t.name.startswith("wds-async-engine")), flush=True)
print(sum(1 for _ in wds.WebDataset(sys.argv[1])) > 0, flush=True)  # the next iteration works
"""


@pytest.mark.parametrize("when", ["after", "before"])
def test_an_interrupt_while_the_engine_starts_stops_it(shard_dir: Path, when: str) -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD), str(shard_dir / "shard-000000.tar"), when],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == ["interrupted", "[]", "True"], (proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stderr


_GOPEN_CHILD = """
import sys, threading
import wds_async._loop
import wds_async.compat.gopen as g

wds_async._loop.START_WAIT = 0.2  # the bound on waiting for a thread the interrupt kept from existing
original = threading.Thread.start

def start(self):  # the interrupt, as the signal handler would raise it inside Thread.start()
    if self.name != "wds-async-gopen":
        return original(self)
    if sys.argv[2] == "after":  # the loop's thread exists and runs
        original(self)
    raise KeyboardInterrupt

threading.Thread.start = start
try:
    g.gopen(sys.argv[1])
except KeyboardInterrupt:
    print("interrupted", flush=True)
threading.Thread.start = original
print(sorted(t.name for t in threading.enumerate() if t.name.startswith("wds-async-gopen")), flush=True)
with g.gopen(sys.argv[1]) as f:
    print(len(f.read()) > 0, flush=True)  # the next open works
"""


@pytest.mark.parametrize("when", ["after", "before"])
def test_an_interrupt_while_gopen_starts_its_loop_stops_it(store: Any, when: str) -> None:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_GOPEN_CHILD), store.url("shard-000000.tar"), when],
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.splitlines() == ["interrupted", "[]", "True"], (proc.stdout, proc.stderr)
    assert proc.returncode == 0, proc.stderr
