"""``p2pdl node``: a long-lived peer (a bootstrap node, a relay, a peer of a collaboration).

    p2pdl node [--listen MULTIADDR ...] [--initial-peers MULTIADDR ...] [--identity FILE]
               [--relay] [--no-relays] [--status-interval S] [--duration S]
               [--run-id R ...] [--authority ID --certificate FILE | --allowlist FILE]
               [--revocations FILE] [--metrics HOST:PORT]

Prints each full address on its own line (with ``--metrics``, then
``metrics: http://HOST:PORT/metrics``), then one line per run it serves
(``--run-id``, repeatable) saying who may take part (open, allowlist or
certificate, ``_runs``), then a status line every ``--status-interval``
seconds.  SIGINT or SIGTERM stops it (exit status 0).
"""

from __future__ import annotations

import argparse
import logging
import signal
import time
from collections.abc import AsyncIterator

import trio

from .. import NodeConfig, TrioNode, open_node
from .._concurrency import open_service_nursery
from ..metrics import serve_metrics
from ._args import (
    DEFAULT_LISTEN,
    UsageError,
    add_identity,
    add_initial_peers,
    add_listen,
    add_metrics,
    run_id_text,
)
from ._runs import RunPlan, add_membership, closed, identity_path, peer_id_of_identity, plan_runs

__all__ = ["STATUS_INTERVAL", "add_parser", "run", "serve_node", "start_peer", "status_line"]

logger = logging.getLogger(__name__)

#: Seconds between status lines (default of --status-interval).
STATUS_INTERVAL = 10.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``p2pdl node`` to the ``p2pdl`` parser's subcommands."""
    p = sub.add_parser(
        "node", help="run a long-lived peer (bootstrap node, or a peer of a collaboration)",
        description="Run a long-lived p2pdl peer.  Prints each full address on its own line, "
                    "then a status line every --status-interval seconds.  Ctrl-C or SIGTERM "
                    "stops it.")
    add_listen(p, help_default=f"{DEFAULT_LISTEN}, a free port on every interface")
    p.add_argument("--announce", nargs="+", metavar="MULTIADDR", default=[],
                   help="addresses to advertise instead of the listen addresses")
    add_initial_peers(p, "connect to and stay connected with")
    p.add_argument("--relay", action="store_true",
                   help="serve circuit relay v2 so that peers behind NAT can be reached through "
                        "this node (for public nodes)")
    p.add_argument("--no-relays", action="store_true",
                   help="do not reserve on relays even when this node is not publicly reachable")
    add_identity(p)
    p.add_argument("--status-interval", type=float, default=STATUS_INTERVAL, metavar="SECONDS",
                   help=f"seconds between status lines (default {STATUS_INTERVAL:g})")
    p.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                   help="stop after this many seconds (default: run until stopped)")
    p.add_argument("--run-id", action="append", default=[], type=run_id_text, metavar="R",
                   dest="run_ids",
                   help="a run this node serves, with the membership flags below (repeat "
                        "for more; a certificate is for one run)")
    add_membership(p)
    add_metrics(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``p2pdl node`` with parsed ``args``; return the exit status.

    Raises :class:`~p2pdl.errors.P2PDLError` (a ConfigError for bad input)
    for the caller to print.
    """
    if args.status_interval <= 0:
        raise UsageError("--status-interval must be positive")
    if closed(args) and not args.run_ids:
        raise UsageError("--authority, --certificate, --allowlist and --revocations are "
                         "for a run: give --run-id")
    identity = identity_path(args)
    plan = plan_runs(args, args.run_ids,
                     peer_id_of_identity(identity) if closed(args) else None, member=False)
    trio.run(serve_node, args, plan, identity)
    return 0


async def serve_node(args: argparse.Namespace, plan: RunPlan | None = None,
                     identity: str | None = None) -> None:
    """Run the node until a signal or ``--duration``, printing addresses and status.

    ``plan``: the runs it serves (default: none); ``identity``: its identity
    file (default: ``args.identity``).
    """
    if identity is None:
        identity = args.identity
    config = NodeConfig.build(listen=args.listen, announce=args.announce,
                              initial_peers=args.initial_peers, identity_path=identity,
                              relay_service=args.relay, use_relays=not args.no_relays)
    runs = plan.policies if plan is not None else ()
    # Signals are caught from the start, before anything is printed, so that a
    # supervisor that saw the addresses can always stop the node cleanly.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_node(config, runs=runs) as node, open_service_nursery() as nursery:
            await start_peer(node, nursery, signals, args)
            if plan is not None:
                for line in plan.lines:
                    logger.info("%s", line)
                    print(line, flush=True)
                if plan.revocations is not None:
                    stored = await node.membership.publish_revocations(plan.revocations)
                    print(plan.published_line(stored), flush=True)
            start = time.monotonic()
            while True:
                print(status_line(node, time.monotonic() - start), flush=True)
                await trio.sleep(args.status_interval)


async def start_peer(node: TrioNode, nursery: trio.Nursery,
                     signals: AsyncIterator[int], args: argparse.Namespace) -> None:
    """What every long-lived peer command does once its node is open: stop
    ``nursery`` on the first of ``signals`` or after ``--duration``, print the
    node's addresses, and with ``--metrics`` serve them and print
    ``metrics: <url>``."""
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
    if getattr(args, "metrics", None):
        host, port = await nursery.start(serve_metrics, node, args.metrics)
        print(f"metrics: http://{host}:{port}/metrics", flush=True)


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
