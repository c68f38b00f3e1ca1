"""``p2pdl train``: a training peer of a task (the built-in example by default).

    p2pdl train [--task MODULE:FACTORY [--task-arg KEY=VALUE ...]]
                [--initial-peers MULTIADDR ...] [--run-id NAME] [--auxiliary | --client-mode]
                [--target-batch-size N] [--batch-size N] [--duration S] [--json-lines]
                [--authority ID --certificate FILE | --allowlist FILE] [--revocations FILE]
                [--metrics HOST:PORT] ...

One process is one peer: a sync :class:`~p2pdl.Node` (trio in its thread)
and a :class:`~p2pdl.Optimizer` over the task's model, trained by a plain
loop in the main thread.  The task is the built-in example
(:class:`~p2pdl.training.ExampleTask`) or the one ``--task`` names (the
protocol: :mod:`p2pdl.training._task`); :class:`~p2pdl.training.TaskRunner`
calls it, so that an error in the task's code is one line naming the
function and the line.  Every peer builds the model from the task's seed, so
all start from the same parameters; each draws its own batches
(``--peer-index``).

Output is either human (the addresses, then a status line every
``--status-interval`` seconds) or, with ``--json-lines``, one JSON object per
line on stdout (see :data:`EVENTS`), for ``p2pdl demo`` and other programs.

Membership (``_runs``): the run is open unless ``--authority ID
--certificate FILE`` or ``--allowlist FILE`` close it; the flags are checked
against this peer's id before anything starts, and the peer says which mode
the run is in (a line after the addresses, or the ``ready`` event's
``membership``).

Stopping: SIGINT or SIGTERM interrupts whatever the loop is doing (a local
step, or a wait for a round: the round is abandoned), then the optimizer is
closed and the node shut down, within seconds; the exit status is 0, as when
``--duration`` or ``--max-epochs`` ends the run.  A second signal exits at
once (status 130).  If stdout goes away (the reader died), the peer stops too.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import signal
import sys
import time
from collections.abc import Iterator
from typing import Any

from ..averaging import AGGREGATORS, Aggregator
from ..metrics import start_metrics
from ._args import (
    ATTACK_KINDS,
    UsageError,
    add_identity,
    add_initial_peers,
    add_listen,
    add_metrics,
    display_name,
    non_negative_float,
    non_negative_int,
    option_pair,
    positive_float,
    positive_int,
    run_id_text,
    tau_value,
)
from ._format import cell, finite
from ._runs import add_membership, closed, identity_path, peer_id_of_identity, plan_runs

__all__ = ["EVENTS", "add_parser", "derive_peer_index", "run"]

logger = logging.getLogger(__name__)

#: Seconds between human status lines (default of --status-interval).
STATUS_INTERVAL = 5.0
#: Most seconds between two ``step`` events with --json-lines (besides one per epoch).
EVENT_INTERVAL = 1.0
#: Weight of the newest batch in the training-loss moving average (~10 steps).
LOSS_EMA_WEIGHT = 0.1
#: How long an auxiliary peer's ``step()`` waits for a round before the loop
#: looks at its deadline and signals again (s).
AUX_READY_TIMEOUT = 10.0
#: Held-out batches (of --batch-size windows) per evaluation, by default.
EVAL_BATCHES = 4
#: AdamW's learning rate for a task that builds no optimizer (--lr).
DEFAULT_LR = 1e-3
#: Longest wait for --wait-for-peers, by default (s).
WAIT_FOR_PEERS_TIMEOUT = 60.0

#: The events of --json-lines, each one JSON object on one line of stdout.
EVENTS = {
    "ready": "peer_id, addrs, peer_index, role (trainer | auxiliary), attack (--attack, "
             "or null), task (--task, or null: the built-in example), client_mode, run_id, "
             "target, batch_size, parameters, codec (--codec), error_feedback (on with "
             "uint8 and uint4), membership (open | allowlist | certificate), "
             "membership_note (the run's mode in words)",
    "metrics": "url (with --metrics: where Prometheus scrapes this peer)",
    "started": "training began (after --wait-for-peers): peers",
    "step": "t (s since training began), epoch, loss (moving average of the local "
            "training loss), samples (local total), global_samples, target, peers, "
            "stepped (a global step in this call), outcome, group_size, round_seconds; "
            "one per epoch and at least every second",
    "eval": "t, epoch, val_loss (held-out loss of the current parameters)",
    "done": "t, reason (duration | max-epochs | signal | stdout-closed), epoch, samples, "
            "local_steps, loss, val_loss (the latest held-out loss; measured at the end "
            "unless stopped by a signal), samples_per_second, statistics (the optimizer's), "
            "admission (the node's gate: requests admitted and refused), "
            "membership_statistics (the node's membership record), flags, first_flagged "
            "and bans (the node's flag book for the run: counts by kind, the time of "
            "each kind's first flag, the bans in force)",
}


# -- argument parsing --------------------------------------------------------------

def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``p2pdl train`` to the ``p2pdl`` parser's subcommands."""
    p = sub.add_parser(
        "train", help="train a model as one peer of a collaboration (your task, or the "
                      "built-in example: a small byte-level transformer on Python's "
                      "documentation)",
        description="Train a task as one peer: yours (--task), or the built-in example, a "
                    "small transformer language model on the documentation text that ships "
                    "with Python (no downloads).  "
                    "Peers with the same --run-id that reach each other (--initial-peers) "
                    "train one model together.  Ctrl-C or SIGTERM stops it cleanly.")
    p.add_argument("--task", default=None, metavar="MODULE:FACTORY",
                   help="train your own task: FACTORY in MODULE (or in a FILE.py) returns an "
                        "object with batch_size, build_model(), batches(peer_index) and "
                        "loss(model, batch), and optionally build_optimizer(model), "
                        "build_scheduler(optimizer) and validation_loss(model, max_batches) "
                        "(docs/training.md; default: the built-in example, "
                        "p2pdl.training:ExampleTask)")
    p.add_argument("--task-arg", action="append", default=[], type=option_pair,
                   metavar="KEY=VALUE",
                   help="a keyword argument for --task's factory, as a string (repeatable)")
    p.add_argument("--run-id", default="p2pdl-example", type=run_id_text,
                   help="the collaboration's name; every peer of a run uses the same "
                        "(default: p2pdl-example)")
    add_initial_peers(p, "join through")
    add_listen(p)
    add_identity(p)
    role = p.add_mutually_exclusive_group()
    role.add_argument("--client-mode", action="store_true",
                      help="never accept connections (a peer behind NAT): send parts, "
                           "reduce none")
    role.add_argument("--auxiliary", action="store_true",
                      help="compute no gradients: only help average (a CPU box with a good link)")
    p.add_argument("--target-batch-size", type=positive_int, default=256, metavar="N",
                   help="samples the whole swarm processes per global step (default 256)")
    p.add_argument("--batch-size", type=positive_int, default=None, metavar="N",
                   help="samples per local step of the built-in example (default 16; a "
                        "--task sets its own batch_size)")
    p.add_argument("--lr", type=positive_float, default=None,
                   help="AdamW learning rate (the inner one with --mode diloco; default "
                        f"{DEFAULT_LR:g}) for a task without build_optimizer")
    p.add_argument("--mode", choices=["dedloc", "diloco"], default="dedloc",
                   help="dedloc: average gradients, one global step per epoch (default); "
                        "diloco: local steps, then average the parameter deltas")
    p.add_argument("--delay-updates", action="store_true",
                   help="average in the background while the next batches compute; the "
                        "result is applied one step late (diloco: the inner steps taken "
                        "meanwhile are kept)")
    p.add_argument("--fragments", type=positive_int, default=1, metavar="N",
                   help="diloco: average one of N fragments of the parameters per epoch, in "
                        "turn (Streaming DiLoCo; default 1: all of them)")
    p.add_argument("--matchmaking-time", type=positive_float, default=None, metavar="SECONDS",
                   help="longest wait to form an averaging group (default: the node's, 15 s)")
    p.add_argument("--discovery-time", type=non_negative_float, default=None, metavar="SECONDS",
                   help="how long a peer that sees no other keeps accumulating before it steps "
                        "alone (default: the optimizer's, 10 s; 0 for a peer meant to train "
                        "alone)")
    p.add_argument("--bandwidth", type=positive_float, default=None, metavar="MBIT_S",
                   help="this peer's bandwidth in Mbit/s, for the load plan (default: what "
                        "its own rounds measured)")
    p.add_argument("--aggregator", choices=list(AGGREGATORS), default="centered_clip",
                   help="how reducers combine the copies of each chunk: centered_clip (the "
                        "default, robust to a malicious minority), mean (exact, for peers "
                        "that trust each other) or another robust rule; every peer of a run "
                        "must use the same (docs/allreduce.md, Robust aggregation)")
    p.add_argument("--tau", type=tau_value, default="auto",
                   help="CenteredClip's clipping radius per chunk, or 'auto' (the default): "
                        "each chunk's own, from its contributors' distances "
                        "(--aggregator centered_clip)")
    p.add_argument("--codec", choices=["fp16", "uint8", "uint4", "topk", "qtopk", "none"],
                   default="fp16",
                   help="how the large tensors travel in a round: fp16 (the default, 2 bytes "
                        "a value), uint8 (about 1), uint4 (about 0.53), topk (the 8 largest "
                        "of every 256 values, 0.125 bytes a value sent; results carry the "
                        "union of the members' positions), qtopk (topk with 2-bit values, "
                        "0.055 bytes a value sent; results with 8-bit values) or none (4, "
                        "exact); with uint8, uint4, topk and qtopk each peer carries what the "
                        "codec dropped to its next round (error feedback); every peer of a "
                        "run must use the same (docs/training.md)")
    p.add_argument("--clip-sent-norm", type=positive_float, default=None, metavar="NORM",
                   help="clip what this peer sends to a round to this total norm (default: "
                        "none)")
    p.add_argument("--attack", choices=ATTACK_KINDS, default=None, metavar="KIND",
                   help="misbehave on purpose, to see the others catch it (p2pdl demo "
                        "--attacker): " + ", ".join(ATTACK_KINDS) + " (docs/security.md)")
    p.add_argument("--name", type=display_name, default=None, metavar="NAME",
                   help="a display name this peer's progress reports carry, for people "
                        "watching the run (p2pdl monitor); nothing counts it (default: none)")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="write checkpoints here and resume from the newest (default: none)")
    p.add_argument("--resume-from", metavar="DIR", default=None,
                   help="start from the newest checkpoint in DIR (a monitor's --backup-dir) "
                        "when --checkpoint-dir holds none")
    p.add_argument("--checkpoint-every", type=positive_int, default=10, metavar="EPOCHS",
                   help="epochs between checkpoints (default 10)")
    p.add_argument("--peer-index", type=non_negative_int, default=None, metavar="N",
                   help="which stream of training batches to draw (default: derived from the "
                        "peer id, so peers differ)")
    p.add_argument("--max-epochs", type=positive_int, default=None, metavar="N",
                   help="stop once the model has taken this many global steps")
    p.add_argument("--duration", type=positive_float, default=None, metavar="SECONDS",
                   help="stop after training this long (default: until stopped)")
    p.add_argument("--wait-for-peers", type=positive_int, default=1, metavar="N",
                   help="before training, wait until N peers (this one included, auxiliary "
                        "ones too) take part in the run, at most --wait-timeout (default 1)")
    p.add_argument("--wait-timeout", type=positive_float, default=WAIT_FOR_PEERS_TIMEOUT,
                   metavar="SECONDS",
                   help=f"longest wait for --wait-for-peers (default {WAIT_FOR_PEERS_TIMEOUT:g})")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch threads (default 1)")
    p.add_argument("--eval-every", type=positive_int, default=None, metavar="EPOCHS",
                   help="measure the held-out loss every this many epochs, and at the start "
                        "and the end (default: only at the end)")
    p.add_argument("--eval-batches", type=positive_int, default=EVAL_BATCHES, metavar="N",
                   help=f"held-out batches per evaluation (default {EVAL_BATCHES}; "
                        f"the held-out text has 12 of 16 windows)")
    p.add_argument("--json-lines", action="store_true",
                   help="print machine-readable events on stdout, one JSON object per line "
                        "(ready, started, step, eval, done)")
    p.add_argument("--status-interval", type=positive_float, default=STATUS_INTERVAL,
                   metavar="SECONDS",
                   help=f"seconds between human status lines (default {STATUS_INTERVAL:g})")
    add_membership(p)
    add_metrics(p)
    p.set_defaults(handler=run)


# -- signals -----------------------------------------------------------------------

class _Stopped(Exception):
    """Raised in the main thread by the first SIGINT / SIGTERM (or a closed stdout)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Interrupts:
    """SIGINT and SIGTERM stop the run: the first raises :class:`_Stopped` in
    the main thread, unless inside :meth:`shielded` (then it is raised when the
    shield ends); a second one raises KeyboardInterrupt (exit at once)."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._shield = 0
        self._closing = False
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._previous[signum] = signal.signal(signum, self._handle)

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: object) -> None:
        if self.reason is not None:
            raise KeyboardInterrupt
        self.reason = "signal"
        logger.info("received %s, stopping", signal.Signals(signum).name)
        if not self._shield and not self._closing:
            raise _Stopped("signal")

    @contextlib.contextmanager
    def shielded(self) -> Iterator[None]:
        """Defer the first signal until the block ends (for whole output lines)."""
        self._shield += 1
        try:
            yield
        finally:
            self._shield -= 1
        if not self._shield and not self._closing and self.reason is not None:
            raise _Stopped(self.reason)

    def closing(self) -> None:
        """From now on the first signal only records (cleanup runs to its end)."""
        self._closing = True


# -- output ------------------------------------------------------------------------

class _Output:
    """Events as JSON lines, or human lines; a write to a closed stdout stops the run."""

    def __init__(self, json_lines: bool, interrupts: _Interrupts) -> None:
        self.json_lines = json_lines
        self._interrupts = interrupts

    def _write(self, text: str) -> None:
        with self._interrupts.shielded():
            try:
                sys.stdout.write(text + "\n")
                sys.stdout.flush()
            except (BrokenPipeError, OSError, ValueError):
                if self._interrupts.reason is None:
                    self._interrupts.reason = "stdout-closed"
                raise _Stopped("stdout-closed") from None

    def event(self, name: str, **fields: Any) -> None:
        if self.json_lines:
            self._write(json.dumps({"event": name, **fields}, default=_jsonable,
                                   allow_nan=False))

    def human(self, text: str) -> None:
        if not self.json_lines:
            self._write(text)


def _jsonable(value: Any) -> Any:
    return str(value)


def derive_peer_index(peer_id_bytes: bytes) -> int:
    """A stable stream index from a peer id (different peers, different batches)."""
    return int.from_bytes(hashlib.blake2b(peer_id_bytes, digest_size=4).digest(), "big")


# -- the run -----------------------------------------------------------------------

@dataclasses.dataclass
class _Progress:
    """What the loop knows of its own training, for events and status lines."""

    start: float = 0.0
    loss: float | None = None
    val_loss: float | None = None
    samples: int = 0
    last_event: float = -math.inf
    last_status: float = -math.inf
    last_epoch: int = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.start if self.start else 0.0

    def add_loss(self, loss: float) -> None:
        self.loss = loss if self.loss is None else \
            (1 - LOSS_EMA_WEIGHT) * self.loss + LOSS_EMA_WEIGHT * loss


def run(args: argparse.Namespace) -> int:
    """Run ``p2pdl train`` with parsed ``args``; return the exit status.

    Raises :class:`~p2pdl.errors.P2PDLError` (a ConfigError for bad input)
    for the caller to print.
    """
    interrupts = _Interrupts()
    interrupts.install()
    try:
        return _run(args, interrupts)
    except _Stopped:  # a signal before the node or the optimizer was up
        return 0
    finally:
        interrupts.restore()


def _run(args: argparse.Namespace, interrupts: _Interrupts) -> int:
    # The membership flags are checked first: a mistake there is one line, at once.
    identity = identity_path(args)
    plan = plan_runs(args, [args.run_id],
                     peer_id_of_identity(identity) if closed(args) else None)
    for line in plan.lines:
        logger.info("%s", line)

    import torch

    from .. import Node, NodeConfig, Optimizer
    from ..training import count_parameters

    torch.set_num_threads(args.threads)
    with contextlib.suppress(RuntimeError):  # only possible before any parallel work
        torch.set_num_interop_threads(1)
    task = _load_task(args)
    model = task.build_model()
    lr = DEFAULT_LR if args.lr is None else args.lr
    inner = task.build_optimizer(
        model, lambda m: torch.optim.AdamW(m.parameters(), lr=lr))
    scheduler = task.build_scheduler(inner)

    config = NodeConfig.build(listen=args.listen, initial_peers=args.initial_peers,
                              identity_path=identity)
    if args.client_mode:
        config = dataclasses.replace(config,
                                     nat=dataclasses.replace(config.nat, client_mode=True))
    out = _Output(args.json_lines, interrupts)
    node = Node(config, handle_sigterm=False, runs=plan.policies)
    opt: Any = None
    trainer: Any = None   # the optimizer, or the attack wrapped around it (--attack)
    progress = _Progress()
    reason = "duration"
    # What ends the run, for the optimizer's __exit__: on a stop or an error a
    # round in flight is abandoned rather than waited for.
    exc_info: tuple[Any, Any, Any] = (None, None, None)
    gate: dict[str, Any] = {}
    try:
        stored = node.membership.publish_revocations(plan.revocations) \
            if plan.revocations is not None else None
        peer_index = args.peer_index if args.peer_index is not None \
            else derive_peer_index(node.peer_id.to_bytes())
        options: dict[str, Any] = {"mode": args.mode, "delay_updates": args.delay_updates,
                                   "auxiliary": args.auxiliary,
                                   "checkpoint_every": args.checkpoint_every}
        if args.fragments != 1:
            options["fragments"] = args.fragments
        if args.auxiliary:
            options["ready_timeout"] = AUX_READY_TIMEOUT
        if args.matchmaking_time is not None:
            options["matchmaking_time"] = args.matchmaking_time
        if args.discovery_time is not None:
            options["discovery_time"] = args.discovery_time
        if args.bandwidth is not None:
            options["bandwidth"] = args.bandwidth * 1e6 / 8
        if args.checkpoint_dir is not None:
            options["checkpoint_dir"] = args.checkpoint_dir
        if args.name is not None:
            options["display_name"] = args.name
        if args.resume_from is not None:
            options["resume_from"] = args.resume_from
        options["allreduce"] = dataclasses.replace(
            config.allreduce, aggregator=Aggregator(args.aggregator, tau=args.tau)
            if args.aggregator == "centered_clip" else Aggregator(args.aggregator),
            codecs=dataclasses.replace(config.allreduce.codecs, large=args.codec))
        if args.clip_sent_norm is not None:
            options["clip_sent_norm"] = args.clip_sent_norm
        opt = Optimizer(node=node, run_id=args.run_id, optimizer=inner, scheduler=scheduler,
                        target_batch_size=args.target_batch_size,
                        batch_size_per_step=task.batch_size, **options)
        trainer = opt
        if args.attack is not None:
            from ..training import ATTACKS

            trainer = ATTACKS[args.attack](opt)
            logger.warning("this peer attacks the run on purpose: %s", args.attack)
        addrs = node.addrs
        out.event("ready", peer_id=str(node.peer_id), addrs=addrs, peer_index=peer_index,
                  role="auxiliary" if args.auxiliary else "trainer", attack=args.attack,
                  client_mode=args.client_mode, run_id=args.run_id,
                  target=args.target_batch_size, batch_size=task.batch_size, task=args.task,
                  parameters=count_parameters(model), epoch=opt.local_epoch,
                  codec=args.codec, error_feedback=opt.rounds.feedback is not None,
                  membership=plan.mode, membership_note=plan.lines[0])
        for addr in addrs:
            out.human(addr)
        if args.metrics is not None:
            host, port = start_metrics(node, args.metrics)
            out.event("metrics", url=f"http://{host}:{port}/metrics")
            out.human(f"metrics: http://{host}:{port}/metrics")
        for line in plan.lines:
            out.human(line)
        if stored is not None:
            out.human(plan.published_line(stored))
        _wait_for_peers(opt, args, out)
        progress.start = time.monotonic()
        progress.last_epoch = opt.local_epoch
        out.event("started", peers=opt.global_progress().num_peers, epoch=opt.local_epoch)
        if args.eval_every is not None and not args.auxiliary:
            _evaluate(task, model, opt, args, progress, out)
        if args.auxiliary:
            reason = _assist_loop(opt, args, progress, out)
        else:
            reason = _train_loop(task, model, trainer, args, peer_index, progress, out)
    except _Stopped as exc:
        reason = exc.reason
        exc_info = (type(exc), exc, None)
    except BaseException as exc:
        exc_info = (type(exc), exc, exc.__traceback__)
        raise
    finally:
        interrupts.closing()
        try:
            if opt is not None:
                opt.__exit__(*exc_info)
        finally:
            gate = _node_record(node, args.run_id)  # while the node still runs
            node.shutdown()
    if opt is None:
        return 0
    stopped = reason in ("signal", "stdout-closed")
    if not args.auxiliary and not stopped:  # a stop should be quick: no final evaluation
        with contextlib.suppress(_Stopped):
            progress.val_loss = task.validation_loss(model, args.eval_batches)
    elapsed = progress.elapsed()
    stats = (trainer or opt).statistics()
    sps = progress.samples / elapsed if elapsed > 0 else 0.0
    with contextlib.suppress(_Stopped):
        out.event("done", t=finite(elapsed, 3), reason=reason, epoch=opt.local_epoch,
                  samples=progress.samples, local_steps=stats["local_steps"],
                  loss=finite(progress.loss), val_loss=finite(progress.val_loss),
                  samples_per_second=finite(sps, 2), statistics=stats, **gate)
        out.human(f"done ({reason}): epoch {opt.local_epoch}, {progress.samples} samples in "
                  f"{elapsed:.0f} s ({sps:.1f} samples/s), loss {cell(progress.loss)}, "
                  f"held-out loss {cell(progress.val_loss)}")
    return 0


def _node_record(node: Any, run_id: str) -> dict[str, Any]:
    """What the node's gate, membership and flag book decided, for the ``done``
    event (a shut down node: what it recorded last; empty where it cannot
    say): ``flags`` (peer -> count by kind), ``first_flagged`` (peer -> kind ->
    the wall-clock time of its first flag) and ``bans`` (peer -> run, until,
    reason) of the run."""
    record: dict[str, Any] = {}
    try:
        record["flags"] = node.flagged(run_id)
        record["bans"] = _plain(node.banned(run_id))
        book = node.trio_node.flags
        record["first_flagged"] = node.portal.run_sync(lambda: book.first_flagged(run_id))
    except Exception:
        logger.debug("no flags at the end", exc_info=True)
    try:
        record["admission"] = _plain(node.statistics().admission)
    except Exception:  # the node is gone: the event goes without it
        logger.debug("no admission statistics at the end", exc_info=True)
    try:
        record["membership_statistics"] = _plain(node.membership.statistics())
    except Exception:
        logger.debug("no membership statistics at the end", exc_info=True)
    return record


def _plain(value: Any) -> Any:
    """A statistics record as plain JSON data."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _deadline_passed(args: argparse.Namespace, progress: _Progress) -> bool:
    return args.duration is not None and progress.elapsed() >= args.duration


def _wait_for_peers(opt: Any, args: argparse.Namespace, out: _Output) -> None:
    if args.wait_for_peers <= 1:
        return
    deadline = time.monotonic() + args.wait_timeout
    last = 0.0
    while True:
        peers = opt.global_progress().num_peers
        if peers >= args.wait_for_peers:
            return
        if time.monotonic() >= deadline:
            logger.warning("only %d of %d peers joined within %.0f s; training anyway",
                           peers, args.wait_for_peers, args.wait_timeout)
            return
        if time.monotonic() - last >= args.status_interval:
            last = time.monotonic()
            out.human(f"waiting for peers: {peers} of {args.wait_for_peers}")
        time.sleep(0.1)


def _load_task(args: argparse.Namespace) -> Any:
    """The task to train, as a :class:`~p2pdl.training.TaskRunner`: the built-in
    example, or the one ``--task`` names (UsageError for flags that do not
    apply to it, TaskError for a task that does not load)."""
    from ..training import ExampleConfig, ExampleTask, TaskRunner, load_task

    if args.task is None:
        if args.task_arg:
            raise UsageError("--task-arg: only with --task")
        example = ExampleConfig() if args.batch_size is None \
            else ExampleConfig(batch_size=args.batch_size)
        return TaskRunner(ExampleTask(example), "the example", passthrough=(_Stopped,))
    if args.batch_size is not None:
        raise UsageError("--batch-size: only for the built-in example (a --task sets its "
                         "own batch_size)")
    keys = [key for key, _ in args.task_arg]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise UsageError(f"--task-arg: {', '.join(twice)} given more than once")
    task, source = load_task(args.task, dict(args.task_arg))
    runner = TaskRunner(task, args.task, source=source, passthrough=(_Stopped,))
    if args.lr is not None and runner.has("build_optimizer"):
        raise UsageError("--lr: the task builds its own optimizer (build_optimizer)")
    if args.eval_every is not None and not runner.has("validation_loss"):
        raise UsageError("--eval-every: the task has no validation_loss")
    return runner


def _train_loop(task: Any, model: Any, opt: Any, args: argparse.Namespace, peer_index: int,
                progress: _Progress, out: _Output) -> str:
    from .. import Optimizer

    task.start(peer_index)
    while True:
        if _deadline_passed(args, progress):
            return "duration"
        if args.max_epochs is not None and opt.local_epoch >= args.max_epochs:
            return "max-epochs"
        loss = task.loss(model, task.next_batch())
        task.backward(loss)
        progress.add_loss(float(loss.detach()))
        # The optimizer's reports carry the moving average (an attack wrapper's do not).
        stepped = opt.step(loss=progress.loss) if isinstance(opt, Optimizer) else opt.step()
        opt.zero_grad()
        progress.samples += task.batch_size
        _report(opt, args, progress, out, stepped)
        if args.eval_every is not None and opt.local_epoch != progress.last_epoch \
                and opt.local_epoch % args.eval_every == 0:
            _evaluate(task, model, opt, args, progress, out)
        progress.last_epoch = opt.local_epoch


def _assist_loop(opt: Any, args: argparse.Namespace, progress: _Progress,
                 out: _Output) -> str:
    while True:
        if _deadline_passed(args, progress):
            return "duration"
        if args.max_epochs is not None and opt.local_epoch >= args.max_epochs:
            return "max-epochs"
        stepped = opt.step()
        _report(opt, args, progress, out, stepped)
        progress.last_epoch = opt.local_epoch


def _report(opt: Any, args: argparse.Namespace, progress: _Progress, out: _Output,
            stepped: bool) -> None:
    now = time.monotonic()
    new_epoch = opt.local_epoch != progress.last_epoch
    event_due = out.json_lines and (new_epoch or now - progress.last_event >= EVENT_INTERVAL)
    status_due = not out.json_lines and now - progress.last_status >= args.status_interval
    if not (event_due or status_due):
        return
    gp = opt.global_progress()
    info = opt.last_round
    if event_due:
        progress.last_event = now
        out.event("step", t=finite(progress.elapsed(), 3), epoch=opt.local_epoch,
                  loss=finite(progress.loss), samples=progress.samples,
                  global_samples=gp.samples_accumulated, target=gp.target_batch_size,
                  peers=gp.num_peers, clients=gp.num_clients, auxiliary=gp.num_auxiliary,
                  swarm_samples_per_second=finite(gp.samples_per_second, 1),
                  stepped=stepped, outcome=info.outcome if info else None,
                  group_size=info.group_size if info else None,
                  round_seconds=finite(info.seconds, 3) if info else None)
    if status_due:
        progress.last_status = now
        last = "none yet" if info is None else \
            f"{info.outcome} ({info.group_size} peer(s), {info.seconds:.1f} s)"
        out.human(f"status: epoch {opt.local_epoch} | loss {cell(progress.loss)} | "
                  f"swarm {gp.samples_accumulated}/{gp.target_batch_size} samples | "
                  f"{gp.num_peers} peer(s) ({gp.num_clients} client, {gp.num_auxiliary} "
                  f"auxiliary) | {gp.samples_per_second:.0f} samples/s | last round {last} | "
                  f"up {progress.elapsed():.0f} s")


def _evaluate(task: Any, model: Any, opt: Any, args: argparse.Namespace,
              progress: _Progress, out: _Output) -> None:
    progress.val_loss = task.validation_loss(model, args.eval_batches)
    out.event("eval", t=finite(progress.elapsed(), 3), epoch=opt.local_epoch,
              val_loss=finite(progress.val_loss))
    out.human(f"eval: epoch {opt.local_epoch} | held-out loss {progress.val_loss:.3f}")

