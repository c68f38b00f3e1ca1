"""``p2pdl netlab``: the emulated internet, mounted from :mod:`p2pdl.netlab.cli`.

    p2pdl netlab check | up | list | cleanup ...

The subcommand's arguments are parsed by ``python -m p2pdl.netlab``'s own
parser (one copy), so ``p2pdl netlab ARGS`` and ``python -m p2pdl.netlab
ARGS`` are the same command.  The lab is imported only when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

__all__ = ["PROG", "add_parser", "run", "run_args"]

#: What the lab's help and errors call the command.
PROG = "p2pdl netlab"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``p2pdl netlab`` to the ``p2pdl`` parser's subcommands (for its help line)."""
    netlab = sub.add_parser(
        "netlab", add_help=False,
        help="the emulated internet (network namespaces, NAT, bandwidth caps; needs root): "
             "check | up | list | cleanup",
        description=f"See: {PROG} --help")
    netlab.add_argument("args", nargs=argparse.REMAINDER)
    netlab.set_defaults(handler=run_args)


def run(argv: Sequence[str]) -> int:
    """Run ``p2pdl netlab`` with the arguments after ``netlab``; return the exit status."""
    from ..netlab.cli import main

    return main(list(argv), prog=PROG)


def run_args(args: argparse.Namespace) -> int:
    """Run it from the ``p2pdl`` parser's result (global options came first)."""
    return run(args.args)
