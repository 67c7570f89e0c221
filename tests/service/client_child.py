"""A client process for the node service tests: ``python client_child.py SOCKET PATTERN``.

Reads one sample through the service, prints ``ready`` and then sleeps until killed, holding its session.
"""

from __future__ import annotations

import sys
import time

import wds_async as wds


def main() -> None:
    socket, pattern = sys.argv[1], sys.argv[2]
    samples = iter(wds.WebDataset(pattern, service="unix://" + socket))
    next(samples)
    print("ready", flush=True)
    time.sleep(600)


if __name__ == "__main__":
    main()
