"""``python -m emustore --root DIR ...``: serve a folder as the emulated store (see :mod:`emustore.server`)."""

import sys

from emustore.server import main

sys.exit(main())
