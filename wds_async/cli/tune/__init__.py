"""``wds-async tune``: :mod:`.command` (arguments, display, plot), :mod:`.recommend` (the knee and the
recommendation), :mod:`.sweep` (windows of raw reads at a fixed concurrency).
"""
