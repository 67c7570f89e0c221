import subprocess
import sys
import types
from pathlib import Path

import pytest

import wds_async


def test_all_is_exactly_the_public_surface() -> None:
    # Submodules are importable but are not part of __all__; nor are webdataset's other top-level names, which
    # dir() lists and which resolve from the compat shim (tests/parity/test_names.py).
    from wds_async.compat import top

    public = {name for name in dir(wds_async)
              if not name.startswith("_") and not isinstance(getattr(wds_async, name), types.ModuleType)}
    theirs = {name for name in top.__all__ if not isinstance(getattr(top, name), types.ModuleType)}
    assert public == set(wds_async.__all__) - {"__version__"} | theirs
    for name in wds_async.__all__:
        assert getattr(wds_async, name) is not None


def test_custom_backends_are_registered_through_the_public_api() -> None:
    from wds_async.io import register_backend

    assert "register_backend" in wds_async.__all__ and wds_async.register_backend is register_backend


def test_webdataset_names_are_exported() -> None:
    # The webdataset 1.0.2 names that its own tests and users reach for; each has a parity test in
    # tests/parity/test_names.py or tests/parity/test_names_fields_and_caches.py.
    names = {"tarfile_samples", "shardspec", "MockDataset", "non_empty", "resampled", "extract_keys", "rename_keys",
             "rsample", "xdecode", "RoundRobin", "RandomMix", "Cached", "LMDBCached", "detshuffle", "ResampledShards",
             "FluidWrapper"}
    assert names <= set(wds_async.__all__)
    assert callable(wds_async.DataPipeline([1]).stage)
    for method in ("rsample", "extract_keys", "rename_keys", "xdecode", "mcached", "lmdb_cached"):
        assert callable(getattr(wds_async.WebDataset, method))


def test_limit_and_engine_errors_are_exported_in_the_tree() -> None:
    assert {"SampleTooLarge", "EmptyShards", "EngineError"} <= set(wds_async.__all__)
    assert issubclass(wds_async.SampleTooLarge, wds_async.SampleError)
    assert issubclass(wds_async.EmptyShards, wds_async.WdsError) and issubclass(wds_async.EmptyShards, ValueError)
    assert issubclass(wds_async.EngineError, wds_async.WdsError) and issubclass(wds_async.EngineError, RuntimeError)


def test_every_export_loads_lazily_from_the_one_list() -> None:
    # the TYPE_CHECKING imports in __init__ are the one list; _EXPORTS is read from them at import
    assert set(wds_async._EXPORTS) == set(wds_async.__all__) - {"__version__"}
    assert wds_async.errors.UrlError is wds_async.UrlError  # submodules still resolve as attributes
    with pytest.raises(AttributeError, match="no_such_name"):
        _ = wds_async.no_such_name


def test_import_and_the_command_line_do_not_import_torch(shard_dir: Path, tmp_path: Path) -> None:
    # torch takes ~1.5 s to import and is an extra: `import wds_async`, every command of the CLI (imported and run),
    # the writers, the decoders and the index must not load it; with torch installed the dataset side does.
    shard = str(shard_dir / "shard-000000.tar")
    code = f"""
import sys
import wds_async
import wds_async.cli.main, wds_async.cli.ls, wds_async.cli.cat, wds_async.cli.verify, wds_async.cli.cp
import wds_async.cli.index, wds_async.cli.cache, wds_async.cli.serve, wds_async.cli.bench.command
import wds_async.cli.tune.command
from wds_async import Decoder, MissingDependency, ShardIndex, ShardWriter, TarWriter, build_index, imagehandler
from wds_async.cli.main import main
assert main(["ls", {shard!r}]) == 0 and main(["cat", "-n", "2", {shard!r}]) == 0
assert main(["verify", "-q", {shard!r}]) == 0 and main(["cp", "-q", {shard!r}, {str(tmp_path)!r} + "/"]) == 0
assert main(["index", "-q", "-o", {str(tmp_path / "i.idx")!r}, {shard!r}]) == 0
assert Decoder([])({{"__key__": "k", "json": b"[1]"}})["json"] == [1]
assert 'torch' not in sys.modules, 'torch imported'
wds_async.WebDataset
assert 'torch' in sys.modules, 'the dataset side did not load torch'
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_with_torch_the_datasets_are_torch_iterable_datasets() -> None:
    # torch is an extra; where it is installed (here) every dataset class is a torch IterableDataset as before
    from torch.utils.data import DataLoader, IterableDataset

    from wds_async.data import _torch

    assert _torch.HAVE_TORCH and _torch.IterableDataset is IterableDataset and _torch.DataLoader is DataLoader
    for cls in (wds_async.WebDataset, wds_async.DataPipeline, wds_async.FluidWrapper, wds_async.WebLoader,
                wds_async.RoundRobin, wds_async.RandomMix, wds_async.SimpleShardList, wds_async.ResampledShards,
                wds_async.MockDataset):
        assert issubclass(cls, IterableDataset), cls
    assert isinstance(wds_async.DataPipeline([1, 2]), IterableDataset)
    assert isinstance(wds_async.WebLoader([1, 2], batch_size=None).pipeline[0], DataLoader)
    _torch.require_torch("anything")  # returns: torch is here


def test_without_torch_require_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    # The in-process half of tests/integration/test_without_torch.py (which runs in a venv that has no torch).
    from wds_async.data import _torch

    monkeypatch.setattr(_torch, "HAVE_TORCH", False)
    with pytest.raises(wds_async.MissingDependency, match=r"WebLoader .*pip install 'wds-async\[torch\]'"):
        wds_async.WebLoader([1, 2], batch_size=None)
    with pytest.raises(wds_async.MissingDependency, match=r"'torchrgb' image decoder .*wds-async\[torch\]"):
        wds_async.DataPipeline([1]).decode("torchrgb")
    with pytest.raises(wds_async.MissingDependency, match=r"wds-async\[torch\]"):
        _torch.NoDataLoader([1])
    with pytest.raises(wds_async.MissingDependency, match=r"wds-async\[torch\]"):
        _torch.NoTensor()
    with pytest.raises(NotImplementedError, match="does not define __iter__"):
        iter(_torch.PlainIterable())
