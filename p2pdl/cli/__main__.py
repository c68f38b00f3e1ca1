"""``python -m p2pdl.cli``: the ``p2pdl`` command."""

import sys

from ._main import main

sys.exit(main())
