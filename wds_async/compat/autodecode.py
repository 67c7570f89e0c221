"""``webdataset.autodecode``: the decoders, wds-async's own (:mod:`wds_async.data.decoders`).

The same handler chain (``pre + handlers + post``, ``Continue``, ``gzfilter``, ``basichandlers``), image specs and
extension matching as webdataset 1.0.2. The pickle family (``pkl``, ``pyd``, ``pth``) is refused unless
``WDS_ASYNC_ALLOW_PICKLE=1`` or ``Decoder(..., allow_pickle=True)``: unpickling runs code from the data.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

from ..data.decoders import (
    IMAGE_EXTENSIONS,
    IMAGE_SPECS,
    Continue,
    Decoder,
    ImageHandler,
    basichandlers,
    gzfilter,
    handle_extension,
    imagehandler,
    read_tenbin,
)
from ..errors import DecodingError
from ._names import refusing

__all__ = [
    "IMAGE_EXTENSIONS", "Continue", "Decoder", "DecodingError", "ImageHandler", "basichandlers",
    "call_extension_handler", "cbor_loads", "decoders", "default_decoder", "default_post_handlers",
    "default_pre_handlers", "gzfilter", "handle_extension", "imagehandler", "imagespecs", "msgpack_loads", "npy_loads",
    "npz_loads", "pytorch_weights_only", "tenbin_loads",
]

_PICKLE = ("it unpickles the data, which runs code from it; decode such fields with "
           "Decoder(..., allow_pickle=True) or WDS_ASYNC_ALLOW_PICKLE=1")
__getattr__ = refusing("webdataset.autodecode", {
    "unpickle_loads": _PICKLE,
    "torch_loads": _PICKLE + " (torch.load of a .pth field)",
    "torch_video": "wds-async has no video decoder (webdataset's reads a temporary file through torchvision.io); "
                   "add one with handle_extension('mp4', your_function)",
    "torch_audio": "wds-async has no audio decoder (webdataset's goes through torchaudio); add one with "
                   "handle_extension('flac wav', your_function)",
})

#: webdataset's ``WDS_PYTORCH_WEIGHTS_ONLY`` switch, read the same way.
pytorch_weights_only = os.environ.get("WDS_PYTORCH_WEIGHTS_ONLY", "0") == "1"

#: spec -> (container, element type, mode), with webdataset's lower-case mode names.
imagespecs: dict[str, tuple[str, str | None, str]] = {
    spec: (kind, dtype, mode.lower()) for spec, (kind, dtype, mode) in IMAGE_SPECS.items()}


def _by_extension(extension: str, data: bytes) -> Any:
    return basichandlers("." + extension, data)


tenbin_loads = read_tenbin
npy_loads = functools.partial(_by_extension, "npy")
npz_loads = functools.partial(_by_extension, "npz")
cbor_loads = functools.partial(_by_extension, "cbor")
msgpack_loads = functools.partial(_by_extension, "mp")

#: extension -> ``data -> value`` for the extensions :func:`basichandlers` decodes (the pickle family left out).
decoders: dict[str, Callable[[bytes], Any]] = {
    extension: functools.partial(_by_extension, extension)
    for extension in ("txt", "text", "transcript", "cls", "cls2", "index", "inx", "id", "json", "jsn", "mp", "msg",
                      "npy", "npz", "ten", "tb", "cbor")
}

default_pre_handlers = [gzfilter]
default_post_handlers = [basichandlers]
default_decoder = Decoder


def call_extension_handler(key: str, data: bytes, f: Callable[[bytes], Any], extensions: Sequence[str]) -> Any:
    """``f(data)`` when ``key`` ends in one of ``extensions`` (each compared by its dot-separated components,
    case-insensitively), else None."""
    parts = key.lower().split(".")
    for target in extensions:
        wanted = target.split(".")
        if len(wanted) <= len(parts) and parts[-len(wanted):] == wanted:
            return f(data)
    return None
