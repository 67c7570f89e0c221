#!/usr/bin/env bash
# Create .venv (if needed) and install wds-async with the given extras into it, plus Azurite (npm) for
# the Azure tests. torch goes first and pinned, so that nothing pulls the multi-GB CUDA build: 2.13.0 is
# the CPU build available to this machine, and the project's torch range admits it.
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
if [ "$extras" = "dev" ]; then
    if command -v npm >/dev/null 2>&1; then
        if [ ! -x .servers/node_modules/.bin/azurite-blob ]; then
            echo "installing Azurite (npm) into .servers/ ..."
            mkdir -p .servers
            npm install --silent --no-audit --no-fund --prefix .servers azurite@3.37.0
        fi
    else
        echo "npm not found: the Azure tests need Azurite (apt-get install npm); they will be skipped locally" >&2
    fi
fi
