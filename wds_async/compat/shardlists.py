"""``webdataset.shardlists``: shard sources and the splitters, wds-async's own (:mod:`wds_async.data.shardlists`,
:mod:`wds_async.data.pipeline`).

``expand_urls`` expands ``::`` lists, ``${NAME}`` (from ``WDS_NAME``) and braces as webdataset does (timm and
open_clip call it), and raises :class:`~wds_async.UrlError` for a pattern that names no URL, where webdataset
returns an empty list.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

from ..data.pipeline import split_by_node, split_by_worker
from ..data.shardlists import ResampledShards, SimpleShardList, _resampled, make_seed, non_empty, resampled, shardspec
from ..data.topology import node_info
from ..errors import UrlError
from ..urls import expand_env, expand_urls
from ._names import refusing

__all__ = [
    "ResampledShardList", "ResampledShards", "SimpleShardList", "default_rng", "envlookup", "envsubst",
    "expand_source", "expand_urls", "make_seed", "non_empty", "resampled", "resampled_", "shardspec", "single_node_only",
    "split_by_node", "split_by_worker",
]

_YAML = ("wds-async does not read webdataset's YAML multi-source specs (deprecated there); list the shards, or mix "
         "datasets with wds.RandomMix / wds.RoundRobin")
__getattr__ = refusing("webdataset.shardlists", {
    "MultiShardSample": _YAML,
    "MSSource": _YAML,
    "expand": _YAML,
    "DirectoryShardList": "it hands out shards by renaming files in a shared local folder (a work queue between "
                          "processes); wds-async has no such queue - split the shard list with split_by_node",
    "check_pid_is_running": "a helper of DirectoryShardList, which wds-async does not provide",
    "get_pid_from_filename": "a helper of DirectoryShardList, which wds-async does not provide",
    "without_last_extension": "a helper of DirectoryShardList, which wds-async does not provide",
})

#: The generator webdataset's module-level helpers draw from.
default_rng = random.Random()

ResampledShardList = ResampledShards

#: The uncurried ``resampled`` stage: ``resampled_(src, n)`` draws ``n`` items with replacement from ``src``.
resampled_ = _resampled


def envlookup(m: re.Match[str]) -> str:
    """The value of ``WDS_<name>`` for a ``${name}`` match; :class:`~wds_async.UrlError` when it is not set."""
    return expand_env(m.group(0))


def envsubst(s: str) -> str:
    """``s`` with each ``${name}`` replaced by the environment variable ``WDS_name``."""
    return re.sub(r"\$\{(\w+)\}", envlookup, s)


def single_node_only(src: Iterable[Any], group: Any = None) -> Iterator[Any]:
    """Pass the items through; raise :class:`ValueError` in a job of more than one process."""
    _rank, world = node_info()
    if world > 1:
        raise ValueError("input pipeline needs to be reconfigured for multinode training")
    yield from src


def expand_source(source: Any, max_urls: int = int(1e9)) -> list[str]:
    """A URL list from a pattern string (expanded), a list, or another iterable (at most ``max_urls``)."""
    if isinstance(source, str):
        return expand_urls(source)
    if isinstance(source, list):
        return list(source)
    if isinstance(source, Iterable):
        return list(islice(source, max_urls))
    raise UrlError(f"cannot read shard URLs from {type(source).__name__}: give a pattern string or a list")
