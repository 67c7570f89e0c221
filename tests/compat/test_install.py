"""``wds_async.install_as_webdataset()``: webdataset's modules and names resolve to wds-async's shim.

Each test that installs the shim runs in a fresh interpreter (it changes ``sys.modules`` and ``sys.meta_path``
for the rest of the process), with this checkout on the path: forked from a warm launcher that imported torch
and nothing of wds-async or webdataset (``tests/warm.py``; the file took 95 s with each interpreter started from
nothing).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.warm import Runner, close_launchers, warm_runner
from wds_async.compat._install import MODULES, NOT_PROVIDED

ROOT = Path(__file__).resolve().parents[2]


#: Each fresh interpreter's environment: this checkout importable, and one thread for OpenMP and OpenBLAS (numpy's
#: pool would otherwise start with torch's import, and the warm launcher forks only from a process of one thread).
_ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}

#: The module's runner (``tests/warm.py``): a warm launcher that imported torch once (1.5-2.5 s of CPU per
#: interpreter), each test's interpreter forked from it with nothing of wds-async or webdataset imported, or where it
#: refused to start, each interpreter started from nothing. [] before the first test.
_runner: list[Runner] = []
_scripts: list[Path] = []


@pytest.fixture(scope="module", autouse=True)
def _close_launcher() -> Iterator[None]:
    yield
    close_launchers(_runner, _scripts)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run as a script in a fresh interpreter (forked from the warm launcher where it runs), from ``ROOT``."""
    if not _runner:
        _runner.append(warm_runner(sys.executable, ["torch"], _ENV, cwd=str(ROOT)))
        _scripts.append(Path(tempfile.mkdtemp(prefix="wds-install-")))
    runner, folder = _runner[0], _scripts[0]
    fd, name = tempfile.mkstemp(".py", dir=folder)
    with os.fdopen(fd, "w") as script:
        script.write(textwrap.dedent(code))
    return runner.run(name, [], _ENV, folder, timeout=120, quick_exit=True)


def _ok(code: str) -> str:
    proc = _python(code)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _real_webdataset_dir() -> Path:
    spec = importlib.util.find_spec("webdataset")  # finds the installed package without importing it
    assert spec is not None and spec.origin is not None
    return Path(spec.origin).parent


def _defined_names(path: Path) -> set[str]:
    """The names a webdataset module defines or re-exports at its top level (what ``from it import X`` can take),
    leaving out the modules and typing helpers it merely imports."""
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.ImportFrom) and node.level == 1 and path.name == "__init__.py":
            names.update(alias.asname or alias.name for alias in node.names)
    return {n for n in names if not (n.startswith("__") and n.endswith("__")) and n not in ("trace",)}


def test_every_module_imports_as_webdataset_x_and_is_the_shim() -> None:
    out = _ok(f"""
        import importlib, json, sys
        import wds_async
        wds_async.install_as_webdataset()
        import webdataset
        found = {{}}
        for name in {sorted(MODULES)!r}:
            module = importlib.import_module(name)
            found[name] = [module.__name__, sys.modules[name] is module]
        print(json.dumps([found, webdataset.__version__, webdataset.__wds_async__, wds_async.__version__]))
    """)
    found, version, ours, wds_async_version = json.loads(out)
    assert found == {name: [target, True] for name, target in MODULES.items()}
    assert version == "1.0.2" and ours == wds_async_version
    assert {name.split(".", 1)[1] for name in MODULES if "." in name} == {
        "autodecode", "cache", "compat", "extradatasets", "filters", "gopen", "handlers", "mix", "pipeline",
        "pytorch", "shardlists", "tariterators", "utils", "wids", "writer"}


def test_every_submodule_is_an_attribute_of_the_shim_as_of_a_package() -> None:
    # `import webdataset.wids` then `webdataset.wids.ShardListDataset`, and `from webdataset import wids`: a package
    # binds its imported submodules; the shim binds them at install. A name the top binds itself stays its own:
    # `webdataset.gopen` is the function, in webdataset 1.0.2 as here.
    out = _ok(f"""
        import importlib, json, sys
        import wds_async
        wds_async.install_as_webdataset()
        import webdataset.wids
        from webdataset import wids
        found = {{}}
        for name in {sorted(MODULES)!r}:
            if "." in name:
                child = name.split(".", 1)[1]
                found[child] = getattr(webdataset, child) is sys.modules[name]
        print(json.dumps([found, webdataset.wids.ShardListDataset.__module__, wids is webdataset.wids,
                          callable(webdataset.gopen), webdataset.gopen is webdataset.gopen.__globals__["gopen"]]))
    """)
    found, module, same, gopen_callable, gopen_is_function = json.loads(out)
    assert found == {name.split(".", 1)[1]: name != "webdataset.gopen" for name in MODULES if "." in name}
    assert module == "wds_async.compat.wids" and same and gopen_callable and gopen_is_function


def test_wds_async_wids_is_the_wids_drop_in() -> None:
    out = _ok("""
        import json
        import wds_async
        import wds_async.wids
        from wds_async import wids
        from wds_async.compat import wids as implementation
        print(json.dumps([wids is wds_async.wids, sorted(wids.__all__) == sorted(implementation.__all__),
                          all(getattr(wids, n) is getattr(implementation, n) for n in implementation.__all__)]))
    """)
    assert json.loads(out) == [True, True, True]


def test_the_names_open_clip_and_timm_import_resolve_to_ours() -> None:
    out = _ok("""
        import json
        import wds_async
        wds_async.install_as_webdataset()
        import webdataset as wds
        from webdataset.filters import _shuffle, getfirst, pipelinefilter
        from webdataset.shardlists import expand_urls
        from webdataset.tariterators import base_plus_ext, url_opener, tar_file_expander, valid_sample
        from webdataset.utils import pytorch_worker_seed
        from webdataset.gopen import gopen, gopen_schemes
        class detshuffle2(wds.PipelineStage):
            def run(self, src):
                return (x * 10 for x in src)
        names = [_shuffle, getfirst, pipelinefilter, expand_urls, base_plus_ext, url_opener, tar_file_expander,
                 valid_sample, pytorch_worker_seed, gopen, wds.utils.pytorch_worker_seed, wds.shardlists.expand_urls,
                 wds.SimpleShardList, wds.split_by_node, wds.split_by_worker, wds.tarfile_to_samples, wds.shuffle,
                 wds.select, wds.decode, wds.rename, wds.map_dict, wds.map, wds.to_tuple, wds.batched,
                 wds.DataPipeline, wds.WebLoader, wds.PipelineStage]
        print(json.dumps({
            "modules": sorted({getattr(n, "__module__", None) or type(n).__module__ for n in names}),
            "gopen_is_function": callable(wds.gopen) and wds.gopen is gopen,
            "schemes": sorted(gopen_schemes),
            "stage": list(wds.DataPipeline(range(1, 4), detshuffle2())),
            "seed": pytorch_worker_seed(),
            "split": base_plus_ext("a/b.c/img.seg.PNG"),
            "urls": expand_urls("x-{0..2}.tar::y.tar"),
            "first": getfirst({"png": 1, "jpg": 2}, "jpg;png"),
            "valid": [valid_sample({"a": 1}), valid_sample({}), valid_sample(None), valid_sample({"__bad__": True})],
        }))
    """)
    got = json.loads(out)
    assert all(m.startswith("wds_async.") for m in got["modules"]), got["modules"]
    assert got["gopen_is_function"] and {"file", "pipe", "http", "https", "s3", "gs", "__default__"} <= set(
        got["schemes"])
    assert got["stage"] == [10, 20, 30]
    assert got["seed"] == 0
    assert got["split"] == ["a/b.c/img", "seg.PNG"]
    assert got["urls"] == ["x-0.tar", "x-1.tar", "x-2.tar", "y.tar"]
    assert got["first"] == 2 and got["valid"] == [True, False, False, False]


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_name_of_webdataset_1_0_2_is_provided_or_refused_by_name(module: str) -> None:
    if module == "webdataset.wids":  # webdataset's random access ships as its own package, wids: its public names
        spec = importlib.util.find_spec("wids")
        assert spec is not None and spec.origin is not None, "the dev extra installs wids"
        source = Path(spec.origin)
    else:
        source = _real_webdataset_dir() / ("__init__.py" if module == "webdataset" else f"{module.split('.')[1]}.py")
    names = sorted(_defined_names(source))
    out = _ok(f"""
        import importlib, json
        import wds_async
        wds_async.install_as_webdataset()
        from wds_async.compat import NotProvided
        module = importlib.import_module({module!r})
        result = {{}}
        for name in {names!r}:
            try:
                exec(f"from {module} import {{name}}", {{}})
                result[name] = "provided"
            except NotProvided as exn:
                result[name] = str(exn)
            except ImportError as exn:
                result[name] = "MISSING: " + str(exn)
        print(json.dumps(result))
    """)
    result = json.loads(out)
    missing = {name: why for name, why in result.items() if why.startswith("MISSING")}
    assert not missing
    for name, why in result.items():
        if why != "provided":  # refused: the message names it and gives a reason
            assert why.startswith(f"{module}.{name} is not provided by wds-async: ") and len(why) > 60, why


def test_a_refused_name_fails_at_the_import_that_asks_for_it_with_its_reason() -> None:
    out = _ok("""
        import wds_async
        wds_async.install_as_webdataset()
        try:
            from webdataset.gopen import gopen_ais
        except ImportError as exn:
            print(exn)
        import sys
        try:
            sys.modules["webdataset.gopen"].gopen_ais  # (webdataset.gopen is the function, as in webdataset)
        except ImportError as exn:
            print(exn)
    """)
    first, second = out.strip().splitlines()
    assert first == second
    assert first.startswith("webdataset.gopen.gopen_ais is not provided by wds-async: ") and "AIStore" in first


@pytest.mark.parametrize("module", sorted(NOT_PROVIDED))
def test_a_module_not_provided_is_refused_by_name(module: str) -> None:
    proc = _python(f"""
        import wds_async
        wds_async.install_as_webdataset()
        import {module}
    """)
    assert proc.returncode != 0
    assert f"{module} is not provided by wds-async: " in proc.stderr


def test_an_unknown_submodule_is_not_found_and_an_unknown_name_is_an_attribute_error() -> None:
    out = _ok("""
        import wds_async
        wds_async.install_as_webdataset()
        import webdataset
        try:
            import webdataset.no_such_module
        except ModuleNotFoundError as exn:
            print(type(exn).__name__, exn.name)
        try:
            webdataset.filters.no_such_name
        except AttributeError as exn:
            print(type(exn).__name__, "no_such_name" in str(exn))
        print(hasattr(webdataset.filters, "no_such_name"))
    """)
    assert out.split() == ["ModuleNotFoundError", "webdataset.no_such_module", "AttributeError", "True", "False"]


def test_calling_it_twice_is_a_no_op() -> None:
    out = _ok("""
        import sys
        import wds_async
        from wds_async.compat._install import WebdatasetFinder
        wds_async.install_as_webdataset()
        import webdataset, webdataset.filters
        first = (webdataset, webdataset.filters, list(sys.meta_path))
        wds_async.install_as_webdataset()
        import webdataset, webdataset.filters
        again = (webdataset, webdataset.filters, list(sys.meta_path))
        print(first == again, sum(isinstance(f, WebdatasetFinder) for f in sys.meta_path), wds_async.compat.installed())
    """)
    assert out.split() == ["True", "1", "True"]


def test_calling_it_after_the_real_webdataset_was_imported_raises_and_changes_nothing() -> None:
    out = _ok("""
        import sys
        import webdataset, webdataset.filters
        real = webdataset
        import wds_async
        try:
            wds_async.install_as_webdataset()
        except RuntimeError as exn:
            print("RuntimeError:", exn)
        import webdataset
        print(webdataset is real, webdataset.__file__.endswith("site-packages/webdataset/__init__.py"),
              wds_async.compat.installed())
    """)
    first, last = out.strip().splitlines()
    assert first.startswith("RuntimeError: install_as_webdataset() was called after the real webdataset was imported")
    assert "webdataset.filters" in first and "before anything imports webdataset" in first
    assert last.split() == ["True", "True", "False"]


def test_the_shim_never_imports_the_real_webdataset() -> None:
    out = _ok("""
        import sys
        import wds_async
        wds_async.install_as_webdataset()
        import webdataset, webdataset.filters, webdataset.tariterators, webdataset.gopen
        print(sorted({getattr(m, "__file__", "") .split("/site-packages/")[-1].split("/")[0]
                      for n, m in sys.modules.items() if n.startswith("webdataset")}))
    """)
    assert "webdataset" not in out and "wds_async" not in out  # files are under the checkout, not site-packages


def test_a_dataloader_worker_inherits_the_shim() -> None:
    out = _ok("""
        import wds_async
        wds_async.install_as_webdataset()
        import webdataset as wds
        from torch.utils.data import DataLoader

        def where(src):
            import webdataset
            for x in src:
                yield (x, webdataset.__name__, webdataset.utils.pytorch_worker_seed())

        pipeline = wds.DataPipeline(wds.SimpleShardList(["a", "b", "c", "d"]), wds.split_by_worker, where)
        loader = DataLoader(pipeline, batch_size=None, num_workers=2)
        print(sorted((item["url"], name, seed) for item, name, seed in loader))
    """)
    assert out.strip() == str([("a", "wds_async.compat.top", 0), ("b", "wds_async.compat.top", 1),
                               ("c", "wds_async.compat.top", 0), ("d", "wds_async.compat.top", 1)])
