"""``wds-async bench``: :mod:`.command` (arguments and table), :mod:`.run` (the phases), :mod:`.phase` (one
phase in a child process) and :mod:`.peers` (other loaders, each with its own client).
"""
