"""The timed region of ``wds-async bench``'s phases: what a phase's rate must not include."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from wds_async.cli.bench import phase
from wds_async.io import registry


def test_the_raw_phase_imports_its_backends_before_the_clock_starts(tmp_path: Path, monkeypatch: Any) -> None:
    """The loader's phase imports a scheme's backend module at construction, before its clock (botocore alone
    takes about 0.15 s): the raw phase must too, or a short pass of s3:// URLs flatters every ratio against raw
    (0.82-0.88x s5cmd's rate, where the loader ran at 0.97-1.00x). The first lookup of a backend class (the
    import) is made to take 1 s here; a local file is read in milliseconds."""
    shard = tmp_path / "a.tar"
    shard.write_bytes(b"\0" * 4096)
    real = registry.backend_class
    looked_up: list[str] = []

    def slow_first_import(scheme: str, url: str | None = None) -> Any:
        if not looked_up:
            time.sleep(1.0)
        looked_up.append(scheme)
        return real(scheme, url)

    monkeypatch.setattr(registry, "backend_class", slow_first_import)
    result = phase._phase_raw([str(shard)], 4, phase._Reporter(None))
    assert result["bytes"] == 4096 and looked_up
    assert result["wall_s"] < 0.9, f"the raw phase timed its backend's import: {result['wall_s']:.2f} s"


@pytest.mark.parametrize("url", ["/data/a.tar", "file:///data/a.tar"])
def test_the_raw_phase_names_a_missing_backend_before_it_starts(url: str, monkeypatch: Any) -> None:
    from wds_async.errors import MissingDependency

    def missing(scheme: str, url: str | None = None) -> Any:
        raise MissingDependency(f"the {scheme}:// backend needs a package", url=url)

    monkeypatch.setattr(registry, "backend_class", missing)
    with pytest.raises(MissingDependency, match="needs a package"):
        phase._phase_raw([url], 4, phase._Reporter(None))
