"""The ``p2pdl`` command.

    p2pdl node [--listen MULTIADDR ...] [--initial-peers MULTIADDR ...] [--identity FILE]
    p2pdl train [--initial-peers MULTIADDR ...] [--run-id NAME] [--json-lines] ...
    p2pdl demo [--duration SECONDS] [--out DIR]

``node`` lives here; ``train`` is in ``_train_cli``, ``demo`` in ``_demo``.
Only subcommands that work are listed; later layers add theirs.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import time
from collections.abc import Sequence

import trio

from . import __version__
from ._concurrency import open_service_nursery
from ._demo import add_demo_parser, main_demo
from ._node import NodeConfig, TrioNode, open_node
from ._train_cli import add_train_parser, main_train
from .errors import P2PDLError

logger = logging.getLogger(__name__)

STATUS_INTERVAL = 10.0


def _add_node_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "node", help="run a long-lived peer (bootstrap node, or a peer of a collaboration)",
        description="Run a long-lived p2pdl peer.  Prints each full address on its own line, "
                    "then a status line every --status-interval seconds.  Ctrl-C or SIGTERM "
                    "stops it.")
    p.add_argument("--listen", nargs="+", metavar="MULTIADDR", default=["/ip4/0.0.0.0/tcp/0"],
                   help="addresses to listen on (default: /ip4/0.0.0.0/tcp/0, a free port on "
                        "every interface)")
    p.add_argument("--announce", nargs="+", metavar="MULTIADDR", default=[],
                   help="addresses to advertise instead of the listen addresses")
    p.add_argument("--initial-peers", nargs="+", metavar="MULTIADDR", default=[],
                   help="full addresses (.../p2p/<id>) of peers to connect to and stay "
                        "connected with")
    p.add_argument("--relay", action="store_true",
                   help="serve circuit relay v2 so that peers behind NAT can be reached through "
                        "this node (for public nodes)")
    p.add_argument("--no-relays", action="store_true",
                   help="do not reserve on relays even when this node is not publicly reachable")
    p.add_argument("--identity", metavar="FILE",
                   help="ed25519 identity file, created (mode 0600) if missing; "
                        "default: a new identity every run")
    p.add_argument("--status-interval", type=float, default=STATUS_INTERVAL, metavar="SECONDS",
                   help=f"seconds between status lines (default {STATUS_INTERVAL:g})")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds (default: run until stopped)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="p2pdl", description="Collaborative deep learning over the internet (DeDLOC).")
    parser.add_argument("--version", action="version", version=f"p2pdl {__version__}")
    parser.add_argument("--log-level", default="warning",
                        choices=["debug", "info", "warning", "error"],
                        help="log level of p2pdl's messages on stderr (default: warning)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_node_parser(sub)
    add_train_parser(sub)
    add_demo_parser(sub)
    netlab = sub.add_parser(
        "netlab", add_help=False,
        help="the emulated internet (network namespaces, NAT, bandwidth caps; needs root): "
             "check | up | list | cleanup",
        description="See: p2pdl netlab --help")
    netlab.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def _configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # py-libp2p reports at ERROR what p2pdl already turns into its own errors
    # and messages; show its records only when debugging.
    logging.getLogger("libp2p").setLevel(logging.DEBUG if level == "debug" else logging.CRITICAL)


async def run_node(args: argparse.Namespace) -> None:
    config = NodeConfig.build(listen=args.listen, announce=args.announce,
                              initial_peers=args.initial_peers, identity_path=args.identity,
                              relay_service=args.relay, use_relays=not args.no_relays)
    # Signals are caught from the start, before anything is printed, so that a
    # supervisor that saw the addresses can always stop the node cleanly.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_node(config) as node, open_service_nursery() as nursery:

            async def stop_on_signal() -> None:
                async for signum in signals:
                    logger.info("received %s, stopping", signal.Signals(signum).name)
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(stop_on_signal)
            if args.duration is not None:
                nursery.cancel_scope.deadline = trio.current_time() + args.duration
            for addr in node.addrs:
                print(addr, flush=True)
            start = time.monotonic()
            while True:
                print(status_line(node, time.monotonic() - start), flush=True)
                await trio.sleep(args.status_interval)


def status_line(node: TrioNode, uptime: float) -> str:
    """One line: peers, reachability (client mode), relays, and the path to each peer."""
    stats = node.statistics()
    paths = stats["paths"]
    path_text = ", ".join(f"{n} {kind}" for kind, n in paths.items() if n) or "none"
    role = "client mode" if stats["client_mode"] else "accepts connections"
    relays = stats["relay_reservations"]
    return (f"status: peer {node.peer_id} | {stats['connected_peers']} connected peer(s) | "
            f"reachability {stats['reachability']} ({role}) | "
            f"{relays} relay reservation(s) | paths: {path_text} | up {uptime:.0f} s")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["netlab"]:
        from .netlab import cli as netlab_cli  # only this subcommand needs it

        return netlab_cli.main(argv[1:], prog="p2pdl netlab")
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging(args.log_level)
    if args.command == "train":
        return main_train(args)
    if args.command == "demo":
        return main_demo(args)
    if getattr(args, "status_interval", 1.0) <= 0:
        parser.error("--status-interval must be positive")
    try:
        trio.run(run_node, args)
    except P2PDLError as exc:
        print(f"p2pdl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C while stopping
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
