"""The README stays a short door and the docs site stays whole: cheap checks beside the strict site build.

``mkdocs build --strict`` (``scripts/lint.sh``) fails on broken links and anchors, on pages missing from ``nav`` and
on docstrings the API reference cannot render. What it cannot see is checked here: the README's length and its
first lines (CI runs command 2 exactly as written there), that the README's quick start is the block that
``tests/parity/test_docs_examples.py`` runs, that its links into ``docs/`` resolve on GitHub, that every page
``mkdocs.yml`` lists exists, that every public name has an entry in the API reference, and that the user-facing
text names no work sessions or issue numbers.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

import wds_async

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: The README's two commands, byte for byte: `.ci/run` calls the second, and users copy both.
COMMANDS = (
    "bash scripts/demo.sh    # 1. install everything; synthetic shards on a local emulated object store, streamed "
    "through the loader, beside raw bandwidth",
    "bash scripts/test.sh    # 2. install the test dependencies; run the whole suite against real loopback servers "
    "it starts and stops",
)


def _python_block(text: str, heading: str) -> str:
    section = text[text.index(f"\n{heading}\n"):]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, f"no python block under {heading!r}"
    return match.group(1)


def _nav_pages(node: Any) -> list[str]:
    """Every page file named in an mkdocs ``nav`` tree (lists of ``{title: page or subtree}`` or bare pages)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [page for item in node for page in _nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in _nav_pages(value)]
    raise AssertionError(f"unexpected nav entry {node!r} in mkdocs.yml")


def test_readme_is_at_most_250_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move the detail to a page under docs/"


def test_readme_starts_with_title_one_paragraph_and_the_two_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# wds-async" and lines[1] == ""
    end = lines.index("", 2)  # the paragraph: the lines up to the next blank one
    paragraph = lines[2:end]
    assert paragraph and not any(line.startswith(("#", "```", "* ", "|")) for line in paragraph)
    assert lines[end + 1:end + 5] == ["```bash", *COMMANDS, "```"]


def test_readme_quick_start_is_the_block_the_docs_test_runs() -> None:
    readme = _python_block(README.read_text(encoding="utf-8"), "## Quick start")
    page = _python_block((DOCS / "getting-started.md").read_text(encoding="utf-8"), "## Quick start")
    assert readme == page, "README.md's quick start differs from docs/getting-started.md's, the one that is run"


def test_readme_links_resolve_in_the_repository() -> None:
    text = README.read_text(encoding="utf-8")
    targets = [t for t in re.findall(r"\]\(([^)\s]+)\)", text) if not re.match(r"[a-z]+:", t)]
    assert any(t.startswith("docs/") for t in targets)
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_page_mkdocs_lists_exists_and_every_page_is_listed() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs"
    pages = _nav_pages(config["nav"])
    assert len(pages) == len(set(pages)), "a page is listed twice in mkdocs.yml's nav"
    missing = [page for page in pages if not (DOCS / page).is_file()]
    assert not missing, f"mkdocs.yml lists pages that do not exist under docs/: {missing}"
    unlisted = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if str(p.relative_to(DOCS)) not in pages)
    assert not unlisted, f"pages under docs/ that mkdocs.yml's nav leaves out: {unlisted}"


def test_every_public_name_is_in_the_api_reference() -> None:
    listed = set(re.findall(r"^::: wds_async\.(\w+)$", (DOCS / "api.md").read_text(encoding="utf-8"), re.MULTILINE))
    public = set(wds_async.__all__) - {"__version__"}
    assert public - listed == set(), "public names without a '::: wds_async.NAME' entry in docs/api.md"
    assert listed - public == set(), "docs/api.md documents names wds_async does not export"


def test_user_docs_name_no_work_sessions_or_issue_numbers() -> None:
    history = re.compile(r"\bissues?\s*#?\d+|\bsession's run|\bsessions' runs|\bin this session\b", re.IGNORECASE)
    found = [f"{path.relative_to(ROOT)}: {match.group(0)!r}"
             for path in [README, *sorted(DOCS.rglob("*.md"))]
             for match in history.finditer(path.read_text(encoding="utf-8"))]
    assert not found, f"say how to reproduce a figure, not which session or issue made it: {found}"
