"""``python -m p2pdl.netlab``: see :mod:`p2pdl.netlab.cli`."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
