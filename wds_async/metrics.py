"""The counters of ``stats()`` in Prometheus' text format, for any process: :func:`serve_metrics`.

A scrape reads the live counters of this process (:func:`wds_async.stats.watched`): every dataset iterated here,
its DataLoader workers summed as ``ds.stats()`` sums them, and the node service's counters in ``wds-async serve
--metrics-port``. Each set is labelled ``dataset`` (its number in this process, or the name given to
:func:`watch`; ``service`` for the node service) and ``rank`` (``$RANK``, as torchrun sets it; ``0`` without).
A new epoch starts its counters from zero: Prometheus' ``rate()`` treats that as a counter reset.

``prometheus_client`` comes with the ``metrics`` extra (``pip install 'wds-async[metrics]'``); it is imported only
when metrics are served or collected. See ``docs/metrics.md`` for the metric list and a dashboard.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Self

from .errors import MissingDependency
from .stats import SharedStats, Stats, watched
from .stats import watch as _watch_stats

__all__ = ["COUNTERS", "GAUGES", "MetricsServer", "collect", "serve_metrics", "watch"]

#: (key of ``stats()``, metric name without ``_total``, help): counters, exported as ``<name>_total``.
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("bytes_read", "wds_async_bytes_read", "Bytes received from the store (compressed size for .tar.gz)."),
    ("samples_delivered", "wds_async_samples", "Samples handed to the training loop."),
    ("samples_read", "wds_async_samples_read", "Samples completed by the engine."),
    ("requests", "wds_async_requests", "Requests opened (each retry and each ranged part is one)."),
    ("retries", "wds_async_retries", "Requests retried after a transient failure."),
    ("throttled", "wds_async_throttled", "Answers asking to slow down (429, 503 SlowDown)."),
    ("cache_hits", "wds_async_cache_hits", "Items read from a complete copy in the shard cache."),
    ("cache_fills", "wds_async_cache_fills", "Shards written to the shard cache."),
    ("cache_bypasses", "wds_async_cache_bypasses",
     "Shards read from the store uncached because another process's fill of them stalled."),
    ("batches_read_ahead", "wds_async_batches_read_ahead",
     "Random access: batches whose reads had started before the DataLoader asked for them."),
    ("shards_done", "wds_async_shards_done", "Shards read to their end."),
    ("shards_skipped", "wds_async_shards_skipped", "Shards skipped by an error handler."),
    ("samples_skipped", "wds_async_samples_skipped", "Samples skipped by an error handler."),
    ("wait_s", "wds_async_consumer_wait_seconds",
     "Seconds the training loop waited on the loader (its rate is the starvation fraction)."),
)
#: (key of ``stats()``, metric name, help, scale): gauges; one without a value (no first sample yet) is left out.
GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("concurrency", "wds_async_concurrency", "Requests the engine allows in flight now.", 1.0),
    ("concurrency_cap", "wds_async_concurrency_cap", "The most requests the engine may allow in flight.", 1.0),
    ("shards_in_flight", "wds_async_shards_in_flight", "Shards being read now.", 1.0),
    ("buffered_bytes", "wds_async_buffered_bytes", "Bytes read and not yet handed to the training loop.", 1.0),
    ("buffer_limit", "wds_async_buffer_limit_bytes", "The most bytes the loader buffers.", 1.0),
    ("peak_buffered_bytes", "wds_async_peak_buffered_bytes", "The most bytes buffered at once so far.", 1.0),
    ("first_sample_s", "wds_async_first_sample_seconds",
     "Seconds from the iteration's start to its first sample (time to first batch).", 1.0),
    ("ttfb_ms", "wds_async_ttfb_seconds", "Time to a request's first byte (moving average).", 1e-3),
    ("elapsed_s", "wds_async_elapsed_seconds", "Seconds since the iteration started (to its end once done).", 1.0),
    ("workers", "wds_async_dataloader_workers", "DataLoader workers whose counters are summed here.", 1.0),
)


def _prometheus() -> Any:
    try:
        import prometheus_client
        import prometheus_client.core  # the metric families, as an attribute of the package
    except ImportError:
        raise MissingDependency("Prometheus metrics need prometheus_client: pip install 'wds-async[metrics]'") from None
    return prometheus_client


def _rank() -> str:
    return os.environ.get("RANK", "0")


def watch(source: Any, name: str) -> None:
    """Export ``source`` under ``dataset="name"``: a dataset (``WebDataset``, a mix or ``IndexedWebDataset``;
    replaces its number as the label) or a :class:`~wds_async.stats.Stats` (exported from now on, whether or not it
    counted anything)."""
    if isinstance(source, Stats):
        _watch_stats(source, name)
        return
    shared = getattr(source, "_worker_stats", None)
    if not isinstance(shared, SharedStats):
        raise TypeError("watch() takes a WebDataset, a mix, an IndexedWebDataset or a wds_async.stats.Stats, "
                        f"not {type(source).__name__}")
    shared.name = name


class _Collector:
    """A prometheus_client collector over :func:`~wds_async.stats.watched`, read at each scrape."""

    def collect(self) -> Iterator[Any]:
        core = _prometheus().core
        rank = _rank()
        sets = watched()
        labels = ["dataset", "rank"]
        for key, name, help_text in COUNTERS:
            family = core.CounterMetricFamily(name, help_text, labels=labels)
            for dataset, snap in sets:
                family.add_metric([dataset, rank], float(snap.get(key) or 0))
            yield family
        for key, name, help_text, scale in GAUGES:
            family = core.GaugeMetricFamily(name, help_text, labels=labels)
            for dataset, snap in sets:
                value = snap.get(key, 1 if key == "workers" else None)
                if value is not None:
                    family.add_metric([dataset, rank], float(value) * scale)
            yield family
        info = core.InfoMetricFamily("wds_async_concurrency_reason", "Why the concurrency last changed.",
                                     labels=labels)
        for dataset, snap in sets:
            info.add_metric([dataset, rank], {"reason": str(snap.get("concurrency_reason") or "fixed")})
        yield info


def collect() -> bytes:
    """The metrics of this process in Prometheus' text format, as a scrape would read them."""
    client = _prometheus()
    registry = client.CollectorRegistry()
    registry.register(_Collector())
    return bytes(client.generate_latest(registry))


class MetricsServer:
    """A running metrics endpoint (a daemon thread); ``close()`` stops it."""

    def __init__(self, server: Any, thread: Any) -> None:
        self._server, self._thread = server, thread
        self.addr, self.port = server.server_address[:2]
        self.url = f"http://{self.addr}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serve_metrics(port: int, addr: str = "127.0.0.1") -> MetricsServer:
    """Serve this process's loader metrics at ``http://addr:port/metrics`` from a daemon thread, until the process
    ends or ``close()``; ``port=0`` picks a free port (the server's ``port``). Every dataset iterated in this
    process is exported, with its DataLoader workers summed; ``addr`` is 127.0.0.1 unless you open it on purpose.
    Several ranks on one node each need their own port (e.g. ``9100 + LOCAL_RANK``)."""
    client = _prometheus()
    registry = client.CollectorRegistry()
    registry.register(_Collector())
    server, thread = client.start_http_server(port, addr=addr, registry=registry)
    return MetricsServer(server, thread)
