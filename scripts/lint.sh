#!/usr/bin/env bash
# Lint, type-check, check the layers and build the docs, as CI does after the tests (.ci/run): ruff, mypy,
# import-linter (the layers contract in pyproject.toml) and `mkdocs build --strict`, all pinned in the `dev`
# extra that scripts/install.sh installs.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/ruff ] && [ -x .venv/bin/mypy ] && [ -x .venv/bin/lint-imports ] && [ -x .venv/bin/mkdocs ] \
    || bash scripts/install.sh dev
.venv/bin/ruff check wds_async backends tests benchmarks examples emustore
.venv/bin/mypy
.venv/bin/lint-imports
if [ -f mkdocs.yml ]; then
    NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir .site
fi
