#!/usr/bin/env bash
# Command 1: install everything, then generate synthetic shards, serve them from the emulated object store
# on 127.0.0.1 and print wds-async's throughput beside raw parallel download (and webdataset).
# The shards stay in .bench/shards/ for the next run (about 0.5 GB with the defaults):
# `bash scripts/demo.sh --clean` (or scripts/clean.sh) removes them; `--clean --all` also .venv/ and .servers/.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--clean" ]; then
    shift
    exec bash scripts/clean.sh "$@"
fi
bash scripts/install.sh dev
status=0
.venv/bin/python -m benchmarks.demo "$@" || status=$?
if [ -d .bench/shards ]; then
    echo "the shards stay in .bench/shards/ ($(du -sh .bench/shards 2>/dev/null | cut -f1)) for the next run;" \
         "bash scripts/demo.sh --clean removes them" >&2
fi
exit "$status"
