"""Pipeline stages: each is ``iterator -> iterator``, picklable, and, where it holds items, stateful.

* :mod:`.base`: :class:`~.base.Stage` and :func:`~.base.pipelinefilter`;
* :mod:`.plain`: the stateless steps (``map``, ``select``, ``to_tuple``, ...);
* :mod:`.stateful`: ``shuffle``, ``batched``, ``slice`` as objects with a state;
* :mod:`.detshuffle`: the epoch-seeded shuffle;
* :mod:`.patterns`: picking, renaming and decoding fields by glob;
* :mod:`.cached`: replaying a first pass from memory or LMDB;
* :mod:`.factories`: the pipeline-form factories (``wds.shuffle(1000)``, ...).
"""
