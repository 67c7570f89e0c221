"""The data layer: what users iterate.

* :mod:`.dataset` (``WebDataset``), :mod:`.pipeline` (``DataPipeline``, ``WebLoader``, the tar-reading stage),
  :mod:`.fluid` (the chained methods), :mod:`.mix`, :mod:`.mock`;
* :mod:`.stages`: every pipeline stage (plain, stateful, shuffles, patterns, caches);
* :mod:`.decoders`, :mod:`.handlers`: decoding by extension, error policies;
* planning: :mod:`.topology` (rank and worker), :mod:`.shardlists`, :mod:`.plan`, :mod:`.epoch`, :mod:`.state`.
"""
