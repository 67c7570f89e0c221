#!/usr/bin/env bash
# Command 2: install the test dependencies, then run the whole suite. The tests start the real local
# servers they use (the emulated object store, as a subprocess on 127.0.0.1) and stop them afterwards.
# The suite runs in one process per CPU, 4 at most (pytest-xdist; `logical`, since `auto` counts physical cores
# and falls back to 1 where a container hides them; each test file whole on one process, so a file's servers and
# launchers start once); `-n 0` among the arguments runs it in this process alone.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
exec .venv/bin/python -m pytest --numprocesses logical --maxprocesses 4 --dist loadfile "$@"
