"""``python -m wds_async.cli``: the ``wds-async`` command."""

import sys

from .main import main

sys.exit(main())
