#!/usr/bin/env bash
# Remove what command 1 (scripts/demo.sh) and the benchmarks leave in the checkout: .bench/ (the synthetic
# shards, about 0.5 GB after the demo's defaults, and any benchmark output). With --all, also .venv/ and
# .servers/ (Azurite), which scripts/install.sh puts back on the next run of command 1 or 2.
set -euo pipefail
cd "$(dirname "$0")/.."
all=0
for arg in "$@"; do
    case "$arg" in
        --all) all=1 ;;
        -h|--help) echo "usage: bash scripts/clean.sh [--all]   # .bench/; --all: also .venv/ and .servers/"; exit 0 ;;
        *) echo "clean.sh: unknown argument '$arg' (usage: bash scripts/clean.sh [--all])" >&2; exit 2 ;;
    esac
done
paths=(.bench)
if [ "$all" = 1 ]; then
    paths+=(.venv .servers)
fi
removed=0
for path in "${paths[@]}"; do
    if [ -e "$path" ]; then
        size="$(du -sh "$path" 2>/dev/null | cut -f1)"
        rm -rf -- "$path"
        echo "removed $path/ ($size)"
        removed=1
    fi
done
if [ "$removed" = 0 ]; then
    echo "nothing to remove (${paths[*]} not present)"
fi
