import types

import wds_async


def test_all_is_exactly_the_public_surface() -> None:
    # Submodules are importable but are not part of __all__.
    public = {name for name in dir(wds_async)
              if not name.startswith("_") and not isinstance(getattr(wds_async, name), types.ModuleType)}
    assert set(wds_async.__all__) - {"__version__"} == public
    for name in wds_async.__all__:
        assert getattr(wds_async, name) is not None
