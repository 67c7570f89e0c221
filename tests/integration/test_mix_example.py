"""``docs/mixing.md``, "A worked example: three stores, a kill, a resume", run as a program.

The code block is taken from the page and changed by the test only textually: its three URLs point at emulators on
127.0.0.1 (the emulated store over TLS for https, moto for s3://, gcp-storage-emulator for gs://, keeping the
example's bucket and file names) with a few small shards each; ``OPTIONS`` holds the local endpoints (moto's
``endpoint_url``, the GCS emulator's ``endpoint_url`` with anonymous access, and the https store's CA as ``ca_file``);
``batch_size=8, num_workers=2``; and the training step ``...`` logs the batch's txt and json fields as one JSON line
per step, then sleeps 50 ms (time for the test to kill it mid-epoch). The index files the example names are built
with ``wds.build_index(urls).save(path)`` and put in the directory the program runs in, with its ``mix.ckpt``.

The program runs to the end once (the reference), then from scratch in a fresh directory, where its process group
is SIGKILLed at a random step once ``mix.ckpt`` exists; run again there, it resumes from ``mix.ckpt``. The steps
logged up to the checkpointed step, followed by the resumed run's, must be the reference's, as a sequence.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from emustore import Knobs, StoreProcess
from tests.conftest import doc_block, write_tar
from tests.emulators import MOTO_ENV

REPO = Path(__file__).resolve().parents[2]
MIXING = REPO / "docs" / "mixing.md"
HEADING = "## A worked example: three stores, a kill, a resume"
#: (source, bucket or store, shards, samples per shard): the example's names with a few small shards each.
SOURCES = [("web", "https", 4, 24), ("code", "corpus", 3, 20), ("books", "corpus", 2, 16)]
STEP_TIME = 0.05
#: Each wait on a child is bounded: its run takes a few seconds.
CHILD_TIMEOUT = 60.0
#: The kill point is random but reproducible.
RNG = random.Random(20261125 ^ 0x5EED)

#: The training step's stand-in, at the loop body's indentation: log the step's samples (txt, and the json's
#: ``name``, which says the same), then take a little time, as a training step does.
STEP = ('    with open("steps.log", "a") as steps_log:  # the test\'s stand-in for the training step\n'
        '        steps_log.write(json.dumps({"step": step + 1, "txt": list(batch[0]), "json": list(batch[1]["name"])})'
        ' + "\\n")\n'
        f'    time.sleep({STEP_TIME})\n')


def substitute(code: str, old: str | re.Pattern[str], new: str) -> str:
    """Replace the one occurrence of ``old`` (text, or a pattern matching one line) by ``new``."""
    pattern = old if isinstance(old, re.Pattern) else re.compile(re.escape(old))
    found = pattern.findall(code)
    assert len(found) == 1, f"the example changed: {pattern.pattern!r} occurs {len(found)} times; update this test"
    return pattern.sub(lambda _: new, code)


def members(name: str, shard: int, count: int) -> list[tuple[str, bytes]]:
    out = []
    for i in range(count):
        key, text = f"s{shard:06d}_{i:06d}", f"{name}/{shard}/{i}"
        out += [(f"{key}.txt", text.encode()), (f"{key}.json", json.dumps({"name": text, "i": i}).encode())]
    return out


def pattern_of(name: str, shards: int) -> str:
    return f"{name}-{{000000..{shards - 1:06d}}}.tar"


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory, moto_endpoint: str, gcs_endpoint: str) -> Iterator[Path]:
    """The three stores filled with small txt+json shards, the program (the docs block with the substitutions)
    and its index files, in a directory; yields that directory."""
    import boto3
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    data = tmp_path_factory.mktemp("mix-example")
    https_root = data / "https"
    https_root.mkdir()
    name, _, shards, count = SOURCES[0]
    for shard in range(shards):
        write_tar(https_root / f"{name}-{shard:06d}.tar", members(name, shard, count))
    tars = data / "tars"
    tars.mkdir()
    for name, _, shards, count in SOURCES[1:]:
        for shard in range(shards):
            write_tar(tars / f"{name}-{shard:06d}.tar", members(name, shard, count))

    with StoreProcess(https_root, Knobs(seed=11), https=True) as store, pytest.MonkeyPatch.context() as mp:
        for var, value in MOTO_ENV.items():  # moto's credentials, for the uploads and the index build here
            mp.setenv(var, value)
        s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
        s3.create_bucket(Bucket="corpus")
        name, _, shards, _ = SOURCES[1]
        for shard in range(shards):
            key = f"{name}-{shard:06d}.tar"
            s3.put_object(Bucket="corpus", Key=key, Body=(tars / key).read_bytes())
        gcs = storage.Client(project="test", credentials=AnonymousCredentials(),
                             client_options={"api_endpoint": gcs_endpoint})
        bucket = gcs.create_bucket("corpus")
        name, _, shards, _ = SOURCES[2]
        for shard in range(shards):
            key = f"{name}-{shard:06d}.tar"
            bucket.blob(key).upload_from_string((tars / key).read_bytes())

        options = {"s3": {"endpoint_url": moto_endpoint}, "gs": {"endpoint_url": gcs_endpoint, "anonymous": True},
                   "https": {"ca_file": store.ca_file}}
        urls = {"web": store.base_url + pattern_of(*SOURCES[0][::2]),
                "code": "s3://corpus/" + pattern_of(*SOURCES[1][::2]),
                "books": "gs://corpus/" + pattern_of(*SOURCES[2][::2])}
        for name, url in urls.items():
            wds.build_index(url, backend_options=options).save(data / f"{name}.index")

        code = doc_block(MIXING, HEADING)
        code = substitute(code, re.compile(r"^import os\n", re.MULTILINE), "import json\nimport os\nimport time\n")
        code = substitute(code, '{"s3": {"endpoint_url": "https://minio.example.com:9000"}}', repr(options))
        code = substitute(code, '"https://data.example.com/web-{000000..000599}.tar"', repr(urls["web"]))
        code = substitute(code, '"s3://corpus/code-{000000..000199}.tar"', repr(urls["code"]))
        code = substitute(code, '"gs://corpus/books-{000000..000049}.tar"', repr(urls["books"]))
        code = substitute(code, "batch_size=64, num_workers=4", "batch_size=8, num_workers=2")
        code = substitute(code, re.compile(r"^    \.\.\. +# forward, backward, step\n", re.MULTILINE), STEP)
        (data / "mix_example.py").write_text(code)
        yield data


# -- running the program ------------------------------------------------------------------------------------

def _env() -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items()
            if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "STORAGE_EMULATOR", "WDS_ASYNC_"))}
    return {**keep, **MOTO_ENV, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def _rundir(example: Path, name: str) -> Path:
    """A fresh directory holding the example's index files, where the program runs (and keeps ``mix.ckpt``)."""
    run = example / f"{name}-{uuid.uuid4().hex[:8]}"
    run.mkdir()
    for source, *_ in SOURCES:
        shutil.copy(example / f"{source}.index", run / f"{source}.index")
    return run


def _lines(log: Path) -> list[dict[str, Any]]:
    if not log.exists():
        return []
    with open(log) as fh:
        return [json.loads(line) for line in fh if line.endswith("\n")]


def _run(example: Path, run: Path, kill_at: int | None = None) -> int:
    """Run the program in ``run``; with ``kill_at``, SIGKILL its process group (it and its DataLoader workers) once
    it has logged that step and ``mix.ckpt`` exists. Returns the step it was killed at, or 0 once it has ended."""
    errors = run / "stderr.txt"
    # Its temporary files (a SIGKILLed run's DataLoader workers leave their pymp-* folders) in a short folder of its
    # own, removed below: a Unix socket's path in there may not exceed 107 bytes, so not the test's tmp_path.
    scratch = tempfile.mkdtemp(prefix="wds-mixex-")
    with open(errors, "ab") as err:
        proc = subprocess.Popen([sys.executable, str(example / "mix_example.py")], cwd=run,
                                env={**_env(), "TMPDIR": scratch}, start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=err, stderr=err)
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT
        while proc.poll() is None and time.monotonic() < deadline:
            if kill_at is not None and (run / "mix.ckpt").exists():
                lines = _lines(run / "steps.log")
                if lines and lines[-1]["step"] >= kill_at:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(10)
                    return int(lines[-1]["step"])
            time.sleep(0.005)
        assert proc.poll() is not None, f"the example still ran after {CHILD_TIMEOUT:.0f} s in {run}"
        assert proc.returncode == 0, f"the example failed (status {proc.returncode}):\n{errors.read_text()[-3000:]}"
        assert kill_at is None, f"the example ended before step {kill_at}, where it was to be killed"
        return 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(scratch, ignore_errors=True)


def _checkpointed(run: Path) -> int:
    import torch

    return int(torch.load(run / "mix.ckpt", weights_only=False)["step"])


def _steps(lines: list[dict[str, Any]]) -> list[tuple[int, list[str]]]:
    return [(line["step"], line["txt"]) for line in lines]


# -- the test -----------------------------------------------------------------------------------------------

def test_docs_mix_example_resumes_after_a_sigkill_as_if_uninterrupted(example: Path) -> None:
    reference_run = _rundir(example, "reference")
    _run(example, reference_run)
    reference = _lines(reference_run / "steps.log")
    assert [line["step"] for line in reference] == list(range(1, len(reference) + 1))
    for line in reference:
        assert line["txt"] == line["json"], f"step {line['step']}: the txt and json fields of a sample disagree"
    delivered = [t for line in reference for t in line["txt"]]
    assert len(delivered) == len(set(delivered)), "the uninterrupted run delivered a sample twice"
    assert {t.split("/")[0] for t in delivered} == {s[0] for s in SOURCES}
    total = sum(shards * count for _, _, shards, count in SOURCES)
    # longest=False: the pass ends when a drawn source has no sample left; with weights in proportion to the
    # sizes ("samples") and balanced draws, every source is then within a few samples of its end (per worker).
    assert total - 6 * len(SOURCES) <= len(delivered) <= total, f"{len(delivered)} of {total} samples delivered"
    assert len(reference) >= 10, f"only {len(reference)} steps"

    run = _rundir(example, "killed")
    kill_at = RNG.randrange(2, len(reference) - 2)
    killed_at = _run(example, run, kill_at=kill_at)
    saved = _checkpointed(run)
    assert 1 <= saved <= killed_at < len(reference), (kill_at, killed_at, saved)
    before = [line for line in _lines(run / "steps.log") if line["step"] <= saved]
    (run / "steps.log").rename(run / "steps-before-the-kill.log")
    _run(example, run)  # mix.ckpt is there: the program resumes from it
    after = _lines(run / "steps.log")
    got, want = _steps(before + after), _steps(reference)
    first = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    assert got == want, (f"killed at step {killed_at} (checkpoint at step {saved}): {len(got)} steps vs "
                         f"{len(want)} uninterrupted; first difference at step index {first}: "
                         f"{got[first:first + 1]} vs {want[first:first + 1]}")


def test_docs_mix_example_reads_its_three_stores_on_one_engine(example: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the section says after the block: every source is given the same ``OPTIONS``, so the https store, the
    S3 bucket and the GCS bucket are read on one engine (here in this process, as in each DataLoader worker)."""
    from tests.conftest import engine_threads, wait_until

    code = (example / "mix_example.py").read_text()
    head = code[:code.index("\nloader = StatefulDataLoader(")]  # the imports, OPTIONS, source() and the mix
    for var, value in MOTO_ENV.items():
        monkeypatch.setenv(var, value)
    monkeypatch.chdir(_rundir(example, "in-process"))  # the index files, by their relative names
    namespace: dict[str, Any] = {"__name__": "mix_example"}
    exec(compile(head, str(MIXING), "exec"), namespace)  # the documented example is the point
    mix = namespace["mix"]
    wait_until(lambda: not engine_threads())
    before = len(engine_threads())
    it = iter(mix)
    seen = [next(it)[0] for _ in range(60)]
    assert {t.split("/")[0] for t in seen} == {s[0] for s in SOURCES}, "60 samples did not come from all three stores"
    assert len(engine_threads()) == before + 1, f"{len(engine_threads()) - before} engines for the three stores"
    it.close()
    assert wait_until(lambda: len(engine_threads()) == before)
