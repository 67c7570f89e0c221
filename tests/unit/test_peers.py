"""The peers' registry, URL mapping, table and chart (``wds-async bench --peers``), without running any peer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from wds_async.cli.bench.peers import PEERS, peer_names
from wds_async.cli.bench.peers._report import add_ratios, format_peers_table, plot_peers
from wds_async.cli.bench.peers._run import store_urls
from wds_async.cli.bench.peers.runners._common import keys_digest, sample_name


def test_peer_names_parses_dedupes_and_expands_all() -> None:
    assert peer_names(" s5cmd, boto3,s5cmd ") == ["s5cmd", "boto3"]
    assert peer_names("all") == list(PEERS)


@pytest.mark.parametrize("text", ["", "s5cmd,rclone", ",,"])
def test_unknown_peer_names_the_choices(text: str) -> None:
    with pytest.raises(ValueError, match="choose from s5cmd, gsutil, boto3"):
        peer_names(text)


def test_every_peer_has_its_runner_and_no_runner_shadows_a_package() -> None:
    for peer in PEERS.values():
        assert Path(peer.script).is_file(), peer.name
        stem = Path(peer.script).stem
        # A script's folder is first on its sys.path: a runner named like a package it imports would shadow it.
        assert stem not in {"boto3", "botocore", "webdataset", "s3torchconnector", "streaming", "litdata", "torch"}


def test_store_urls_names_the_same_objects_for_each_scheme() -> None:
    names = store_urls(["s3://b/x/shard-0.tar"], "https://127.0.0.1:9000/")
    assert names == {"s3": ["s3://b/x/shard-0.tar"], "gs": ["gs://b/x/shard-0.tar"],
                     "http": ["https://127.0.0.1:9000/b/x/shard-0.tar"]}
    assert store_urls(["s3://b/k"], None)["http"] is None


@pytest.mark.parametrize("url", ["http://h/b/k.tar", "s3://bucket-only", "/local/shard.tar", "gs://b/k.tar"])
def test_store_urls_wants_s3_urls(url: str) -> None:
    with pytest.raises(ValueError, match="s3://BUCKET/KEY"):
        store_urls([url], "http://127.0.0.1:1")


def test_keys_digest_sees_order_free_sets_and_repeats() -> None:
    a = [sample_name("s3://b/p/shard-1.tar", "k1"), sample_name("s3://b/p/shard-1.tar", "k2")]
    assert a[0] == "shard-1.tar/k1"
    assert keys_digest(a) == keys_digest(reversed(a))
    assert keys_digest(a + a[:1]) != keys_digest(a)


def _rows() -> list[dict[str, Any]]:
    return [
        {"name": "raw download (4 conns)", "kind": "raw", "peer": "raw", "mb_s": 100.0, "samples_s": None,
         "cpu_s_per_gb": 1.0, "peak_rss": 50e6, "exactly_once": "yes"},
        {"name": "s5cmd", "kind": "raw", "peer": "s5cmd", "mb_s": 125.0, "samples_s": None, "cpu_s_per_gb": 0.5,
         "peak_rss": 30e6, "exactly_once": "yes", "settings": "--numworkers 4"},
        {"name": "wds-async (4 conns)", "kind": "loader", "peer": "wds-async", "mb_s": 120.0, "samples_s": 1200.0,
         "cpu_s_per_gb": 2.0, "peak_rss": 90e6, "exactly_once": "yes"},
        {"name": "mosaic (best)", "kind": "loader", "peer": "mosaic", "mb_s": 60.0, "samples_s": 600.0,
         "cpu_s_per_gb": 3.0, "peak_rss": 400e6, "exactly_once": "yes"},
        {"name": "gsutil", "kind": "raw", "peer": "gsutil", "error": "gsutil speaks only https to the JSON API"},
    ]


def test_table_ratios_failures_and_winner() -> None:
    rows = _rows()
    text = format_peers_table(rows, 4)
    assert rows[2]["vs_fastest_raw"] == pytest.approx(120 / 125)
    assert "did not run: gsutil speaks only https" in text
    assert "fastest raw copy at 4 connections: s5cmd (125.0 MB/s)" in text
    assert "vs best peer loader mosaic (best) 600 samples/s: 2.00x" in text
    assert "s5cmd: --numworkers 4" in text


def test_no_raw_row_means_no_ratio() -> None:
    rows = [r for r in _rows() if r["kind"] != "raw"]
    assert add_ratios(rows) is None
    assert "vs_fastest_raw" not in rows[0]


def test_plot_writes_a_png(tmp_path: Path) -> None:
    path = tmp_path / "peers.png"
    plot_peers(_rows(), str(path), "test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
