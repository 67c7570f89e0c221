#!/usr/bin/env bash
# Lint and type-check, as CI does after the tests (.ci/run): ruff and mypy, both configured in pyproject.toml
# and pinned in the `dev` extra that scripts/install.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/ruff ] && [ -x .venv/bin/mypy ] || bash scripts/install.sh dev
.venv/bin/ruff check wds_async backends tests benchmarks examples
.venv/bin/mypy
