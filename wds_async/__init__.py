"""wds-async: stream WebDataset tar shards from object stores at full network bandwidth.

The public API is what this module re-exports (checked by ``tests/unit/test_exports.py``)::

    import wds_async as wds
    ds = wds.WebDataset("https://host/train-{000000..000099}.tar").shuffle(1000).to_tuple("jpg", "cls")
"""

from .backends import register_backend
from .cached import Cached, LMDBCached
from .config import EngineConfig, RetryPolicy
from .dataset import WebDataset
from .decoders import Continue, Decoder, ImageHandler, basichandlers, handle_extension, imagehandler
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
    ShardFormatError,
    Throttled,
    TransientError,
    TruncatedShard,
    UrlError,
    WdsError,
)
from .filters import (
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
from .fluid import Stage, pipelinefilter
from .grouping import Sample
from .handlers import ignore_and_continue, ignore_and_stop, reraise_exception, warn_and_continue, warn_and_stop
from .index import ShardEntry, ShardIndex
from .indexer import build_index
from .mix import RandomMix, RoundRobin
from .mock import MockDataset
from .pipeline import (
    DataPipeline,
    FluidWrapper,
    WebLoader,
    split_by_node,
    split_by_worker,
    tarfile_samples,
    tarfile_to_samples,
)
from .shardlists import ResampledShards, SimpleShardList, non_empty, resampled, shardspec
from .stages import default_collation_fn
from .state import merge_states
from .urls import braceexpand, expand_urls
from .writer import ShardWriter, TarWriter

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
    "ShardFormatError",
    "Throttled",
    "TransientError",
    "TruncatedShard",
    "UrlError",
    "WdsError",
    "WebDataset",
    "__version__",
    "braceexpand",
    "build_index",
    "default_collation_fn",
    "expand_urls",
    "ignore_and_continue",
    "merge_states",
    "ignore_and_stop",
    "register_backend",
    "reraise_exception",
    "split_by_node",
    "split_by_worker",
    "warn_and_continue",
    "warn_and_stop",
]
