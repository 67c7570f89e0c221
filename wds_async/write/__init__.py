"""Writing shards: :mod:`.writer` (``TarWriter``, ``ShardWriter``), :mod:`.encoders`, :mod:`.sinks` (local files
and object stores), and copying between stores: :mod:`.copy`, :mod:`.reshard`, :mod:`.dest`.
"""
