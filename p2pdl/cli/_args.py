"""Argument types and arguments shared by the commands, one copy of each.

The types turn bad values into argparse's own usage error (one line on
stderr, exit status 2), e.g. ``p2pdl train: error: argument --lr: must be a
positive number, got '-1'``.  Addresses are not checked here: the node's
configuration checks them and says what is wrong (a ``ConfigError``).
"""

from __future__ import annotations

import argparse
import math
import re

from ..errors import ConfigError

__all__ = [
    "ATTACK_KINDS",
    "DEFAULT_LISTEN",
    "UsageError",
    "add_identity",
    "add_initial_peers",
    "add_listen",
    "duration",
    "non_negative_float",
    "non_negative_int",
    "option_pair",
    "positive_float",
    "positive_int",
    "peer_id_text",
    "run_id_text",
    "tau_value",
]

#: The attacks of ``p2pdl train --attack`` and ``p2pdl demo --attacker``: the
#: keys of ``p2pdl.training.ATTACKS``, which imports torch (the parsers do not).
ATTACK_KINDS = ("sign_flip", "scale", "noise", "inflate", "alie", "lying_reducer", "equivocate",
                "epoch_liar")

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


def tau_value(text: str) -> float | str:
    """CenteredClip's radius: a positive number, or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return positive_float(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a positive number or 'auto', "
                                         f"got {text!r}") from None


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value


#: Seconds per unit of a duration (``30m``, ``12h``, ``7d``, ``2w``).
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"([0-9]+)([smhdw])")


def duration(text: str) -> float:
    """A duration such as ``30m``, ``12h``, ``7d`` or ``2w`` (also ``90s``), in seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f"must be a duration such as 30m, 12h, 7d or 2w, got {text!r}")
    return float(int(match.group(1)) * DURATION_UNITS[match.group(2)])


def peer_id_text(text: str) -> str:
    """A p2pdl peer id in base58 (``12D3KooW...``): one that embeds its ed25519 key,
    by the rule of :func:`p2pdl.membership.peer_id_problem`."""
    from ..membership import peer_id_problem

    if peer_id_problem(text) is not None:
        raise argparse.ArgumentTypeError(
            f"must be a peer id (base58, such as 12D3KooW...; `p2pdl identity` prints "
            f"one), got {text!r}")
    return text


def run_id_text(text: str) -> str:
    """A run id, checked with the rule every protocol uses."""
    from ..service import run_id_problem

    problem = run_id_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def display_name(text: str) -> str:
    """A display name for progress reports (1 to 64 printable characters)."""
    from ..progress import check_info

    problem = check_info(text, None, None)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem.removeprefix("its "))
    return text


def option_pair(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` with KEY a Python identifier (a keyword argument)."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"must be KEY=VALUE with KEY a Python name, "
                                         f"got {text!r}")
    return key, value


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


def add_metrics(parser: argparse.ArgumentParser) -> None:
    """``--metrics HOST:PORT``: serve Prometheus metrics (docs/metrics.md)."""
    parser.add_argument("--metrics", type=metrics_address, default=None, metavar="HOST:PORT",
                        help="serve Prometheus metrics at http://HOST:PORT/metrics "
                             "(port 0: a free one, printed; docs/metrics.md)")


def metrics_address(text: str) -> str:
    """An argparse type: ``HOST:PORT`` as :func:`p2pdl.metrics.parse_address` reads it."""
    from ..metrics import parse_address

    try:
        parse_address(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text

