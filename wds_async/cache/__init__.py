"""The shard cache on local disk: each remote shard downloaded once per node and read from disk afterwards.

* :mod:`.disk`: :class:`~.disk.ShardCache`, its directory (and the rules that refuse an unsafe one), limits and
  eviction;
* :mod:`.items`: what the engine reads through (a hit, a fill, the identity prechecks);
* :mod:`.files`: locks, stamps and quiet removal of the files themselves, opened without following links and
  trusted only as regular files of this user;
* :mod:`.source`: the cache as the engine's item source, wrapped around the store.
"""
