"""wds-async: stream WebDataset tar shards from object stores at full network bandwidth.

The public API is what this module re-exports (checked by ``tests/unit/test_exports.py``)::

    import wds_async as wds
    ds = wds.WebDataset("https://host/train-{000000..000099}.tar").shuffle(1000).to_tuple("jpg", "cls")

Exports load on first use (SPEC 1 lazy loading; lazy_loader's ``attach_stub`` reads its names from a stub the same
way): the ``TYPE_CHECKING`` imports below are the one list, read by type checkers as written and, at run time, by
:func:`_exports` to map each name to its submodule. So ``import wds_async`` costs a few milliseconds, and the
command line (``wds-async ls``, ``cat``, ``verify``) never imports torch, which only the dataset side needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .compat import install_as_webdataset
    from .config import EngineConfig, RetryPolicy
    from .data.dataset import WebDataset
    from .data.decoders import Continue, Decoder, ImageHandler, basichandlers, handle_extension, imagehandler
    from .data.fluid import Stage, pipelinefilter
    from .data.handlers import ignore_and_continue, ignore_and_stop, reraise_exception, warn_and_continue, warn_and_stop
    from .data.indexed import IndexedWebDataset
    from .data.mix import RandomMix, RoundRobin
    from .data.mock import MockDataset
    from .data.packed import PackedSamples, pack_samples
    from .data.pipeline import (
        DataPipeline,
        FluidWrapper,
        WebLoader,
        split_by_node,
        split_by_worker,
        tarfile_samples,
        tarfile_to_samples,
    )
    from .data.samplers import BlockShuffleSampler
    from .data.shardlists import ResampledShards, SimpleShardList, non_empty, resampled, shardspec
    from .data.stages.cached import Cached, LMDBCached
    from .data.stages.factories import (
        batched,
        decode,
        detshuffle,
        extract_keys,
        listed,
        map,
        map_dict,
        map_tuple,
        rename,
        rename_keys,
        rsample,
        select,
        shuffle,
        slice,
        to_tuple,
        unbatched,
        unlisted,
        xdecode,
    )
    from .data.stages.plain import default_collation_fn
    from .data.state import merge_states
    from .engine.grouping import Sample
    from .errors import (
        BackendError,
        DecodingError,
        EmptyShards,
        EngineError,
        MissingDependency,
        NotFound,
        ObjectChanged,
        PermissionDenied,
        PipeError,
        SampleError,
        SampleTooLarge,
        ServiceError,
        ShardFormatError,
        Throttled,
        TransientError,
        TruncatedShard,
        UrlError,
        WdsError,
    )
    from .index.build import build_index
    from .index.format import ShardEntry, ShardIndex
    from .io import register_backend
    from .metrics import serve_metrics
    from .urls import braceexpand, expand_urls
    from .write.writer import ShardWriter, TarWriter

__version__ = "0.1.0"

__all__ = [
    "ShardWriter",
    "TarWriter",
    "BackendError",
    "Continue",
    "Decoder",
    "DecodingError",
    "EmptyShards",
    "EngineError",
    "SampleTooLarge",
    "ImageHandler",
    "basichandlers",
    "decode",
    "handle_extension",
    "imagehandler",
    "Cached",
    "LMDBCached",
    "MockDataset",
    "RandomMix",
    "RoundRobin",
    "extract_keys",
    "non_empty",
    "rename_keys",
    "resampled",
    "rsample",
    "shardspec",
    "tarfile_samples",
    "xdecode",
    "DataPipeline",
    "FluidWrapper",
    "ResampledShards",
    "SimpleShardList",
    "Stage",
    "WebLoader",
    "PackedSamples",
    "pack_samples",
    "batched",
    "detshuffle",
    "listed",
    "map",
    "map_dict",
    "map_tuple",
    "pipelinefilter",
    "rename",
    "select",
    "shuffle",
    "slice",
    "tarfile_to_samples",
    "to_tuple",
    "unbatched",
    "unlisted",
    "EngineConfig",
    "MissingDependency",
    "NotFound",
    "PermissionDenied",
    "PipeError",
    "RetryPolicy",
    "Sample",
    "SampleError",
    "ShardEntry",
    "ShardIndex",
    "ObjectChanged",
    "ServiceError",
    "ShardFormatError",
    "Throttled",
    "TransientError",
    "TruncatedShard",
    "UrlError",
    "WdsError",
    "WebDataset",
    "IndexedWebDataset",
    "BlockShuffleSampler",
    "__version__",
    "braceexpand",
    "build_index",
    "default_collation_fn",
    "expand_urls",
    "install_as_webdataset",
    "ignore_and_continue",
    "merge_states",
    "ignore_and_stop",
    "register_backend",
    "serve_metrics",
    "reraise_exception",
    "split_by_node",
    "split_by_worker",
    "warn_and_continue",
    "warn_and_stop",
]


def _exports() -> dict[str, str]:
    """``name -> submodule`` for every name the ``TYPE_CHECKING`` block above imports, read from this file."""
    import ast
    from pathlib import Path

    exports: dict[str, str] = {}
    for node in ast.parse(Path(__file__).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                if isinstance(imp, ast.ImportFrom) and imp.level == 1 and imp.module:
                    exports.update((alias.asname or alias.name, imp.module) for alias in imp.names)
    return exports


_EXPORTS = _exports()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        try:  # ``wds_async.errors`` and the other submodules, as after an eager import
            return importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError:
            pass
        return _webdataset_name(name)
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # the next access is a plain module attribute
    return value


def _webdataset_name(name: str) -> Any:
    """webdataset 1.0.2's other top-level names (``wds.PipelineStage``, ``wds.getfirst``, ``wds.with_epoch``,
    ``wds.filters``, ...), so that ``import wds_async as wds`` in place of ``import webdataset as wds`` finds them:
    taken from the shim package that :func:`install_as_webdataset` installs (``wds_async.compat.top``), built on
    wds-async's own parts. A name webdataset has and wds-async does not provide is an ``AttributeError`` saying why."""
    from .compat import top
    from .compat._names import NotProvided

    missing = f"module {__name__!r} has no attribute {name!r}"
    if name.startswith("_"):  # the shim's own dunders (its __version__ is webdataset's) are not ours
        raise AttributeError(missing)
    try:
        value = getattr(top, name)
    except NotProvided as refused:
        raise AttributeError(f"{missing}: {refused}") from None
    except AttributeError:
        raise AttributeError(missing) from None
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # the exports, the submodules loaded so far and the dunders; not this module's own helper imports; and
    # webdataset's other top-level names, which resolve too (see _webdataset_name)
    from .compat import top

    return sorted({*__all__, *(n for n, v in globals().items() if n.startswith("__") or type(v) is type(importlib)),
                   *top.__all__})
