"""``examples/train_ddp.py`` under real torchrun launches (gloo on CPU, everything on 127.0.0.1).

13 shards of uneven sample counts (341 samples) are served by the emulated store and indexed. The jobs:

* one node, 4 ranks x 2 DataLoader workers, 2 epochs;
* two torchrun launches rendezvousing as 2 nodes x 2 ranks, 2 epochs;
* 2 ranks x 2 workers where rank 0 SIGKILLs itself mid-epoch or just after an epoch-end checkpoint
  (torchrun tears the job down), then a relaunch with ``--resume``.

Each rank logs the sample keys of every step. With an index, the job's samples are laid end to end in the
epoch's shard order and cut into ``ranks * workers`` equal shares of ``ceil(N / (ranks * workers))``, the
last ones padded by wrapping around to the first samples (``wds_async/data/plan.py``), so every rank runs the
same number of steps and each rank's keys are known exactly.
"""

from __future__ import annotations

import io
import json
import math
import random
import signal
import tarfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import wds_async as wds
from emustore import Knobs, StoreProcess
from tests.conftest import free_port
from tests.torch.children import Launches
from wds_async.data.plan import shard_order

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "train_ddp.py")
SAMPLES_PER_SHARD = [11, 40, 23, 31, 7, 36, 19, 28, 14, 33, 26, 45, 28]  # 341 in all: no share count divides it
N = sum(SAMPLES_PER_SHARD)
SEED = 0  # the example's WebDataset(seed=0)
BATCH = 4
WORKERS = 2
LAUNCH_TIMEOUT = 80.0


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The shards, the store serving them and their index; ``keys[s]`` are shard s's keys in tar order."""
    root = tmp_path_factory.mktemp("torchrun")
    rng = random.Random(13)
    keys: list[list[str]] = []
    for shard, count in enumerate(SAMPLES_PER_SHARD):
        keys.append([f"s{shard:02d}_{i:03d}" for i in range(count)])
        with tarfile.open(root / f"shard-{shard:06d}.tar", "w", format=tarfile.USTAR_FORMAT) as tar:
            for key in keys[-1]:
                for ext, payload in (("bin", rng.randbytes(rng.randint(1600, 2400))),
                                     ("cls", str(rng.randrange(1000)).encode())):
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
    with StoreProcess(root, Knobs(seed=7)) as store:
        pattern = store.base_url + f"shard-{{000000..{len(SAMPLES_PER_SHARD) - 1:06d}}}.tar"
        index = wds.build_index(pattern)
        assert [e.nsamples for e in index.shards] == SAMPLES_PER_SHARD
        index.save(root / "train.index")
        yield {"pattern": pattern, "index": str(root / "train.index"), "keys": keys}


# -- launching ---------------------------------------------------------------------------------------------

def script_args(data: dict[str, Any], tmp: Path, logs: str, *extra: str) -> list[str]:
    return [data["pattern"], "--index", data["index"], "--workers", str(WORKERS), "--batch-size", str(BATCH),
            "--epochs", "2", "--checkpoint-dir", str(tmp / "ckpt"), "--log-dir", str(tmp / logs), *extra]


# -- what the logs must show -------------------------------------------------------------------------------

def read_logs(log_dir: Path, world: int) -> list[list[dict[str, Any]]]:
    """Per rank, its log lines (a line cut short by a kill is dropped)."""
    out = []
    for rank in range(world):
        path = log_dir / f"rank{rank}.jsonl"
        text = path.read_text() if path.exists() else ""
        out.append([json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")])
    return out


def keys_of(lines: list[dict[str, Any]], epoch: int, upto: int | None = None) -> Counter[str]:
    return Counter(k for line in lines if line["epoch"] == epoch and (upto is None or line["step"] <= upto)
                   for k in line["keys"])


def expected_shares(data: dict[str, Any], epoch: int, world: int) -> list[Counter[str]]:
    """Per rank, the keys of its workers' shares: the epoch's samples in shard order, wrapped around to a
    multiple of ``world * WORKERS`` and cut into equal contiguous shares (process = rank * WORKERS + worker)."""
    order = [k for s in shard_order(len(SAMPLES_PER_SHARD), SEED, epoch, True) for k in data["keys"][s]]
    per = math.ceil(N / (world * WORKERS))
    padded = (order * 2)[: per * world * WORKERS]
    return [Counter(padded[r * WORKERS * per:(r + 1) * WORKERS * per]) for r in range(world)]


def steps_per_epoch(world: int) -> int:
    return WORKERS * math.ceil(math.ceil(N / (world * WORKERS)) / BATCH)


def check_epochs(logs: list[list[dict[str, Any]]], data: dict[str, Any], world: int) -> None:
    """An uninterrupted 2-epoch run: equal steps, each key once per epoch plus the documented padding."""
    total = world * WORKERS * math.ceil(N / (world * WORKERS))
    everything = Counter(k for shard in data["keys"] for k in shard)
    assert len(everything) == N
    for epoch in (0, 1):
        steps = [sum(1 for line in lines if line["epoch"] == epoch) for lines in logs]
        assert steps == [steps_per_epoch(world)] * world, f"epoch {epoch}: steps per rank {steps}"
        seen = sum((keys_of(lines, epoch) for lines in logs), Counter())
        assert set(seen) == set(everything), f"epoch {epoch}: missing {sorted(set(everything) - set(seen))[:10]}"
        assert sum(seen.values()) == total, f"epoch {epoch}: {sum(seen.values())} samples delivered, not {total}"
        assert max(seen.values()) <= math.ceil(total / N)
        assert sum(seen.values()) - len(seen) == total - N  # the padding is the only repetition
        assert [keys_of(lines, epoch) for lines in logs] == expected_shares(data, epoch, world), f"epoch {epoch}"
    assert keys_of(logs[0], 0) != keys_of(logs[0], 1), "set_epoch(1) did not change the shard order"
    assert [line["step"] for line in logs[0]] == list(range(1, 2 * steps_per_epoch(world) + 1))


# -- the tests ---------------------------------------------------------------------------------------------

def test_one_node_4_ranks_2_workers(data: dict[str, Any], tmp_path: Path) -> None:
    with Launches(EXAMPLE) as job:
        job.start(["--nproc-per-node", "4", "--master-port", str(free_port())],
                  script_args(data, tmp_path, "logs", "--checkpoint-every", "10"), tmp_path / "torchrun.out")
        assert job.wait(LAUNCH_TIMEOUT) == [0], job.output()
    check_epochs(read_logs(tmp_path / "logs", 4), data, 4)


def test_two_nodes_of_2_ranks(data: dict[str, Any], tmp_path: Path) -> None:
    port = str(free_port())
    with Launches(EXAMPLE) as job:
        for node in (0, 1):
            job.start(["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "2", "--master-port", port],
                      script_args(data, tmp_path, "logs"), tmp_path / f"node{node}.out")
        assert job.wait(LAUNCH_TIMEOUT) == [0, 0], job.output()
    check_epochs(read_logs(tmp_path / "logs", 4), data, 4)


@pytest.mark.parametrize("every,die_at", [(5, 23), (22, 45)], ids=["mid-epoch", "at-epoch-end"])
def test_preempted_job_resumes(data: dict[str, Any], tmp_path: Path, every: int, die_at: int) -> None:
    """Rank 0 dies on fetching step ``die_at``'s batch; the relaunch resumes from the last checkpoint (step 20,
    mid-epoch 0; or step 44, the last of epoch 0, dying in epoch 1)."""
    world = 2
    saved = (die_at - 1) // every * every
    torchrun = ["--nproc-per-node", str(world)]
    with Launches(EXAMPLE) as job:
        job.start([*torchrun, "--master-port", str(free_port())],
                  script_args(data, tmp_path, "first", "--checkpoint-every", str(every), "--die-at-step", str(die_at)),
                  tmp_path / "first.out")
        assert job.wait(LAUNCH_TIMEOUT) != [0], job.output()
    first = read_logs(tmp_path / "first", world)
    assert first[0][-1]["step"] == die_at - 1, "rank 0 trained past the step it was to die at"

    with Launches(EXAMPLE) as job:
        job.start([*torchrun, "--master-port", str(free_port())],
                  script_args(data, tmp_path, "resumed", "--checkpoint-every", str(every), "--resume"),
                  tmp_path / "resumed.out")
        assert job.wait(LAUNCH_TIMEOUT) == [0], job.output()
    resumed = read_logs(tmp_path / "resumed", world)

    everything = {k for shard in data["keys"] for k in shard}
    for epoch in (0, 1):
        shares = expected_shares(data, epoch, world)
        runs = [keys_of(first[r], epoch, upto=saved) + keys_of(resumed[r], epoch) for r in range(world)]
        assert runs == shares, f"epoch {epoch}: per-rank keys of the first launch up to step {saved} + the relaunch"
        whole = sum(runs, Counter())
        assert set(whole) == everything and sum(whole.values()) == world * WORKERS * math.ceil(N / (world * WORKERS))
    for rank in range(world):
        steps = [line["step"] for line in resumed[rank]]
        assert steps == list(range(saved + 1, 2 * steps_per_epoch(world) + 1)), f"rank {rank} resumed at {steps[:1]}"
        assert [line["epoch"] for line in resumed[rank]] == [
            (step - 1) // steps_per_epoch(world) for step in steps], f"rank {rank}: steps per epoch changed"


def test_one_node_4_ranks_2_workers_through_the_node_service(data: dict[str, Any], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The same job with every rank's workers as clients of one ``wds-async serve`` (``WDS_ASYNC_SERVICE``): the
    same equal shares, step for step, as without it."""
    from wds_async.service import start_service

    with start_service(str(tmp_path / "svc" / "node.sock")) as service:
        monkeypatch.setenv("WDS_ASYNC_SERVICE", service.url)
        with Launches(EXAMPLE) as job:
            job.start(["--nproc-per-node", "4", "--master-port", str(free_port())],
                      script_args(data, tmp_path, "logs", "--checkpoint-every", "10"), tmp_path / "torchrun.out")
            assert job.wait(LAUNCH_TIMEOUT) == [0], job.output()
        status = service.status()
    check_epochs(read_logs(tmp_path / "logs", 4), data, 4)
    assert status["sessions"] == 0  # every client's session ended with its worker
    assert status["sessions_served"] >= 4 * WORKERS  # every worker of every rank was a client


def test_preempted_job_resumes_through_a_restarted_service(data: dict[str, Any], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0 dies at step 23; the service is killed with it (SIGKILL) and a new one started on the same socket;
    the relaunch resumes from the step-20 checkpoint with exactly the shares of an uninterrupted job."""
    from wds_async.service import start_service

    every, die_at, world = 5, 23, 2
    saved = (die_at - 1) // every * every
    sock = str(tmp_path / "svc" / "node.sock")
    monkeypatch.setenv("WDS_ASYNC_SERVICE", "unix://" + sock)
    with start_service(sock) as service:
        with Launches(EXAMPLE) as job:
            job.start(["--nproc-per-node", str(world), "--master-port", str(free_port())],
                      script_args(data, tmp_path, "first", "--checkpoint-every", str(every), "--die-at-step",
                                  str(die_at)), tmp_path / "first.out")
            assert job.wait(LAUNCH_TIMEOUT) != [0], job.output()
        service.process.send_signal(signal.SIGKILL)
        service.process.wait(30)
    first = read_logs(tmp_path / "first", world)
    with start_service(sock):
        with Launches(EXAMPLE) as job:
            job.start(["--nproc-per-node", str(world), "--master-port", str(free_port())],
                      script_args(data, tmp_path, "resumed", "--checkpoint-every", str(every), "--resume"),
                      tmp_path / "resumed.out")
            assert job.wait(LAUNCH_TIMEOUT) == [0], job.output()
    resumed = read_logs(tmp_path / "resumed", world)
    for epoch in (0, 1):
        runs = [keys_of(first[r], epoch, upto=saved) + keys_of(resumed[r], epoch) for r in range(world)]
        assert runs == expected_shares(data, epoch, world), f"epoch {epoch}"
