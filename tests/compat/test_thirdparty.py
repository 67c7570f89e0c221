"""open_clip's and timm's webdataset data paths, installed from PyPI and run unchanged, deliver the same batches in
the same order under ``wds_async.install_as_webdataset()`` as under webdataset itself.

They run in a virtual environment of their own, built once and reused (``wds_async.cli.bench.peers._venv``, the
benchmark peers' machinery; in ``$WDS_ASYNC_PEERS_DIR/compat``): timm and open-clip-torch need torchvision, and
PyPI's torchvision does not load beside the CPU torch 2.13.0 of this project's environment, so the venv holds the
torch 2.14.1 + torchvision 0.29.1 pair, which do (about 5.6 GB, a minute or two to build from the local wheels).
wds-async itself comes from this checkout (``PYTHONPATH``), its dependencies from its own metadata. Each run is
forked from a warm launcher in that venv (``tests/warm.py``) that imported torch and its company once: 26 s for the
file instead of 170.

References: webdataset 1.0.2 for timm; for open_clip, webdataset 0.2.86 (open_clip pins ``webdataset<=0.2.86``:
1.0.2's ``tar_file_expander`` yields an end-of-shard ``{}`` that open_clip's own ``group_by_keys_nothrow`` cannot
read), installed with ``--target`` inside the venv and put first on ``PYTHONPATH``; open_clip's eval path, which
1.0.2 runs, is compared against both.

open_clip's training-time sample shuffle draws from a clock-seeded generator, so two webdataset runs differ; the
strict order comparisons (train and resampled) set its buffer to one item (``_SAMPLE_SHUFFLE_SIZE``, a module
constant), which leaves the order to the seeded shard shuffle or shard draws, and the run with open_clip's own buffer
compares each epoch's samples as a multiset.
"""

from __future__ import annotations

import importlib.metadata
import io
import json
import os
import re
import tarfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.warm import Runner, warm_runner
from wds_async.cli.bench.peers._venv import VenvError, ensure_venv, peers_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("thirdparty_runner.py")
VENV = "compat"
OLD_WEBDATASET = "webdataset==0.2.86"
SHARDS, PER_SHARD = 4, 10


def _wds_async_requirements() -> list[str]:
    """wds-async's runtime dependencies, from its installed metadata (extras left out)."""
    requires = importlib.metadata.requires("wds-async") or []
    return [*sorted(r for r in requires if "extra ==" not in r), "pillow>=9"]


def _old_webdataset_dir() -> Path:
    return peers_dir() / VENV / "webdataset-0.2.86"


@pytest.fixture(scope="session")
def venv_python() -> Path:
    """The third-party venv's interpreter, built on first use (a few minutes) and reused while its steps hold."""
    steps = [
        ["torch==2.14.1", "torchvision==0.29.1"],
        ["timm==1.0.29", "open-clip-torch==3.3.0", "webdataset==1.0.2", "pandas", "braceexpand",
         *_wds_async_requirements()],
        ["--no-deps", "--target", str(_old_webdataset_dir()), OLD_WEBDATASET],
    ]
    try:
        return ensure_venv(VENV, steps)
    except VenvError:  # a registry hiccup mid-build: the half-built venv is discarded and built once more
        return ensure_venv(VENV, steps)


#: What every run imports before open_clip or timm do anything (about 6 of a run's 7-8 CPU seconds), imported once by
#: the warm launcher each run is forked from (``tests/warm.py``). Nothing here imports webdataset.
PRELOAD = ("torch", "torchvision", "numpy", "PIL.Image", "pandas")


def _env(paths: list[str]) -> dict[str, str]:
    # One thread for OpenMP and OpenBLAS, as the resume tests' children have: numpy's import would otherwise start
    # OpenBLAS's pool, and the warm launcher forks only from a process of one thread (both libraries' runs alike).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, str(ROOT)]), "PYTHONHASHSEED": "0",
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
    env.pop("WDS_SHUFFLE_SIZE", None)
    return env


@pytest.fixture(scope="session")
def runner(venv_python: Path) -> Iterator[Runner]:
    """The venv's interpreter with torch and its company imported, forking a fresh child for every run (each run
    started from nothing where the launcher refused to start)."""
    runner = warm_runner(venv_python, PRELOAD, _env([]), timeout=600)
    try:
        yield runner
    finally:
        runner.close()


def _jpeg(value: int) -> bytes:
    from PIL import Image

    image = Image.new("RGB", (8, 8), ((value * 37) % 256, (value * 91) % 256, (value * 53) % 256))
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=95)
    return out.getvalue()


def _write_tar(path: Path, members: list[tuple[str, bytes]]) -> None:
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def openclip_shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Four shards of ten image-caption pairs (jpg + txt); the caption is the sample's key."""
    root = tmp_path_factory.mktemp("openclip")
    for s in range(SHARDS):
        members: list[tuple[str, bytes]] = []
        for i in range(PER_SHARD):
            key = f"s{s}_{i:02d}"
            members += [(f"{key}.jpg", _jpeg(s * PER_SHARD + i)), (f"{key}.txt", key.encode())]
        _write_tar(root / f"oc-{s:02d}.tar", members)
    return str(root / f"oc-{{00..{SHARDS - 1:02d}}}.tar")


@pytest.fixture(scope="module")
def timm_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """timm's layout: shards of jpg + cls (the label is the sample's global number) and ``_info.json``."""
    root = tmp_path_factory.mktemp("timm")
    splits: dict[str, Any] = {}
    number = 0
    for split, count in (("train", SHARDS), ("validation", 2)):
        names = []
        for s in range(count):
            members: list[tuple[str, bytes]] = []
            for i in range(PER_SHARD):
                members += [(f"{split}{s}_{i:02d}.jpg", _jpeg(number)), (f"{split}{s}_{i:02d}.cls", str(number).encode())]
                number += 1
            name = f"synthetic-{split}-{s:04d}.tar"
            _write_tar(root / name, members)
            names.append(name)
        splits[split] = {"name": split, "num_samples": count * PER_SHARD, "filenames": names,
                         "shard_lengths": [PER_SHARD] * count}
    (root / "_info.json").write_text(json.dumps({"name": "synthetic", "splits": splits}))
    return str(root)


def _run(runner: Runner, lib: str, case: str, data: str, workers: int, tmp_path: Path, *, old: bool = False,
         nsamples: int = 0) -> dict[str, Any]:
    out = tmp_path / f"{case}-{lib}-{'old' if old else 'new'}-{workers}.json"
    env = _env([str(_old_webdataset_dir())] if old else [])
    argv = [lib, case, data, str(workers), str(out), "--nsamples", str(nsamples)]
    proc = runner.run(str(RUNNER), argv, env, tmp_path / "runs", timeout=600, quick_exit=True)
    assert proc.returncode == 0, f"{RUNNER.name} {' '.join(argv)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    result: dict[str, Any] = json.loads(out.read_text())
    assert result["shim"] is (lib == "wds_async")
    if lib == "webdataset":
        assert result["version"] == ("0.2.86" if old else "1.0.2"), result
    return result


def _keys(result: dict[str, Any]) -> list[list[str]]:
    return [[key for batch in epoch for key in batch[0]] for epoch in result["epochs"]]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", ["openclip-train-ordered", "openclip-resampled", "openclip-eval"])
def test_open_clip_get_wds_dataset_delivers_what_webdataset_does(runner: Runner, openclip_shards: str, case: str,
                                                                  workers: int, tmp_path: Path) -> None:
    nsamples = SHARDS * PER_SHARD
    ours = _run(runner, "wds_async", case, openclip_shards, workers, tmp_path, nsamples=nsamples)
    reference = _run(runner, "webdataset", case, openclip_shards, workers, tmp_path, old=True, nsamples=nsamples)
    assert ours["epochs"] == reference["epochs"]
    assert all(epoch for epoch in ours["epochs"])
    if case == "openclip-eval":  # every sample once per epoch, in shard order per worker
        assert all(sorted(keys) == sorted(f"s{s}_{i:02d}" for s in range(SHARDS) for i in range(PER_SHARD))
                   for keys in _keys(ours))
        assert ours["epochs"] == _run(runner, "webdataset", case, openclip_shards, workers, tmp_path,
                                      nsamples=nsamples)["epochs"]
    if case == "openclip-train-ordered":
        first, second = _keys(ours)
        assert first != second  # the seeded shard shuffle draws anew each epoch


@pytest.mark.parametrize("workers", [0, 2])
def test_open_clip_shuffled_training_epochs_hold_the_same_samples(runner: Runner, openclip_shards: str,
                                                                   workers: int, tmp_path: Path) -> None:
    nsamples = SHARDS * PER_SHARD
    ours = _run(runner, "wds_async", "openclip-train", openclip_shards, workers, tmp_path, nsamples=nsamples)
    reference = _run(runner, "webdataset", "openclip-train", openclip_shards, workers, tmp_path, old=True,
                     nsamples=nsamples)
    for mine, theirs in zip(_keys(ours), _keys(reference), strict=True):
        assert Counter(mine) == Counter(theirs) and len(mine) == nsamples
    assert [[len(b[0]) for b in epoch] for epoch in ours["epochs"]] == \
        [[len(b[0]) for b in epoch] for epoch in reference["epochs"]]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("case", ["timm-train", "timm-eval"])
def test_timm_reader_wds_delivers_what_webdataset_does(runner: Runner, timm_root: str, case: str, workers: int,
                                                        tmp_path: Path) -> None:
    ours = _run(runner, "wds_async", case, timm_root, workers, tmp_path)
    reference = _run(runner, "webdataset", case, timm_root, workers, tmp_path)
    assert ours["epochs"] == reference["epochs"]
    assert all(epoch for epoch in ours["epochs"])
    if case == "timm-eval":  # the validation split (read from _info.json through wds.gopen), each sample once
        expected = list(range(SHARDS * PER_SHARD, (SHARDS + 2) * PER_SHARD))
        assert all(sorted(labels) == expected for labels in _keys(ours))


def test_the_venv_runs_the_packages_it_was_built_for(runner: Runner, tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import importlib.metadata as m, torchvision\n"
                     "print(m.version('timm'), m.version('open-clip-torch'), m.version('webdataset'))\n")
    done = runner.run(str(probe), [], _env([]), tmp_path / "runs", timeout=120, quick_exit=True)
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"1\.0\.29 3\.3\.0 1\.0\.2\s*", done.stdout), done.stdout
