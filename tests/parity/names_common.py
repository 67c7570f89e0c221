"""Helpers shared by the parity tests of webdataset's drop-in names (``test_names.py``,
``test_names_fields_and_caches.py``): both libraries as one parameter, and running a call with webdataset's own
warnings silenced or with its exception type as the outcome. Their ``shards`` fixture lives in ``conftest.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import pytest
import webdataset

import wds_async

#: Both libraries under one name each, for tests parametrized over them.
LIBS = pytest.mark.parametrize("lib", [webdataset, wds_async], ids=["webdataset", "wds_async"])


def quietly(f: Callable[[], Any]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # webdataset's own deprecation and "no shuffle" warnings
        return f()


def outcome(f: Callable[[], Any]) -> Any:
    """The result of ``f()``, or the type of the exception it raised."""
    try:
        return quietly(f)
    except Exception as exn:  # the exception type is the outcome being compared
        return type(exn)
