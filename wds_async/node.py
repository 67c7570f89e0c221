"""One connection and memory budget per node, divided among the node's loader processes.

Every process that iterates a dataset (each DataLoader worker of each torchrun rank) runs its own
engine. Left alone, each would allow up to 256 requests in flight and ``max_buffered_bytes`` (256 MiB):
an 8-GPU node with 8 workers per rank runs 64 engines, so 16384 requests and 16 GiB of buffers, far more
than the network or the host memory wants. So the two limits are *node* settings and each process takes
its share of them.

The rule, for connections and bytes alike::

    share = max(floor, node_value // processes)
    share = min(share, per_process_value)   # only when capped, see below

* ``processes`` is :func:`local_processes`: ``LOCAL_WORLD_SIZE`` (set by torchrun, default 1) times
  the current DataLoader's ``num_workers`` (1 outside a worker), or ``WDS_ASYNC_LOCAL_PROCESSES``.
  It assumes every rank on the node uses the same ``num_workers``.
* ``node_value`` is the argument, else ``WDS_ASYNC_NODE_CONNECTIONS`` / ``WDS_ASYNC_NODE_BUFFERED_BYTES``
  (an int, or a size such as ``"4GiB"``/``"512MB"``), else the node default: 256 connections and
  2 GiB, that is 8 processes at 32 connections and 256 MiB each.
* The floors are 1 connection and 8 MiB: an engine needs one connection to make progress, and below
  about 8 reads of the default 1 MiB chunk the budget is mostly the one-chunk-per-reader slack that
  :class:`~wds_async.io.budget.ByteBudget` allows anyway, so a smaller share only makes readers stall.
  A floor may exceed a node budget split among very many processes; it wins.
* The share is capped by the config's per-process value when the user set that value (its name is in
  ``explicit``), or when the node value is itself the default.
* With ``max_connections="auto"`` (the default) the connection share is the autotuner's *ceiling*
  (``EngineConfig.connection_cap``): each process tunes its own concurrency below its share, so the
  node never has more than ``node_connections`` requests in flight. A fixed int is the concurrency
  itself, lowered to the share.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass

from .config import EngineConfig

__all__ = ["MIN_BUFFERED_BYTES", "MIN_CONNECTIONS", "NODE_BUFFERED_BYTES", "NODE_CONNECTIONS", "NodeShare",
           "local_processes", "parse_bytes", "share_config"]

MiB = 1 << 20
GiB = 1 << 30
NODE_CONNECTIONS = 256          # default node budget: 8 processes x 32
NODE_BUFFERED_BYTES = 2 * GiB   # default node budget: 8 processes x 256 MiB
MIN_CONNECTIONS = 1
MIN_BUFFERED_BYTES = 8 * MiB

ENV_PROCESSES = "WDS_ASYNC_LOCAL_PROCESSES"
ENV_CONNECTIONS = "WDS_ASYNC_NODE_CONNECTIONS"
ENV_BUFFERED_BYTES = "WDS_ASYNC_NODE_BUFFERED_BYTES"

# KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024; the "B" may be left out.
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 1 << 10, "mi": 1 << 20, "gi": 1 << 30, "ti": 1 << 40}
_SIZE = re.compile(r"(\d+)(\.\d+)?\s*([kmgt]i?)?b?", re.IGNORECASE | re.ASCII)
_INT = re.compile(r"\d+", re.ASCII)


@dataclass(frozen=True)
class NodeShare:
    """The node budgets, how many processes share them, and this process's share."""

    processes: int
    node_connections: int
    node_buffered_bytes: int
    max_connections: int
    max_buffered_bytes: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def parse_bytes(text: str, name: str = "size") -> int:
    """``"4GiB"``, ``"512MB"``, ``"1.5G"`` or ``"1048576"`` in bytes; ValueError naming ``name`` if not."""
    m = _SIZE.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"{name}={text!r} is not a size (an int, or e.g. '512MB', '4GiB')")
    unit = _UNITS[(m.group(3) or "").lower()]
    value = int(m.group(1)) * unit + int(float("0" + (m.group(2) or "")) * unit)
    if value < 1:
        raise ValueError(f"{name}={text!r} must be at least 1 byte")
    return value


def _positive(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _parse_int(text: str, name: str) -> int:
    if _INT.fullmatch(text.strip()) is None or int(text) < 1:
        raise ValueError(f"{name}={text!r} must be a positive int")
    return int(text)


def _env(name: str, parse: Callable[[str, str], int]) -> int | None:
    """``parse`` of environment variable ``name``; None when it is unset or blank."""
    text = os.environ.get(name, "")
    return parse(text, name) if text.strip() else None


def _node_value(arg: int | None, arg_name: str, env: int | None, default: int) -> tuple[int, bool]:
    """``(value, chosen)``: the argument, else the environment's value, else ``default`` (not chosen)."""
    if arg is not None:
        return _positive(arg, arg_name), True
    return (default, False) if env is None else (env, True)


def local_processes() -> int:
    """Loader processes on this node: ``LOCAL_WORLD_SIZE`` x DataLoader ``num_workers``.

    ``WDS_ASYNC_LOCAL_PROCESSES``, when set, is taken as is (for launchers other than torchrun, or
    ranks with different worker counts).
    """
    override = _env(ENV_PROCESSES, _parse_int)
    if override is not None:
        return override
    ranks = _env("LOCAL_WORLD_SIZE", _parse_int) or 1
    # A DataLoader worker has always imported torch; asking only where it is loaded keeps torch out of the command
    # line, the service and installs without torch.
    loaded = sys.modules.get("torch.utils.data")
    info = None if loaded is None else loaded.get_worker_info()
    return ranks * (info.num_workers if info is not None else 1)


def share_config(
    config: EngineConfig,
    *,
    node_connections: int | None = None,
    node_buffered_bytes: int | None = None,
    processes: int | None = None,
    explicit: frozenset[str] = frozenset(),
) -> tuple[EngineConfig, NodeShare]:
    """``config`` with this process's share of the node budgets (module docstring has the rule).

    ``explicit`` names the per-process settings the user chose (``"max_connections"``,
    ``"max_buffered_bytes"``): those always cap the share.
    """
    procs = local_processes() if processes is None else _positive(processes, "processes")
    node_conn, conn_chosen = _node_value(node_connections, "node_connections",
                                         _env(ENV_CONNECTIONS, _parse_int), NODE_CONNECTIONS)
    node_bytes, bytes_chosen = _node_value(node_buffered_bytes, "node_buffered_bytes",
                                           _env(ENV_BUFFERED_BYTES, parse_bytes), NODE_BUFFERED_BYTES)

    connections = max(MIN_CONNECTIONS, node_conn // procs)
    if "max_connections" in explicit or not conn_chosen:
        connections = min(connections, config.connections)
    buffered = max(MIN_BUFFERED_BYTES, node_bytes // procs)
    if "max_buffered_bytes" in explicit or not bytes_chosen:
        buffered = min(buffered, config.max_buffered_bytes)

    share = NodeShare(processes=procs, node_connections=node_conn, node_buffered_bytes=node_bytes,
                      max_connections=connections, max_buffered_bytes=buffered)
    if config.autotune:  # the autotuner moves freely below this process's share
        shared = config.replace(connection_cap=connections, min_connections=min(config.min_connections, connections),
                                max_buffered_bytes=buffered)
    else:
        shared = config.replace(max_connections=connections, max_buffered_bytes=buffered)
    return shared, share
