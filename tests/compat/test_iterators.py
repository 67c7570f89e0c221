"""The shim's iterator functions against webdataset 1.0.2's own, on the same input (both imported side by side,
nothing installed): ``url_opener`` -> ``tar_file_expander`` -> ``group_by_keys`` as open_clip composes them,
``gopen`` over HTTP on 127.0.0.1, and ``_shuffle`` with a generator shared across passes, as timm uses it."""

from __future__ import annotations

import functools
import gzip
import http.server
import io
import random
import tarfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import webdataset.filters as real_filters
import webdataset.tariterators as real

from wds_async import NotFound
from wds_async.compat import filters as ours_filters
from wds_async.compat import tariterators as ours
from wds_async.compat.gopen import gopen


def _tar(members: list[tuple[str, bytes]], *, compress: bool = False) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(out.getvalue(), mtime=0) if compress else out.getvalue()


MEMBERS = [
    ("__meta__", b"skipped"), ("a/b.c/img1.seg.PNG", b"1"), ("a/b.c/img1.txt", b"one"), ("noext", b"x"),
    ("dir/__index__/x.txt", b"meta"), ("k2.jpg", b"\xff\xd8"), ("k2.json", b"{}"), ("k3.txt", b"3" * 5000),
    ("q/.hidden.txt", b"h"), ("long/" + "n" * 150 + ".cls", b"7"),
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    root = tmp_path_factory.mktemp("iter")
    paths = []
    for i, compress in enumerate([False, True, False]):
        path = root / f"shard-{i}.tar{'.gz' if compress else ''}"
        # the last key of one shard is the first of the next: only the URL tells the samples apart
        path.write_bytes(_tar([*MEMBERS, ("edge.txt", str(i).encode())] if i < 2 else
                              [("edge.txt", b"next"), *MEMBERS], compress=compress))
        paths.append(str(path))
    return paths


def _opened(lib: Any, urls: list[str], closing: list[Any]) -> Iterator[dict[str, Any]]:
    """``lib.url_opener`` over ``urls``, each stream remembered in ``closing`` (webdataset's expander leaves its
    streams open)."""
    for source in lib.url_opener([{"url": u} for u in urls]):
        closing.append(source["stream"])
        yield source


def _chain(lib: Any, urls: list[str], **expander: Any) -> list[dict[str, Any]]:
    closing: list[Any] = []
    try:
        return list(lib.group_by_keys(lib.tar_file_expander(_opened(lib, urls, closing), **expander)))
    finally:
        for stream in closing:
            stream.close()


def test_the_open_clip_chain_yields_webdatasets_samples(shards: list[str]) -> None:
    mine = _chain(ours, shards, eof_value={})
    theirs = _chain(real, shards, eof_value={})
    assert mine == theirs and len(mine) > 10
    # without the marker (webdataset 0.2's default, and ours) a sample still never spans two shards
    assert _chain(ours, shards) == theirs


def test_files_come_out_as_webdatasets(shards: list[str]) -> None:
    def files(lib: Any) -> list[dict[str, Any]]:
        closing: list[Any] = []
        try:
            return list(lib.tar_file_expander(_opened(lib, shards, closing), select_files=lambda n: not n.endswith(
                ".json"), rename_files=str.lower, eof_value=None))
        finally:
            for stream in closing:
                stream.close()

    assert files(ours) == files(real)
    assert [ours.base_plus_ext(name) for name, _ in MEMBERS] == [real.base_plus_ext(name) for name, _ in MEMBERS]


def test_open_clip_s_own_grouper_reads_our_files(shards: list[str]) -> None:
    # open_clip's group_by_keys_nothrow reads every item's "fname": the end-of-shard {} of 1.0.2 breaks it, ours
    # yields none unless asked
    files = list(ours.tar_file_expander(ours.url_opener([{"url": u} for u in shards])))
    assert all("fname" in f and "data" in f and f["__url__"] in shards for f in files)
    closing: list[Any] = []
    try:
        with pytest.raises(KeyError):
            [f["fname"] for f in real.tar_file_expander(_opened(real, shards, closing))]
    finally:
        for stream in closing:
            stream.close()


def test_errors_go_to_the_handler_with_the_url(shards: list[str], tmp_path: Path) -> None:
    truncated = tmp_path / "cut.tar"
    truncated.write_bytes(Path(shards[0]).read_bytes()[:3000])
    seen: list[BaseException] = []

    def keep(exn: BaseException) -> bool:
        seen.append(exn)
        return True

    urls = [str(tmp_path / "missing.tar"), str(truncated), shards[2]]
    opened = ours.url_opener([{"url": u} for u in urls], handler=keep)
    samples = list(ours.group_by_keys(ours.tar_file_expander(opened, handler=keep), handler=keep))
    assert {s["__url__"] for s in samples} >= {shards[2]}
    assert isinstance(seen[0], FileNotFoundError) and seen[0].args[-1] == urls[0]
    assert type(seen[1]).__name__ == "TruncatedShard" and seen[1].args[-1] == str(truncated)
    with pytest.raises(FileNotFoundError):
        list(ours.url_opener([{"url": urls[0]}]))


@pytest.fixture()
def http_root(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", tmp_path
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_gopen_reads_http_through_our_backend_and_the_chain_works_over_it(http_root: tuple[str, Path],
                                                                          shards: list[str]) -> None:
    base, folder = http_root
    payload = bytes(range(256)) * 5000
    (folder / "blob.bin").write_bytes(payload)
    with gopen(f"{base}/blob.bin") as f:
        assert f.read(10) == payload[:10]
        assert f.read() == payload[10:]
    (folder / "s.tar").write_bytes(Path(shards[0]).read_bytes())
    over_http = _chain(ours, [f"{base}/s.tar"])
    local = _chain(ours, [shards[0]])
    assert [{k: v for k, v in s.items() if k != "__url__"} for s in over_http] == \
        [{k: v for k, v in s.items() if k != "__url__"} for s in local]
    with pytest.raises(NotFound):
        gopen(f"{base}/missing.tar")


def test_gopen_writes_local_files_and_pipes(tmp_path: Path) -> None:
    with gopen(str(tmp_path / "out.bin"), "wb") as f:
        f.write(b"abc")
    assert (tmp_path / "out.bin").read_bytes() == b"abc"
    sink = gopen(f"pipe:cat > {tmp_path / 'piped.bin'}", "wb")
    sink.write(b"xyz")
    sink.close()
    assert (tmp_path / "piped.bin").read_bytes() == b"xyz"
    assert gopen(f"pipe:cat {tmp_path / 'piped.bin'}").read() == b"xyz"


@pytest.mark.parametrize("bufsize,initial", [(8192, 2048), (10, 3), (1, 1)])
def test_shuffle_draws_like_webdataset_across_passes_of_one_generator(bufsize: int, initial: int) -> None:
    # timm builds wds.shuffle(..., rng=random.Random(worker_seed)) once and runs it every epoch; open_clip and timm
    # call _shuffle(src, bufsize, initial, rng) directly
    def passes(lib: Any) -> list[list[int]]:
        rng = random.Random(42)
        return [list(lib._shuffle(iter(range(40)), bufsize, initial, rng)) for _ in range(3)]

    assert passes(ours_filters) == passes(real_filters)
    assert list(ours_filters.shuffle(bufsize, initial, seed=3)(iter(range(40)))) == \
        list(real_filters.shuffle(bufsize, initial, seed=3)(iter(range(40))))
