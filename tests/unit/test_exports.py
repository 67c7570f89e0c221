import subprocess
import sys
import types

import pytest

import wds_async


def test_all_is_exactly_the_public_surface() -> None:
    # Submodules are importable but are not part of __all__.
    public = {name for name in dir(wds_async)
              if not name.startswith("_") and not isinstance(getattr(wds_async, name), types.ModuleType)}
    assert set(wds_async.__all__) - {"__version__"} == public
    for name in wds_async.__all__:
        assert getattr(wds_async, name) is not None


def test_custom_backends_are_registered_through_the_public_api() -> None:
    from wds_async.io import register_backend

    assert "register_backend" in wds_async.__all__ and wds_async.register_backend is register_backend


def test_webdataset_names_are_exported() -> None:
    # The webdataset 1.0.2 names that its own tests and users reach for; each has a parity test in
    # tests/parity/test_names.py.
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


def test_import_and_the_command_line_do_not_import_torch() -> None:
    # torch takes ~1.5 s to import; `wds-async ls/cat/verify` and `import wds_async` must not pay for it
    code = ("import sys, wds_async, wds_async.cli.main, wds_async.cli.ls, wds_async.cli.cat, wds_async.cli.verify, "
            "wds_async.cli.tune.command; assert 'torch' not in sys.modules, 'torch imported'; "
            "wds_async.WebDataset; assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
