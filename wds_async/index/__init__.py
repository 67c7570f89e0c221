"""The shard index: each shard's identity and each sample's byte range.

* :mod:`.format`: :class:`~.format.ShardIndex` and :class:`~.format.ShardEntry`, the file format, loading;
* :mod:`.build`: building one by streaming the shards once.
"""
