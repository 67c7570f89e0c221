"""Helpers and samples shared by the decoder tests (``test_decoders.py``, ``test_decoders_images.py``,
``test_decoders_stage.py``): a deep comparison, webdataset 1.0.2's decoding as the reference, and sample bytes."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import PIL.Image
import torch
from webdataset import autodecode as wds_ad
from webdataset import tenbin as wds_tenbin

# ---------------------------------------------------------------- helpers


def assert_same(ours: Any, ref: Any, where: str = "value", flags: bool = True) -> None:
    """Same type and equal contents, recursively: arrays and tensors by dtype, shape and values.

    ``flags``: also the arrays' writeability and the tensors' contiguity (when ``ref`` is webdataset's).
    """
    assert type(ours) is type(ref), f"{where}: {type(ours)} != {type(ref)}"
    if isinstance(ref, np.ndarray):
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, where
        assert np.array_equal(ours, ref), where
        assert not flags or ours.flags.writeable == ref.flags.writeable, where
    elif isinstance(ref, torch.Tensor):
        assert ours.dtype == ref.dtype and ours.shape == ref.shape, where
        assert torch.equal(ours, ref), where
        assert not flags or ours.is_contiguous() == ref.is_contiguous(), where
    elif isinstance(ref, PIL.Image.Image):
        assert (ours.mode, ours.size) == (ref.mode, ref.size), where
        assert ours.tobytes() == ref.tobytes(), where
    elif isinstance(ref, dict):
        assert list(ours) == list(ref), where
        for k in ref:
            assert_same(ours[k], ref[k], f"{where}[{k!r}]", flags)
    elif isinstance(ref, (list, tuple)):
        assert len(ours) == len(ref), where
        for i, (a, b) in enumerate(zip(ours, ref)):
            assert_same(a, b, f"{where}[{i}]", flags)
    else:
        assert ours == ref, where


def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


def image_bytes(mode: str, fmt: str, size: tuple[int, int] = (7, 5), **save: Any) -> bytes:
    rng = np.random.RandomState(len(mode) + len(fmt))
    channels = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "P": 1, "1": 1}[mode]
    pixels = rng.randint(0, 256, (size[1], size[0], channels), dtype=np.uint8)
    if mode in ("L", "P", "1"):
        image = PIL.Image.fromarray(pixels[:, :, 0], "L")
        image = image.convert(mode) if mode != "P" else image.convert("RGB").quantize(16)
    else:
        image = PIL.Image.fromarray(pixels, mode)
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save)
    return buf.getvalue()


def wds_reference(sample: dict[str, Any], *args: Any, **kw: Any) -> dict[str, Any]:
    """webdataset 1.0.2 decoding ``sample`` as ``.decode(*args, **kw)`` would."""
    handlers = [wds_ad.ImageHandler(a) if isinstance(a, str) else a for a in args]
    return wds_ad.Decoder(handlers, **kw)(sample)  # type: ignore[no-any-return]


# ---------------------------------------------------------------- shared samples

ARRAY = np.arange(12, dtype=np.float32).reshape(3, 4)
TENBIN = bytes(wds_tenbin.encode_buffer([ARRAY, np.array([1, -2], dtype="i8"), np.zeros((2, 0), "u1")]))

IMAGES = {
    "rgb.png": image_bytes("RGB", "PNG"), "l.png": image_bytes("L", "PNG"), "rgba.png": image_bytes("RGBA", "PNG"),
    "la.png": image_bytes("LA", "PNG"), "p.png": image_bytes("P", "PNG"), "1.png": image_bytes("1", "PNG"),
    "rgb.jpg": image_bytes("RGB", "JPEG", quality=90), "l.jpeg": image_bytes("L", "JPEG"),
    "rgb.ppm": image_bytes("RGB", "PPM"), "l.pgm": image_bytes("L", "PPM"), "rgb.bmp": image_bytes("RGB", "BMP"),
    "rgba.webp": image_bytes("RGBA", "WEBP", lossless=True), "p.gif": image_bytes("P", "GIF"),
    "rgb.tiff": image_bytes("RGB", "TIFF"),
}
