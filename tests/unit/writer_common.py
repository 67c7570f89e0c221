"""Helpers shared by the TarWriter / ShardWriter tests (``test_writer.py``, ``test_writer_shards.py``,
``test_writer_errors.py``): a sample covering every default encoder, reading shards back with webdataset 1.0.2,
and writing samples to bytes in memory.
"""

from __future__ import annotations

import gc
import io
import warnings
from typing import Any

import cbor2
import msgpack
import numpy as np
import PIL.Image
import torch
import webdataset

MTIME = 1_234_567_890

# -- samples covering every default encoder ------------------------------------------------------------


def make_sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    rgb = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (6, 5), dtype=np.uint8)
    smooth = np.stack([np.add.outer(np.arange(16) * 8, np.arange(16) * 4) + i] * 3, -1).astype(np.uint8)  # JPEG-able
    return {
        "__key__": f"dir/sample{i:03d}",
        "txt": f"héllo {i}", "text": "t", "transcript": "tr", "html": "<p>x</p>", "htm": "<b>",
        "cls": i, "cls2": i + 1, "class": 3, "count": 4, "index": i * 10, "inx": 7, "id": 123456789,
        "json": {"i": i, "list": [1, 2.5, None], "s": "ü"}, "jsn": [i],
        "npy": rng.standard_normal((3, 4)).astype(np.float32),
        "npz": {"a": np.arange(i + 3), "b": np.eye(2)},
        "mp": {"i": i, "b": b"raw"}, "msgpack": [1, 2], "msg": 5,
        "cbor": {"i": i, "f": 1.5},
        "ten": np.arange(12, dtype=np.int32).reshape(3, 4),
        "tb": [np.ones(3, np.float64), np.zeros((2, 2), np.uint8)],
        "pyd": {"set": {1, 2}}, "pickle": (1, "a"), "pkl": [i],
        "pth": torch.arange(4, dtype=torch.float32) * i,
        "png": rgb, "seg.png": gray, "ppm": rgb, "pgm": gray, "pbm": (gray > 127).astype(np.uint8) * 255,
        "tiff": rgb, "tif": rgb[:, :, :1],
        "jpg": smooth, "jpeg": PIL.Image.fromarray(smooth),
        "flt.png": rgb.astype(np.float64) / 255.0,
        "chw.png": torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0,
        "txt.gz": "compressed " * 20,
        "bin": bytes(range(256)) * 3,
        "foo": "plain str under an unknown extension",
    }


def expected_image(field: str, value: Any) -> np.ndarray:
    """What an RGB uint8 decode of the encoded field must give."""
    if isinstance(value, PIL.Image.Image):
        value = np.asarray(value)
    elif isinstance(value, torch.Tensor):
        value = (value.permute(1, 2, 0).numpy() * 255.0).astype(np.uint8)
    elif value.dtype.kind == "f":
        value = (value * 255.0).astype(np.uint8)
    if value.ndim == 3 and value.shape[2] == 1:
        value = value[:, :, 0]
    return np.stack([value] * 3, -1) if value.ndim == 2 else value


IMAGE_EXTS = {"png", "ppm", "pgm", "pbm", "tiff", "tif", "jpg", "jpeg"}


def check_value(field: str, original: Any, decoded: Any) -> None:
    """``decoded`` is webdataset's ``.decode(cbor, "rgb8")`` of the member (or equivalent)."""
    ext = field.rsplit(".", 1)[-1]
    if ext in IMAGE_EXTS:
        want = expected_image(field, original)
        assert decoded.shape == want.shape, field
        diff = np.abs(decoded.astype(int) - want.astype(int))
        assert (diff.mean() < 4) if ext in ("jpg", "jpeg") else not diff.any(), field
    elif field in ("npy", "ten"):
        np.testing.assert_array_equal(decoded if field == "npy" else decoded[0], original)
    elif field == "tb":
        assert len(decoded) == 2 and all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(decoded, original))
    elif field == "npz":
        assert decoded.keys() == original.keys() and all(np.array_equal(decoded[k], original[k]) for k in original)
    elif field == "pth":
        assert torch.equal(decoded, original)
    elif field == "msgpack":  # webdataset decodes .mp and .msg only
        assert msgpack.unpackb(decoded) == original
    elif isinstance(decoded, bytes) and not isinstance(original, bytes):  # webdataset has no decoder for it
        assert field in ("foo", "class", "count", "html", "htm") and decoded == str(original).encode()
    else:
        assert decoded == original, field


def cbor_handler(key: str, data: bytes) -> Any:
    # webdataset's own cbor decoder imports the legacy ``cbor`` package, which is not installed.
    return cbor2.loads(data) if key.endswith("cbor") else None


def read_webdataset(urls: Any, *decode_args: Any) -> list[dict[str, Any]]:
    """Read with webdataset 1.0.2; it leaves its shard file to the garbage collector (a ResourceWarning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        dataset = webdataset.WebDataset(urls, shardshuffle=False).decode(*decode_args)
        samples = list(dataset)
        del dataset
        gc.collect()
    return samples


def assert_roundtrip(samples: list[dict[str, Any]], decoded: list[dict[str, Any]]) -> None:
    assert [s["__key__"] for s in decoded] == [s["__key__"] for s in samples]
    for original, got in zip(samples, decoded):
        fields = {k for k in got if not k.startswith("__")}
        assert fields == {k for k in original if not k.startswith("_")}
        for field in fields:
            check_value(field, original[field], got[field])


def write_bytes(cls: Any, samples: list[dict[str, Any]], **kw: Any) -> tuple[bytes, list[int]]:
    buf = io.BytesIO()
    writer = cls(buf, **kw)
    sizes = [writer.write(s) for s in samples]
    writer.close()
    return buf.getvalue(), sizes
