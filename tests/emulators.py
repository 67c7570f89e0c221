"""The local cloud emulators for the backend tests (see :mod:`emustore.emulators`), with the policy:
a server that cannot start makes its tests skip with the reason, except under ``CI=true``, where that
is a failure, because CI must exercise every backend.
"""

from __future__ import annotations

import os

import pytest

from emustore.emulators import (
    AZURITE_ACCOUNT,
    AZURITE_KEY,
    HOST,
    MOTO_ENV,
    azurite,
    azurite_connection_string,
    free_port,
    gcs_emulator,
    moto_server,
)

__all__ = [
    "AZURITE_ACCOUNT", "AZURITE_KEY", "HOST", "MOTO_ENV", "azurite", "azurite_connection_string", "free_port",
    "gcs_emulator", "moto_server", "unavailable",
]


def unavailable(reason: str) -> None:
    """Skip (locally) or fail (under CI=true) a test whose server could not start."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{reason} (CI=true: every emulator must run)", pytrace=False)
    pytest.skip(reason)
