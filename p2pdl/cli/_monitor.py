"""``p2pdl monitor``: follow a run and credit its contributors.

    p2pdl monitor --run-id R [--initial-peers MULTIADDR ...] [--db FILE]
                  [--target-batch-size N] [--status-interval S] [--duration S]
                  [--top N] [--export FILE.csv|FILE.json] [--http HOST:PORT]
                  [--view live|lines] [--backup-dir DIR [--backup-every N]]
                  [--metrics HOST:PORT]
                  [--authority ID --certificate FILE | --allowlist FILE] ...

A peer that takes no part in training or averaging: it follows the run's
progress gossip (an auxiliary peer with no samples; in a certificate run its
certificate's role is ``monitor``), credits each peer with the samples its
own signed reports claim at every epoch the run completes
(:mod:`p2pdl.monitor`: capped at the target batch size per peer and epoch)
into an SQLite database (``--db``, kept across restarts), and prints its
addresses.  With ``--http`` it serves the web dashboard (``dashboard:
<url>`` is printed).  On a terminal (``--view live``, the default there) it
redraws the run's view (:mod:`._monitor_view`); elsewhere (``--view
lines``) it prints a status line every ``--status-interval`` seconds with
the run's epoch, peers, throughput and the leaderboard's top ``--top``.
With ``--backup-dir`` it downloads the run's state every ``--backup-every``
epochs and keeps it as atomic checkpoints (``p2pdl train --resume-from
DIR`` starts from the newest).  At the end (SIGINT, SIGTERM or
``--duration``) it prints the leaderboard and, with ``--export``, writes the
run's credits as CSV or JSON.
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import signal
import sys
import time
from pathlib import Path

import trio

from .. import NodeConfig, open_node
from .._concurrency import open_service_nursery
from ..monitor import (
    BackupConfig,
    Backups,
    CreditStore,
    Dashboard,
    Glance,
    follow_run,
    serve_dashboard,
)
from ._args import (
    UsageError,
    add_identity,
    add_initial_peers,
    add_listen,
    add_metrics,
    metrics_address,
    positive_float,
    positive_int,
    run_id_text,
)
from ._node import start_peer
from ._runs import (
    RunPlan,
    add_membership,
    closed,
    identity_path,
    peer_id_of_identity,
    plan_runs,
)

__all__ = ["add_parser", "run", "DEFAULT_DB", "STATUS_INTERVAL"]

logger = logging.getLogger(__name__)

#: The credit database by default (in the working directory).
DEFAULT_DB = "p2pdl-monitor.sqlite"
#: Seconds between status lines (default of --status-interval).
STATUS_INTERVAL = 10.0
#: Target batch size assumed by default (p2pdl train's default).
TARGET_BATCH_SIZE = 256
#: Leaderboard lines in the status (default of --top).
TOP = 3
#: Seconds between redraws of the live view.
LIVE_INTERVAL = 1.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``p2pdl monitor`` to the ``p2pdl`` parser's subcommands."""
    p = sub.add_parser(
        "monitor", help="follow a run and credit its contributors (leaderboard, exports, "
                        "a live view and web dashboard, backups of the model)",
        description="Follow a run's progress without training, credit each peer with the "
                    "samples its own signed reports claim at every epoch the run completes, "
                    "keep the credits in SQLite, show the run (a live terminal view or status "
                    "lines; a web dashboard with --http), keep copies of its state "
                    "(--backup-dir), and print a leaderboard at the end.")
    p.add_argument("--run-id", required=True, type=run_id_text, metavar="R",
                   help="the run to follow")
    add_listen(p)
    add_initial_peers(p, "join the run through")
    add_identity(p)
    p.add_argument("--db", default=DEFAULT_DB, metavar="FILE",
                   help=f"the credit database (SQLite), kept across restarts "
                        f"(default {DEFAULT_DB})")
    p.add_argument("--target-batch-size", type=positive_int, default=TARGET_BATCH_SIZE,
                   metavar="N", help=f"the run's target batch size: the most a peer is "
                                     f"credited per epoch (default {TARGET_BATCH_SIZE})")
    p.add_argument("--status-interval", type=positive_float, default=STATUS_INTERVAL,
                   metavar="SECONDS",
                   help=f"seconds between status lines (default {STATUS_INTERVAL:g})")
    p.add_argument("--duration", type=positive_float, default=None, metavar="SECONDS",
                   help="stop after this many seconds (default: run until stopped)")
    p.add_argument("--top", type=positive_int, default=TOP, metavar="N",
                   help=f"leaderboard lines in each status line (default {TOP})")
    p.add_argument("--export", default=None, metavar="FILE",
                   help="at the end, write the run's credits to FILE (.csv or .json)")
    p.add_argument("--http", type=metrics_address, default=None, metavar="HOST:PORT",
                   help="serve the web dashboard at http://HOST:PORT/ (the run live: loss, "
                        "throughput, peers, epochs, leaderboard; its metrics at /metrics; "
                        "port 0: a free one, printed)")
    p.add_argument("--backup-dir", default=None, metavar="DIR",
                   help="keep copies of the run's state (model, optimizer) in DIR as atomic "
                        "checkpoints, so the run survives all its trainers leaving "
                        "(p2pdl train --resume-from DIR)")
    p.add_argument("--backup-every", type=positive_int, default=10, metavar="EPOCHS",
                   help="epochs between copies (default 10)")
    p.add_argument("--backup-keep", type=positive_int, default=3, metavar="N",
                   help="copies kept, the newest (default 3)")
    p.add_argument("--view", choices=("live", "lines"), default=None,
                   help="live: redraw the run's view in place; lines: print status lines "
                        "(default: live on a terminal, lines elsewhere)")
    add_membership(p)
    add_metrics(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``p2pdl monitor`` with parsed ``args``; return the exit status."""
    if args.export is not None and Path(args.export).suffix.lower() not in (".csv", ".json"):
        raise UsageError("--export FILE must end in .csv or .json")
    identity = identity_path(args)
    plan = plan_runs(args, [args.run_id],
                     peer_id_of_identity(identity) if closed(args) else None)
    with CreditStore(args.db) as store:
        trio.run(_monitor, args, plan, identity, store)
        board = store.leaderboard(args.run_id)
        print(f"leaderboard of {args.run_id} ({len(board)} peer(s), "
              f"{sum(s.samples for s in board)} samples credited):", flush=True)
        for rank, standing in enumerate(board, 1):
            named = f" ({standing.name})" if standing.name else ""
            print(f"{rank:4d}. {standing.peer_id}{named}  {standing.samples} samples in "
                  f"{standing.epochs} epoch(s) ({standing.first_epoch}..{standing.last_epoch})",
                  flush=True)
        if args.export is not None:
            path = Path(args.export)
            text = store.export_json(args.run_id) if path.suffix.lower() == ".json" \
                else store.export_csv(args.run_id)
            path.write_text(text)
            print(f"exported: {path}", flush=True)
    return 0


async def _monitor(args: argparse.Namespace, plan: RunPlan, identity: str | None,
                   store: CreditStore) -> None:
    config = NodeConfig.build(listen=args.listen, initial_peers=args.initial_peers,
                              identity_path=identity)
    dashboard = Dashboard(args.run_id, store)
    live = args.view == "live" or (args.view is None and sys.stdout.isatty())
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_node(config, runs=plan.policies) as node, \
                open_service_nursery() as nursery:

            await start_peer(node, nursery, signals, args)
            for line in plan.lines:
                print(line, flush=True)
            if args.http is not None:
                host, port = await nursery.start(serve_dashboard, node, dashboard, args.http)
                print(f"dashboard: http://{host}:{port}/", flush=True)
            backups = None
            if args.backup_dir is not None:
                backups = Backups(node, args.run_id, BackupConfig(
                    Path(args.backup_dir), every=args.backup_every, keep=args.backup_keep))
                dashboard.backups = backups
                print(f"backups: every {args.backup_every} epoch(s) in {args.backup_dir}"
                      + (f" (newest: epoch {backups.last_epoch})"
                         if backups.last_epoch is not None else ""), flush=True)
            await nursery.start(functools.partial(
                follow_run, node, args.run_id, store, target_batch_size=args.target_batch_size,
                on_glance=dashboard.observe, backups=backups))
            if live:
                await _live(dashboard, args.top)
            start = time.monotonic()
            while True:
                await trio.sleep(args.status_interval)
                if dashboard.glance is not None:
                    print(status_line(dashboard.glance, store, args.run_id, args.top,
                                      time.monotonic() - start), flush=True)


async def _live(dashboard: Dashboard, top: int) -> None:
    """Redraw the run's view in place until cancelled (a terminal only)."""
    from rich.console import Console
    from rich.live import Live

    from ._monitor_view import monitor_view

    with Live(monitor_view(dashboard.state(), top), console=Console(), auto_refresh=False,
              transient=False) as view:
        while True:
            await trio.sleep(LIVE_INTERVAL)
            view.update(monitor_view(dashboard.state(), top), refresh=True)


def status_line(glance: Glance, store: CreditStore, run_id: str, top: int,
                uptime: float) -> str:
    """One line: the run's epoch, peers by role, throughput, ETA, and the top credits."""
    view = glance.progress
    trainers = sum(1 for p in glance.peers if not p.auxiliary)
    auxiliary = len(glance.peers) - trainers
    eta = view.eta_next_epoch - view.time
    eta_text = f"{eta:.0f} s" if math.isfinite(eta) and eta >= 0 else "-"
    board = store.leaderboard(run_id, limit=top)
    leaders = ", ".join(f"{s.name or s.peer_id[-8:]} {s.samples}" for s in board) or "none yet"
    return (f"monitor: run {run_id} | epoch {view.epoch} (quorum {view.quorum_epoch}) | "
            f"{trainers} trainer(s), {auxiliary} auxiliary | "
            f"{view.samples_per_second:.1f} samples/s | next epoch in {eta_text} | "
            f"credited: {leaders} | up {uptime:.0f} s")
