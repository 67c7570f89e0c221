"""``first_sample_s`` in the counters, and their Prometheus export (wds_async.metrics) read in this process."""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import wds_async as wds
from wds_async import metrics
from wds_async.errors import MissingDependency
from wds_async.stats import _WIDTH, SharedStats, Stats, _Publisher, watched


def _parse(text: bytes | str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(sample name, sorted labels): value} of a scrape."""
    body = text.decode() if isinstance(text, bytes) else text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(body) for s in family.samples}


def _value(scrape: dict[Any, float], name: str, dataset: str, **labels: str) -> float:
    key = (name, tuple(sorted({"dataset": dataset, "rank": "0", **labels}.items())))
    return scrape[key]


def test_first_delivery_stamps_first_sample_once() -> None:
    stats = Stats()
    assert stats.snapshot()["first_sample_s"] is None
    stats.delivered(0)  # an ItemDone-only handoff is no sample
    assert stats.first_sample_s is None and stats.samples_delivered == 0
    stats.delivered(3)
    first = stats.first_sample_s
    assert first is not None and first >= 0 and stats.samples_delivered == 3
    stats.delivered(2)
    assert stats.first_sample_s == first and stats.samples_delivered == 5
    assert stats.snapshot()["first_sample_s"] == round(first, 4)


def test_an_iteration_reports_its_first_sample(shard_dir: Path) -> None:
    ds = wds.WebDataset(str(shard_dir / "shard-{000000..000001}.tar"), max_connections=2)
    started = time.perf_counter()
    assert sum(1 for _ in ds) > 0
    s = ds.stats()
    assert s["first_sample_s"] is not None
    assert 0 < s["first_sample_s"] <= s["elapsed_s"] <= time.perf_counter() - started


def test_a_very_short_run_reports_its_first_sample_within_its_length() -> None:
    # Both figures are rounded alike: a first sample at 4.34 ms of a 4.36 ms run once read 0.0043 s against 0.004.
    now = time.perf_counter()
    s = Stats(started=now - 0.00436, first_sample_s=0.00434, finished=now).snapshot()
    assert s["first_sample_s"] <= s["elapsed_s"]


def test_a_first_sample_taken_after_the_engine_finished_is_within_the_run() -> None:
    # CI once read first_sample_s 0.0043 against elapsed_s 0.0042: the engine had read both shards before the
    # consumer took the first sample.
    now = time.perf_counter()
    s = Stats(started=now - 0.0042, first_sample_s=0.0043, finished=now).snapshot()
    assert s["first_sample_s"] <= s["elapsed_s"]


def test_workers_combine_to_the_earliest_first_sample() -> None:
    # Two workers' slots, written as their publisher threads write them: the first sample of the run is the
    # earliest any worker delivered, counted from the earliest worker's start.
    shared = SharedStats()
    now = time.perf_counter()
    early = Stats(started=now - 2.0, first_sample_s=1.5, samples_delivered=4)   # first sample at now - 0.5
    late = Stats(started=now - 1.0, first_sample_s=0.2, samples_delivered=6)    # first sample at now - 0.8
    for slot, stats in enumerate((early, late)):
        _Publisher(shared._array, slot * _WIDTH, 2, stats).stop()
    s = shared.combined()
    assert s["workers"] == 2 and s["samples_delivered"] == 10
    assert s["first_sample_s"] == pytest.approx(1.2, abs=1e-3)
    none = SharedStats()
    _Publisher(none._array, 0, 1, Stats()).stop()
    assert none.combined()["first_sample_s"] is None


def test_collect_exports_an_iterated_dataset_as_its_stats_say(shard_dir: Path) -> None:
    ds = wds.WebDataset(str(shard_dir / "shard-{000000..000002}.tar"), max_connections=2)
    assert sum(1 for _ in ds) > 0
    metrics.watch(ds, "train-unit")
    s = ds.stats()
    scrape = _parse(metrics.collect())
    assert _value(scrape, "wds_async_bytes_read_total", "train-unit") == s["bytes_read"] > 0
    assert _value(scrape, "wds_async_samples_total", "train-unit") == s["samples_delivered"] > 0
    assert _value(scrape, "wds_async_requests_total", "train-unit") == s["requests"] > 0
    assert _value(scrape, "wds_async_retries_total", "train-unit") == 0
    assert _value(scrape, "wds_async_throttled_total", "train-unit") == 0
    assert _value(scrape, "wds_async_cache_hits_total", "train-unit") == 0
    assert _value(scrape, "wds_async_consumer_wait_seconds_total", "train-unit") == s["wait_s"]
    assert _value(scrape, "wds_async_concurrency", "train-unit") == s["concurrency"]
    assert _value(scrape, "wds_async_first_sample_seconds", "train-unit") == s["first_sample_s"]
    assert _value(scrape, "wds_async_buffer_limit_bytes", "train-unit") == s["buffer_limit"] > 0
    reason = s["concurrency_reason"] or "fixed"
    assert _value(scrape, "wds_async_concurrency_reason_info", "train-unit", reason=reason) == 1
    families = {f.name: f.type for f in text_string_to_metric_families(metrics.collect().decode())}
    assert families["wds_async_bytes_read"] == "counter" and families["wds_async_concurrency"] == "gauge"


def test_a_dataset_not_iterated_is_not_exported(shard_dir: Path) -> None:
    ds = wds.WebDataset(str(shard_dir / "shard-000000.tar"))
    name = ds._worker_stats.name
    assert name not in {n for n, _ in watched()}
    assert sum(1 for _ in ds) > 0
    assert name in {n for n, _ in watched()}


def test_watched_stats_are_exported_under_their_name() -> None:
    stats = Stats(bytes_read=1234, concurrency=7, concurrency_cap=64, concurrency_reason="autotune: growing")
    metrics.watch(stats, "unit-service")
    scrape = _parse(metrics.collect())
    assert _value(scrape, "wds_async_bytes_read_total", "unit-service") == 1234
    assert _value(scrape, "wds_async_concurrency_cap", "unit-service") == 64
    assert _value(scrape, "wds_async_concurrency_reason_info", "unit-service", reason="autotune: growing") == 1
    with pytest.raises(TypeError, match="WebDataset"):
        metrics.watch(object(), "nothing")


def test_serve_metrics_answers_over_http_on_loopback() -> None:
    stats = Stats(samples_delivered=11)
    metrics.watch(stats, "unit-http")
    with wds.serve_metrics(0) as server:
        assert server.addr == "127.0.0.1" and server.port > 0
        with urllib.request.urlopen(server.url, timeout=10) as answer:
            first = _parse(answer.read())
        stats.samples_delivered = 15
        with urllib.request.urlopen(server.url, timeout=10) as answer:
            second = _parse(answer.read())
    assert _value(first, "wds_async_samples_total", "unit-http") == 11
    assert _value(second, "wds_async_samples_total", "unit-http") == 15


def test_without_prometheus_client_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what `import` finds when it is not installed
    with pytest.raises(MissingDependency, match=r"wds-async\[metrics\]"):
        wds.serve_metrics(0)


def test_the_bench_table_has_a_first_sample_column() -> None:
    from wds_async.cli.bench.run import format_table

    common = {"mb_s": 100.0, "vs_raw": 1.0, "cpu_s_per_gb": 1.0, "peak_above_baseline": 0, "samples_s": None}
    raw = {**common, "name": "raw download (2 conns)", "samples": None, "first_s": 0.004}
    loader = {**common, "name": "wds-async (2 conns)", "samples": 10, "unique": 10, "samples_s": 5.0,
              "first_s": 0.031, "first_sample_s": 0.025, "peak_buffered": 0, "limit": 1 << 20, "wait_s": 0.1}
    peer = {**common, "name": "webdataset 1 process", "samples": 10, "unique": 10}  # a row without the figure
    lines = format_table([raw, loader, peer]).splitlines()
    assert lines[0].split()[-3:] == ["ms", "exactly", "once"] and "first ms" in lines[0]
    assert lines[2].split()[-2:] == ["4", "-"] and lines[3].split()[-2:] == ["31", "yes"]
    assert lines[4].split()[-2:] == ["-", "yes"]
    assert "first sample 31 ms after the loop began (the engine's first_sample_s: 25 ms), the raw read's first " \
           "byte 4 ms: +27 ms" in " ".join(lines)
