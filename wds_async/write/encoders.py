"""Encoders for the writers: sample field values -> bytes, by extension, as webdataset 1.0.2 encodes them.

Pure functions and a read-only default table (``default_handlers``); :func:`make_encoder` turns
``TarWriter(encoder=...)`` into a function ``sample -> sample of bytes``. Everything is deterministic
(fixed inner timestamps in ``.gz`` fields and ``.npz`` archives) so a fixed ``mtime`` gives bit-exact shards.
``npy``/``npz`` never pickle.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle
import struct
import zipfile
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import MissingDependency, SampleError

__all__ = ["Handler", "default_handlers", "make_encoder"]

Handler = Callable[[Any], "bytes | bytearray | memoryview"]
_BYTES = (bytes, bytearray, memoryview)


def _need(module: str, package: str) -> Any:
    try:
        return __import__(module)
    except ImportError:
        raise MissingDependency(f"encoding this field needs {module}: pip install {package}") from None


# -- encoders: value -> bytes, pure functions ---------------------------------------------------------


def _text(value: Any) -> bytes:
    if not isinstance(value, str):
        raise TypeError(f"expected str, got {type(value).__name__}")
    return value.encode("utf-8")


def _npy(value: Any) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, np.asanyarray(value), allow_pickle=False)
    return out.getvalue()


def _npz(value: Any) -> bytes:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise TypeError(f"npz expects a dict of str -> array, got {type(value).__name__}")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, array in value.items():
            # The zip epoch instead of numpy's wall clock keeps the encoding a pure function.
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            with zf.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)
    return out.getvalue()


# tenbin (webdataset's .ten): chunks of b"~TenBin~", int64 length, data zero-padded to 64 bytes; each array
# is a header chunk (dtype code, info, ndim, dims as int64) then its raw little-endian data.
_TEN_CODES = {"float16": b"f2", "float32": b"f4", "float64": b"f8", "int8": b"i1", "int16": b"i2", "int32": b"i4",
              "int64": b"i8", "uint8": b"u1", "uint16": b"u2", "uint64": b"u8"}  # webdataset cannot read uint32


def _ten_chunk(payload: bytes) -> bytes:
    return b"~TenBin~" + struct.pack("<q", len(payload)) + payload + b"\0" * (-len(payload) % 64)


def _tenbin(value: Any) -> bytes:
    parts = []
    for item in value if isinstance(value, list) else [value]:
        array = np.asarray(item)
        code = _TEN_CODES.get(array.dtype.name)
        if code is None or array.ndim >= 10:
            raise TypeError(f"tenbin cannot hold dtype {array.dtype.name} with {array.ndim} dimensions")
        header = struct.pack(f"<8s8sq{array.ndim}q", code, b"", array.ndim, *array.shape)
        parts += [_ten_chunk(header), _ten_chunk(np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes())]
    return b"".join(parts)


def _torch(value: Any) -> bytes:
    torch = _need("torch", "'wds-async[torch]'")  # the extra; write/ cannot import data/_torch.py (layers)
    out = io.BytesIO()
    torch.save(value, out)
    return out.getvalue()


def _image_array(value: Any) -> np.ndarray:
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
        if value.ndim == 3:  # tensors are CHW by torch convention, arrays HWC
            value = value.transpose(1, 2, 0)
    if not isinstance(value, np.ndarray):
        raise TypeError(f"expected a PIL image, numpy array or torch tensor, got {type(value).__name__}")
    if value.dtype.kind == "f":
        if value.size and (np.amin(value) <= -0.001 or np.amax(value) >= 1.001):
            raise ValueError(f"float image values must lie in [0, 1], got {np.amin(value)}..{np.amax(value)}")
        value = (np.clip(value, 0.0, 1.0) * 255.0).astype(np.uint8)  # truncates, as webdataset does
    if value.ndim == 3 and value.shape[2] == 1:
        value = value[:, :, 0]
    if value.ndim not in (2, 3) or (value.ndim == 3 and value.shape[2] not in (3, 4)):
        raise ValueError(f"image arrays must be HxW or HxWxC with C in 1, 3, 4; got shape {value.shape}")
    return np.asarray(value)


def _image(pil_format: str, mode: str | None = None, **options: Any) -> Handler:
    def encode(value: Any) -> bytes:
        image_module = _need("PIL.Image", "Pillow").Image
        image = value if isinstance(value, image_module.Image) else image_module.fromarray(_image_array(value))
        if mode is not None and image.mode != mode:
            image = image.convert(mode)
        out = io.BytesIO()
        image.save(out, format=pil_format, **options)
        return out.getvalue()

    return encode


def _table(entries: dict[str, Handler]) -> dict[str, Handler]:
    return {ext: handler for exts, handler in entries.items() for ext in exts.split()}


#: Extension (after the last dot, lower case) -> encoder; webdataset 1.0.2's table plus ``pkl``.
default_handlers: Mapping[str, Handler] = MappingProxyType(_table({
    "cls cls2 class count index inx id": lambda x: str(x).encode("ascii"),
    "txt text transcript html htm": _text,
    "pyd pickle pkl": pickle.dumps,
    "pth": _torch,
    "npy": _npy,
    "npz": _npz,
    "ten tenbin tb": _tenbin,
    "json jsn": lambda x: json.dumps(x).encode("utf-8"),
    "mp msgpack msg": lambda x: _need("msgpack", "msgpack").packb(x),
    "cbor": lambda x: _need("cbor2", "cbor2").dumps(x),
    "jpg jpeg img image": _image("JPEG", quality=100),
    "png": _image("PNG"),
    "ppm": _image("PPM"),
    "pgm": _image("PPM", "L"),
    "pbm": _image("PPM", "1"),
    "tiff tif": _image("TIFF", quality=100),
}))


def _encode_field(field: str, value: Any, handlers: Mapping[str, Handler]) -> Any:
    """One field by webdataset's rules: metadata stays str, str -> utf-8, bytes pass, else by extension."""
    if field.startswith("_"):
        if not isinstance(value, (str, *_BYTES)):
            raise TypeError(f"metadata values must be str, got {type(value).__name__}")
        return value
    name, compress = (field[:-3], True) if field.endswith(".gz") else (field, False)
    if isinstance(value, str):
        data: Any = value.encode("utf-8")
    elif isinstance(value, _BYTES):
        data = value
    else:
        extension = name.rsplit(".", 1)[-1].lower()
        handler = handlers.get(extension)
        if handler is None:
            raise TypeError(f"no encoder for extension {extension!r} and the value is "
                            f"{type(value).__name__}, not bytes or str")
        data = handler(value)
    return gzip.compress(bytes(data), mtime=0) if compress else data


def _encode_sample(sample: Mapping[str, Any], fields: list[str], handlers: Mapping[str, Handler]) -> dict[str, Any]:
    key = sample.get("__key__")
    encoded = {}
    for field in fields:
        try:
            encoded[field] = _encode_field(field, sample[field], handlers)
        except MissingDependency:
            raise
        except Exception as exc:
            raise SampleError(f"sample {key!r}: cannot encode field {field!r}: {exc}", member=f"{key}.{field}") from exc
    return encoded


Sample = dict[str, Any]


def make_encoder(spec: bool | Mapping[str, Handler] | Callable[[Sample], Sample] | None) -> Callable[[Sample], Sample]:
    """``True``: :data:`default_handlers`; a dict: those handlers; ``False``/``None``: identity; a callable."""
    if spec is False or spec is None:
        return lambda sample: sample
    if spec is True or isinstance(spec, Mapping):
        handlers = default_handlers if spec is True else spec
        return lambda sample: _encode_sample(sample, list(sample), handlers)
    if callable(spec):
        return spec
    raise ValueError(f"encoder must be True, False, None, a dict or a callable, not {spec!r}")
