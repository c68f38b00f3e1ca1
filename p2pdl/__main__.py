"""``python -m p2pdl``: the ``p2pdl`` command (:mod:`p2pdl.cli`)."""

import sys

from .cli import main

sys.exit(main())
