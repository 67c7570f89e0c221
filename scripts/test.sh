#!/usr/bin/env bash
# Command 2: install the test dependencies, then run the whole suite. The tests start the real local
# servers they use (the emulated object store, as a subprocess on 127.0.0.1) and stop them afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
exec .venv/bin/python -m pytest "$@"
