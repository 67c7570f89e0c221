#!/usr/bin/env bash
# Create .venv (if needed) and install wds-async with the given extras into it.
# torch goes first and pinned, so that nothing pulls the multi-GB CUDA build: 2.13.0 is the CPU build
# available to this machine, and the project's torch range admits it.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv || { echo "cannot create a virtualenv: install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
fi
echo "installing torch==2.13.0 (CPU) and wds-async[$extras] into .venv ..."
.venv/bin/python -m pip install --quiet "torch==2.13.0"
.venv/bin/python -m pip install --quiet -e ".[$extras]"
