"""The shard cache on local disk: each remote shard downloaded once per node and read from disk afterwards.

* :mod:`.disk`: :class:`~.disk.ShardCache`, its directory, limits and eviction;
* :mod:`.items`: what the engine reads through (a hit, a fill, the identity prechecks);
* :mod:`.files`: locks, stamps and quiet removal of the files themselves.
"""
