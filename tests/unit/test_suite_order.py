"""The suite's order (tests/conftest.py): the longest files first, so that pytest-xdist does not leave them to the
end."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests import conftest


def test_every_file_named_longest_first_exists() -> None:
    root = Path(conftest.__file__).parent
    missing = [name for name in conftest.LONGEST_FIRST if not (root / name).is_file()]
    assert not missing, f"LONGEST_FIRST names files that are gone: {missing}"


def test_the_longest_files_go_first_and_the_rest_keep_their_order() -> None:
    root = Path(conftest.__file__).parent

    def item(name: str, test: str) -> Any:
        return SimpleNamespace(path=root / name, name=test)

    items = [item("unit/test_a.py", "1"), item(conftest.LONGEST_FIRST[1], "2"), item("unit/test_b.py", "3"),
             item(conftest.LONGEST_FIRST[0], "4"), item(conftest.LONGEST_FIRST[1], "5"), item("unit/test_a.py", "6")]
    conftest.pytest_collection_modifyitems(items)
    assert [i.name for i in items] == ["4", "2", "5", "1", "3", "6"]
