"""``p2pdl identity``: this peer's id, the one to give a run's operator.

    p2pdl identity [--identity FILE] [--json]

Prints the peer id of the identity file (an ed25519 key, created with mode
0600 if missing) on one line.  The default file is the one closed runs use
when ``p2pdl train`` or ``p2pdl node`` get no ``--identity``
(``~/.p2pdl/identity.key``); open runs without ``--identity`` use a new
identity every time.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ._runs import DEFAULT_IDENTITY, peer_id_of_identity

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``p2pdl identity`` to the ``p2pdl`` parser's subcommands."""
    p = sub.add_parser(
        "identity", help="print this peer's id (creating its identity file if missing)",
        description="Print the peer id of an identity file, creating the key (mode 0600) if "
                    "the file is missing.  Give the id to a run's operator to get a "
                    "certificate or a place in an allowlist.")
    p.add_argument("--identity", metavar="FILE", default=str(DEFAULT_IDENTITY),
                   help=f"ed25519 identity file (default {DEFAULT_IDENTITY}, the one "
                        f"`p2pdl train` and `p2pdl node` use for closed runs)")
    p.add_argument("--json", action="store_true",
                   help='print {"peer_id": ..., "identity": ...} instead')
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Print the peer id; ConfigError (one line, status 2) if the file is unusable."""
    path = Path(args.identity).expanduser()
    peer_id = peer_id_of_identity(path)
    if args.json:
        print(json.dumps({"peer_id": peer_id, "identity": str(path)}))
    else:
        print(peer_id)
    return 0
