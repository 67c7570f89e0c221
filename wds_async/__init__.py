"""wds-async: stream WebDataset tar shards from object stores at full network bandwidth.

The public API is what this module re-exports (checked by ``tests/unit/test_exports.py``)::

    import wds_async as wds
    ds = wds.WebDataset("https://host/train-{000000..000099}.tar").shuffle(1000).to_tuple("jpg", "cls")
"""

from .config import EngineConfig, RetryPolicy
from .dataset import WebDataset
from .decoders import Continue, Decoder, ImageHandler, basichandlers, handle_extension, imagehandler
from .errors import (
    BackendError,
    DecodingError,
    MissingDependency,
    NotFound,
    ObjectChanged,
    PermissionDenied,
    PipeError,
    SampleError,
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
    listed,
    map,
    map_dict,
    map_tuple,
    rename,
    select,
    shuffle,
    slice,
    to_tuple,
    unbatched,
    unlisted,
)
from .fluid import Stage, pipelinefilter
from .grouping import Sample
from .handlers import ignore_and_continue, ignore_and_stop, reraise_exception, warn_and_continue, warn_and_stop
from .index import ShardEntry, ShardIndex
from .indexer import build_index
from .pipeline import (
    DataPipeline,
    ResampledShards,
    SimpleShardList,
    WebLoader,
    split_by_node,
    split_by_worker,
    tarfile_to_samples,
)
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
    "ImageHandler",
    "basichandlers",
    "decode",
    "handle_extension",
    "imagehandler",
    "DataPipeline",
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
    "reraise_exception",
    "split_by_node",
    "split_by_worker",
    "warn_and_continue",
    "warn_and_stop",
]
