"""The ``wds-async`` command: :mod:`.main` wires one module per subcommand (``ls``, ``cat``, ``verify``, ``cp``,
``index``, ``cache``, ``serve``, ``bench``, ``tune``), each with ``add_arguments(parser)`` and
``command(args) -> exit status``. ``python -m wds_async.cli`` runs it too.
"""
