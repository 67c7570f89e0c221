"""benchmarks/wds_suite.py: which of webdataset's tests it keeps, how it points them at wds_async, and the
stand-in test data it writes (the yardstick is only as honest as these rules)."""

from __future__ import annotations

import tarfile
import textwrap
from pathlib import Path

from benchmarks.wds_suite import select, synthesize

MODULE = '''
import webdataset as wds
from webdataset import autodecode
from webdataset.shardlists import SimpleShardList, ResampledShards
from webdataset.filters import _shuffle

def test_public():
    assert wds.WebDataset and SimpleShardList and ResampledShards

def test_uses_an_internal_module():
    autodecode.ImageHandler("rgb")

def test_uses_a_private_function():
    list(_shuffle(iter([1]), 1))

def test_reaches_the_internet():
    wds.WebDataset(remote_loc + "x.tar")

def test_internal_attribute():
    wds.utils.enforce_security = True

def helper():
    pass
'''


def test_select_keeps_public_tests_and_rewrites_imports(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    path = tmp_path / "tests" / "test_x.py"
    path.write_text(textwrap.dedent(MODULE))
    chosen, skipped = select(path)
    assert chosen == ["tests/test_x.py::test_public"]
    assert skipped == {"tests an internal module": 3, "needs the internet": 1}
    text = path.read_text()
    assert "import wds_async as wds" in text and "import webdataset as wds" not in text
    # public names move to wds_async; a module with private names stays webdataset's (and marks its users out)
    assert "from wds_async import SimpleShardList, ResampledShards" in text
    assert "from webdataset.filters import _shuffle" in text
    assert len(text.splitlines()) == len(textwrap.dedent(MODULE).splitlines())  # line numbers kept


def test_synthesized_shard_has_the_shape_the_tests_assert(tmp_path: Path) -> None:
    from PIL import Image

    path = tmp_path / "imagenet-000000.tgz"
    synthesize(path)
    with tarfile.open(path) as tar:
        names = tar.getnames()
        first_png = tar.extractfile(names[1])
        assert first_png is not None
        size = Image.open(first_png).size
    keys = {name.rsplit(".", 1)[0] for name in names}
    assert len(keys) == 47
    assert {name.rsplit(".", 1)[1] for name in names} == {"cls", "png", "wnid", "xml"}
    assert size == (600, 793)  # PIL: (width, height); test_select_files expects a (793, 600, 3) array
