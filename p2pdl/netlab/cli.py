"""``python -m p2pdl.netlab``: check, bring up a sample internet, list and remove runs.

    python -m p2pdl.netlab check            can the lab run here?  (exit 1 if not)
    python -m p2pdl.netlab up [--rate-mbit R] [--duration S]
                                           relay + two NATs of different types with one
                                           private host each; stays up until Ctrl-C
    python -m p2pdl.netlab list             runs on this machine and their owners
    python -m p2pdl.netlab cleanup [--all | --run ID]
                                           remove leftovers of dead runs

:func:`main` takes ``argv`` and returns the exit status, so that the
``p2pdl`` command can mount it as a subcommand.  Errors of the lab are
printed on one line (exit 2).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from collections.abc import Sequence
from types import FrameType

from ..errors import ConfigError
from ._cleanup import cleanup, runs_present
from ._errors import NetlabError
from ._names import read_owner
from ._nat import NatType
from ._probe import check
from ._topology import DEFAULT_PUBLIC_NET, Internet

__all__ = ["main", "build_parser"]

#: Seconds between checks for the end of ``up --duration``.
_TICK = 0.2


def build_parser(prog: str = "python -m p2pdl.netlab") -> argparse.ArgumentParser:
    """The argument parser (``prog`` is what help and errors call the command)."""
    parser = argparse.ArgumentParser(
        prog=prog, description="An emulated internet on this machine: network namespaces, "
                               "NAT gateways, bandwidth caps (no delay or loss: this kernel "
                               "has no netem).  Needs root.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub.add_parser("check", help="report whether the lab can run here, and if not why",
                   description="Try every facility the lab uses; exit 1 if one is missing.")
    up = sub.add_parser(
        "up", aliases=["demo"], help="build a sample internet and keep it up until Ctrl-C",
        description="Build: a public host 'relay'; gateway 'nat1' (endpoint-independent) with "
                    "private host 'a'; gateway 'nat2' (symmetric) with private host 'b'.  "
                    "Prints the machines, then waits for Ctrl-C or SIGTERM and removes "
                    "everything.  Run programs inside with `ip netns exec NAMESPACE ...`.")
    up.add_argument("--rate-mbit", type=float, default=None, metavar="MBIT",
                    help="cap every host's link at this many Mbit/s each way (default: none)")
    up.add_argument("--public-net", default=DEFAULT_PUBLIC_NET, metavar="CIDR",
                    help=f"the internet's addresses (default {DEFAULT_PUBLIC_NET})")
    up.add_argument("--duration", type=float, default=None, metavar="SECONDS",
                    help="remove everything after this many seconds (default: wait for Ctrl-C)")
    sub.add_parser("list", help="list the lab runs on this machine",
                   description="One line per run: id, owner pid and whether it still runs, "
                               "namespaces.")
    clean = sub.add_parser(
        "cleanup", help="remove leftovers of lab runs whose process died",
        description="Stop the processes in, and delete, the namespaces of runs whose owner "
                    "process is gone.  Runs of live processes are kept unless --all.")
    which = clean.add_mutually_exclusive_group()
    which.add_argument("--all", action="store_true", help="also remove runs of live processes")
    which.add_argument("--run", metavar="ID", help="remove this run only, live or not")
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m p2pdl.netlab") -> int:
    """Run the command line ``argv`` (default: ``sys.argv[1:]``); return the exit status."""
    args = build_parser(prog).parse_args(argv)
    try:
        if args.command == "check":
            return _check()
        if args.command in ("up", "demo"):
            return _up(args)
        if args.command == "list":
            return _list()
        return _cleanup(args)
    except (NetlabError, ConfigError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2


def _check() -> int:
    report = check()
    width = max(len(f.name) for f in report)
    for f in report:
        mark = "ok" if f.ok else ("MISSING" if f.required else "no")
        line = f"{f.name.ljust(width)}  {mark}"
        print(f"{line}  {f.detail}" if f.detail else line)
    ok = all(f.ok for f in report if f.required)
    print("netlab can run here" if ok else "netlab cannot run here")
    return 0 if ok else 1


class _Stop(Exception):
    """SIGTERM, turned into an exception so that the ``with`` block cleans up."""


def _raise_stop(signum: int, frame: FrameType | None) -> None:
    raise _Stop


def _up(args: argparse.Namespace) -> int:
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        with Internet(public_net=args.public_net) as net:
            relay = net.add_public_host("relay", rate_mbit=args.rate_mbit)
            nat1 = net.add_nat("nat1", NatType.ENDPOINT_INDEPENDENT)
            net.add_private_host("a", behind=nat1, rate_mbit=args.rate_mbit)
            nat2 = net.add_nat("nat2", NatType.SYMMETRIC)
            net.add_private_host("b", behind=nat2, rate_mbit=args.rate_mbit)
            print(net.describe())
            print(f"\nRun programs inside a machine with `ip netns exec NAMESPACE COMMAND`, "
                  f"e.g.\n  ip netns exec {relay.netns} python3 -m http.server 8000\n"
                  f"  ip netns exec {net['a'].netns} python3 -c \"import urllib.request; "
                  f"print(urllib.request.urlopen('http://{relay.ip}:8000/').status)\"")
            print("Ctrl-C removes everything." if args.duration is None
                  else f"removing everything in {args.duration:g} s.", flush=True)
            deadline = None if args.duration is None else time.monotonic() + args.duration
            while deadline is None or time.monotonic() < deadline:
                time.sleep(_TICK if deadline is None else
                           max(0.0, min(_TICK, deadline - time.monotonic())))
    except (KeyboardInterrupt, _Stop):
        print("stopped; the lab is removed", flush=True)
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
    print("done; the lab is removed", flush=True)
    return 0


def _list() -> int:
    runs = runs_present()
    if not runs:
        print("no lab runs on this machine")
    for run_id, names in sorted(runs.items()):
        owner = read_owner(run_id)
        state = ("no owner record" if owner is None else
                 f"owner pid {owner.pid} {'running' if owner.is_alive() else 'gone'}")
        print(f"{run_id}  {state}  {len(names)} namespaces: {' '.join(sorted(names))}")
    return 0


def _cleanup(args: argparse.Namespace) -> int:
    removed = cleanup(args.run, all_runs=args.all)
    print(f"removed {len(removed)} namespaces" + (f": {' '.join(removed)}" if removed else ""))
    return 0
