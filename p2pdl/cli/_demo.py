"""``p2pdl demo``: a local swarm trains the example model, then one peer alone, side by side.

    p2pdl demo [--duration SECONDS | --quick] [--out DIR] [--target-batch-size N] ...

Everything runs on 127.0.0.1 as child processes of this one
(``python -m p2pdl ...``), each in a session of its own so that the demo
alone decides when they stop:

1. **the swarm**: a bootstrap node that also serves circuit relay v2
   (``p2pdl node --relay``); three trainers (``p2pdl train --json-lines``),
   the third in client mode (it accepts no connections, as a peer behind NAT
   would); one auxiliary peer that only helps average.  Each uses one torch
   thread.  The trainers wait for each other (``--wait-for-peers``), then train
   for ``--duration`` seconds while a live view shows the epoch, the global
   batch, the peers and the losses.
2. **the baseline**: one trainer alone (``--peer-index 0``, one thread) for the
   same time, with the same batch per step, learning rate, mode **and target
   batch size**: both runs take the same optimizer steps of the same global batch,
   so the comparison isolates what the swarm adds, the samples per second of
   its pooled compute, less the cost of averaging.  (A target scaled to one
   peer would take smaller steps and learn more per sample but less per
   step: a different optimization, not the same one run on fewer machines.)

The swarm's run is a **certificate run**: the demo makes a run authority on
the fly (in a temporary directory, deleted at the end), creates each member's
identity file, and signs a certificate for each member's peer id (the relay
and the monitor as monitors, the trainers, the auxiliary peer).  The
monitor (``p2pdl monitor``) credits each member with the samples its signed
reports claim at every epoch the run completes (``credits.sqlite``,
``credits.json``) and serves its web dashboard, with Prometheus metrics at
``/metrics`` (its URL is printed; ``report.json`` keeps what the dashboard
showed last while the trainers trained).  It also starts one
**uninvited** peer: a real ``p2pdl train --auxiliary`` of the same run id
with no certificate.  The summary says how many members refused it, from the
members' own final statistics (their admission gate's refused requests; the
uninvited peer is the only non-member in the swarm).

With ``--attacker KIND`` one more member trains: ``p2pdl train --attack
KIND`` (``p2pdl.training.ATTACKS``).  The summary says which members flagged
and banned it and how soon, from their flag books, and the honest trainers'
held-out loss against the baseline's.

The swarm has three trainers on the machine's cores (two on this project's
machine kind: three processes share them), the baseline one process on one
core; ``cpu_count`` is in the report.

At the end: a summary table (with the monitor's credits), ``report.json``
(settings, each peer's final statistics, epochs, samples/s, first and last
training loss, held-out loss at the start and the end, the contributions,
the paths), ``loss.png`` (training loss of each
swarm trainer and of the baseline, held-out loss of both, against time), and
per child ``logs/<name>.log`` (its stderr) and ``logs/<name>.jsonl`` (its
events).  Ctrl-C or SIGTERM stops every child (SIGTERM, then SIGKILL after
a grace period), writes the partial report and exits with status 130; a
second Ctrl-C kills the children at once.  Every wait has a limit.

This module runs the phases; ``_demo_children`` starts, reads and stops the
children, ``_demo_view`` draws the live view, ``_demo_report`` writes the
results.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import secrets
import shutil
import signal
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import trio

from .. import __version__
from .._concurrency import open_service_nursery
from ..errors import P2PDLError
from ._args import ATTACK_KINDS, positive_float, positive_int
from ._demo_children import Children, Phase, open_children, wait_for
from ._demo_report import build_report, summary, write_plot, write_report
from ._demo_view import watch

__all__ = ["add_parser", "run"]

logger = logging.getLogger(__name__)

#: Swarm training time by default (s).
DURATION = 180.0
#: Training time of --quick (s).
QUICK_DURATION = 40.0
#: Global batch by default.  Measured on the 2-core machine kind, idle (60 s
#: runs): a round takes ~0.75 s with a 5 s matchmaking time (0.5 s of it is
#: matchmaking's gather pause, a tenth of that time) and ~0.4 s with 2 s; an
#: epoch of 256 samples computes in ~0.9 s, so at 256 the trainers sat in rounds
#: 27-37 % of the time and the swarm's samples/s were 1.0-1.2x one peer's;
#: at 512, 25 % (5 s) and 1.3x.  Smaller batches learn more per sample
#: (:class:`~p2pdl.training.ExampleTask`), larger ones lose less to rounds: 512
#: with a 3 s matchmaking time gives ~70 epochs in the default 3 minutes.
TARGET_BATCH_SIZE = 512
#: Matchmaking time by default (s): every peer is local, so a short gather
#: pause (0.3 s) and join window (1 s) suffice, and cost less per round.
MATCHMAKING_TIME = 3.0
#: The monitor's credit database and its export, in --out.
CREDITS_DB = "credits.sqlite"
CREDITS = "credits.json"
#: The child name of the malicious trainer of --attacker.
ATTACKER = "attacker"
#: Trainer-0 and the baseline measure the held-out loss every this many epochs.
EVAL_EVERY = 5
#: Lifetime of the members' certificates beyond the demo's longest run (s).
CERTIFICATE_SLACK = 3600.0
#: Longest wait for a child to print its address or its ``ready`` event (s).
START_TIMEOUT = 120.0
#: Longest wait of the trainers for each other (their --wait-timeout, s).
WAIT_FOR_PEERS_TIMEOUT = 90.0
#: Time given to the children past their --duration to finish and report (s).
FINISH_SLACK = 60.0

TRAINERS = 3
#: Seconds the demo waits for the monitor's dashboard to answer.
DASHBOARD_TIMEOUT = 10.0
#: Seconds between two readings of the monitor's dashboard.
DASHBOARD_INTERVAL = 5.0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``p2pdl demo`` to the ``p2pdl`` parser's subcommands."""
    p = sub.add_parser(
        "demo", help="train the example model with a local swarm (3 trainers, one in client "
                     "mode, an auxiliary peer, a relay), then alone, and compare",
        description="Start a swarm on 127.0.0.1 as child processes (a bootstrap and relay node, "
                    "three trainers, one of them in client mode, one auxiliary peer), train the "
                    "built-in example model for --duration seconds with a live view, then train "
                    "one peer alone as long, and write a summary, report.json and loss.png to "
                    "--out.  Ctrl-C stops everything and writes a partial report.")
    p.add_argument("--duration", type=positive_float, default=None, metavar="SECONDS",
                   help=f"training time of the swarm and of the baseline, each (default "
                        f"{DURATION:g}; the whole demo takes about twice this plus a minute)")
    p.add_argument("--quick", action="store_true",
                   help=f"a short run: --duration {QUICK_DURATION:g}")
    p.add_argument("--out", default="p2pdl-demo", metavar="DIR",
                   help="where to write the report, the plot and the logs (default: "
                        "./p2pdl-demo)")
    p.add_argument("--target-batch-size", type=positive_int, default=TARGET_BATCH_SIZE,
                   metavar="N",
                   help=f"samples per global step, swarm and baseline (default "
                        f"{TARGET_BATCH_SIZE})")
    p.add_argument("--batch-size", type=positive_int, default=16, metavar="N",
                   help="samples per local step (default 16)")
    p.add_argument("--lr", type=positive_float, default=1e-3,
                   help="AdamW learning rate (default 1e-3)")
    p.add_argument("--mode", choices=["dedloc", "diloco"], default="dedloc",
                   help="dedloc: average gradients, one global step per epoch (default); "
                        "diloco: local AdamW steps, average the parameter deltas every "
                        "--target-batch-size samples (the baseline runs the same mode)")
    p.add_argument("--delay-updates", action="store_true",
                   help="the trainers average in the background (one step late)")
    p.add_argument("--matchmaking-time", type=positive_float, default=MATCHMAKING_TIME,
                   metavar="SECONDS",
                   help=f"longest wait to form a group (default {MATCHMAKING_TIME:g}: every "
                        f"peer is local; a tenth of it is a fixed pause of every round)")
    p.add_argument("--attacker", choices=ATTACK_KINDS, default=None, metavar="KIND",
                   help="add one admitted malicious trainer (p2pdl train --attack KIND): "
                        + ", ".join(ATTACK_KINDS) + "; the summary says who caught it and "
                        "when, and the honest held-out loss against one peer alone")
    p.add_argument("--eval-every", type=positive_int, default=EVAL_EVERY, metavar="EPOCHS",
                   help=f"held-out loss every this many epochs (default {EVAL_EVERY})")
    p.set_defaults(handler=run)


class _Demo:
    """One demo: its settings, its two phases and how they ended."""

    def __init__(self, args: argparse.Namespace, console: Any) -> None:
        self.args = args
        self.console = console
        self.out = Path(args.out)
        self.logs = self.out / "logs"
        self.duration = args.duration if args.duration is not None \
            else (QUICK_DURATION if args.quick else DURATION)
        self.run_id = f"p2pdl-demo-{secrets.token_hex(3)}"
        self.swarm = Phase("swarm")
        self.solo = Phase("solo")
        self.children: Children | None = None
        self.interrupted = False
        #: what the monitor's dashboard showed last while trainers were in its view
        self.dashboard: dict[str, Any] | None = None
        self.error: str | None = None
        self.keys: Path | None = None  # the authority, identities, certificates (temporary)
        self.authority_id: str | None = None
        self.member_ids: dict[str, str] = {}

    def make_members(self) -> None:
        """Make the run authority, each member's identity and its certificate (in
        a temporary directory that :meth:`forget_keys` deletes)."""
        from ..membership import Authority
        from ..service import Role
        from ._runs import peer_id_of_identity

        self.keys = Path(tempfile.mkdtemp(prefix="p2pdl-demo-keys-"))
        authority = Authority.generate()
        authority.save(self.keys / "authority")
        self.authority_id = authority.id
        roles = {"relay": Role.MONITOR, "monitor": Role.MONITOR, "auxiliary": Role.AUXILIARY,
                 **{f"trainer-{i}": Role.TRAINER for i in range(TRAINERS)}}
        if self.args.attacker is not None:
            roles[ATTACKER] = Role.TRAINER
        lifetime = 2 * self.duration + START_TIMEOUT + WAIT_FOR_PEERS_TIMEOUT \
            + 2 * FINISH_SLACK + CERTIFICATE_SLACK
        for name, role in roles.items():
            peer_id = peer_id_of_identity(self.keys / f"{name}.key")
            authority.issue(self.run_id, peer_id, role,
                            expires_in=lifetime).save(self.keys / f"{name}.cert")
            self.member_ids[name] = peer_id

    def member_args(self, name: str) -> list[str]:
        """The flags that make child ``name`` a member of the run."""
        assert self.keys is not None and self.authority_id is not None
        return ["--identity", str(self.keys / f"{name}.key"), "--authority",
                self.authority_id, "--certificate", str(self.keys / f"{name}.cert")]

    def forget_keys(self) -> None:
        if self.keys is not None:
            shutil.rmtree(self.keys, ignore_errors=True)

    def _train_args(self, *extra: str) -> list[str]:
        a = self.args
        args = ["train", "--json-lines", "--listen", "/ip4/127.0.0.1/tcp/0", "--threads", "1",
                "--target-batch-size", str(a.target_batch_size), "--batch-size",
                str(a.batch_size), "--lr", repr(a.lr), "--duration", repr(self.duration),
                "--matchmaking-time", repr(a.matchmaking_time), "--mode", a.mode]
        if a.delay_updates:
            args.append("--delay-updates")
        return args + list(extra)

    async def run(self, children: Children) -> None:
        self.children = children
        await self._run_swarm(children)
        await self._run_solo(children)

    async def _run_swarm(self, children: Children) -> None:
        a, phase = self.args, self.swarm
        self.console.print(f"[bold]p2pdl demo[/]: run {self.run_id}, {self.duration:g} s of "
                           f"swarm training, then {self.duration:g} s alone; output in "
                           f"{self.out}/")
        await trio.to_thread.run_sync(self.make_members)
        self.console.print(f"certificate run: authority {self.authority_id} signed "
                           f"{len(self.member_ids)} members' certificates")
        lifetime = repr(self.duration + START_TIMEOUT + WAIT_FOR_PEERS_TIMEOUT
                        + 2 * FINISH_SLACK)
        relay = await children.start("relay", "bootstrap + relay", [
            "node", "--relay", "--listen", "/ip4/127.0.0.1/tcp/0", "--status-interval", "10",
            "--duration", lifetime, "--run-id", self.run_id, *self.member_args("relay")])
        phase.others.append(relay)
        await wait_for(relay.have_addr, relay, START_TIMEOUT, "print its address")
        bootstrap = relay.addrs[0]
        self.console.print(f"relay and bootstrap node: {bootstrap}")
        # The monitor credits each member from its signed reports (p2pdl monitor).
        monitor = await children.start("monitor", "monitor", [
            "monitor", "--listen", "/ip4/127.0.0.1/tcp/0", "--run-id", self.run_id,
            "--initial-peers", bootstrap, "--db", str(self.out / CREDITS_DB),
            "--export", str(self.out / CREDITS), "--target-batch-size",
            str(a.target_batch_size), "--status-interval", "10", "--http", "127.0.0.1:0",
            "--view", "lines", "--duration", lifetime, *self.member_args("monitor")])
        phase.others.append(monitor)
        await wait_for(monitor.have_dashboard, monitor, START_TIMEOUT, "serve its dashboard")
        self.console.print(f"monitor: credits the members from their signed reports "
                           f"({self.out / CREDITS_DB}); dashboard at {monitor.dashboard_url} "
                           f"(open it in a browser), Prometheus metrics at "
                           f"{monitor.dashboard_url}metrics")
        peers = TRAINERS + 1 + (a.attacker is not None)
        common = ["--run-id", self.run_id, "--initial-peers", bootstrap,
                  "--wait-for-peers", str(peers), "--wait-timeout", repr(WAIT_FOR_PEERS_TIMEOUT)]
        for i in range(TRAINERS):
            extra = ["--peer-index", str(i), "--name", f"trainer-{i}", *common,
                     *self.member_args(f"trainer-{i}")]
            if i == 0:
                extra += ["--eval-every", str(a.eval_every)]
            if i == TRAINERS - 1:
                extra.append("--client-mode")
            role = "trainer (client mode)" if i == TRAINERS - 1 else "trainer"
            phase.trainers.append(await children.start(f"trainer-{i}", role,
                                                       self._train_args(*extra)))
        if a.attacker is not None:
            phase.others.append(await children.start(
                ATTACKER, f"attacker ({a.attacker})", self._train_args(
                    "--attack", a.attacker, "--peer-index", str(TRAINERS), *common,
                    *self.member_args(ATTACKER))))
        # The auxiliary peer outlives the trainers (it is stopped once they are done),
        # so that no trainer's last round loses a reducer that left on its own.
        aux = self._train_args("--auxiliary", *common, *self.member_args("auxiliary"))
        aux[aux.index("--duration") + 1] = repr(self.duration + FINISH_SLACK)
        phase.others.append(await children.start("auxiliary", "auxiliary", aux))
        # The uninvited peer: the same run id and bootstrap, no certificate.  An
        # auxiliary peer computes no gradients, so it takes no CPU from the trainers.
        uninvited = self._train_args("--auxiliary", "--run-id", self.run_id,
                                     "--initial-peers", bootstrap)
        uninvited[uninvited.index("--duration") + 1] = repr(self.duration + FINISH_SLACK)
        phase.uninvited.append(await children.start("uninvited", "uninvited (no certificate)",
                                                    uninvited))
        self.console.print(f"started {TRAINERS} trainers (trainer-{TRAINERS - 1} in client "
                           f"mode), an auxiliary peer and an uninvited peer (no certificate)"
                           + (f", and an attacker ({a.attacker})" if a.attacker else "")
                           + "; waiting for the members to meet")
        async with trio.open_nursery() as watching:
            watching.start_soon(self._read_dashboard, monitor.dashboard_url)
            await self._watch(phase, START_TIMEOUT + WAIT_FOR_PEERS_TIMEOUT)
            watching.cancel_scope.cancel()
        await children.stop(phase.children)

    async def _read_dashboard(self, url: str | None) -> None:
        """Read the monitor's dashboard every DASHBOARD_INTERVAL s while the
        swarm trains; keep the last reading that showed trainers (their loss)."""
        while True:
            await trio.sleep(DASHBOARD_INTERVAL)
            state = await trio.to_thread.run_sync(_dashboard_state, url)
            if state is not None and (self.dashboard is None or state.get("loss") is not None
                                      or self.dashboard.get("loss") is None):
                self.dashboard = state

    async def _run_solo(self, children: Children) -> None:
        phase = self.solo
        self.console.print(f"baseline: one trainer alone for {self.duration:g} s")
        phase.trainers.append(await children.start("solo", "trainer alone", self._train_args(
            "--run-id", f"{self.run_id}-solo", "--peer-index", "0", "--discovery-time", "0",
            "--eval-every", str(self.args.eval_every))))
        await self._watch(phase, START_TIMEOUT)
        await children.stop(phase.children)

    async def _watch(self, phase: Phase, start_timeout: float) -> None:
        await watch(phase, self.console, duration=self.duration,
                    target_batch_size=self.args.target_batch_size,
                    limit=start_timeout + self.duration + FINISH_SLACK)

    def settings(self) -> dict[str, Any]:
        """The demo's settings, as the report and the plot give them."""
        a = self.args
        return {
            "run_id": self.run_id, "duration": self.duration,
            "target_batch_size": a.target_batch_size,
            "baseline_target_batch_size": a.target_batch_size,
            "batch_size": a.batch_size, "lr": a.lr, "optimizer": "AdamW",
            "mode": a.mode, "delay_updates": a.delay_updates,
            "matchmaking_time": a.matchmaking_time, "eval_every": a.eval_every,
            "torch_threads_per_peer": 1, "trainers": TRAINERS, "client_mode_trainers": 1,
            "auxiliary_peers": 1, "membership": "certificate", "attacker": a.attacker,
            "authority": self.authority_id, "uninvited_peers": 1,
            "cpu_count": os.cpu_count(), "p2pdl": __version__,
            "python": platform.python_version(), "platform": platform.platform(),
        }

    def report(self) -> dict[str, Any]:
        report = build_report(settings=self.settings(), interrupted=self.interrupted,
                              error=self.error, swarm=self.swarm, solo=self.solo,
                              children=self.children.all if self.children else [],
                              out=self.out, member_ids=self.member_ids)
        report["dashboard"] = self.dashboard
        return report


def _dashboard_state(url: str | None) -> dict[str, Any] | None:
    """What the monitor's dashboard shows now (``/api/state``), summed up:
    its URL, the run's epoch, the peers in view, the leaderboard's rows and
    the history's points (None when it does not answer)."""
    if url is None:
        return None
    try:
        with urllib.request.urlopen(url + "api/state", timeout=DASHBOARD_TIMEOUT) as answer:
            state = json.loads(answer.read())
    except (OSError, ValueError) as exc:
        logger.warning("the monitor's dashboard did not answer: %s", exc)
        return {"url": url, "answered": False}
    status = state.get("status") or {}
    return {"url": url, "answered": True, "epoch": status.get("epoch"),
            "peers": len(state.get("peers", [])), "leaderboard": len(state.get("leaderboard", [])),
            "points": len(state.get("points", [])), "loss": status.get("loss")}


async def _run_demo(demo: _Demo) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_service_nursery() as nursery:
            main = trio.CancelScope()

            async def on_signals() -> None:
                async for signum in signals:
                    if not demo.interrupted:
                        demo.interrupted = True
                        demo.console.print(f"[yellow]{signal.Signals(signum).name}: stopping "
                                           f"the children and writing a partial report[/]")
                        main.cancel()
                    elif demo.children is not None:
                        demo.children.kill_all()

            nursery.start_soon(on_signals)
            try:
                # The children's readers live outside ``main``: a signal cancels the
                # run, and the children are then stopped while their output is read.
                async with open_children(demo.logs, demo.args.log_level) as children:
                    demo.children = children
                    with main:
                        await demo.run(children)
            finally:
                nursery.cancel_scope.cancel()


def run(args: argparse.Namespace) -> int:
    """``p2pdl demo``: 0 when complete, 1 if a phase failed, 130 when interrupted."""
    from rich.console import Console

    console = Console(highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(highlight=False, width=120)  # log files: wider than 80
    demo = _Demo(args, console)
    try:
        demo.logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"p2pdl: error: cannot create {demo.logs}: {exc}", file=sys.stderr)
        return 2
    try:
        trio.run(_run_demo, demo)
    except (P2PDLError, OSError) as exc:
        demo.error = str(exc)
        console.print(f"[red]p2pdl demo: {exc}[/]")
    except KeyboardInterrupt:  # a signal before trio's handler was up
        demo.interrupted = True
    finally:
        demo.forget_keys()
    report = demo.report()
    plot = write_plot(demo.out, demo.swarm, demo.solo, report["settings"])
    if plot is None:
        report["paths"]["plot"] = None
    path = write_report(demo.out, report)
    console.print(summary(report))
    console.print(f"report: {path}")
    if plot is not None:
        console.print(f"plot:   {plot}")
    console.print(f"logs:   {demo.logs}/")
    if demo.interrupted:
        return 130
    return 1 if demo.error else 0
