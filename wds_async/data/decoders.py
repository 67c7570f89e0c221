"""Decode sample fields by extension: webdataset 1.0.2's ``.decode(...)``, with unpickling off.

A :class:`Decoder` runs each field of a sample through a chain of handlers ``h(key, data)`` where
``key`` is ``"." + field`` (``".seg.json.gz"``), as webdataset passes it. The chain is
``pre + handlers + post``, by default ``[gzfilter] + handlers + [basichandlers]``. A handler returns
None to pass, a :class:`Continue` to rewrite key and data and go on with the *next* handler (that is
how ``.json.gz`` is gunzipped and then parsed), or the decoded value. When no handler claims a field
it stays ``bytes``. ``__*`` fields are not decoded (``bytes`` become ``str`` when valid UTF-8).

Security: ``pkl``, ``pickle``, ``pyd`` (``pickle.loads``) and ``pth`` (``torch.load`` with
``weights_only=False``) run arbitrary code from the data. webdataset decodes them by default; we
refuse them with a :class:`DecodingError` unless the caller opts in with ``allow_pickle=True`` or
``WDS_ASYNC_ALLOW_PICKLE=1``, because shards often come from places the trainer does not control.

Deliberate differences from 1.0.2: ``cbor`` uses ``cbor2`` (1.0.2 imports the unmaintained ``cbor``
and fails without it); ``tenbin`` also reads ``u4`` arrays and 0-d arrays (1.0.2 crashes on both);
``imagehandler(spec, "jpg png")`` splits a string of extensions (1.0.2 takes its characters);
errors carry ``key``, ``field`` and ``url`` as attributes and say so in ``str()``.
"""

from __future__ import annotations

import functools
import gzip
import importlib
import io
import json
import os
import pickle
import struct
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from ..engine.grouping import Sample
from ..errors import DecodingError, MissingDependency
from ._torch import require_torch
from .handlers import reraise_exception

__all__ = [
    "IMAGE_EXTENSIONS", "IMAGE_SPECS", "Continue", "Decoder", "DecodingError", "ImageHandler", "basichandlers",
    "decode", "decoder_from_args", "gzfilter", "handle_extension", "imagehandler", "read_tenbin",
]

Handler = Callable[[str, bytes], Any]

ALLOW_PICKLE_ENV = "WDS_ASYNC_ALLOW_PICKLE"

#: Extensions the image handlers claim: those Pillow can open, the same list as webdataset 1.0.2.
IMAGE_EXTENSIONS = [
    "blp", "bmp", "dib", "bufr", "cur", "pcx", "dcx", "dds", "ps", "eps", "fit", "fits", "fli", "flc", "ftc",
    "ftu", "gbr", "gif", "grib", "h5", "hdf", "png", "apng", "jp2", "j2k", "jpc", "jpf", "jpx", "j2c", "icns",
    "ico", "im", "iim", "tif", "tiff", "jfif", "jpe", "jpg", "jpeg", "mpg", "mpeg", "msp", "pcd", "pxr", "pbm",
    "pgm", "ppm", "pnm", "psd", "bw", "rgb", "rgba", "sgi", "ras", "tga", "icb", "vda", "vst", "webp", "wmf",
    "emf", "xbm", "xpm",
]

#: spec -> (container, element type, Pillow mode). Float images are float32 in [0, 1]; arrays are
#: HWC (HW for one channel), tensors CHW (HW for one channel).
IMAGE_SPECS: dict[str, tuple[str, str | None, str]] = {
    "l8": ("numpy", "uint8", "L"), "rgb8": ("numpy", "uint8", "RGB"), "rgba8": ("numpy", "uint8", "RGBA"),
    "l": ("numpy", "float", "L"), "rgb": ("numpy", "float", "RGB"), "rgba": ("numpy", "float", "RGBA"),
    "torchl8": ("torch", "uint8", "L"), "torchrgb8": ("torch", "uint8", "RGB"),
    "torchrgba8": ("torch", "uint8", "RGBA"), "torchl": ("torch", "float", "L"),
    "torchrgb": ("torch", "float", "RGB"), "torch": ("torch", "float", "RGB"),
    "torchrgba": ("torch", "float", "RGBA"),
    "pill": ("pil", None, "L"), "pil": ("pil", None, "RGB"), "pilrgb": ("pil", None, "RGB"),
    "pilrgba": ("pil", None, "RGBA"),
}


class Continue:
    """Returned by a handler to replace key and data and carry on with the next handler."""

    __slots__ = ("data", "key")

    def __init__(self, key: str, data: bytes) -> None:
        self.key, self.data = key, data


def _last_extension(key: str) -> str:
    return key.rsplit(".", 1)[-1]


# ---------------------------------------------------------------- basic types


def _require(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependency(f"decoding this field needs {package}: pip install {package}") from None


def _utf8(data: bytes) -> str:
    return data.decode("utf-8")


def _msgpack(data: bytes) -> Any:
    return _require("msgpack", "msgpack").unpackb(data)


def _cbor(data: bytes) -> Any:
    return _require("cbor2", "cbor2").loads(data)


def _npy(data: bytes) -> np.ndarray:
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)


def _npz(data: bytes) -> dict[str, np.ndarray]:
    # A plain dict, read eagerly, as webdataset returns: an NpzFile would keep the archive open.
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return dict(archive)


_TENBIN_MAGIC = b"~TenBin~"
_TENBIN_DTYPES = {"f2": "float16", "f4": "float32", "f8": "float64", "i1": "int8", "i2": "int16",
                  "i4": "int32", "i8": "int64", "u1": "uint8", "u2": "uint16", "u4": "uint32", "u8": "uint64"}


def read_tenbin(data: bytes) -> list[np.ndarray]:
    """Read webdataset's tenbin format into a list of read-only arrays (views of ``data``).

    The format is a run of chunks ``magic "~TenBin~" | int64 length | payload padded to 64 bytes``
    (native byte order); chunks pair up as (header, array bytes). A header is int64s: the dtype code
    (ASCII such as ``f4``, zero-padded to 8 bytes), an 8-byte info string, the rank, then each dim.
    """
    view, pos, chunks = memoryview(data), 0, []
    while pos < len(view):
        if view[pos:pos + 8] != _TENBIN_MAGIC:
            raise ValueError(f"tenbin: bad magic at byte {pos}")
        (length,) = struct.unpack_from("=q", view, pos + 8)
        if length < 0 or pos + 16 + length > len(view):
            raise ValueError(f"tenbin: chunk at byte {pos} claims {length} bytes, past the end")
        chunks.append(view[pos + 16:pos + 16 + length])
        pos += 16 + -(-length // 64) * 64
    if len(chunks) % 2:
        raise ValueError("tenbin: a header chunk has no data chunk")
    arrays = []
    for header, payload in zip(chunks[::2], chunks[1::2]):
        words = np.frombuffer(header, dtype="=i8")
        code = words[:1].tobytes().rstrip(b"\0").decode("ascii")
        if code not in _TENBIN_DTYPES:
            raise ValueError(f"tenbin: unsupported dtype code {code!r}")
        shape = tuple(int(n) for n in words[3:3 + int(words[2])])
        count = int(np.prod(shape, dtype=np.int64))
        arrays.append(np.frombuffer(payload, dtype=_TENBIN_DTYPES[code], count=count).reshape(shape))
    return arrays


_BASIC: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(("txt", "text", "transcript"), _utf8),
    **dict.fromkeys(("cls", "cls2", "index", "inx", "id"), int),  # int() accepts b" 7\n"
    **dict.fromkeys(("json", "jsn"), json.loads),
    **dict.fromkeys(("mp", "msg"), _msgpack),
    **dict.fromkeys(("ten", "tb"), read_tenbin),
    "npy": _npy, "npz": _npz, "cbor": _cbor,
}
_PICKLED = frozenset(("pkl", "pickle", "pyd", "pth"))


def basichandlers(key: str, data: bytes) -> Any:
    """Decode by the last extension of ``key``: text, ints, JSON, msgpack, CBOR, NumPy, tenbin.

    The pickle family (``pkl pickle pyd pth``) raises :class:`DecodingError`: a :class:`Decoder`
    built with ``allow_pickle=True`` swaps this handler for one that unpickles.
    """
    extension = _last_extension(key)
    if extension in _PICKLED:
        raise DecodingError(f"refusing to unpickle a .{extension} field: unpickling runs code from the data; "
                            f"if you trust these shards, pass allow_pickle=True or set {ALLOW_PICKLE_ENV}=1")
    decoder = _BASIC.get(extension)
    return None if decoder is None else decoder(data)


def _unpickling_basichandlers(key: str, data: bytes, *, weights_only: bool) -> Any:
    extension = _last_extension(key)
    if extension == "pth":
        require_torch("decoding a .pth field (torch.load)")
        import torch

        return torch.load(io.BytesIO(data), weights_only=weights_only, map_location="cpu")
    if extension in _PICKLED:
        return pickle.loads(data)
    return basichandlers(key, data)


def gzfilter(key: str, data: bytes) -> Continue | None:
    """Gunzip ``*.gz`` fields and let the rest of the chain decode the inner extension."""
    if not key.endswith(".gz"):
        return None
    return Continue(key[:-3], gzip.decompress(data))


def handle_extension(extensions: str, f: Callable[[bytes], Any]) -> Handler:
    """A handler applying ``f(data)`` to fields ending in one of the space-separated ``extensions``.

    Matching is per dot-separated component and case-insensitive: ``"png"`` matches ``seg.png`` but
    not ``xpng``; ``"seg.png"`` matches ``a.seg.png`` but not ``png``.
    """
    targets = [target.split(".") for target in extensions.lower().split()]

    def handler(key: str, data: bytes) -> Any:
        parts = key.lower().split(".")
        for target in targets:
            if len(target) <= len(parts) and parts[len(parts) - len(target):] == target:
                return f(data)
        return None

    return handler


# ---------------------------------------------------------------- images


class ImageHandler:
    """Decode images with Pillow into the form ``imagespec`` names (see :data:`IMAGE_SPECS`)."""

    def __init__(self, imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> None:
        if imagespec not in IMAGE_SPECS:
            raise ValueError(f"unknown imagespec {imagespec!r}; use one of {' '.join(IMAGE_SPECS)}")
        if IMAGE_SPECS[imagespec][0] == "torch":  # at .decode("torchrgb"), not at the first sample
            require_torch(f"the {imagespec!r} image decoder")
        self.imagespec = imagespec
        self.extensions = frozenset(extensions.split() if isinstance(extensions, str) else extensions)

    def __call__(self, key: str, data: bytes) -> Any:
        if _last_extension(key).lower() not in self.extensions:
            return None
        container, etype, mode = IMAGE_SPECS[self.imagespec]
        with _require("PIL.Image", "pillow").open(io.BytesIO(data)) as opened:
            opened.load()
            image = opened.convert(mode)  # after this the channel count always matches the spec
        if container == "pil":
            return image
        array = np.asarray(image)
        if etype == "float":
            array = array.astype(np.float32)
            array /= 255.0
        if container == "numpy":
            return array
        import torch

        chw = array.transpose(2, 0, 1) if array.ndim == 3 else array
        if not (chw.flags.c_contiguous and chw.flags.writeable):
            chw = chw.copy()  # torch wants writable memory; Pillow's arrays are read-only
        return torch.from_numpy(chw)


def imagehandler(imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> ImageHandler:
    """webdataset's lower-case alias of :class:`ImageHandler`."""
    return ImageHandler(imagespec, extensions)


# ---------------------------------------------------------------- samples


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def _handler_list(handlers: Iterable[Handler], what: str) -> list[Handler]:
    result = list(handlers)  # a string becomes characters, which fail the check below
    if not all(callable(h) for h in result):
        raise TypeError(f"{what} must be a list of handler callables, got {handlers!r}")
    return result


class Decoder:
    """Decode every field of a sample through ``pre + handlers + post`` (see the module docstring).

    ``only``: field names (a list, or a space-separated string) to decode; others pass unchanged.
    ``partial``: let values that are not ``bytes`` (already decoded) through instead of failing.
    ``allow_pickle``: decode ``pkl pickle pyd pth``; None reads ``WDS_ASYNC_ALLOW_PICKLE``. For ``pth``,
    ``torch.load`` gets ``weights_only=False`` as in webdataset, unless ``WDS_PYTORCH_WEIGHTS_ONLY=1``.
    """

    def __init__(self, handlers: Sequence[Handler], pre: Sequence[Handler] | None = None,
                 post: Sequence[Handler] | None = None, only: str | Iterable[str] | None = None,
                 partial: bool = False, allow_pickle: bool | None = None) -> None:
        self.allow_pickle = _env_flag(ALLOW_PICKLE_ENV) if allow_pickle is None else bool(allow_pickle)
        chain = (_handler_list([gzfilter] if pre is None else pre, "pre") + _handler_list(handlers, "handlers")
                 + _handler_list([basichandlers] if post is None else post, "post"))
        if self.allow_pickle:
            unpickling = functools.partial(_unpickling_basichandlers,
                                           weights_only=_env_flag("WDS_PYTORCH_WEIGHTS_ONLY"))
            chain = [unpickling if h is basichandlers else h for h in chain]
        self.handlers = chain
        self.only = None if only is None else frozenset(only.split() if isinstance(only, str) else only)
        self.partial = partial

    def decode_field(self, field: str, data: bytes) -> Any:
        """Decode one field's bytes; returns them unchanged when no handler claims the field."""
        key = "." + field
        for handler in self.handlers:
            result = handler(key, data)
            if result is None:
                continue
            if isinstance(result, Continue):
                key, data = result.key, result.data
                continue
            return result
        return data

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(sample, dict):
            raise TypeError(f"Decoder expects dict samples, got {type(sample).__name__}")
        out = _empty_like(sample)
        for field, value in sample.items():
            if field.startswith("__"):
                out[field] = _meta_value(value)
            elif self.only is not None and field not in self.only:
                out[field] = value
            elif isinstance(value, bytes):
                try:
                    out[field] = self.decode_field(field, value)
                except Exception as exn:
                    raise _decoding_error(sample, field, exn) from exn
            elif self.partial and value is not None:
                out[field] = value
            else:
                raise _decoding_error(sample, field, TypeError(
                    f"value is {type(value).__name__}, not bytes (pass partial=True to let decoded values through)"))
        return out


def _empty_like(sample: dict[str, Any]) -> dict[str, Any]:
    # Keep a Sample's shard position (url, offset) so that decoded samples can still be resumed.
    if not isinstance(sample, Sample):
        return {}
    out = Sample()
    out.url, out.offset = sample.url, sample.offset
    return out


def _meta_value(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def _decoding_error(sample: dict[str, Any], field: str, cause: BaseException) -> DecodingError:
    key, url = _meta_value(sample.get("__key__")), _meta_value(sample.get("__url__"))
    detail = cause.message if isinstance(cause, DecodingError) else f"{type(cause).__name__}: {cause}"
    return DecodingError(f"cannot decode field {field!r} of sample {key!r}: {detail}",
                         url=url, offset=getattr(sample, "offset", None), key=key, field=field)


def decoder_from_args(*args: str | Handler, pre: Sequence[Handler] | None = None,
                      post: Sequence[Handler] | None = None, only: str | Iterable[str] | None = None,
                      partial: bool = False, allow_pickle: bool | None = None) -> Decoder:
    """The :class:`Decoder` that ``.decode(*args)`` builds: strings are image specs, callables handlers.

    They run after ``gzfilter`` and before the default ``basichandlers`` (replace those with ``pre=``,
    ``post=``).
    """
    handlers: list[Handler] = []
    for arg in args:
        if isinstance(arg, str):
            handlers.append(ImageHandler(arg))
        elif callable(arg):
            handlers.append(arg)
        else:
            raise TypeError(f"decode() takes image specs and handler callables, got {arg!r}")
    return Decoder(handlers, pre=pre, post=post, only=only, partial=partial, allow_pickle=allow_pickle)


def decode(data: Iterable[dict[str, Any]], *args: str | Handler,
           handler: Callable[[BaseException], bool] = reraise_exception, only: str | Iterable[str] | None = None,
           partial: bool = False, allow_pickle: bool | None = None, pre: Sequence[Handler] | None = None,
           post: Sequence[Handler] | None = None) -> Iterator[dict[str, Any]]:
    """Stage: decode each sample; a failing sample goes to ``handler`` (True: skip it, False: stop).

    The decoder is built (and the image specs checked) at the call, not at the first sample.
    """
    decoder = decoder_from_args(*args, pre=pre, post=post, only=only, partial=partial, allow_pickle=allow_pickle)
    return _decode_each(data, decoder, handler)


def _decode_each(data: Iterable[dict[str, Any]], decoder: Decoder,
                 handler: Callable[[BaseException], bool]) -> Iterator[dict[str, Any]]:
    for sample in data:
        try:
            decoded = decoder(sample)
        except Exception as exn:  # any failure is the handler's to judge, as in webdataset
            if handler(exn):
                continue
            break
        yield decoded
