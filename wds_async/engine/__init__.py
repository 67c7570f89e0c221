"""The engine layer: many work items in flight over the I/O layer, parsed as they arrive, into one byte-bounded
channel, and the bridge that hands the samples to synchronous code.

* :mod:`.engine`: :class:`~.engine.Engine`, the reader tasks in one TaskGroup;
* :mod:`.work`: work items (byte ranges of shards) and their completion markers;
* :mod:`.limiter`, :mod:`.autotune`: requests in flight as tokens, and the tuner that sets their total;
* :mod:`.parts`: one large object read as ordered ranged parts;
* :mod:`.tarstream` (sans-IO tar parser), :mod:`.grouping` (members to samples), :mod:`.shard` (the one serial
  reader of one shard, for the CLI, the indexer and copies);
* :mod:`.channel`: where complete samples wait for the consumer;
* :mod:`.bridge`: the one seam between the loop thread and the consumer's thread;
* :mod:`.failures`: what an error looks like when it leaves the engine.
"""
