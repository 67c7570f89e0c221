"""wds_async.data.decoders' image handlers against webdataset 1.0.2's, on the same images.

Every image spec is applied to every image format (PNG in each mode, JPEG, PPM/PGM, BMP, WebP, GIF, TIFF) by both
and compared pixel by pixel; extension matching, unknown specs and non-images too. The other field formats are
tested in ``test_decoders.py``; handlers, options and the decode stage in ``test_decoders_stage.py``; the helpers
they share live in ``decoders_common.py``.
"""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from webdataset import autodecode as wds_ad

from tests.unit.decoders_common import IMAGES, assert_same, wds_reference
from wds_async.data.decoders import (
    IMAGE_EXTENSIONS,
    IMAGE_SPECS,
    DecodingError,
    ImageHandler,
    decode,
    decoder_from_args,
    imagehandler,
)


def test_image_specs_are_webdatasets() -> None:
    assert set(IMAGE_SPECS) == set(wds_ad.imagespecs)
    for spec, (container, etype, mode) in IMAGE_SPECS.items():
        assert (container, etype, mode.lower()) == wds_ad.imagespecs[spec]
    assert IMAGE_EXTENSIONS == wds_ad.IMAGE_EXTENSIONS


@pytest.mark.parametrize("spec", sorted(IMAGE_SPECS))
@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_spec_matches_webdataset(spec: str, name: str) -> None:
    field = name.split(".", 1)[1]
    ours = imagehandler(spec)("." + field, IMAGES[name])
    ref = wds_ad.imagehandler(spec)("." + field, IMAGES[name])
    assert_same(ours, ref, f"{spec} {name}")


def test_image_shapes_and_ranges() -> None:
    data = IMAGES["rgb.png"]
    assert imagehandler("rgb8")(".png", data).shape == (5, 7, 3)
    rgb = imagehandler("rgb")(".png", data)
    assert rgb.dtype == np.float32 and rgb.min() >= 0.0 and rgb.max() <= 1.0
    assert imagehandler("torchrgb")(".png", data).shape == (3, 5, 7)
    assert imagehandler("torchl8")(".png", data).shape == (5, 7)  # no channel axis, as in 1.0.2
    assert imagehandler("torchrgba8")(".png", data)[3].eq(255).all()
    assert imagehandler("pilrgba")(".png", data).mode == "RGBA"


def test_image_extension_matching() -> None:
    png = IMAGES["rgb.png"]
    for key in (".PNG", ".seg.png", ".x.Jpg", ".png.txt", ".npng", ".txt"):
        data = IMAGES["rgb.jpg"] if "jpg" in key.lower() else png
        ours, ref = ImageHandler("rgb8")(key, data), wds_ad.ImageHandler("rgb8")(key, data)
        assert (ours is None) == (ref is None), key
        if ref is not None:
            assert_same(ours, ref, key)
    only_png = ImageHandler("l8", extensions=["png"])
    assert only_png(".jpg", IMAGES["rgb.jpg"]) is None and only_png(".png", png).shape == (5, 7)
    # a space-separated string is split (1.0.2 would make a set of its characters)
    assert ImageHandler("l8", "png jpg").extensions == {"png", "jpg"}


@pytest.mark.parametrize("spec", ["numpy", "RGB", "rgb16", ""])
def test_unknown_image_spec(spec: str) -> None:
    with pytest.raises(ValueError, match="imagespec"):
        ImageHandler(spec)
    with pytest.raises(ValueError):
        wds_ad.ImageHandler(spec)


def test_image_not_an_image() -> None:
    sample = {"__key__": "k", "png": b"not a png"}
    with pytest.raises(DecodingError) as ours:
        decoder_from_args("rgb8")(sample)
    with pytest.raises(wds_ad.DecodingError) as ref:
        wds_reference(sample, "rgb8")
    assert type(ours.value.__cause__) is type(ref.value.__cause__)


@pytest.mark.parametrize("spec", ["pil", "torchrgb8", "l"])
def test_mixed_sample_through_decode(spec: str) -> None:
    sample = {"__key__": "k", "__url__": "u", "jpg": IMAGES["rgb.jpg"], "seg.png": IMAGES["p.png"],
              "json": b"[1]", "cls": b"2", "txt.gz": gzip.compress(b"t")}
    (ours,) = decode(iter([sample]), spec)
    assert_same(ours, wds_reference(sample, spec))
