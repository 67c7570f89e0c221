"""Command 1's job (``python -m benchmarks.demo``, what ``scripts/demo.sh`` runs after installing) on a few small
shards: the table beside raw download, and the faults the store injected beside the retries that answered them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import demo


@pytest.mark.slow
def test_demo_prints_the_table_and_the_faults_it_met(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 16 shards, each request cut short with p=0.5 or refused with p=0.1: a run with no fault at all has p < 1e-5;
    # a 503 makes no progress, so 8 in a row (the retry policy's attempts) has p = 1e-8 per shard.
    assert demo.main(["--dir", str(tmp_path / "shards"), "--shards", "16", "--shard-size", "256KiB", "--sample-size",
                      "16KiB", "--ttfb", "0.01", "--bw", "50e6", "-c", "4", "--no-webdataset",
                      "--faults", "drop_rate=0.5&fail_rate=0.1"]) == 0
    out = capsys.readouterr().out
    for phase in ("raw download (4 conns)", "wds-async (4 conns)", "wds-async under faults"):
        assert re.search(rf"^{re.escape(phase)}\s+\d", out, re.M), out
    retries = int(re.search(r"under faults \(drop_rate=0.5&fail_rate=0.1\): .*?, (\d+) retries, samples identical "
                            r"count", out).group(1))  # type: ignore[union-attr]
    injected = re.search(r"faults the store injected: (\d+) answers 503, (\d+) bodies cut short", out)
    assert injected, out
    failed, dropped = int(injected.group(1)), int(injected.group(2))
    # Only the run under faults asks for them, and the loader retries each one once: nothing lost, nothing extra.
    assert failed + dropped == retries > 0, out
