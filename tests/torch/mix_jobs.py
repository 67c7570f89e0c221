"""What the mix's resume tests share (test_mix_resume.py in one process, test_mix_torchrun.py under torchrun): the
sources, running ``mix_child.py`` and reading its log, and the check of the draws' proportions over windows.

The shards and their store are the ``mix_data`` fixture of ``tests/torch/conftest.py``: each module that takes it
builds them and starts the store once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.torch.children import lines, run_child

CHILD = str(Path(__file__).with_name("mix_child.py"))
PROBS = [0.6, 0.3, 0.1]
NAMES = ["a", "b", "c"]
#: (name, shards, shard bytes): samples of ~3 KiB (three tar members), so 49 / 34 / 19 samples per shard in the
#: small set (294 / 136 / 57 samples) and 399 / 349 / 199 in the big one (3990 / 2094 / 796).
SMALL = [("sa", 6, 150 << 10), ("sb", 4, 105 << 10), ("sc", 3, 60 << 10)]
BIG = [("a", 10, 1200 << 10), ("b", 6, 1050 << 10), ("c", 4, 600 << 10)]
WINDOW, TOLERANCE = 1000, 0.03
#: The small set's sources, the ones most tests mix.
S = ["sa", "sb", "sc"]


# -- running the child -------------------------------------------------------------------------------------

def run_mix_child(cfg: dict[str, Any], env: dict[str, str] | None = None, kill_at: int | None = None,
                  settle: float = 0.0) -> int:
    """Run the child (see :func:`tests.torch.children.run_child`)."""
    return run_child(CHILD, cfg, env, kill_at, settle)


def logged_batches(log: str, upto: int | None = None) -> list[dict[str, Any]]:
    """The logged batches (``{"step", "worker", "keys"}``) up to step ``upto``."""
    return [line for line in lines(log) if "keys" in line and (upto is None or line["step"] <= upto)]


def keys_of(batches: list[dict[str, Any]]) -> list[str]:
    return [k for batch in batches for k in batch["keys"]]


def mix_config(data: dict[str, Any], tmp: Path, *, names: list[str], shuffle: tuple[int, ...] = (0, 0, 0),
               resampled: tuple[bool, ...] = (False, False, False), index: bool = False,
               **mix: Any) -> dict[str, Any]:
    sources = [{"urls": data[name]["urls"], "index": data[name]["index"] if index else None, "seed": 7 + 10 * n,
                "shuffle": shuffle[n], "resampled": resampled[n]} for n, name in enumerate(names)]
    return {"sources": sources, "mix": "random", "probs": PROBS, "seed": 1234, "longest": False, "workers": 0,
            "batch": 8, "step_time": 0.005, "ckpt": str(tmp / "run.ckpt"), "log": str(tmp / "run.log"), **mix}


def uninterrupted(cfg: dict[str, Any], tmp: Path) -> list[str]:
    ref = {**cfg, "ckpt": str(tmp / "ref.ckpt"), "log": str(tmp / "ref.log")}
    run_mix_child(ref)
    return keys_of(logged_batches(ref["log"]))


def mismatch(got: list[str], want: list[str]) -> str:
    at = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    return (f"{len(got)} keys vs {len(want)} uninterrupted; first difference at {at}: "
            f"{got[at:at + 3]} vs {want[at:at + 3]}")


def source_of(key: str) -> int:
    return NAMES.index(key.split("/", 1)[0].removeprefix("s"))


def check_windows(stream: list[str], end: int | None = None) -> int:
    """Every window of ``WINDOW`` consecutive keys of ``stream[:end]`` holds each source within ``TOLERANCE``
    of its weight; returns how many windows were checked."""
    stream = stream[:end] if end is not None else stream
    counts = [0] * len(PROBS)
    worst = (0.0, -1, -1)
    for i, key in enumerate(stream):
        counts[source_of(key)] += 1
        if i >= WINDOW:
            counts[source_of(stream[i - WINDOW])] -= 1
        if i >= WINDOW - 1:
            for s, p in enumerate(PROBS):
                off = abs(counts[s] / WINDOW - p)
                if off > worst[0]:
                    worst = (off, i + 1 - WINDOW, s)
    assert worst[0] <= TOLERANCE, (f"the window starting at sample {worst[1]} holds {NAMES[worst[2]]} at a share "
                                   f"{worst[0]:.3f} away from its weight {PROBS[worst[2]]}")
    return max(0, len(stream) - WINDOW + 1)
