"""The shard cache against hostile and careless directories, with the emulated store on 127.0.0.1 and real users:
another user's directory (made, with links planted in it, by a process that dropped to ``nobody``) is refused and
nothing is written through its links; in a directory of ours no link, FIFO or other user's file is followed or
trusted; modes that let others write are refused with a remedy; a directory we cannot write (a process of
``nobody`` with its own read-only directory: root ignores modes) costs one warning, never the epoch.

Each test says in its docstring how it failed on the cache before these rules (commit a1fbb60 and earlier)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import re
import shutil
import stat
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from emustore import StoreProcess
from tests.conftest import sample_digest
from wds_async.cache.disk import ShardCache, UnsafeCacheDirectory, make_cache

N = 4
NOBODY = 65534

needs_root = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="needs root to act as another user (nobody)")


@pytest.fixture()
def shared_tmp() -> Iterator[Path]:
    """A fresh directory like ``/tmp`` itself (mode 1777: every user may create entries, only in their name), in
    ``/tmp`` because pytest's own temporary folders (mode 0700) are closed to other users."""
    base = Path(tempfile.mkdtemp(prefix="wds-cache-security-"))
    os.chmod(base, 0o1777)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _urls(store: StoreProcess) -> list[str]:
    return [store.base_url + f"shard-{i:06d}.tar" for i in range(N)]


def _drop_to_nobody() -> None:
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def _as_nobody(target: Callable[..., None], *args: Any) -> None:
    """Run ``target(*args)`` in a forked process that gave up root for ``nobody``; fail the test if it fails."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_nobody_main, args=(send, target, args))
    child.start()
    send.close()
    try:
        error = receive.recv()
    except EOFError:
        error = "the child died without a word"
    child.join()
    assert error is None and child.exitcode == 0, error


def _nobody_main(send: Any, target: Callable[..., None], args: tuple[Any, ...]) -> None:
    try:
        _drop_to_nobody()
        target(*args)
    except BaseException:
        send.send(traceback.format_exc())
        raise
    send.send(None)


def _plant(directory: str, links: dict[str, str]) -> None:
    """As another user: make ``directory`` open to all (0777), planting each name -> target as a symbolic link."""
    os.mkdir(directory)
    os.chmod(directory, 0o777)
    for name, target in links.items():
        os.symlink(target, os.path.join(directory, name))


def _root_only(path: Path, content: bytes) -> Path:
    path.write_bytes(content)
    os.chmod(path, 0o600)
    return path


def _every_planted_name(cache: str, urls: list[str]) -> list[str]:
    sc = ShardCache(cache)
    return [os.path.basename(sc.path(url, suffix)) for url in urls
            for suffix in ("", ".json", ".part", ".json.tmp", ".lock")]


@needs_root
def test_another_users_directory_is_refused_and_its_links_never_followed(store: StoreProcess, shared_tmp: Path
                                                                         ) -> None:
    """``nobody`` creates the cache directory first (0777) and plants links under every name the cache would
    use, to a root-only file. Before: ``WebDataset`` accepted the directory, and the epoch wrote shard bytes
    through ``NAME.part`` and metadata through ``NAME.json.tmp`` into the root-only file, then renamed the links
    into place as the cache's entries. Now the directory is refused at construction and, when it appears only
    later, at the first item, with an error naming it and what to do; the file is untouched."""
    urls = _urls(store)
    secret = _root_only(shared_tmp / "secret", b"root only\n")
    for when in ("constructed", "iterated"):
        cache = str(shared_tmp / f"cache-{when}")
        planted = dict.fromkeys(_every_planted_name(cache, urls), str(secret))
        if when == "constructed":
            _as_nobody(_plant, cache, planted)
            with pytest.raises(UnsafeCacheDirectory, match=re.escape(cache) + r": it is owned by another user "
                               r"\(uid 65534.*pass a cache_dir of your own"):
                wds.WebDataset(urls, cache_dir=cache)
        else:
            ds = wds.WebDataset(urls, cache_dir=cache)  # nothing there yet: accepted
            _as_nobody(_plant, cache, planted)  # ... and then another user creates it
            with pytest.raises(UnsafeCacheDirectory, match=re.escape(cache) + ".*owned by another user"):
                sample_digest(ds)
        assert secret.read_bytes() == b"root only\n"
        assert all(os.readlink(os.path.join(cache, name)) == str(secret) for name in planted)  # none replaced
        assert sorted(os.listdir(cache)) == sorted(planted)  # and nothing written there


@needs_root
def test_a_link_another_user_owns_is_refused_as_the_cache_directory(shared_tmp: Path) -> None:
    """``nobody`` plants ``cache`` as a link to a directory of root's (mode 0700, so it passes every check of
    its own). They could point it anywhere later (``/etc``); before, it was accepted."""
    ours = shared_tmp / "roots-own"
    ours.mkdir(mode=0o700)
    link = str(shared_tmp / "cache")
    _as_nobody(os.symlink, str(ours), link)
    with pytest.raises(UnsafeCacheDirectory, match=re.escape(link) + r": it is a symbolic link owned by another"):
        make_cache(link, None)
    assert list(ours.iterdir()) == []


def test_directory_modes(store: StoreProcess, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Ours but writable by others (0777, 0773, sticky 1777): refused with ``chmod 700 DIR`` as the remedy, by
    the dataset (when made, and at the first item if it became so later) and by ``wds-async cache``; before, all
    were accepted. Ours with 0755 (made so by hand or an older version): accepted. A directory the cache
    creates: 0700, and its files 0600."""
    from wds_async.cli.main import main

    urls = _urls(store)
    expected = sample_digest(wds.WebDataset(urls, deterministic=True))
    cache = tmp_path / "cache"
    cache.mkdir()
    for mode in (0o777, 0o773, 0o1777):
        os.chmod(cache, mode)
        with pytest.raises(UnsafeCacheDirectory, match=re.escape(str(cache)) + f": it is writable by other users "
                           rf"\(mode {mode:04o}\).*run `chmod 700 {re.escape(str(cache))}`"):
            wds.WebDataset(urls, cache_dir=cache)
        assert main(["cache", "ls", str(cache)]) == 2
        assert f"chmod 700 {cache}" in capsys.readouterr().err
    os.chmod(cache, 0o755)
    ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True)
    os.chmod(cache, 0o777)  # opened up after the dataset was made: refused at the first item
    with pytest.raises(UnsafeCacheDirectory, match="writable by other users"):
        sample_digest(ds)
    assert list(cache.iterdir()) == []
    os.chmod(cache, 0o755)
    assert sample_digest(wds.WebDataset(urls, cache_dir=cache, deterministic=True)) == expected
    assert len(ShardCache(cache).entries()) == N
    fresh = tmp_path / "fresh" / "cache"
    assert sample_digest(wds.WebDataset(urls, cache_dir=fresh, deterministic=True)) == expected
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in fresh.iterdir()} == {0o600}


def _forge(store_root: Path, other: str, path: Path) -> tuple[Path, Path]:
    """A valid shard that is not the one asked for (``other``'s bytes), with metadata that vouches for it."""
    data = path.with_suffix(".tar")
    shutil.copy(store_root / other, data)
    meta = path.with_suffix(".json")
    meta.write_text(json.dumps({"version": 1, "url": "forged", "size": data.stat().st_size, "etag": None,
                                "generation": None, "last_modified": None}))
    return data, meta


def test_planted_entries_in_our_directory_are_never_followed_nor_trusted(
        store: StoreProcess, shard_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A directory of ours (0700) where entries were planted anyway (by a group member, an older process, a
    mistake), read with ``cache_validate=False`` so that nothing but the entries decides:

    * shard 0: ``NAME`` and ``NAME.json`` are links to a forged copy (another shard's bytes) and its metadata.
      Before: followed, and shard 2's samples were delivered as shard 0's.
    * shard 1: ``NAME.part`` and ``NAME.json.tmp`` are links to files outside. Before: the fill wrote the shard
      through the first and the metadata through the second, and the links became the copy and its metadata.
    * shard 2: ``NAME.lock`` is a link. Now the shard is read from the store uncached (one warning naming the
      lock); the link stays (lock files are never removed) and its target is untouched.
    * shard 3: the copy is a forged file owned by another user (uid 65534), with metadata of ours that vouches
      for it. Before: trusted and delivered.
    """
    urls = _urls(store)
    expected = sample_digest(wds.WebDataset(urls, deterministic=True))
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    outside = tmp_path / "outside"
    outside.mkdir()
    sc = ShardCache(cache)
    names = [Path(sc.path(url)).name for url in urls]
    forged_data, forged_meta = _forge(shard_dir, "shard-000002.tar", outside / "forged")
    (cache / names[0]).symlink_to(forged_data)
    (cache / (names[0] + ".json")).symlink_to(forged_meta)
    targets = {suffix: _root_only(outside / f"target{suffix}", b"keep me\n") for suffix in (".part", ".json.tmp",
                                                                                             ".lock")}
    (cache / (names[1] + ".part")).symlink_to(targets[".part"])
    (cache / (names[1] + ".json.tmp")).symlink_to(targets[".json.tmp"])
    (cache / (names[2] + ".lock")).symlink_to(targets[".lock"])
    other_data, other_meta = _forge(shard_dir, "shard-000002.tar", outside / "other")
    shutil.copy(other_data, cache / names[3])
    os.chown(cache / names[3], NOBODY, NOBODY)
    shutil.copy(other_meta, cache / (names[3] + ".json"))
    forged_bytes = forged_data.read_bytes()
    assert sc.entries() == [] and sc.usage()["copies"] == 0  # `wds-async cache ls|du` count none of them

    with caplog.at_level(logging.WARNING, logger="wds_async"):
        got, stats = (lambda ds: (sample_digest(ds), ds.stats()))(
            wds.WebDataset(urls, cache_dir=cache, deterministic=True, cache_validate=False))
    assert got == expected
    assert (stats["cache_hits"], stats["cache_fills"]) == (0, N - 1)
    assert all(t.read_bytes() == b"keep me\n" for t in targets.values())
    assert forged_data.read_bytes() == forged_bytes
    for i in (0, 1, 3):  # replaced by real copies: regular files of ours with the store's bytes
        for entry in (cache / names[i], cache / (names[i] + ".json")):
            st = os.lstat(entry)
            assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid(), entry
        assert (cache / names[i]).read_bytes() == (shard_dir / f"shard-{i:06d}.tar").read_bytes()
    assert not (cache / names[2]).exists() and (cache / (names[2] + ".lock")).is_symlink()
    assert not [n for n in os.listdir(cache) if n.endswith((".part", ".tmp"))]
    warned = [r.getMessage() for r in caplog.records if r.name == "wds_async" and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "not caching" in warned[0] and names[2] + ".lock" in warned[0], warned


def test_a_fifo_planted_as_metadata_hangs_nothing(store: StoreProcess, tmp_path: Path) -> None:
    """A FIFO at ``NAME.json``: before, a lookup (and ``cache ls``) opened it for reading and waited forever for
    a writer (this test then failed by pytest's timeout). Now it is opened without blocking, refused as no
    regular file, and the shard is fetched and cached in its place."""
    urls = _urls(store)[:1]
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    sc = ShardCache(cache)
    os.mkfifo(sc.path(urls[0], ".json"))
    Path(sc.path(urls[0])).write_bytes(b"\0" * 1024)
    assert sc.entries() == [] and sc.usage()["copies"] == 0
    ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True, cache_validate=False)
    assert sample_digest(ds) == sample_digest(wds.WebDataset(urls, deterministic=True))
    assert ds.stats()["cache_fills"] == 1 and stat.S_ISREG(os.lstat(sc.path(urls[0], ".json")).st_mode)


def test_cache_clear_touches_only_the_caches_names(store: StoreProcess, tmp_path: Path) -> None:
    """``wds-async cache clear DIR`` given the wrong directory: before, it removed every file in it not
    starting with a dot (and ``a.json`` next to ``a``). Now only names the cache makes are removed; a link
    among them goes, never what it points to."""
    from wds_async.cli.main import main

    urls = _urls(store)
    cache = tmp_path / "cache"
    sample_digest(wds.WebDataset(urls, cache_dir=cache))
    os.chmod(cache, 0o700)
    keep = {"notes.txt": b"mine", "data": b"x", "data.json": b"{}", "report.part": b"y"}
    for name, content in keep.items():
        (cache / name).write_bytes(content)
    target = tmp_path / "target"
    target.write_bytes(b"keep me")
    planted = cache / (Path(ShardCache(cache).path(urls[0])).name + ".json.tmp")
    planted.symlink_to(target)
    assert main(["cache", "clear", str(cache)]) == 0
    assert sorted(n for n in os.listdir(cache) if not n.endswith(".lock")) == sorted(keep)
    assert all((cache / n).read_bytes() == c for n, c in keep.items()) and target.read_bytes() == b"keep me"


def _warm_up(urls: list[str], local: str) -> None:
    """Import, as root, every module an epoch needs: a process of nobody cannot read this interpreter's
    standard library (under /root, mode 0700), so nothing may be imported after the switch."""
    sample_digest(wds.WebDataset(urls, deterministic=True))
    sample_digest(wds.WebDataset([local], deterministic=True))


def _read_only_epochs(urls: list[str], local: str, cache: str, send: Any) -> None:
    _warm_up(urls, local)
    _drop_to_nobody()
    records: list[tuple[int, str]] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append((record.levelno, record.getMessage()))  # type: ignore[method-assign]
    logging.getLogger("wds_async").addHandler(handler)
    results = []
    # empty and read-only; writable (filled); read-only with its copies; read-only with a damaged copy
    for phase, mode in enumerate((0o500, 0o700, 0o500, 0o500)):
        os.chmod(cache, mode)
        records.clear()
        if phase == 3:
            with open(ShardCache(cache).path(urls[1]), "r+b") as fh:  # the file is ours: writable in any directory
                fh.seek(148)
                fh.write(b"XXXXXXX\0")  # its first header's checksum
        ds = wds.WebDataset(urls, cache_dir=cache, deterministic=True)
        digest = sample_digest(ds)
        stats = ds.stats()
        results.append({"digest": list(digest), "fills": stats["cache_fills"], "hits": stats["cache_hits"],
                        "warnings": [m for level, m in records if level >= logging.WARNING]})
    send.send(results)


@needs_root
def test_a_read_only_directory_costs_one_warning_not_the_epoch(store: StoreProcess, shard_dir: Path,
                                                               shared_tmp: Path) -> None:
    """A process of ``nobody`` with its own cache directory, mode 0500 (root would write it anyway). Before:
    every item failed with a ``BackendError`` about its lock file and the epoch ended there. Now: the store
    serves every shard, with exactly one warning naming the directory; once writable the epoch fills it;
    read-only again, its copies are read (one warning again, for that dataset); and a damaged copy there, which
    cannot be dropped, is read from the store (before: the failed removal ended the epoch)."""
    urls = _urls(store)
    expected = list(sample_digest(wds.WebDataset(urls, deterministic=True)))
    cache = shared_tmp / "nobodys-cache"
    cache.mkdir(mode=0o700)
    os.chown(cache, NOBODY, NOBODY)
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_read_only_epochs, args=(urls, str(shard_dir / "shard-000000.tar"), str(cache), send))
    child.start()
    send.close()
    try:
        results = receive.recv()
    except EOFError:
        results = None
    child.join()
    assert child.exitcode == 0 and results is not None, "the reader failed (its traceback is in the output above)"
    read_only, filled, copies, damaged = results
    assert [r["digest"] for r in results] == [expected] * 4
    assert (read_only["fills"], read_only["hits"]) == (0, 0)
    assert len(read_only["warnings"]) == 1, read_only["warnings"]
    assert f"nothing can be written in the cache directory {cache}" in read_only["warnings"][0]
    assert (filled["fills"], filled["hits"], filled["warnings"]) == (N, 0, [])
    assert (copies["fills"], copies["hits"], len(copies["warnings"])) == (0, N, 1)
    assert (damaged["fills"], damaged["hits"], len(damaged["warnings"])) == (0, N, 2)
    assert "nothing can be written" in damaged["warnings"][0] and "is damaged" in damaged["warnings"][1]
    assert os.path.exists(ShardCache(cache).path(urls[1]))  # still there: the directory is read-only
