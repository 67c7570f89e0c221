#!/usr/bin/env bash
# Create .venv (if needed) and install wds-async with the given extras into it, plus Azurite (npm) for
# the Azure tests. torch goes first and pinned (2.13.0, which the project's range torch>=2.1 admits), so that
# installing wds-async afterwards changes nothing about it. Which build pip takes depends on where it looks:
# the development machines and CI find a local 2.13.0+cpu wheel, which pip prefers; from PyPI alone, Linux
# x86_64 gets PyPI's default build, which is the CUDA one (several GB with its nvidia packages). To choose,
# name PyTorch's index for the build: TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu (or a CUDA one).
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-dev}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv || { echo "cannot create a virtualenv: install python3-venv (apt-get install python3-venv)" >&2; exit 1; }
fi
torch_index=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then
    torch_index=(--index-url "$TORCH_INDEX_URL")
fi
echo "installing torch==2.13.0${TORCH_INDEX_URL:+ from $TORCH_INDEX_URL} and wds-async[$extras] into .venv ..."
.venv/bin/python -m pip install --quiet "${torch_index[@]}" "torch==2.13.0"
# The versions CI passed with (see the file's header); pyproject.toml's ranges still say what the library accepts.
.venv/bin/python -m pip install --quiet -c scripts/constraints.txt -e ".[$extras]"
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
