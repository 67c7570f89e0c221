import wds_async


def test_all_is_exactly_the_public_surface() -> None:
    public = {name for name in dir(wds_async) if not name.startswith("_")} - {
        # submodules are importable but not part of __all__
        "backends", "bridge", "config", "dataset", "engine", "errors", "grouping", "handlers", "queues",
        "stages", "stats", "tarstream", "urls", "listing", "bench", "cli", "_compat",
    }
    assert set(wds_async.__all__) - {"__version__"} == public
    for name in wds_async.__all__:
        assert getattr(wds_async, name) is not None
