"""Backend implementations, one module per URL scheme: ``file``, ``pipe``, ``http`` (and https), ``s3``, ``gcs``,
``azure``.

Nothing here is imported by name from the layers above: :mod:`wds_async.io.registry` maps each scheme to
``"wds_async.backends.MODULE:Class"`` and imports the module on first use, so ``import wds_async`` stays light
and a missing SDK gives an install hint. Each class implements :class:`wds_async.io.backend.Backend` and
declares its :class:`~wds_async.io.backend.Capabilities`.
"""
