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

The swarm has three trainers on the machine's cores (two on this project's
machine kind: three processes share them), the baseline one process on one
core; ``cpu_count`` is in the report.

At the end: a summary table, ``report.json`` (settings, each peer's final
statistics, epochs, samples/s, first and last training loss, held-out loss
at the start and the end, the paths), ``loss.png`` (training loss of each
swarm trainer and of the baseline, held-out loss of both, against time), and
per child ``logs/<name>.log`` (its stderr) and ``logs/<name>.jsonl`` (its
events).  Ctrl-C or SIGTERM stops every child (SIGTERM, then SIGKILL after
a grace period), writes the partial report and exits with status 130; a
second Ctrl-C kills the children at once.  Every wait has a limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import platform
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import trio

from . import __version__
from ._concurrency import open_service_nursery
from ._train_cli import _positive_float, _positive_int
from .errors import CallTimeoutError, P2PDLError

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
#: (``training._example``), larger ones lose less to rounds: 512 with a 3 s
#: matchmaking time gives ~70 epochs in the default 3 minutes.
TARGET_BATCH_SIZE = 512
#: Matchmaking time by default (s): every peer is local, so a short gather
#: pause (0.3 s) and join window (1 s) suffice, and cost less per round.
MATCHMAKING_TIME = 3.0
#: Trainer-0 and the baseline measure the held-out loss every this many epochs.
EVAL_EVERY = 5
#: Longest wait for a child to print its address or its ``ready`` event (s).
START_TIMEOUT = 120.0
#: Longest wait of the trainers for each other (their --wait-timeout, s).
WAIT_FOR_PEERS_TIMEOUT = 90.0
#: Time given to the children past their --duration to finish and report (s).
FINISH_SLACK = 60.0
#: Time between SIGTERM and SIGKILL when the demo stops a child (s).  A
#: trainer stops in about 2 s (most of it the interpreter's exit); a machine
#: shared with other jobs can make that several times longer.
STOP_GRACE = 20.0
#: Longest stdout line read from a child (bytes); longer lines are dropped.
MAX_LINE = 1 << 20
#: Seconds between plain progress lines when stdout is not a terminal.
PLAIN_INTERVAL = 10.0

TRAINERS = 3


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``p2pdl demo`` to the ``p2pdl`` parser's subcommands."""
    p = sub.add_parser(
        "demo", help="train the example model with a local swarm (3 trainers, one in client "
                     "mode, an auxiliary peer, a relay), then alone, and compare",
        description="Start a swarm on 127.0.0.1 as child processes (a bootstrap and relay node, "
                    "three trainers, one of them in client mode, one auxiliary peer), train the "
                    "built-in example model for --duration seconds with a live view, then train "
                    "one peer alone as long, and write a summary, report.json and loss.png to "
                    "--out.  Ctrl-C stops everything and writes a partial report.")
    p.add_argument("--duration", type=_positive_float, default=None, metavar="SECONDS",
                   help=f"training time of the swarm and of the baseline, each (default "
                        f"{DURATION:g}; the whole demo takes about twice this plus a minute)")
    p.add_argument("--quick", action="store_true",
                   help=f"a short run: --duration {QUICK_DURATION:g}")
    p.add_argument("--out", default="p2pdl-demo", metavar="DIR",
                   help="where to write the report, the plot and the logs (default: "
                        "./p2pdl-demo)")
    p.add_argument("--target-batch-size", type=_positive_int, default=TARGET_BATCH_SIZE,
                   metavar="N",
                   help=f"samples per global step, swarm and baseline (default "
                        f"{TARGET_BATCH_SIZE})")
    p.add_argument("--batch-size", type=_positive_int, default=16, metavar="N",
                   help="samples per local step (default 16)")
    p.add_argument("--lr", type=_positive_float, default=1e-3,
                   help="AdamW learning rate (default 1e-3)")
    p.add_argument("--mode", choices=["dedloc", "diloco"], default="dedloc",
                   help="dedloc: average gradients, one global step per epoch (default); "
                        "diloco: local AdamW steps, average the parameter deltas every "
                        "--target-batch-size samples (the baseline runs the same mode)")
    p.add_argument("--delay-updates", action="store_true",
                   help="the trainers average in the background (one step late)")
    p.add_argument("--matchmaking-time", type=_positive_float, default=MATCHMAKING_TIME,
                   metavar="SECONDS",
                   help=f"longest wait to form a group (default {MATCHMAKING_TIME:g}: every "
                        f"peer is local; a tenth of it is a fixed pause of every round)")
    p.add_argument("--eval-every", type=_positive_int, default=EVAL_EVERY, metavar="EPOCHS",
                   help=f"held-out loss every this many epochs (default {EVAL_EVERY})")


# -- children ------------------------------------------------------------------------

@dataclasses.dataclass
class _Child:
    """One child process, what it printed, and where its output goes."""

    name: str
    role: str
    command: list[str]
    log_path: Path
    events_path: Path
    process: trio.Process | None = None
    addrs: list[str] = dataclasses.field(default_factory=list)
    ready: dict[str, Any] | None = None
    started: dict[str, Any] | None = None
    last_step: dict[str, Any] | None = None
    first_step: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    evals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    exited: trio.Event = dataclasses.field(default_factory=trio.Event)
    have_addr: trio.Event = dataclasses.field(default_factory=trio.Event)
    have_ready: trio.Event = dataclasses.field(default_factory=trio.Event)
    have_started: trio.Event = dataclasses.field(default_factory=trio.Event)

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def on_line(self, line: str) -> None:
        if line.startswith("/"):  # `p2pdl node` prints its addresses first
            self.addrs.append(line)
            self.have_addr.set()
            return
        if not line.startswith("{"):
            return
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("event")
        if kind == "ready":
            self.ready = event
            self.have_ready.set()
        elif kind == "started":
            self.started = event
            self.have_started.set()
        elif kind == "step":
            if self.first_step is None:
                self.first_step = event
            self.last_step = event
            if len(self.steps) < 100_000:  # bounded: ~1 event per second per child
                self.steps.append(event)
        elif kind == "eval":
            if len(self.evals) < 10_000:
                self.evals.append(event)
        elif kind == "done":
            self.done = event


class _Children:
    """The demo's child processes: started here, always stopped on the way out."""

    def __init__(self, nursery: trio.Nursery, logs: Path, log_level: str) -> None:
        self._nursery = nursery
        self._logs = logs
        self._log_level = log_level
        self._files: list[IO[bytes]] = []
        self.all: list[_Child] = []

    async def start(self, name: str, role: str, args: Sequence[str]) -> _Child:
        command = [sys.executable, "-m", "p2pdl", "--log-level", self._log_level, *args]
        child = _Child(name, role, command, self._logs / f"{name}.log",
                       self._logs / f"{name}.jsonl")
        stderr, events = self._open_files(child)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        child.process = await trio.lowlevel.open_process(
            command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
        self.all.append(child)
        self._nursery.start_soon(self._read, child, events)
        return child

    def _open_files(self, child: _Child) -> tuple[IO[bytes], IO[bytes]]:
        # Small local files, closed in aclose: opening them does not block for long.
        stderr = open(child.log_path, "wb")  # noqa: SIM115
        self._files.append(stderr)
        events = open(child.events_path, "wb")  # noqa: SIM115
        self._files.append(events)
        return stderr, events

    async def _read(self, child: _Child, events: IO[bytes]) -> None:
        assert child.process is not None and child.process.stdout is not None
        buf = b""
        try:
            async for chunk in child.process.stdout:
                buf += chunk
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    events.write(raw + b"\n")
                    child.on_line(raw.decode(errors="replace").strip())
                if len(buf) > MAX_LINE:
                    buf = b""
            await child.process.wait()
        finally:
            events.flush()
            child.exited.set()

    def kill_all(self) -> None:
        for child in self.all:
            if child.process is not None and child.process.returncode is None:
                child.process.kill()

    async def stop(self, children: Sequence[_Child], grace: float = STOP_GRACE) -> None:
        """SIGTERM the living ones, wait at most ``grace`` s, then SIGKILL (shielded)."""
        with trio.CancelScope(shield=True):
            for child in children:
                if child.process is not None and child.process.returncode is None:
                    child.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(grace):
                for child in children:
                    await child.exited.wait()
            for child in children:
                if child.process is not None and child.process.returncode is None:
                    logger.warning("%s did not stop within %.0f s; killing it", child.name,
                                   grace)
                    child.process.kill()
            with trio.move_on_after(grace):
                for child in children:
                    await child.exited.wait()

    async def aclose(self) -> None:
        await self.stop(self.all)
        for f in self._files:
            f.close()


@asynccontextmanager
async def _open_children(logs: Path, log_level: str) -> AsyncIterator[_Children]:
    """Children for the block; on the way out they are stopped while their
    output is still read (so their last events arrive), then the readers end."""
    async with open_service_nursery() as nursery:
        children = _Children(nursery, logs, log_level)
        try:
            yield children
        finally:
            await children.aclose()
            nursery.cancel_scope.cancel()


async def _wait(event: trio.Event, child: _Child, timeout: float, what: str) -> None:
    """Wait for ``event`` at most ``timeout`` s; fail if the child exits first."""
    with trio.move_on_after(timeout):
        async with trio.open_nursery() as nursery:
            async def exited() -> None:
                await child.exited.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(exited)
            await event.wait()
            nursery.cancel_scope.cancel()
    if not event.is_set():
        state = f"exited with status {child.returncode}" if child.exited.is_set() \
            else f"did not within {timeout:.0f} s"
        raise CallTimeoutError(f"{child.name} was to {what} but {state}; see {child.log_path}")


# -- the run ---------------------------------------------------------------------

@dataclasses.dataclass
class _Phase:
    """One phase's children and times (the swarm, or the baseline)."""

    name: str
    trainers: list[_Child] = dataclasses.field(default_factory=list)
    others: list[_Child] = dataclasses.field(default_factory=list)
    wall_start: float | None = None
    wall_end: float | None = None

    @property
    def children(self) -> list[_Child]:
        return self.trainers + self.others

    def elapsed(self) -> float:
        return max([c.last_step["t"] for c in self.trainers
                    if c.last_step and c.last_step.get("t") is not None] or [0.0])


class _Demo:
    def __init__(self, args: argparse.Namespace, console: Any) -> None:
        self.args = args
        self.console = console
        self.out = Path(args.out)
        self.logs = self.out / "logs"
        self.duration = args.duration if args.duration is not None \
            else (QUICK_DURATION if args.quick else DURATION)
        self.run_id = f"p2pdl-demo-{secrets.token_hex(3)}"
        self.swarm = _Phase("swarm")
        self.solo = _Phase("solo")
        self.children: _Children | None = None
        self.interrupted = False
        self.error: str | None = None

    def _train_args(self, *extra: str) -> list[str]:
        a = self.args
        args = ["train", "--json-lines", "--listen", "/ip4/127.0.0.1/tcp/0", "--threads", "1",
                "--target-batch-size", str(a.target_batch_size), "--batch-size",
                str(a.batch_size), "--lr", repr(a.lr), "--duration", repr(self.duration),
                "--matchmaking-time", repr(a.matchmaking_time), "--mode", a.mode]
        if a.delay_updates:
            args.append("--delay-updates")
        return args + list(extra)

    async def run(self, children: _Children) -> None:
        self.children = children
        await self._run_swarm(children)
        await self._run_solo(children)

    async def _run_swarm(self, children: _Children) -> None:
        a, phase = self.args, self.swarm
        self.console.print(f"[bold]p2pdl demo[/]: run {self.run_id}, {self.duration:g} s of "
                           f"swarm training, then {self.duration:g} s alone; output in "
                           f"{self.out}/")
        relay = await children.start("relay", "bootstrap + relay", [
            "node", "--relay", "--listen", "/ip4/127.0.0.1/tcp/0", "--status-interval", "10",
            "--duration", repr(self.duration + START_TIMEOUT + WAIT_FOR_PEERS_TIMEOUT
                               + 2 * FINISH_SLACK)])
        phase.others.append(relay)
        await _wait(relay.have_addr, relay, START_TIMEOUT, "print its address")
        bootstrap = relay.addrs[0]
        self.console.print(f"relay and bootstrap node: {bootstrap}")
        peers = TRAINERS + 1
        common = ["--run-id", self.run_id, "--initial-peers", bootstrap,
                  "--wait-for-peers", str(peers), "--wait-timeout", repr(WAIT_FOR_PEERS_TIMEOUT)]
        for i in range(TRAINERS):
            extra = ["--peer-index", str(i), *common]
            if i == 0:
                extra += ["--eval-every", str(a.eval_every)]
            if i == TRAINERS - 1:
                extra.append("--client-mode")
            role = "trainer (client mode)" if i == TRAINERS - 1 else "trainer"
            phase.trainers.append(await children.start(f"trainer-{i}", role,
                                                       self._train_args(*extra)))
        # The auxiliary peer outlives the trainers (it is stopped once they are done),
        # so that no trainer's last round loses a reducer that left on its own.
        aux = self._train_args("--auxiliary", *common)
        aux[aux.index("--duration") + 1] = repr(self.duration + FINISH_SLACK)
        phase.others.append(await children.start("auxiliary", "auxiliary", aux))
        self.console.print(f"started {TRAINERS} trainers (trainer-{TRAINERS - 1} in client "
                           f"mode) and an auxiliary peer; waiting for them to meet")
        await self._watch(phase, START_TIMEOUT + WAIT_FOR_PEERS_TIMEOUT)
        await children.stop(phase.children)

    async def _run_solo(self, children: _Children) -> None:
        phase = self.solo
        self.console.print(f"baseline: one trainer alone for {self.duration:g} s")
        phase.trainers.append(await children.start("solo", "trainer alone", self._train_args(
            "--run-id", f"{self.run_id}-solo", "--peer-index", "0", "--discovery-time", "0",
            "--eval-every", str(self.args.eval_every))))
        await self._watch(phase, START_TIMEOUT)
        await children.stop(phase.children)

    async def _watch(self, phase: _Phase, start_timeout: float) -> None:
        """Show the phase live until its trainers are done (or past every limit)."""
        from rich.live import Live

        phase.wall_start = time.monotonic()
        limit = start_timeout + self.duration + FINISH_SLACK
        deadline = trio.current_time() + limit
        started = False
        last_plain = time.monotonic()
        with Live(self._view(phase), console=self.console, auto_refresh=False,
                  transient=False) as live:
            while True:
                if not started and all(c.have_started.is_set() for c in phase.trainers):
                    started = True
                    self.console.print(f"{phase.name}: training "
                                       f"({phase.trainers[0].started.get('peers')} peers)"
                                       if phase.trainers[0].started else
                                       f"{phase.name}: training")
                if all(c.exited.is_set() for c in phase.trainers):
                    break
                if trio.current_time() >= deadline:
                    self.console.print(f"[yellow]{phase.name}: trainers still running "
                                       f"{limit:.0f} s after the start; stopping them[/]")
                    break
                live.update(self._view(phase), refresh=True)
                if not self.console.is_terminal and time.monotonic() - last_plain \
                        >= PLAIN_INTERVAL:
                    last_plain = time.monotonic()
                    self.console.print(self._plain_line(phase))
                await trio.sleep(0.25)
            live.update(self._view(phase), refresh=True)
        if not self.console.is_terminal:
            self.console.print()  # Live leaves the last frame without a newline there
        phase.wall_end = time.monotonic()
        failed = [c for c in phase.trainers if c.done is None]
        if failed:
            names = ", ".join(f"{c.name} (status {c.returncode}, see {c.log_path})"
                              for c in failed)
            self.console.print(f"[yellow]{phase.name}: no final report from {names}[/]")

    def _plain_line(self, phase: _Phase) -> str:
        parts = []
        for c in phase.trainers:
            s = c.last_step or {}
            parts.append(f"{c.name} epoch {s.get('epoch', '-')} loss {_fmt(s.get('loss'))}")
        return f"{phase.name} {phase.elapsed():.0f}/{self.duration:g} s: " + "; ".join(parts)

    def _view(self, phase: _Phase) -> Any:
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table

        lead = max(phase.trainers, key=lambda c: (c.last_step or {}).get("epoch", -1),
                   default=None)
        step = (lead.last_step if lead else None) or {}
        target = step.get("target") or self.args.target_batch_size
        glob = min(step.get("global_samples") or 0, target)
        elapsed = phase.elapsed()
        head = Table.grid(padding=(0, 2))
        head.add_column(style="bold")
        head.add_column()
        head.add_column()
        head.add_row("elapsed", ProgressBar(total=self.duration, completed=min(elapsed,
                                                                               self.duration),
                                            width=40),
                     f"{elapsed:.0f} / {self.duration:g} s")
        head.add_row("global batch", ProgressBar(total=target, completed=glob, width=40),
                     f"{glob} / {target} samples, epoch {step.get('epoch', 0)}, "
                     f"{step.get('peers', '-')} peer(s), "
                     f"{_fmt(step.get('swarm_samples_per_second'), 0)} samples/s")
        table = Table(title=f"{phase.name}", title_justify="left", expand=False)
        for column in ("peer", "role", "state", "epoch", "samples", "loss", "held-out",
                       "last round"):
            table.add_column(column, justify="right" if column in ("epoch", "samples", "loss",
                                                                   "held-out") else "left")
        for c in phase.trainers + [c for c in phase.others if c.role == "auxiliary"]:
            s = c.last_step or {}
            running = "averaging" if c.role == "auxiliary" else "training"
            state = ("done" if c.done else f"exited {c.returncode}") if c.exited.is_set() \
                else running if c.have_started.is_set() else \
                "waiting for peers" if c.have_ready.is_set() else "starting"
            last = "-" if not s.get("outcome") else \
                f"{s['outcome']} ({s.get('group_size')}, {_fmt(s.get('round_seconds'), 1)} s)"
            held = (c.done or {}).get("val_loss") or (c.evals[-1]["val_loss"] if c.evals
                                                       else None)
            table.add_row(c.name, c.role, state, str(s.get("epoch", "-")),
                          str(s.get("samples", "-")) if c.role != "auxiliary" else "-",
                          _fmt(s.get("loss")), _fmt(held), last)
        return Group(head, table)

    # -- results -----------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        a = self.args
        settings = {
            "run_id": self.run_id, "duration": self.duration,
            "target_batch_size": a.target_batch_size,
            "baseline_target_batch_size": a.target_batch_size,
            "batch_size": a.batch_size, "lr": a.lr, "optimizer": "AdamW",
            "mode": a.mode, "delay_updates": a.delay_updates,
            "matchmaking_time": a.matchmaking_time, "eval_every": a.eval_every,
            "torch_threads_per_peer": 1, "trainers": TRAINERS, "client_mode_trainers": 1,
            "auxiliary_peers": 1, "cpu_count": os.cpu_count(), "p2pdl": __version__,
            "python": platform.python_version(), "platform": platform.platform(),
        }
        return {
            "settings": settings,
            "interrupted": self.interrupted,
            "error": self.error,
            "swarm": self._phase_report(self.swarm),
            "solo": self._phase_report(self.solo),
            "comparison": self._comparison(),
            "processes": [{"name": c.name, "role": c.role, "pid": c.pid,
                           "returncode": c.returncode, "command": c.command}
                          for c in (self.children.all if self.children else [])],
            "paths": self._paths(),
        }

    def _paths(self) -> dict[str, Any]:
        children = self.children.all if self.children else []
        return {"out": str(self.out), "report": str(self.out / "report.json"),
                "plot": str(self.out / "loss.png"),
                "logs": {c.name: str(c.log_path) for c in children},
                "events": {c.name: str(c.events_path) for c in children}}

    def _phase_report(self, phase: _Phase) -> dict[str, Any]:
        trainers = [_peer_report(c) for c in phase.trainers]
        peers = trainers + [_peer_report(c) for c in phase.others]
        wall = (phase.wall_end - phase.wall_start) if phase.wall_start and phase.wall_end \
            else None
        train_seconds = max([p["seconds"] or 0.0 for p in trainers] or [0.0])
        samples = sum(p["samples"] or 0 for p in trainers)
        evaluator = next((c for c in phase.trainers if c.evals), None)
        val_end = None
        if evaluator is not None:
            val_end = (evaluator.done or {}).get("val_loss") or evaluator.evals[-1]["val_loss"]
        round_seconds = [s["round_seconds"] for c in phase.trainers[:1] for s in c.steps
                         if s.get("stepped") and s.get("round_seconds") is not None
                         and s.get("outcome") != "alone"]
        firsts = [p["first_loss"] for p in trainers if p["first_loss"] is not None]
        lasts = [p["last_loss"] for p in trainers if p["last_loss"] is not None]
        return {
            "trainers": len(phase.trainers),
            "wall_seconds": _round(wall, 1),
            "training_seconds": _round(train_seconds, 1),
            "epochs": max([p["epoch"] or 0 for p in trainers] or [0]),
            "samples": samples,
            "samples_per_second": _round(samples / train_seconds, 1) if train_seconds else None,
            "first_loss": _round(_mean(firsts), 4),
            "last_loss": _round(_mean(lasts), 4),
            "mean_round_seconds": _round(_mean(round_seconds), 3),
            # Share of the training time the first trainer spent blocked in rounds.
            "round_time_share": _round(sum(round_seconds) / train_seconds, 3)
            if train_seconds and round_seconds else None,
            "val_loss_start": evaluator.evals[0]["val_loss"] if evaluator else None,
            "val_loss_end": val_end,
            "val_loss_curve": [{"t": e["t"], "epoch": e["epoch"], "val_loss": e["val_loss"]}
                               for e in evaluator.evals] if evaluator else [],
            "peers": peers,
        }

    def _comparison(self) -> dict[str, Any]:
        swarm, solo = self._phase_report(self.swarm), self._phase_report(self.solo)
        result: dict[str, Any] = {}
        if swarm["samples_per_second"] and solo["samples_per_second"]:
            result["samples_per_second_ratio"] = _round(
                swarm["samples_per_second"] / solo["samples_per_second"], 2)
        if swarm["epochs"] and solo["epochs"]:
            result["epochs_ratio"] = _round(swarm["epochs"] / solo["epochs"], 2)
        if swarm["val_loss_end"] is not None and solo["val_loss_end"] is not None:
            result["val_loss_end_difference"] = _round(
                solo["val_loss_end"] - swarm["val_loss_end"], 4)
        return result

    def write_report(self, report: dict[str, Any]) -> Path:
        path = self.out / "report.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        os.replace(tmp, path)
        return path

    def write_plot(self) -> Path | None:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt

        series = [(c, "swarm") for c in self.swarm.trainers] + \
            [(c, "alone") for c in self.solo.trainers]
        if not any(c.steps for c, _ in series):
            return None
        fig, ax = plt.subplots(figsize=(9, 5.5), dpi=100)
        blues = ["#1f4e9c", "#3d7bd9", "#86b0ee"]
        for i, c in enumerate(self.swarm.trainers):
            pts = [(s["t"], s["loss"]) for s in c.steps if s.get("loss") is not None]
            if pts:
                ax.plot(*_columns(pts), color=blues[i % len(blues)], linewidth=1.2,
                        label=f"swarm {c.name}{' (client mode)' if 'client' in c.role else ''}"
                              f": training loss")
        for c in self.solo.trainers:
            pts = [(s["t"], s["loss"]) for s in c.steps if s.get("loss") is not None]
            if pts:
                ax.plot(*_columns(pts), color="#d1495b", linewidth=1.6,
                        label="one peer alone: training loss")
        for phase, color, label in ((self.swarm, "#0b2a5c", "swarm"),
                                    (self.solo, "#8c1c2b", "one peer alone")):
            # One evaluating trainer per phase: the swarm's peers hold the same parameters.
            for c in [c for c in phase.trainers if c.evals][:1]:
                pts = [(e["t"], e["val_loss"]) for e in c.evals if e.get("val_loss") is not None]
                if c.done and c.done.get("reason") in ("duration", "max-epochs") \
                        and c.done.get("val_loss") is not None and c.done.get("t") is not None:
                    pts.append((c.done["t"], c.done["val_loss"]))
                if pts:
                    ax.plot(*_columns(pts), color=color, linestyle="--", marker="o", markersize=4,
                            label=f"{label}: held-out loss")
        a = self.args
        ax.set_xlabel("seconds of training")
        ax.set_ylabel("loss (nats per byte)")
        ax.set_title(f"p2pdl demo: {TRAINERS} trainers (1 client mode) + 1 auxiliary vs one "
                     f"peer alone ({a.mode})\nglobal batch {a.target_batch_size}, "
                     f"batch {a.batch_size} per step, AdamW lr {a.lr:g}, 1 torch thread per peer, "
                     f"{os.cpu_count()} cores", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = self.out / "loss.png"
        fig.savefig(path)
        plt.close(fig)
        return path

    def summary(self, report: dict[str, Any]) -> Any:
        from rich.table import Table

        swarm, solo = report["swarm"], report["solo"]
        table = Table(title="p2pdl demo: summary" + (" (interrupted)" if self.interrupted
                                                     else ""), title_justify="left")
        table.add_column("")
        table.add_column(f"swarm ({swarm['trainers']} trainers + aux)", justify="right")
        table.add_column("one peer alone", justify="right")

        def row(label: str, key: str, digits: int = 3) -> None:
            table.add_row(label, _fmt(swarm.get(key), digits), _fmt(solo.get(key), digits))

        row("training time (s)", "training_seconds", 0)
        row("global steps (epochs)", "epochs", 0)
        row("samples processed", "samples", 0)
        row("samples / s", "samples_per_second", 1)
        row("training loss, first", "first_loss")
        row("training loss, last", "last_loss")
        row("held-out loss, start", "val_loss_start")
        row("held-out loss, end", "val_loss_end")
        rounds = [p["statistics"] for p in swarm["peers"] if p.get("statistics")]
        if rounds:
            averaged = sum(s.get("averaged", 0) for s in rounds)
            failed = sum(s.get("failed", 0) + s.get("partial", 0) for s in rounds)
            table.add_row("rounds averaged / failed (all peers)", f"{averaged} / {failed}", "-")
        if swarm.get("mean_round_seconds") is not None:
            table.add_row("mean round time (s)", f"{swarm['mean_round_seconds']:.2f}", "-")
        if swarm.get("round_time_share") is not None:
            table.add_row("share of time in rounds", f"{swarm['round_time_share']:.0%}", "-")
        return table


def _peer_report(c: _Child) -> dict[str, Any]:
    done = c.done or {}
    last = c.last_step or {}
    return {
        "name": c.name, "role": c.role,
        "peer_id": (c.ready or {}).get("peer_id"),
        "addrs": (c.ready or {}).get("addrs", c.addrs),
        "client_mode": (c.ready or {}).get("client_mode"),
        "finished": c.done is not None, "reason": done.get("reason"),
        "returncode": c.returncode,
        "epoch": done.get("epoch", last.get("epoch")),
        "samples": done.get("samples", last.get("samples")),
        "seconds": done.get("t", last.get("t")),
        "samples_per_second": done.get("samples_per_second"),
        "first_loss": (c.first_step or {}).get("loss"),
        "last_loss": done.get("loss", last.get("loss")),
        "val_loss_start": c.evals[0]["val_loss"] if c.evals else None,
        "val_loss_end": done.get("val_loss"),
        "statistics": done.get("statistics"),
        "log": str(c.log_path),
    }


def _columns(points: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    return [x for x, _ in points], [y for _, y in points]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _round(value: float | None, digits: int) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


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
                async with _open_children(demo.logs, demo.args.log_level) as children:
                    demo.children = children
                    with main:
                        await demo.run(children)
            finally:
                nursery.cancel_scope.cancel()


def main_demo(args: argparse.Namespace) -> int:
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
    report = demo.report()
    plot = demo.write_plot()
    if plot is None:
        report["paths"]["plot"] = None
    path = demo.write_report(report)
    console.print(demo.summary(report))
    console.print(f"report: {path}")
    if plot is not None:
        console.print(f"plot:   {plot}")
    console.print(f"logs:   {demo.logs}/")
    if demo.interrupted:
        return 130
    return 1 if demo.error else 0
