"""Run webdataset's own public-API tests against wds_async: the drop-in yardstick of issue 11.

webdataset's test suite is the measure of "drop-in", not code we ship, so this script borrows it at run time
from a checkout the user points at (nothing of it is copied into this repository)::

    python -m benchmarks.wds_suite --repo PATH_TO_WEBDATASET_CHECKOUT_OR_GIT_DIR [--json out.json] [-v]

What it does:

1. exports ``tests/`` and ``testdata/`` of that checkout into a temporary folder; a data file the source
   lacks is synthesized with the shape the tests assert (see :func:`synthesize`);
2. rewrites ``import webdataset as wds`` to ``import wds_async as wds`` in every test module;
3. selects the public-API tests by reading each test function's source (``ast``): a test that names one of
   webdataset's internal modules (``wds.utils``, ``autodecode.``, ``gopen``, ``cache``, ``compat.``...), or that
   imports them at module level and uses them, is out of scope; so is a test that reaches the internet
   (``remote_*`` fixtures, ``http://``/``gs://`` literals), since these machines have none;
4. runs pytest once on the selection with a JUnit XML report and prints passed / failed / errors per module,
   and each failure's first line, so a regression shows which name or behaviour broke.

The count is reported, never asserted: the parity tests that must pass live in ``tests/parity/``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

#: Module-level names that make a test one of webdataset's internal modules when a test body uses them.
INTERNAL = {"autodecode", "compat", "gopen", "utils", "cache", "handlers", "shardlists", "writer", "filters",
            "tariterators", "FileCache", "LRUCleanup", "StreamingOpen", "url_to_cache_name", "rewrite_url",
            "torch_loads", "unpickle_loads", "DirectoryShardList"}
#: Files that test internal modules only (the issue puts them out of scope).
INTERNAL_FILES = {"test_cache.py", "test_gopen.py", "test_utils.py"}
NETWORK_MARKERS = ("remote_", "http://", "https://", "gs://", "s3://", "pipe:curl", "pipe:gsutil")


def export(repo: Path, dest: Path) -> list[str]:
    """Copy tests/ and testdata/ of a webdataset checkout (work tree or git directory) into ``dest``.

    Its tests at the 1.0.2 release commit and at the mirror's HEAD are the same files. Test data files that the
    source lacks (a mirror may hold large blobs as absent) are synthesized by :func:`synthesize`; their names
    are returned so the report can say so.
    """
    (dest / "testdata").mkdir(parents=True)
    if (repo / "testdata").is_dir():
        for item in (repo / "testdata").iterdir():
            shutil.copy(item, dest / "testdata" / item.name)
    else:
        listing = subprocess.run(["git", "--git-dir", str(repo), "ls-tree", "-r", "HEAD", "testdata"],
                                 check=True, capture_output=True, text=True).stdout
        for line in listing.splitlines():
            meta, name = line.split("\t", 1)
            blob = subprocess.run(["git", "--git-dir", str(repo), "cat-file", "blob", meta.split()[2]],
                                  capture_output=True, check=False)
            if blob.returncode == 0:
                (dest / name).write_bytes(blob.stdout)
    if (repo / "tests").is_dir():
        shutil.copytree(repo / "tests", dest / "tests")
    else:
        archive = subprocess.run(["git", "--git-dir", str(repo), "archive", "HEAD", "tests"],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    # a package, so ``from tests.conftest import ...`` cannot resolve to another project's ``tests``
    (dest / "tests" / "__init__.py").touch()
    made = []
    if not (dest / "testdata" / "imagenet-000000.tgz").exists():
        synthesize(dest / "testdata" / "imagenet-000000.tgz")
        made.append("imagenet-000000.tgz")
    return made


def synthesize(path: Path, count: int = 47) -> None:
    """Write a stand-in for webdataset's ``testdata/imagenet-000000.tgz`` with the shape its tests assert.

    47 samples with the original's fields: ``.png`` (the first 793x600 RGB, as ``test_select_files`` checks),
    ``.cls`` (an integer as text), ``.wnid`` and ``.xml``, in a gzipped tar. Tests that check pixel values or real labels of the
    original cannot pass on it; the report lists every failure, so such a test is visible, not hidden.
    """
    import io
    import tarfile

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tar:
        for i in range(count):
            height, width = (793, 600) if i == 0 else (int(rng.integers(200, 500)), int(rng.integers(200, 500)))
            pixels = np.add.outer(np.arange(height), np.arange(width)).astype(np.uint8)
            image = Image.fromarray(np.stack([pixels, pixels[::-1], pixels.T[:width, :height].T
                                              if height == width else pixels], axis=-1))
            png = io.BytesIO()
            image.save(png, format="PNG")
            wnid = f"n{int(rng.integers(1, 10**8)):08d}"
            fields = {"cls": str(int(rng.integers(0, 1000))).encode(), "png": png.getvalue(),
                      "wnid": wnid.encode(), "xml": f"<annotation><size>{height} {width}</size></annotation>".encode()}
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"n{i:08d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _uses_internal(node: ast.AST, internal_aliases: set[str]) -> bool:
    for sub in ast.walk(node):
        if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id == "wds"
                and sub.attr in INTERNAL):
            return True
        if isinstance(sub, ast.Name) and sub.id in internal_aliases:
            return True
    return False


def _public(names: list[str]) -> bool:
    """True when webdataset exports every one of ``names`` at top level as a non-module public name."""
    import types

    import webdataset

    return all(not n.startswith("_") and not isinstance(getattr(webdataset, n, types), types.ModuleType)
               and hasattr(webdataset, n) for n in names)


def select(path: Path) -> tuple[list[str], Counter[str]]:
    """Point one test module at wds_async; return its in-scope test ids and why the others are out.

    ``import webdataset as wds`` becomes ``import wds_async as wds``; ``from webdataset.M import a, b`` becomes
    ``from wds_async import a, b`` when webdataset exports every name at top level (they are public API),
    and otherwise stays, its names marking the tests that use them as tests of an internal module.
    """
    source = path.read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    internal_aliases: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "webdataset":
            names = [alias.name for alias in node.names]
            if _public(names) and all(alias.asname is None for alias in node.names):
                first = node.lineno - 1
                lines[first:node.end_lineno] = [f"from wds_async import {', '.join(names)}"] + [""] * (
                    node.end_lineno - node.lineno)  # keep line numbers
            else:
                internal_aliases.update(alias.asname or alias.name for alias in node.names)
    path.write_text("\n".join(lines).replace("import webdataset as wds", "import wds_async as wds") + "\n")
    chosen, skipped = [], Counter[str]()
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test")):
            continue
        body = "\n".join(source.splitlines()[node.lineno - 1:node.end_lineno])
        if any(marker in body for marker in NETWORK_MARKERS):
            skipped["needs the internet"] += 1
        elif _uses_internal(node, internal_aliases):
            skipped["tests an internal module"] += 1
        else:
            chosen.append(f"{path.relative_to(path.parent.parent)}::{node.name}")
    return chosen, skipped


def run(repo: Path, verbose: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="wds-suite-") as tmp:
        root = Path(tmp)
        synthesized = export(repo, root)
        skipped: Counter[str] = Counter()
        per_module: dict[str, Counter[str]] = {}
        failures: list[str] = []
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        for path in sorted((root / "tests").glob("test_*.py")):
            if path.name in INTERNAL_FILES:
                skipped["tests an internal module"] += sum(
                    1 for n in ast.parse(path.read_text()).body
                    if isinstance(n, ast.FunctionDef) and n.name.startswith("test"))
                continue
            ids, why = select(path)
            skipped += why
            if not ids:
                continue
            # one pytest per module: a module that fails to import (say, it needs imageio) counts its tests
            # as errors without stopping the others
            report = root / f"{path.stem}.xml"
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout", "120",
                   "-o", "filterwarnings=", "-o", "addopts=", f"--junitxml={report}", *ids]
            subprocess.run(cmd, cwd=root, env=env, capture_output=not verbose, check=False)
            counts, failed = summarize(report, path.stem, len(ids))
            per_module[path.stem] = counts
            failures += failed
        total: Counter[str] = Counter()
        for counts in per_module.values():
            total += counts
        return {"total": dict(total), "per_module": {k: dict(v) for k, v in per_module.items()},
                "out_of_scope": dict(skipped), "failures": failures, "synthesized_testdata": synthesized}


def summarize(report: Path, module: str, expected: int) -> tuple[Counter[str], list[str]]:
    """Outcomes of one module's run; a module that could not be collected counts every selected test as error."""
    counts: Counter[str] = Counter()
    failures: list[str] = []
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = tag
                first = (found.get("message") or tag).splitlines()[0][:160]
                if tag != "skipped":
                    failures.append(f"{module}::{case.get('name') or '(collection)'}: {first}")
        counts[outcome] += 1
    if sum(counts.values()) < expected:  # collection failed: the cases that never ran are errors too
        counts["error"] += expected - sum(counts.values())
    return counts, failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, required=True, help="webdataset checkout or its git directory")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    parser.add_argument("-v", "--verbose", action="store_true", help="show pytest's own output")
    args = parser.parse_args(argv)
    result = run(args.repo.resolve(), args.verbose)
    total: dict[str, int] = result["total"]  # type: ignore[assignment]
    in_scope = sum(total.values())
    for module, counts in result["per_module"].items():  # type: ignore[attr-defined]
        print(f"{module:<20} " + "  ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for line in result["failures"]:  # type: ignore[attr-defined]
        print("  FAIL", line)
    if result["synthesized_testdata"]:
        print(f"synthesized (absent from the source): {result['synthesized_testdata']}")
    print(f"public-API tests passing: {total.get('passed', 0)} of {in_scope}; out of scope: {result['out_of_scope']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
