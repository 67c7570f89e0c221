"""The Prometheus endpoint scraped over http during an epoch over the emulated store: in the process that iterates,
summed over DataLoader workers, and from the node service (``wds-async serve --metrics-port``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import wds_async as wds
from emustore import StoreProcess
from tests.conftest import N_SHARDS, free_port, wait_until

#: Each response streams at 400 kB/s, so the 2 MiB epoch lasts seconds and two scrapes fall inside it.
SLOW = "?bw=400000"
COUNTERS = ("wds_async_bytes_read_total", "wds_async_samples_total", "wds_async_requests_total",
            "wds_async_retries_total", "wds_async_throttled_total", "wds_async_cache_hits_total",
            "wds_async_consumer_wait_seconds_total")
GAUGES = ("wds_async_concurrency", "wds_async_concurrency_cap", "wds_async_buffered_bytes",
          "wds_async_buffer_limit_bytes")


def _scrape(url: str) -> dict[str, dict[str, float]]:
    """{sample name: {dataset label: value}} of one scrape, parsed as Prometheus parses it."""
    with urllib.request.urlopen(url, timeout=10) as answer:
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[sample.labels.get("dataset", "")] = sample.value
    return found


def _slow_urls(store: StoreProcess) -> list[str]:
    return [f"{store.base_url}shard-{i:06d}.tar{SLOW}" for i in range(N_SHARDS)]


def _two_scrapes(samples: Any, url: str) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]], int]:
    """Consume ``samples`` slowly; scrape after the 20th and the 120th sample."""
    first = second = None
    count = 0
    for _ in samples:
        count += 1
        time.sleep(0.005)  # a slow training step
        if count == 20:
            first = _scrape(url)
        if count == 120:
            second = _scrape(url)
            break
    assert first is not None and second is not None, f"the epoch ended after {count} samples"
    return first, second, count


def _increased(first: dict[str, dict[str, float]], second: dict[str, dict[str, float]], dataset: str) -> None:
    for name in COUNTERS + GAUGES:
        assert dataset in first[name] and dataset in second[name], name
    for name in COUNTERS:
        assert second[name][dataset] >= first[name][dataset], name
    for name in ("wds_async_bytes_read_total", "wds_async_samples_total"):
        assert second[name][dataset] > first[name][dataset] > 0, name
    assert second["wds_async_requests_total"][dataset] >= first["wds_async_requests_total"][dataset] > 0


def test_scraped_during_an_epoch_in_process(store: StoreProcess) -> None:
    ds = wds.WebDataset(_slow_urls(store), max_connections=2)
    with wds.serve_metrics(0) as server:
        first, second, count = _two_scrapes(ds, server.url)
    name = ds._worker_stats.name
    _increased(first, second, name)
    assert second["wds_async_samples_total"][name] >= count
    assert 0 < second["wds_async_first_sample_seconds"][name] == ds.stats()["first_sample_s"]
    assert second["wds_async_concurrency"][name] == 2
    assert second["wds_async_concurrency_reason_info"]  # the reason travels as a label


def test_scraped_during_an_epoch_summed_over_dataloader_workers(store: StoreProcess) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    ds = wds.WebDataset(_slow_urls(store), max_connections=1)
    wds.metrics.watch(ds, "train")
    loader = torch_data.DataLoader(ds, batch_size=None, num_workers=2)
    with wds.serve_metrics(0) as server:
        first, second, _ = _two_scrapes(loader, server.url)
    _increased(first, second, "train")
    assert second["wds_async_dataloader_workers"]["train"] == 2
    assert second["wds_async_first_sample_seconds"]["train"] > 0


@pytest.fixture
def metered_service() -> Iterator[tuple[str, str]]:
    """``wds-async serve --metrics-port`` in a subprocess: (socket path, metrics URL)."""
    directory = tempfile.mkdtemp(prefix="wds-met-")
    path, port = os.path.join(directory, "svc.sock"), free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    process = subprocess.Popen([sys.executable, "-m", "wds_async.cli.main", "serve", "--socket", path,
                                "--max-connections", "2", "--metrics-port", str(port)],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def up() -> bool:
        try:
            return os.path.exists(path) and "wds_async_bytes_read_total" in _scrape(url)
        except (OSError, urllib.error.URLError):
            return process.poll() is not None  # stop waiting on a dead service; the assert below says so

    try:
        assert wait_until(up, timeout=60) and process.poll() is None, process.stderr.read().decode()[-2000:] \
            if process.poll() is not None and process.stderr else "the service did not come up"
        yield path, url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_the_service_endpoint_answers_during_an_epoch(store: StoreProcess, metered_service: tuple[str, str]) -> None:
    path, url = metered_service
    ds = wds.WebDataset(_slow_urls(store), service=f"unix://{path}")
    first, second, _ = _two_scrapes(ds, url)
    assert ds.stats().get("service")  # the samples came through the service
    _increased(first, second, "service")


def test_bench_reports_the_time_to_first_sample(store: StoreProcess, tmp_path: Path) -> None:
    rows_file = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, "-m", "wds_async.cli.main", "bench", "-c", "2", "--no-auto",
                           "--json", str(rows_file), store.base_url + "shard-{000000..000001}.tar"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if line.startswith("phase"))
    assert "first ms" in header
    assert "first sample " in done.stdout and "the raw read's first byte" in done.stdout
    rows = {row["kind"]: row for row in json.loads(rows_file.read_text())}
    assert 0 < rows["raw"]["first_s"] < rows["raw"]["wall_s"]
    loader = rows["loader"]
    assert loader["first_sample_s"] > 0 and 0 < loader["first_s"] < loader["wall_s"]
