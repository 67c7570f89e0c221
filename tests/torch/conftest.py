"""The torch tests' children: the warm launcher they are forked from lives for one module (see children.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.torch.children import close_warm_launcher


@pytest.fixture(scope="module", autouse=True)
def _warm_launcher_per_module() -> Iterator[None]:
    yield
    close_warm_launcher()
