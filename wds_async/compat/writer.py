"""``webdataset.writer``: ``TarWriter`` and ``ShardWriter`` (wds-async's, :mod:`wds_async.write.writer`) and the
field encoders by extension.

The writers produce the same bytes as webdataset 1.0.2's at a fixed ``mtime``, write local paths, ``pipe:``
commands and s3/gs/az objects (committed on close, never half-written), and take the same ``encoder=`` forms.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..write.writer import ShardWriter, TarWriter, default_handlers, make_encoder

__all__ = [
    "ShardWriter", "TarWriter", "add_handlers", "bytestr", "cbor_dumps", "default_handlers",
    "encode_based_on_extension", "encode_based_on_extension1", "imageencoder", "make_encoder", "make_handlers",
    "mp_dumps", "numpy_dumps", "numpy_npz_dumps", "tenbin_dumps", "torch_dumps",
]


def _by(extension: str) -> Callable[[Any], bytes]:
    encode = default_handlers[extension]

    def dumps(data: Any) -> bytes:
        return bytes(encode(data))

    dumps.__name__ = f"{extension}_dumps"
    dumps.__doc__ = f"``data`` encoded as a ``.{extension}`` field is."
    return dumps


torch_dumps = _by("pth")
numpy_dumps = _by("npy")
numpy_npz_dumps = _by("npz")
tenbin_dumps = _by("ten")
cbor_dumps = _by("cbor")
mp_dumps = _by("mp")

_IMAGE_FORMATS = {"PNG": "png", "JPEG": "jpg", "JPG": "jpg", "PPM": "ppm", "IMG": "ppm", "IMAGE": "ppm",
                  "TIFF": "tiff", "PGM": "pgm", "PBM": "pbm"}


def imageencoder(image: Any, format: str = "PNG") -> bytes:
    """A PIL image or an array (uint8, or float in [0, 1]) compressed as ``format`` (PNG, JPEG, PPM, TIFF)."""
    extension = _IMAGE_FORMATS.get(format.upper())
    if extension is None:
        raise ValueError(f"imageencoder: unknown format {format!r}; use one of {sorted(_IMAGE_FORMATS)}")
    return bytes(default_handlers[extension](image))


def bytestr(data: Any) -> bytes:
    """``bytes`` as they are, ``str`` as ASCII, anything else as ``str(data)`` in ASCII."""
    if isinstance(data, bytes):
        return data
    return (data if isinstance(data, str) else str(data)).encode("ascii")


def add_handlers(d: dict[str, Callable[[Any], bytes]], keys: str | Iterable[str],
                 value: Callable[[Any], bytes]) -> None:
    """Set ``d[k] = value`` for each of ``keys`` (a list, or a space-separated string)."""
    for key in keys.split() if isinstance(keys, str) else keys:
        d[key] = value


def make_handlers() -> dict[str, Callable[[Any], Any]]:
    """A new, modifiable copy of the default extension -> encoder table."""
    return dict(default_handlers)


def encode_based_on_extension1(data: Any, tname: str, handlers: Mapping[str, Callable[[Any], bytes]]) -> Any:
    """One field's value encoded by the extension of ``tname``: metadata (``_`` names) stays ``str``, ``str`` becomes
    UTF-8, ``bytes`` pass, anything else goes through ``handlers``."""
    return make_encoder(dict(handlers))({tname: data})[tname]


def encode_based_on_extension(sample: Mapping[str, Any], handlers: Mapping[str, Callable[[Any], bytes]]
                              ) -> dict[str, Any]:
    """Every field of ``sample`` encoded by :func:`encode_based_on_extension1`."""
    return make_encoder(dict(handlers))(dict(sample))
