"""Argument types and arguments shared by the commands, one copy of each.

The types turn bad values into argparse's own usage error (one line on
stderr, exit status 2), e.g. ``p2pdl train: error: argument --lr: must be a
positive number, got '-1'``.  Addresses are not checked here: the node's
configuration checks them and says what is wrong (a ``ConfigError``).
"""

from __future__ import annotations

import argparse
import math

from ..errors import ConfigError

__all__ = [
    "DEFAULT_LISTEN",
    "UsageError",
    "add_identity",
    "add_initial_peers",
    "add_listen",
    "non_negative_float",
    "non_negative_int",
    "positive_float",
    "positive_int",
]

#: Where a peer listens unless told otherwise: a free port on every interface.
DEFAULT_LISTEN = "/ip4/0.0.0.0/tcp/0"


class UsageError(ConfigError):
    """A bad argument that only a check after parsing finds; the ``p2pdl``
    command reports it as argparse reports its own (usage, then one line,
    exit status 2)."""


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


def add_listen(parser: argparse.ArgumentParser, help_default: str = DEFAULT_LISTEN) -> None:
    """``--listen MULTIADDR ...``; ``help_default`` describes the default in the help."""
    parser.add_argument("--listen", nargs="+", metavar="MULTIADDR", default=[DEFAULT_LISTEN],
                        help=f"addresses to listen on (default: {help_default})")


def add_initial_peers(parser: argparse.ArgumentParser, purpose: str) -> None:
    """``--initial-peers MULTIADDR ...``; ``purpose`` ends the help: "peers to ..."."""
    parser.add_argument("--initial-peers", nargs="+", metavar="MULTIADDR", default=[],
                        help=f"full addresses (.../p2p/<id>) of peers to {purpose}")


def add_identity(parser: argparse.ArgumentParser) -> None:
    """``--identity FILE``: the peer's ed25519 key, kept across runs."""
    parser.add_argument("--identity", metavar="FILE",
                        help="ed25519 identity file, created (mode 0600) if missing; "
                             "default: a new identity every run")
