"""The webdataset docs' own examples, run unchanged with ``import wds_async as wds``, on generated image
shards (jpg/png + json + cls), and compared with webdataset 1.0.2 where both can run; and our own quick start
(``docs/getting-started.md``, "Quick start"; the README carries a copy that ``tests/unit/test_docs.py`` keeps
identical), run as written on the synthetic shards of ``benchmarks/make_shards.py``."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
import warnings
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import wds_async as wds
from tests.conftest import doc_block
from tests.parity.conftest import write_tar

GETTING_STARTED = Path(__file__).resolve().parents[2] / "docs" / "getting-started.md"


@pytest.fixture(scope="module")
def image_shards(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for shard in range(4):
        members = []
        for i in range(8):
            key = f"img{shard}_{i:02d}"
            pixels = rng.integers(0, 255, size=(32, 40, 3), dtype=np.uint8)
            encoded = {}
            for fmt in ("JPEG", "PNG"):
                buf = io.BytesIO()
                Image.fromarray(pixels).save(buf, format=fmt)
                encoded[fmt] = buf.getvalue()
            members += [(f"{key}.jpg", encoded["JPEG"]), (f"{key}.png", encoded["PNG"]),
                        (f"{key}.json", json.dumps({"shard": shard, "i": i}).encode()),
                        (f"{key}.cls", str(i % 3).encode())]
        write_tar(root / f"images-{shard:06d}.tar", members)
    return str(root / "images-{000000..000003}.tar")


def test_readme_fluid_example(image_shards: str) -> None:
    # webdataset README: dataset = wds.WebDataset(url).shuffle(1000).decode("torchrgb").to_tuple("jpg;png", "json")
    url = image_shards
    dataset = wds.WebDataset(url).shuffle(1000).decode("torchrgb").to_tuple("jpg;png", "json")
    dataloader = torch.utils.data.DataLoader(dataset, num_workers=2, batch_size=16)
    seen = 0
    for inputs, outputs in dataloader:
        assert inputs.shape[1:] == (3, 32, 40) and inputs.dtype == torch.float32
        assert set(outputs) == {"shard", "i"}
        seen += inputs.shape[0]
    assert seen == 32


def test_readme_rgb_islice_example(image_shards: str) -> None:
    url = image_shards
    dataset = (
        wds.WebDataset(url)
        .shuffle(100)
        .decode("rgb")
        .to_tuple("jpg;png", "json")
    )
    for image, data in islice(dataset, 0, 3):
        assert image.shape == (32, 40, 3) and image.dtype == np.float32 and isinstance(data, dict)


def test_getting_started_pipeline_example(image_shards: str) -> None:
    url = image_shards

    def preprocess(sample):  # type: ignore[no-untyped-def]
        image, meta = sample
        return torch.nn.functional.interpolate(image[None], size=(24, 24))[0], meta["i"]

    dataset = wds.DataPipeline(
        wds.SimpleShardList(url),
        # at this point we have an iterator over all the shards
        wds.shuffle(100),
        # add wds.split_by_node here if you are using multiple nodes
        wds.split_by_worker,
        # at this point, we have an iterator over the shards assigned to each worker
        wds.tarfile_to_samples(),
        # this shuffles the samples in memory
        wds.shuffle(1000),
        # this decodes the images and json
        wds.decode("torchrgb"),
        wds.to_tuple("png", "json"),
        wds.map(preprocess),
        wds.shuffle(1000),
        wds.batched(16),
    )
    batch = next(iter(dataset))
    assert batch[0].shape == (16, 3, 24, 24) and batch[1].shape == (16,)


@pytest.mark.parametrize("spec", ["pil", "rgb8", "torchrgb", "l", "torchl8"])
def test_decoded_images_equal_webdataset(image_shards: str, spec: str) -> None:
    import webdataset

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = list(webdataset.WebDataset(image_shards, shardshuffle=False).decode(spec).to_tuple(
            "__key__", "jpg;png", "json", "cls"))
    got = list(wds.WebDataset(image_shards, deterministic=True).decode(spec).to_tuple("__key__", "jpg;png", "json",
                                                                                       "cls"))
    assert len(got) == len(expected) == 32
    for (k1, img1, meta1, cls1), (k2, img2, meta2, cls2) in zip(got, expected):
        assert (k1, meta1, cls1) == (k2, meta2, cls2)
        if spec == "pil":
            assert img1.mode == img2.mode and img1.tobytes() == img2.tobytes()
        elif isinstance(img2, torch.Tensor):
            assert img1.dtype == img2.dtype and torch.equal(img1, img2)
        else:
            assert img1.dtype == img2.dtype and np.array_equal(img1, img2)


def test_decode_errors_go_to_the_handler(tmp_path: Path) -> None:
    path = str(write_tar(tmp_path / "bad.tar", [("a.json", b"{not json"), ("b.json", b"[1]")]))
    with pytest.raises(wds.DecodingError) as info:
        list(wds.WebDataset(path).decode())
    assert info.value.key == "a" and info.value.field == "json" and "bad.tar" in str(info.value)
    assert [s["json"] for s in wds.WebDataset(path).decode(handler=wds.ignore_and_continue)] == [[1]]


def test_pickle_needs_opt_in(tmp_path: Path) -> None:
    import pickle

    path = str(write_tar(tmp_path / "p.tar", [("a.pyd", pickle.dumps({"x": 1}))]))
    with pytest.raises(wds.DecodingError, match="allow_pickle"):
        list(wds.WebDataset(path).decode())
    assert [s["pyd"] for s in wds.WebDataset(path).decode(allow_pickle=True)] == [{"x": 1}]


# torch advises against 4 workers on a machine with fewer cores (CI has 2); the example is for a training node.
@pytest.mark.filterwarnings("ignore:This DataLoader will create 4 worker processes:UserWarning")
def test_quick_start_example_runs_as_written(pattern: str, manifest: dict[str, object]) -> None:
    """The block runs unchanged except its ``urls = ...`` line, pointed at synthetic shards on the emulated store;
    on variable-length .bin fields (what make_shards writes), with 4 DataLoader workers and 10 epochs."""
    code = doc_block(GETTING_STARTED, "## Quick start")
    urls_line = re.compile(r'^urls = "[^"]*"(  #.*)?$', re.MULTILINE)
    assert len(urls_line.findall(code)) == 1, "the example's urls line changed: update this test"
    code = urls_line.sub(lambda m: f"urls = {pattern!r}", code)
    namespace: dict[str, object] = {"__name__": "quick_start_example"}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(GETTING_STARTED), "exec"), namespace)  # our documented example is the point
    inputs, labels = namespace["inputs"], namespace["labels"]
    assert isinstance(inputs, torch.Tensor) and inputs.dtype == torch.uint8 and inputs.ndim == 2
    assert isinstance(labels, torch.Tensor) and labels.dtype == torch.int64 and len(labels) == len(inputs)
    stats = ast.literal_eval(out.getvalue().strip())  # print(ds.stats()): the 4 workers' counters, summed
    assert stats["workers"] == 4 and stats["samples_delivered"] == manifest["expected_samples"]
    assert stats["bytes_read"] == manifest["total_bytes"] and stats["mb_per_s"] > 0


def test_documented_default_collation_names_the_field(pattern: str) -> None:
    """What the quick start says ``.batched(64)`` alone does on these variable-length fields."""
    ds = wds.WebDataset(pattern).decode().to_tuple("bin", "cls").map_tuple(
        lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8), int).batched(64)
    with pytest.raises(ValueError, match=r"cannot batch tuple field 0: shapes differ, \(\d+,\) in sample 0 and "
                                         r"\(\d+,\) in sample \d+ of 64.*collation_fn=list"):
        next(iter(ds))
    by_name = wds.WebDataset(pattern).map(lambda s: {"bin": np.frombuffer(s["bin"], np.uint8)}).batched(8)
    with pytest.raises(ValueError, match="cannot batch field 'bin'"):
        next(iter(by_name))
    lists = next(iter(wds.WebDataset(pattern).to_tuple("bin", "cls").batched(8, collation_fn=list)))
    assert isinstance(lists, list) and len(lists) == 8 and isinstance(lists[0][0], bytes)
