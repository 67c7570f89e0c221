"""webdataset 1.0.2's semantics at the edges, each checked side by side: the same input through both.

``${NAME}`` in URLs, the exception types for bad tars, the last sample of a truncated shard under the
``*_and_stop`` handlers, ``__local_path__``, members whose basename starts with a dot, and malformed URLs.
Where we differ on purpose, the test says so in its name and pins both behaviours.
"""

from __future__ import annotations

import gc
import tarfile
import warnings
from pathlib import Path
from typing import Any

import pytest

import wds_async
from tests.parity.conftest import ours, reference, write_tar

# -- ${NAME} in URLs ---------------------------------------------------------------------------------


@pytest.fixture()
def two_shards(tmp_path: Path) -> Path:
    for i in range(2):
        write_tar(tmp_path / f"env-{i:03d}.tar", [(f"k{i}_{j}.txt", b"%d" % j) for j in range(3)])
    return tmp_path


def test_env_variable_expanded_before_braces(two_shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_SHARDS", str(two_shards))
    monkeypatch.setenv("WDS_FIRST", "000")
    urls = "${SHARDS}/env-{${FIRST}..001}.tar"
    expected = reference(urls)  # type: ignore[arg-type]
    got = [dict(s) for s in ours(urls)]  # type: ignore[arg-type]
    assert got == expected and len(got) == 6
    assert got[0]["__url__"] == f"{two_shards}/env-000.tar"


def test_env_variable_value_expanded_again(two_shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WDS_ROOT", str(two_shards))
    monkeypatch.setenv("WDS_SHARD", "${ROOT}/env-001.tar")  # a value naming another variable
    assert [dict(s) for s in ours("${SHARD}")] == reference("${SHARD}")  # type: ignore[arg-type]


def test_only_wds_prefixed_braced_variables(two_shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """webdataset reads ``${NAME}`` from ``WDS_NAME`` only; a plain ``NAME`` is not consulted by either."""
    monkeypatch.setenv("SHARDS", str(two_shards))
    monkeypatch.delenv("WDS_SHARDS", raising=False)
    with pytest.raises(AssertionError, match="WDS_SHARDS"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import webdataset

        webdataset.WebDataset("${SHARDS}/env-000.tar", shardshuffle=False)
    with pytest.raises(wds_async.UrlError, match=r"WDS_SHARDS, which is not set"):
        wds_async.WebDataset("${SHARDS}/env-000.tar")  # ours is a UrlError, at construction as well


# -- exception types for bad tars ------------------------------------------------------------------

MEMBER = 600  # bytes per member: a 512-byte header and two data blocks in the archive


def _shard(path: Path) -> bytes:
    members = [(f"k{i}.{ext}", bytes([i]) * MEMBER) for i in range(3) for ext in ("a", "b", "c")]
    return write_tar(path, members).read_bytes()


@pytest.fixture()
def cut_shard(tmp_path: Path) -> str:
    """k0 whole, k1.a whole, k1.b cut in the middle of its data."""
    data = _shard(tmp_path / "whole.tar")
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[: 3 * 3 * 512 + 3 * 512 + 512 + 300])
    return str(cut)


def _theirs(urls: list[str], **kw: Any) -> list[Any] | tuple[type[BaseException], str]:
    """webdataset's samples for ``urls``, or the type and message of what it raised. On a bad shard it
    leaves the file open; the garbage is collected here, with its ResourceWarning silenced."""
    import webdataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result: list[Any] | tuple[type[BaseException], str] = list(
                webdataset.WebDataset(urls, shardshuffle=False, nodesplitter=None, **kw))
        except Exception as exc:  # the caller checks the type
            result = (type(exc), str(exc))
        gc.collect()
    return result


@pytest.mark.parametrize("kind", ["truncated", "garbage"])
def test_bad_tar_is_a_tarfile_read_error_in_both(kind: str, cut_shard: str, tmp_path: Path) -> None:
    path = cut_shard
    if kind == "garbage":
        path = str(tmp_path / "garbage.tar")
        Path(path).write_bytes(b"not a tar archive at all " * 100)
    theirs = _theirs([path])
    assert isinstance(theirs, tuple) and issubclass(theirs[0], tarfile.ReadError)
    with pytest.raises(tarfile.ReadError) as info:  # code written for webdataset catches ours unchanged
        ours([path])
    err = info.value
    assert isinstance(err, wds_async.ShardFormatError) and isinstance(err, ValueError)
    assert isinstance(err, wds_async.TruncatedShard) == (kind == "truncated") and err.url == path


def test_format_errors_keep_their_place_in_the_tree() -> None:
    for cls in (wds_async.ShardFormatError, wds_async.TruncatedShard):
        assert issubclass(cls, wds_async.WdsError) and issubclass(cls, ValueError)
        assert issubclass(cls, tarfile.ReadError) and issubclass(cls, tarfile.TarError)
    assert not issubclass(wds_async.SampleError, tarfile.TarError)


# -- the last sample of a truncated shard under *_and_stop handlers --------------------------------


def _fields(samples: list[Any]) -> list[tuple[str, list[str]]]:
    return [(s["__key__"], sorted(k for k in s if not k.startswith("__"))) for s in samples]


@pytest.mark.parametrize("handler", ["ignore_and_stop", "warn_and_stop"])
def test_difference_partial_last_sample_is_dropped(handler: str, cut_shard: str) -> None:
    """webdataset yields what it had of the sample the archive ended in (here k1 without fields b and c):
    its grouper flushes whatever it holds when the tar stream stops. We drop that sample, deliberately:
    a sample missing fields would reach ``to_tuple`` or collation as if whole, and a checkpoint would count
    it delivered. Every whole sample before the cut is delivered by both."""
    import webdataset

    theirs = _theirs([cut_shard], handler=getattr(webdataset, handler))
    assert isinstance(theirs, list) and _fields(theirs) == [("k0", ["a", "b", "c"]), ("k1", ["a"])]
    got = [dict(s) for s in wds_async.WebDataset([cut_shard], deterministic=True, handler=handler)]
    assert got == theirs[:-1]


def test_difference_partial_sample_dropped_before_the_next_shard(cut_shard: str, tmp_path: Path) -> None:
    """With ``ignore_and_continue`` too: we go on with the next shard, without the cut shard's partial sample."""
    nxt = str(write_tar(tmp_path / "next.tar", [("n.a", b"1"), ("n.b", b"2")]))
    got = wds_async.WebDataset([cut_shard, nxt], deterministic=True, handler="ignore_and_continue")
    assert _fields(list(got)) == [("k0", ["a", "b", "c"]), ("n", ["a", "b"])]


# -- __local_path__ ----------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["absolute", "relative", "file-url", "file-localhost"])
def test_local_path_as_webdataset_sets_it(form: str, two_shards: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = two_shards / "env-000.tar"
    monkeypatch.chdir(two_shards.parent)
    url = {"absolute": str(path), "relative": f"{two_shards.name}/env-000.tar", "file-url": f"file://{path}",
           "file-localhost": f"file://localhost{path}"}[form]
    expected = reference([url])
    got = [dict(s) for s in ours([url])]
    assert got == expected
    assert got[0]["__local_path__"] == (f"{two_shards.name}/env-000.tar" if form == "relative" else str(path))


def test_local_path_survives_stages(two_shards: Path) -> None:
    url = str(two_shards / "env-001.tar")

    def build(ds: Any) -> Any:
        return ds.map(lambda s: s).to_tuple("__local_path__", "txt")

    assert ours([url], build) == reference([url], build)


def test_no_local_path_for_remote_shards(pattern: str) -> None:
    sample = next(iter(wds_async.WebDataset(pattern.split("{")[0] + "000000.tar")))
    assert "__local_path__" not in sample and sample["__url__"].startswith("http://127.0.0.1")


# -- members whose basename starts with a dot ------------------------------------------------------

DOTTED = [
    ("q/.hidden.txt", b"1"), ("q/.hidden.json", b"[2]"),  # key "q/", extensions hidden.txt, hidden.json
    ("r/s/.x.y.Z", b"3"),                                 # key "r/s/", extension x.y.z
    ("a.b/.none", b"4"),                                  # no key: the folder path has a dot
    ("a.b/c/.v", b"5"),                                   # key "a.b/c/"
    (".top.txt", b"6"),                                   # no key: nothing before the dot
    ("plain.txt", b"7"),
]


@pytest.mark.parametrize("name", [n for n, _ in DOTTED] + ["q/..x", "q/.hidden", "dir.x/noext", "a/b\nc/d.e",
                                                           "x\n.y/a.b/c.d", "q/._fork.txt"])
def test_split_key_is_base_plus_ext(name: str) -> None:
    from webdataset.tariterators import base_plus_ext

    from wds_async.engine.grouping import split_key

    key, ext = base_plus_ext(name)
    assert split_key(name) == (None if key is None else (key, ext))


def test_dot_files_group_as_in_webdataset(tmp_path: Path) -> None:
    path = str(write_tar(tmp_path / "dots.tar", DOTTED))
    got = [dict(s) for s in ours([path])]
    assert got == reference([path])
    assert _fields(got) == [("q/", ["hidden.json", "hidden.txt"]), ("r/s/", ["x.y.z"]), ("a.b/c/", ["v"]),
                            ("plain", ["txt"])]


def test_difference_macos_fork_in_a_folder_is_skipped(tmp_path: Path) -> None:
    path = str(write_tar(tmp_path / "fork.tar", [("q/.hidden.txt", b"1"), ("q/._hidden.txt", b"fork")]))
    assert _fields(reference([path])) == [("q/", ["_hidden.txt", "hidden.txt"])]
    assert _fields(ours([path])) == [("q/", ["hidden.txt"])]


# -- malformed URLs fail at construction -----------------------------------------------------------


@pytest.mark.parametrize(("url", "fix"), [
    ("s3://", "s3://bucket/"),
    ("s3:///train-000.tar", "names no bucket"),
    ("s3://bucket", "no object"),
    ("s3:/bucket/train-000.tar", "two slashes"),
    ("gs://", "gs://bucket/"),
    ("gs:bucket/x.tar", "two slashes"),
    ("az://", "az://container/"),
    ("file://otherhost/data/x.tar", "file:///path"),
    ("ftp://host/x.tar", "supported:"),
    ("foo:bar", "supported:"),
])
def test_malformed_url_fails_at_construction(url: str, fix: str) -> None:
    """webdataset accepts each of these and fails (or hangs on a retry) only when iterated; ours raises
    UrlError naming the URL and the fix before any worker starts."""
    import webdataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        webdataset.WebDataset(url, shardshuffle=False)  # no error yet
    with pytest.raises(wds_async.UrlError) as info:
        wds_async.WebDataset(f"{url}::/data/ok-{{000..001}}.tar")
    assert url in str(info.value) and fix in str(info.value) and info.value.url == url


def test_forbidden_pipe_fails_at_construction(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(wds_async.UrlError, match=r"disabled.*allow_pipe=True.*url=pipe:cat /x.tar"):
        wds_async.WebDataset("pipe:cat /x.tar", allow_pipe=False)
    monkeypatch.setenv("WDS_ASYNC_NO_PIPE", "1")
    with pytest.raises(wds_async.UrlError, match="WDS_ASYNC_NO_PIPE"):
        wds_async.WebDataset("pipe:cat /x.tar")
    assert wds_async.WebDataset("pipe:cat /x.tar", allow_pipe=True).urls == ["pipe:cat /x.tar"]
