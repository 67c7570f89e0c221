"""``webdataset.handlers``: the error policies, wds-async's own (:mod:`wds_async.data.handlers`).

As there, a handler gets the exception and returns True to skip, False to stop, or raises. The warn handlers log
through the ``wds_async`` logger and do not sleep (webdataset's ``warn_and_continue`` sleeps half a second).
"""

from __future__ import annotations

from ..data.handlers import ignore_and_continue, ignore_and_stop, reraise_exception, warn_and_continue, warn_and_stop

__all__ = ["ignore_and_continue", "ignore_and_stop", "reraise_exception", "warn_and_continue", "warn_and_stop"]
