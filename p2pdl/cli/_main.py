"""The ``p2pdl`` parser, logging on stderr, and the dispatch to each command.

Each command module adds its subparser and sets ``handler``, the function
that runs it with the parsed arguments and returns the exit status.  Errors
are reported here, once for every command: a :class:`~p2pdl.errors.P2PDLError`
(bad input found once the node or the optimizer starts) is one line on
stderr and exit status 2; a second Ctrl-C while stopping is status 130.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .. import __version__
from ..errors import P2PDLError
from . import _auth, _demo, _identity, _monitor, _netlab, _node, _train
from ._args import UsageError

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The ``p2pdl`` argument parser, with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="p2pdl", description="Collaborative deep learning over the internet (DeDLOC).")
    parser.add_argument("--version", action="version", version=f"p2pdl {__version__}")
    parser.add_argument("--log-level", default="warning",
                        choices=["debug", "info", "warning", "error"],
                        help="log level of p2pdl's messages on stderr (default: warning)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _node.add_parser(sub)
    _train.add_parser(sub)
    _monitor.add_parser(sub)
    _demo.add_parser(sub)
    _identity.add_parser(sub)
    _auth.add_parser(sub)
    _netlab.add_parser(sub)
    return parser


def configure_logging(level: str) -> None:
    """Log records of ``level`` and above on stderr, one line each."""
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # py-libp2p reports at ERROR what p2pdl already turns into its own errors
    # and messages; show its records only when debugging.
    logging.getLogger("libp2p").setLevel(logging.DEBUG if level == "debug" else logging.CRITICAL)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit status.

    Usage errors exit through argparse (status 2).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["netlab"]:
        # The lab parses its own arguments, --help included.
        return _netlab.run(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level)
    try:
        return args.handler(args)
    except UsageError as exc:
        parser.error(str(exc))
    except P2PDLError as exc:
        print(f"p2pdl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        return 130
