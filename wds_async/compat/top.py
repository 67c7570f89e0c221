"""The ``webdataset`` package itself, as :func:`~wds_async.install_as_webdataset` installs it: webdataset 1.0.2's
top-level names, each from the shim module webdataset takes it from, and its modules as attributes (except
``gopen``, which is the function there too, its module being ``sys.modules["webdataset.gopen"]``).

``__version__`` is ``"1.0.2"``, the API this stands for (code that checks webdataset's version sees the API it
gets); ``__wds_async__`` is wds-async's own version, for code that wants to know which library it runs on.
"""

from __future__ import annotations

from .. import __version__ as _wds_async_version
from . import (
    autodecode,
    cache,
    compat,
    extradatasets,
    filters,
    handlers,
    mix,
    pipeline,
    pytorch,
    shardlists,
    tariterators,
    utils,
    writer,
)
from ._names import refusing
from .autodecode import Continue, Decoder, DecodingError, gzfilter, handle_extension, imagehandler, pytorch_weights_only
from .cache import pipe_cleaner
from .compat import FluidInterface, FluidWrapper, WebDataset, WebLoader
from .extradatasets import MockDataset, with_epoch, with_length
from .filters import (
    Cached,
    LMDBCached,
    associate,
    batched,
    decode,
    detshuffle,
    extract_keys,
    getfirst,
    info,
    map,
    map_dict,
    map_tuple,
    pipelinefilter,
    rename,
    rename_keys,
    rsample,
    select,
    shuffle,
    slice,
    to_tuple,
    transform_with,
    unbatched,
    xdecode,
)
from .gopen import gopen, gopen_schemes
from .handlers import ignore_and_continue, ignore_and_stop, reraise_exception, warn_and_continue, warn_and_stop
from .mix import RandomMix, RoundRobin
from .pipeline import DataPipeline
from .shardlists import (
    ResampledShards,
    SimpleShardList,
    non_empty,
    resampled,
    shardspec,
    single_node_only,
    split_by_node,
    split_by_worker,
)
from .tariterators import tarfile_samples, tarfile_to_samples
from .utils import PipelineStage, repeatedly
from .writer import ShardWriter, TarWriter, numpy_dumps, torch_dumps

__version__ = "1.0.2"
__wds_async__ = _wds_async_version

#: A package: ``import webdataset.X`` asks the import system, where the shim's finder answers for it.
__path__: list[str] = []

__all__ = [
    "Cached", "Continue", "DataPipeline", "Decoder", "DecodingError", "FluidInterface", "FluidWrapper",
    "LMDBCached", "MockDataset", "PipelineStage", "RandomMix", "ResampledShards", "RoundRobin", "ShardWriter",
    "SimpleShardList", "TarWriter", "WebDataset", "WebLoader", "associate", "autodecode", "batched", "cache",
    "compat", "decode", "detshuffle", "extract_keys", "extradatasets", "filters", "getfirst", "gopen",
    "gopen_schemes", "gzfilter", "handle_extension", "handlers", "ignore_and_continue", "ignore_and_stop",
    "imagehandler", "info", "map", "map_dict", "map_tuple", "mix", "non_empty", "numpy_dumps", "pipe_cleaner",
    "pipeline", "pipelinefilter", "pytorch", "pytorch_weights_only", "rename", "rename_keys", "repeatedly",
    "reraise_exception", "resampled", "rsample", "select", "shardlists", "shardspec", "shuffle", "single_node_only",
    "slice", "split_by_node", "split_by_worker", "tarfile_samples", "tarfile_to_samples",
    "tariterators", "to_tuple", "torch_dumps", "transform_with", "unbatched", "utils", "warn_and_continue",
    "warn_and_stop", "with_epoch", "with_length", "writer", "xdecode",
]

__getattr__ = refusing("webdataset", {
    "MultiShardSample": "wds-async does not read webdataset's YAML multi-source specs (deprecated there); mix "
                        "datasets with RandomMix / RoundRobin",
    "LRUCleanup": "wds-async caches shards itself while streaming them (WebDataset(urls, cache_dir=...)); "
                  "`wds-async cache` trims that cache",
    "torch_loads": "it unpickles the data (torch.load), which runs code from it; decode .pth fields with "
                   "Decoder(..., allow_pickle=True) or WDS_ASYNC_ALLOW_PICKLE=1",
    "torch_video": "wds-async has no video decoder; add one with handle_extension('mp4', your_function)",
    "torch_audio": "wds-async has no audio decoder; add one with handle_extension('flac wav', your_function)",
    "tenbin": "webdataset's tenbin module (its own array container) is not provided; wds-async decodes and encodes "
              ".ten fields (decode() and TarWriter) without it",
})
