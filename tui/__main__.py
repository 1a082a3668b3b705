"""``python -m tui``: the same as ``cluster-tui``."""

import sys

from .app import main

sys.exit(main())
