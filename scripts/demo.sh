#!/usr/bin/env bash
# Command 1: install everything, then generate synthetic shards, serve them from the emulated object store
# on 127.0.0.1 and print wds-async's throughput beside raw parallel download (and webdataset).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh dev
exec .venv/bin/python -m benchmarks.demo "$@"
