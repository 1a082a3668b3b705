"""``python -m cluster.backup``: the continuous backup (:mod:`cluster.backup.main`)."""

import sys

from .main import main

sys.exit(main())
