"""Peak memory of this process as the heap sees it: anonymous resident pages, sampled in a thread.

``ru_maxrss`` counts file-backed pages too (shared libraries such as torch's), which the kernel evicts and
faults back in depending on what else the machine runs: above a post-import baseline it read 176 MB once
and 27 MB another time for the same run. Anonymous memory (resident less file-backed, from
``/proc/self/statm``) is what buffers and the allocator hold, so benchmarks and tests bound that.

    mem = PeakMemory()       # baseline now, then a sample every 5 ms
    ...                      # the work
    above = mem.stop()       # peak bytes above the baseline
"""

from __future__ import annotations

import os
import threading

__all__ = ["PeakMemory", "anonymous_rss"]

_PAGE = os.sysconf("SC_PAGE_SIZE")


def anonymous_rss() -> int:
    """Resident bytes that are not file-backed (Linux)."""
    with open("/proc/self/statm") as f:
        fields = f.read().split()
    return (int(fields[1]) - int(fields[2])) * _PAGE


class PeakMemory:
    """Samples :func:`anonymous_rss` every ``every`` seconds from construction until :meth:`stop`."""

    def __init__(self, every: float = 0.005) -> None:
        self.base = self.peak = anonymous_rss()
        self._done = threading.Event()
        self._every = every
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._done.wait(self._every):
            self.peak = max(self.peak, anonymous_rss())

    def stop(self) -> int:
        """Stop sampling; the peak in bytes above the baseline."""
        self._done.set()
        self._thread.join()
        self.peak = max(self.peak, anonymous_rss())
        return self.peak - self.base
