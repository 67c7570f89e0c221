"""wds-async installed without torch, in a real virtualenv that has none: ``pip install -e .`` with no extra pulls
no torch, and the writer, the dataset as a plain iterable with its fluid stages, the decoders that need no torch,
the index, the cache and every command of the CLI work there; the torch parts (``WebLoader``, the torch image
decoders, ``.pth`` fields) raise :class:`~wds_async.MissingDependency` naming the ``torch`` extra.

The virtualenv (``python -m venv``, no system site-packages, only the project's base dependencies) is kept in
``.bench/`` under a name keyed by pyproject.toml and the interpreter, so a second run reuses it; a change to the
project's dependencies builds a new one. Every script runs in that interpreter, in a subprocess, from a temporary folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import tomllib
from pathlib import Path

import pytest

from emustore import StoreProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
N_SHARDS, PER_SHARD = 4, 10
EXTRA = "wds-async[torch]"


def _venv_dir() -> Path:
    """``.bench/venv-without-torch-<key>``: the key is a hash of what in pyproject.toml shapes a plain install (the
    build system, the project table less its extras, setuptools' settings) and of the interpreter's version, so
    a new extra or a linter setting reuses the venv and a new dependency builds another."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    plain = {"build-system": config.get("build-system"),
             "project": {k: v for k, v in config["project"].items() if k != "optional-dependencies"},
             "setuptools": config.get("tool", {}).get("setuptools"), "python": sys.version}
    key = hashlib.sha256(json.dumps(plain, sort_keys=True).encode()).hexdigest()[:16]
    return ROOT / ".bench" / f"venv-without-torch-{key}"


def _clean_env() -> dict[str, str]:
    """This environment without what would let the venv see another interpreter's packages (or this test's
    venv): no PYTHONPATH, PYTHONHOME, VIRTUAL_ENV, no user site-packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _build(venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True, timeout=300, env=_clean_env())
    python = venv / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-input", "-e", str(ROOT)],
                          capture_output=True, text=True, timeout=600, env=_clean_env(), stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"pip install -e {ROOT} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def venv() -> Path:
    """The virtualenv without torch, built once per pyproject.toml (under a lock: two runs at once build it once)."""
    target = _venv_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    marker = target / ".complete"
    with open(target.parent / "venv-without-torch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        expected = f"{target}\nfor {ROOT}\n"  # a checkout moved elsewhere breaks the venv's scripts: rebuild
        if not marker.exists() or marker.read_text() != expected:  # absent, half-built or moved: (re)build it
            for stale in target.parent.glob("venv-without-torch-*"):  # earlier pyproject.tomls' venvs
                shutil.rmtree(stale, ignore_errors=True)
            _build(target)
            marker.write_text(expected)
    return target


def _python(venv: Path, code: str, *args: str, cwd: Path) -> str:
    """Run ``code`` in the venv's interpreter from ``cwd``; its stdout, after checking it exited 0."""
    script = cwd / "check.py"
    script.write_text(textwrap.dedent(code))
    done = subprocess.run([str(venv / "bin" / "python"), str(script), *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=_clean_env(), stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return done.stdout


def _cli(venv: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(venv / "bin" / "wds-async"), *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=_clean_env(), stdin=subprocess.DEVNULL)


def _ok(out: subprocess.CompletedProcess[str]) -> str:
    assert out.returncode == 0, (out.args, out.returncode, out.stdout[-3000:], out.stderr[-3000:])
    assert "Traceback" not in out.stderr, out.stderr
    return out.stdout


WRITE = """
    import sys
    import numpy as np
    import wds_async as wds

    folder, per_shard, total = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with wds.ShardWriter(f"{folder}/shard-%06d.tar", maxcount=per_shard, verbose=0) as sink:
        for i in range(total):
            sink.write({"__key__": f"s{i:04d}", "json": {"i": i}, "npy": np.full((2, 3), i, dtype=np.int16),
                        "txt": f"sample {i}", "cls": i % 5})
    with wds.TarWriter(f"{folder}/single.tar") as tar:
        tar.write({"__key__": "only", "txt": "one sample", "cls": 7})
    assert "torch" not in sys.modules, "writing imported torch"
"""


@pytest.fixture(scope="module")
def shards(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shards written in the venv with ShardWriter (N_SHARDS x PER_SHARD samples) and one with TarWriter."""
    folder = tmp_path_factory.mktemp("shards")
    _python(venv, WRITE, str(folder), str(PER_SHARD), str(N_SHARDS * PER_SHARD), cwd=folder.parent)
    return folder


@pytest.fixture
def urls(shards: Path) -> list[str]:
    return [str(shards / f"shard-{i:06d}.tar") for i in range(N_SHARDS)]


def test_the_venv_has_no_torch_and_wds_async_is_installed_there(venv: Path, tmp_path: Path) -> None:
    out = _python(venv, """
        import importlib.util, json, sys
        try:
            import torch
        except ModuleNotFoundError as exc:
            missing = exc.name
        else:
            missing = None
        import wds_async, wds_async.cli.main
        print(json.dumps({"missing": missing, "prefix": sys.prefix, "base_prefix": sys.base_prefix,
                          "wds_async": wds_async.__file__, "sys_path": sys.path}))
    """, cwd=tmp_path)
    report = json.loads(out)
    assert report["missing"] == "torch"
    assert report["prefix"] == str(venv) and report["prefix"] != report["base_prefix"]
    assert report["wds_async"] == str(ROOT / "wds_async" / "__init__.py")  # the editable install of this checkout
    assert not any("site-packages" in p and not p.startswith(str(venv)) for p in report["sys_path"]), report


def test_shards_written_without_torch_iterate_as_a_plain_iterable(venv: Path, urls: list[str], shards: Path,
                                                                   tmp_path: Path) -> None:
    out = _python(venv, """
        import json, sys
        import numpy as np
        import wds_async as wds

        urls = sys.argv[1:]
        ds = wds.WebDataset(urls).shuffle(10).decode().to_tuple("json", "npy", "txt", "cls")
        seen = []
        for meta, array, text, cls in ds:
            i = meta["i"]
            assert isinstance(array, np.ndarray) and array.shape == (2, 3) and (array == i).all(), (i, array)
            assert text == f"sample {i}" and cls == i % 5, (i, text, cls)
            seen.append(i)
        # the default collation stacks arrays and numbers into numpy arrays, with no torch
        batch = next(iter(wds.WebDataset(urls, shardshuffle=False).decode().to_tuple("npy", "cls").batched(8)))
        assert type(batch[0]) is np.ndarray and batch[0].shape == (8, 2, 3), batch
        assert batch[1].tolist() == [i % 5 for i in range(8)], batch[1]
        # the explicit pipeline form and a mix, plain iterables too
        pipe = wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_worker, wds.tarfile_to_samples(),
                                wds.decode(), wds.to_tuple("json"))
        mixed = wds.RoundRobin([pipe, [({"i": -1},)]], longest=True).map(lambda t: t[0]["i"])
        print(json.dumps({"seen": seen, "mixed": sorted(mixed),
                          "bases": [c.__module__ + "." + c.__qualname__ for c in type(ds).__mro__],
                          "torch": "torch" in sys.modules}))
    """, *urls, cwd=tmp_path)
    report = json.loads(out)
    total = N_SHARDS * PER_SHARD
    assert sorted(report["seen"]) == list(range(total))
    assert report["seen"] != list(range(total))  # .shuffle(10) shuffled
    assert report["mixed"] == [-1, *range(total)]
    assert "wds_async.data._torch.PlainIterable" in report["bases"]
    assert not any(b.startswith("torch.") for b in report["bases"]), report["bases"]
    assert report["torch"] is False


def test_decoders_that_need_no_torch_work(venv: Path, tmp_path: Path) -> None:
    out = _python(venv, """
        import gzip, io, json
        import numpy as np
        import wds_async as wds

        buffer = io.BytesIO()
        np.save(buffer, np.arange(6, dtype=np.float32).reshape(2, 3))
        sample = {"__key__": "k", "json": b'{"a": [1, 2]}', "npy": buffer.getvalue(), "cls": b"3",
                  "txt.gz": gzip.compress(b"hello"), "bin": b"raw"}
        decoded = wds.Decoder([])(sample)
        assert decoded["npy"].tolist() == [[0, 1, 2], [3, 4, 5]], decoded["npy"]
        print(json.dumps({k: v for k, v in decoded.items() if k != "npy"}, default=repr))
    """, cwd=tmp_path)
    assert json.loads(out) == {"__key__": "k", "json": {"a": [1, 2]}, "cls": 3, "txt.gz": "hello", "bin": "b'raw'"}


def test_the_index_is_built_and_loaded_without_torch(venv: Path, urls: list[str], tmp_path: Path) -> None:
    out = _python(venv, """
        import json, sys
        import wds_async as wds

        target, urls = sys.argv[1], sys.argv[2:]
        wds.build_index(urls).save(target)
        index = wds.ShardIndex.load(target)
        keys = [s["__key__"] for s in wds.WebDataset(urls, index=target, shardshuffle=False)]
        print(json.dumps({"total": index.total_samples, "shards": len(index.shards), "keys": keys,
                          "torch": "torch" in sys.modules}))
    """, str(tmp_path / "shards.index"), *urls, cwd=tmp_path)
    report = json.loads(out)
    total = N_SHARDS * PER_SHARD
    assert (report["total"], report["shards"]) == (total, N_SHARDS)
    assert sorted(report["keys"]) == [f"s{i:04d}" for i in range(total)]
    assert report["torch"] is False


READ_KEYS = """
    import json, sys
    import wds_async as wds

    cache, urls = sys.argv[1], sys.argv[2:]
    ds = wds.WebDataset(urls, cache_dir=cache, cache_validate=False, shardshuffle=False)
    print(json.dumps([s["__key__"] for s in ds]))
    assert "torch" not in sys.modules
"""


def test_the_shard_cache_fills_and_serves_without_torch(venv: Path, shards: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    keys = [f"s{i:04d}" for i in range(N_SHARDS * PER_SHARD)]
    with StoreProcess(shards) as store:
        http = [store.url(f"shard-{i:06d}.tar") for i in range(N_SHARDS)]
        assert json.loads(_python(venv, READ_KEYS, str(cache), *http, cwd=tmp_path)) == keys
    # the store is gone: the second pass reads the copies the first one left
    assert json.loads(_python(venv, READ_KEYS, str(cache), *http, cwd=tmp_path)) == keys
    listed = _ok(_cli(venv, "cache", "ls", "--json", str(cache), cwd=tmp_path)).splitlines()
    assert len(listed) == N_SHARDS, listed
    assert _ok(_cli(venv, "cache", "du", str(cache), cwd=tmp_path)).strip()
    _ok(_cli(venv, "cache", "clear", str(cache), cwd=tmp_path))
    assert _ok(_cli(venv, "cache", "ls", "--json", str(cache), cwd=tmp_path)).strip() == ""


def test_every_command_of_the_cli_runs_without_torch(venv: Path, urls: list[str], shards: Path,
                                                     tmp_path: Path) -> None:
    for command in ("ls", "cat", "verify", "cp", "index", "cache", "bench", "serve", "tune"):
        assert f"usage: wds-async {command}" in _ok(_cli(venv, command, "--help", cwd=tmp_path)), command
    listed = _ok(_cli(venv, "ls", str(shards / "shard-*.tar"), cwd=tmp_path)).split()
    assert listed == urls
    members = _ok(_cli(venv, "cat", "--samples", "--json", urls[0], cwd=tmp_path)).splitlines()
    assert [json.loads(line)["key"] for line in members] == [f"s{i:04d}" for i in range(PER_SHARD)], members
    verified = [json.loads(line) for line in _ok(_cli(venv, "verify", "--json", *urls, cwd=tmp_path)).splitlines()]
    assert [(v["ok"], v["samples"]) for v in verified] == [(True, PER_SHARD)] * N_SHARDS, verified
    copies = tmp_path / "copies"
    _ok(_cli(venv, "cp", "-q", *urls, f"{copies}/", cwd=tmp_path))
    assert sorted(p.name for p in copies.iterdir()) == [Path(u).name for u in urls]
    assert all((copies / Path(u).name).read_bytes() == Path(u).read_bytes() for u in urls)
    index = tmp_path / "cli.index"
    _ok(_cli(venv, "index", "-q", "-o", str(index), *urls, cwd=tmp_path))
    header = json.loads(index.read_text().splitlines()[0])
    assert (header["shards"], header["samples"]) == (N_SHARDS, N_SHARDS * PER_SHARD), header
    tuned = _ok(_cli(venv, "tune", "-q", "--levels", "1,2", "--seconds", "0.2", *urls, cwd=tmp_path))
    assert "recommendation for" in tuned, tuned
    benched = _ok(_cli(venv, "bench", "-c", "2", "--no-auto", *urls, cwd=tmp_path))
    assert "wds-async / raw = " in benched, benched  # the loader phase iterates the dataset itself
    # `cache` runs in test_the_shard_cache_fills_and_serves_without_torch, `serve` in the test below


def test_the_node_service_serves_a_dataset_without_torch(venv: Path, urls: list[str], tmp_path: Path) -> None:
    folder = tmp_path / "run"
    folder.mkdir(mode=0o700)
    socket = folder / "service.sock"
    server = subprocess.Popen([str(venv / "bin" / "wds-async"), "serve", "--socket", str(socket)], cwd=tmp_path,
                              env=_clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120  # a wait for the socket, not a timing check
        while not socket.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert socket.exists(), f"no socket; serve exited {server.poll()}"
        out = _python(venv, """
            import json, sys
            import wds_async as wds

            socket, urls = sys.argv[1], sys.argv[2:]
            ds = wds.WebDataset(urls, service=f"unix://{socket}", shardshuffle=False).decode().to_tuple("json")
            print(json.dumps({"seen": [meta["i"] for (meta,) in ds], "torch": "torch" in sys.modules}))
        """, str(socket), *urls, cwd=tmp_path)
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=60)
    assert json.loads(out) == {"seen": list(range(N_SHARDS * PER_SHARD)), "torch": False}
    assert "Traceback" not in stderr, stderr


def test_the_torch_parts_name_the_torch_extra(venv: Path, urls: list[str], tmp_path: Path) -> None:
    out = _python(venv, """
        import io, json, pickle, sys
        import wds_async as wds

        ds = wds.WebDataset(sys.argv[1:])
        failures = {}

        def check(name, call, error=wds.MissingDependency):
            try:
                call()
            except error as exc:
                failures[name] = [type(exc).__name__, str(exc)]
            else:
                failures[name] = None

        check("WebLoader", lambda: wds.WebLoader(ds, batch_size=None, num_workers=0))
        check("decode torchrgb", lambda: ds.decode("torchrgb"))
        check("ImageHandler torchl8", lambda: wds.ImageHandler("torchl8"))
        check("pth field", lambda: wds.Decoder([], allow_pickle=True)({"__key__": "k", "pth": pickle.dumps(1)}),
              wds.DecodingError)
        check("write pth", lambda: wds.TarWriter(io.BytesIO()).write({"__key__": "k", "pth": [1, 2]}))
        print(json.dumps(failures))
    """, *urls, cwd=tmp_path)
    failures = json.loads(out)
    for name, failure in failures.items():
        assert failure is not None, f"{name}: no error without torch"
        assert EXTRA in failure[1], (name, failure)
    assert failures["WebLoader"][0] == "MissingDependency" and "WebLoader" in failures["WebLoader"][1]
    assert "'torchrgb'" in failures["decode torchrgb"][1]


def test_code_written_for_webdataset_imports_without_torch(venv: Path, urls: list[str], tmp_path: Path) -> None:
    out = _python(venv, """
        import json, sys
        import wds_async

        wds_async.install_as_webdataset()
        import webdataset as wds
        from webdataset.filters import _shuffle, getfirst  # noqa: F401 (names third-party code takes)
        from webdataset.pytorch import DataLoader

        keys = [s["__key__"] for s in wds.WebDataset(sys.argv[1:], shardshuffle=False)]
        try:
            DataLoader([])
        except ImportError as exc:
            refused = str(exc)
        print(json.dumps({"keys": len(keys), "refused": refused, "torch": "torch" in sys.modules}))
    """, *urls, cwd=tmp_path)
    result = json.loads(out)
    assert result["keys"] == N_SHARDS * PER_SHARD and not result["torch"], result
    assert "wds-async[torch]" in result["refused"], result
