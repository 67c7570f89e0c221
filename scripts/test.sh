#!/usr/bin/env bash
# Command 2: install the test dependencies, then run the whole suite. The tests start the real local
# servers they use (the emulated object store, as a subprocess on 127.0.0.1) and stop them afterwards.
# The suite runs in one process per CPU plus one, 4 at most (pytest-xdist; each test file whole on one process, so a
# file's servers and launchers start once): part of its time waits on sockets, servers and child processes, and
# the extra process fills it (2 cores: 615 s in 2 processes, 516 s in 3 at 193% CPU). The CPUs are the ones
# this process may run on (a container's cpuset; a CPU quota does not show). `-n 0` among the arguments runs it
# in this process alone. The longest files start first (tests/conftest.py, LONGEST_FIRST), so that none of them is
# left to run on alone at the end; `--no-loadscope-reorder` keeps that order.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
count='import os
cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
print(min(4, len(cpus) + 1))'
procs=$(.venv/bin/python -c "$count")
exec .venv/bin/python -m pytest --numprocesses "$procs" --dist loadfile --no-loadscope-reorder "$@"
