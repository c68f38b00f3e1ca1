"""Averaging rounds of the training layer: :class:`Rounds`, :class:`RoundInfo`.

A round is one ``node.allreduce.start_round`` (form a group for the epoch,
then the all-reduce, in the node's thread), which returns a
:class:`concurrent.futures.Future`.  :class:`Rounds` starts it, waits for it
(at most the node's ``round_limit``), and judges what came back: every part
averaged, some parts partial, or no group at all.  With delayed updates one
round runs in the background (:class:`PendingRound`) while the next batches
compute; an auxiliary peer's rounds carry no values of its own
(:meth:`Rounds.assist`).

What a round's result does to the parameters is the strategy's
(``_strategies``); what a failed or partial round means for the state, the
state keeper's (``_state_keeping``).

A round's weight is the samples this peer accumulated for the epoch, the
count its tracker was just told; reducers cap a weight at what the sender's
signed progress reports support (docs/allreduce.md), so before each round
with samples :class:`Rounds` has the tracker publish that report at once
(``publish_now``) rather than when its publish policy would.

Error feedback (``OptimizerConfig.error_feedback``): what the codecs rounded
off this peer's values in a round (``AllReduceResult.sent_error``) is added
to what it sends in its next round, so that over rounds nothing is lost to
the rounding but the last round's (:class:`ErrorFeedback`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..averaging import AllReduceResult
from ..errors import CallTimeoutError, MatchmakingFailedError, P2PDLError
from ._node_api import TrainingNode, TrainingTracker
from .config import OptimizerConfig

if TYPE_CHECKING:
    from ..progress import GlobalProgress

__all__ = ["RoundInfo", "RoundResult", "PendingRound", "Rounds", "ErrorFeedback",
           "AUXILIARY_POLL", "ROUND_HISTORY", "LOSSY_CODECS", "clear_incomplete"]

logger = logging.getLogger(__name__)

#: How often an auxiliary peer looks for the next epoch after joining a round (s).
AUXILIARY_POLL = 0.05
#: Rounds an optimizer remembers (``Optimizer.round_history``).
ROUND_HISTORY = 1024
#: The codecs whose rounding ``error_feedback="auto"`` carries over.
LOSSY_CODECS = ("uint8", "uint4", "topk", "qtopk")


class ErrorFeedback:
    """One peer's error feedback: the rounding of its last round's values,
    added to the next round's (sans-IO).

    :meth:`compensate` returns the values to send (new tensors: the given
    ones are left alone); :meth:`keep` takes what the round's codecs rounded
    off them (``AllReduceResult.sent_error``), or None where the values sent
    were applied as they are or dropped (a step alone, a failed round).
    Summed over rounds, the values the reducers decoded plus the residual
    are the values given, up to float32 rounding.

    ``key`` keeps one residual per kind of round (DiLoCo's fragments: the
    residual of a fragment goes to that fragment's next round)."""

    def __init__(self) -> None:
        self._residuals: dict[int, list[torch.Tensor]] = {}

    @property
    def residual(self) -> list[torch.Tensor] | None:
        """The residual of key 0 (None: none)."""
        return self._residuals.get(0)

    def compensate(self, values: Sequence[torch.Tensor], key: int = 0) -> list[torch.Tensor]:
        residual = self._residuals.get(key)
        if residual is None or len(residual) != len(values) or any(
                r.shape != v.shape for r, v in zip(residual, values, strict=True)):
            return list(values)
        return [v + r.to(v.dtype) for v, r in zip(values, residual, strict=True)]

    def keep(self, errors: Sequence[torch.Tensor] | None, key: int = 0) -> None:
        if errors is None:
            self._residuals.pop(key, None)
        else:
            self._residuals[key] = list(errors)


@dataclasses.dataclass(frozen=True)
class RoundInfo:
    """What the last averaging round did, as ``opt.last_round`` says.

    ``outcome`` is ``"averaged"`` (every part completed), ``"partial"``
    (some parts kept this peer's own values), ``"alone"`` (no other peer:
    a local step), ``"failed"`` (no group: ``on_failure`` applied).
    ``opt.round_history()`` keeps the last :data:`ROUND_HISTORY` of them.
    """

    epoch: int
    outcome: str
    group_size: int
    samples: int
    seconds: float
    error: str | None = None
    #: The members whose values this peer's own part took in the round (base58
    #: ids, this peer included): the group less those its reducer excluded.
    #: Empty for a failed round or a step alone.
    contributors: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """A judged round: what this peer sent and what came back (None: the round failed)."""

    info: RoundInfo
    sent: list[torch.Tensor]
    averaged: list[torch.Tensor] | None
    #: members of the group that serve state (neither client mode nor auxiliary)
    servers: int = 0
    #: the group's members that accept connections (not in client mode), peer ids
    reachable: tuple[Any, ...] = ()
    #: parts this peer completed that a member said after the round it lacks,
    #: while their reducer was alive (AllReduceResult.disputed): states differ
    disputed: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class PendingRound:
    """A round running in the background (delayed updates).

    ``grouped`` is set in the node's thread once the group formed; until then
    the round is still in matchmaking.
    """

    future: concurrent.futures.Future[AllReduceResult]
    epoch: int
    sent: list[torch.Tensor]
    samples: int
    started: float
    grouped: threading.Event


class Rounds:
    """Start, wait for and judge the averaging rounds of one run.

    It owns the background round (``pending``), the round counters, and when
    the view last had another trainer (for stepping alone).  Called from the
    training thread only.
    """

    def __init__(self, node: TrainingNode, run_id: str, config: OptimizerConfig, *,
                 tracker: TrainingTracker | None = None) -> None:
        self.node = node
        self.run_id = run_id
        self.config = config
        #: The run's tracker, whose report backs each round's weight (the
        #: Optimizer sets it once it tracks the run; None: nothing to publish).
        self.tracker = tracker
        self.pending: PendingRound | None = None
        self._assisted: int | None = None   # the epoch whose round an auxiliary peer joined
        self._seen_others = time.monotonic()   # when the view last had another trainer
        self._counters = {"rounds": 0, "averaged": 0, "partial": 0, "alone": 0, "failed": 0}
        #: error feedback, when ``config.error_feedback`` resolves to on (None: off)
        self.feedback = ErrorFeedback() if _feedback_on(config, node) else None
        #: The last :data:`ROUND_HISTORY` rounds, oldest first.
        self.history: collections.deque[RoundInfo] = collections.deque(maxlen=ROUND_HISTORY)

    def statistics(self) -> dict[str, int]:
        """Rounds started, and how they ended: averaged, partial, alone, failed."""
        return dict(self._counters)

    # -- alone or together --------------------------------------------------------------

    def observe(self, progress: GlobalProgress) -> None:
        """Note the view: whether another trainer is in it."""
        if progress.num_peers - progress.num_auxiliary > 1:
            self._seen_others = time.monotonic()

    @staticmethod
    def alone(progress: GlobalProgress) -> bool:
        """Whether no other trainer is in the view."""
        return progress.num_peers - progress.num_auxiliary <= 1

    def discovering(self) -> bool:
        """Whether the view had another trainer less than ``discovery_time`` ago.

        Peers started together may not have heard of each other yet, and a
        view that lost the others for a moment (late reports under load) is
        not a swarm of one: stepping alone would drift apart.
        """
        return time.monotonic() - self._seen_others < self.config.discovery_time

    # -- one round ----------------------------------------------------------------------

    def start(self, epoch: int, tensors: Sequence[torch.Tensor], samples: int, *,
              auxiliary: bool = False, grouped: threading.Event | None = None
              ) -> concurrent.futures.Future[AllReduceResult]:
        """Start the round of ``epoch``, averaging ``tensors`` in place, weighted by ``samples``.

        ``samples`` must be what the tracker was last told for ``epoch`` (the
        Optimizer reports its count just before); that report is published
        first, so that the reducers hold the evidence of this weight.
        """
        config = self.config
        if samples > 0 and not auxiliary:
            self._publish_weight()
        on_group = (lambda group: grouped.set()) if grouped is not None else None
        options: dict[str, Any] = {"sent_error": True} \
            if self.feedback is not None and not auxiliary else {}
        return self.node.allreduce.start_round(
            self.run_id, epoch, tensors, weight=float(samples), config=config.allreduce,
            inplace=True, on_group=on_group, auxiliary=auxiliary,
            matchmaking_time=config.matchmaking_time, target_group_size=config.target_group_size,
            bandwidth=config.bandwidth, reduce_rate=config.reduce_rate, **options)

    def _publish_weight(self) -> None:
        """Have the tracker publish its report now: the evidence of the weight
        the round is about to send."""
        if self.tracker is not None:
            self.tracker.publish_now()

    def limit(self) -> float:
        """The longest the training thread waits for a round (s)."""
        return self.node.allreduce.round_limit(matchmaking_time=self.config.matchmaking_time,
                                               config=self.config.allreduce)

    def wait(self, future: concurrent.futures.Future[AllReduceResult]
             ) -> AllReduceResult | BaseException:
        """The round's result, or the p2pdl error it ended with (a round past its limit
        is cancelled: CallTimeoutError).  Anything else is raised."""
        try:
            return future.result(self.limit())
        except concurrent.futures.TimeoutError:
            future.cancel()
            return CallTimeoutError("the averaging round did not end in time")
        except P2PDLError as exc:
            return exc
        except BaseException:
            future.cancel()
            raise

    def judge(self, epoch: int, sent: list[torch.Tensor], samples: int,
              outcome: AllReduceResult | BaseException, seconds: float) -> RoundResult:
        """Count, log and remember how the round ended."""
        result = self._judge(epoch, sent, samples, outcome, seconds)
        if self.feedback is not None:
            self.feedback.keep(getattr(outcome, "sent_error", None), self._key(epoch))
        self.history.append(result.info)
        return result

    def _judge(self, epoch: int, sent: list[torch.Tensor], samples: int,
               outcome: AllReduceResult | BaseException, seconds: float) -> RoundResult:
        if isinstance(outcome, BaseException):
            self._counters["failed"] += 1
            level = logging.INFO if isinstance(outcome, MatchmakingFailedError) else logging.WARNING
            logger.log(level, "run %s epoch %d: averaging failed (%s); %s", self.run_id, epoch,
                       outcome, "stepping with local values" if self.config.on_failure == "local"
                       else "skipping the step")
            return RoundResult(RoundInfo(epoch, "failed", 1, samples, seconds, str(outcome)),
                               sent, None)
        size = len(outcome.group.members)
        contributors = _contributors(outcome)
        servers = sum(1 for m in outcome.group.members
                      if not getattr(m, "client_mode", False) and not getattr(m, "auxiliary",
                                                                                False))
        reachable = tuple(m.peer_id for m in outcome.group.members
                          if not getattr(m, "client_mode", False))
        disputed = tuple(getattr(outcome, "disputed", ()))
        if outcome.completed:
            self._counters["averaged"] += 1
            return RoundResult(RoundInfo(epoch, "averaged", size, samples, seconds,
                                         contributors=contributors), sent, outcome.tensors,
                               servers, reachable, disputed)
        self._counters["partial"] += 1
        missing = [i for i, part in enumerate(outcome.parts) if not part.completed]
        cleared = clear_incomplete(outcome.tensors, outcome.parts)
        logger.warning("run %s epoch %d: parts %s did not complete; no update for their %d "
                       "values", self.run_id, epoch, missing, cleared)
        return RoundResult(RoundInfo(epoch, "partial", size, samples, seconds,
                                     f"parts {missing} incomplete", contributors),
                           sent, outcome.tensors, servers, reachable, disputed)

    def run(self, epoch: int, sent: list[torch.Tensor], samples: int, *, alone: bool
            ) -> RoundResult:
        """One round, waited for (``alone``: none; this peer's own values are the average)."""
        start = time.monotonic()
        self._counters["rounds"] += 1
        sent = self._compensate(sent, epoch)
        if alone:
            logger.info("run %s epoch %d: no other peer for %.0f s; stepping alone",
                        self.run_id, epoch, time.monotonic() - self._seen_others)
            self._counters["alone"] += 1
            info = RoundInfo(epoch, "alone", 1, samples, 0.0)
            self.history.append(info)
            if self.feedback is not None:
                self.feedback.keep(None, self._key(epoch))   # applied as it is
            return RoundResult(info, sent, sent)
        outcome = self.wait(self.start(epoch, sent, samples))
        return self.judge(epoch, sent, samples, outcome, time.monotonic() - start)

    # -- delayed updates ----------------------------------------------------------------

    def start_background(self, epoch: int, sent: list[torch.Tensor], samples: int) -> None:
        """Start a round and return at once; :meth:`finish` picks up its result."""
        self._counters["rounds"] += 1
        sent = self._compensate(sent, epoch)
        grouped = threading.Event()
        future = self.start(epoch, sent, samples, grouped=grouped)
        self.pending = PendingRound(future, epoch, sent, samples, time.monotonic(), grouped)

    def _compensate(self, sent: list[torch.Tensor], epoch: int) -> list[torch.Tensor]:
        """``sent`` with the rounding of the last round of its kind added (error
        feedback), as new tensors."""
        return sent if self.feedback is None else self.feedback.compensate(sent,
                                                                           self._key(epoch))

    def _key(self, epoch: int) -> int:
        """The error feedback's key of the round of ``epoch``: its DiLoCo fragment."""
        return epoch % self.config.fragments

    def matching(self) -> bool:
        """Whether a background round is still in matchmaking."""
        pending = self.pending
        return pending is not None and not pending.grouped.is_set() \
            and not pending.future.done()

    def finish(self, block: bool) -> RoundResult | None:
        """The background round, judged, if it has ended (or once it ends, with ``block``);
        None when there is none or it still runs."""
        pending = self.pending
        if pending is None or (not block and not pending.future.done()):
            return None
        self.pending = None
        outcome = self.wait(pending.future)
        return self.judge(pending.epoch, pending.sent, pending.samples, outcome,
                          time.monotonic() - pending.started)

    def drop(self) -> None:
        """Cancel the background round, if any; its result is never applied."""
        if self.pending is not None:
            self.pending.future.cancel()
        self.pending = None

    # -- auxiliary peers ----------------------------------------------------------------

    def assist(self, tracker: TrainingTracker, epoch: int, params: Sequence[torch.Tensor]
               ) -> tuple[int, RoundInfo | None]:
        """Wait for the next round (at most ``ready_timeout``) and help reduce it.

        Returns the epoch this peer follows now and the round it joined (None:
        none was ready in time).  An auxiliary peer never moves the epoch by
        itself: it follows the trainers' reports.  Were it to advance after
        every round it joined, a round it shared with a single trainer (say,
        one that started early) would announce an epoch the other trainers
        never stepped, and they would all think themselves behind.
        """
        deadline = time.monotonic() + self.config.ready_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return epoch, None
            try:
                progress = tracker.wait_ready(remaining)
            except CallTimeoutError:
                return epoch, None
            if progress.epoch > epoch:
                epoch = progress.epoch   # follow the trainers; then wait for readiness
                tracker.update_epoch(epoch)
                continue
            if self._assisted is None or epoch > self._assisted:
                break
            time.sleep(AUXILIARY_POLL)  # this epoch's round is done: wait for the next epoch
        self._assisted = epoch
        shapes = [torch.zeros(p.shape, dtype=torch.float32) for p in params]  # on the host
        start = time.monotonic()
        self._counters["rounds"] += 1
        outcome = self.wait(self.start(epoch, shapes, 0, auxiliary=True))
        seconds = time.monotonic() - start
        if isinstance(outcome, BaseException):
            self._counters["failed"] += 1
            info = RoundInfo(epoch, "failed", 1, 0, seconds, str(outcome))
        else:
            self._counters["averaged"] += 1
            info = RoundInfo(epoch, "averaged", len(outcome.group.members), 0, seconds,
                             contributors=_contributors(outcome))
        self.history.append(info)
        return epoch, info


def clear_incomplete(tensors: Sequence[torch.Tensor], parts: Sequence[Any]) -> int:
    """Zero the values of every part that did not complete (``parts``: the
    all-reduce's :class:`~p2pdl.averaging.PartResult`, ranges ``[start, end)``
    of the tensors flattened in order); the number of values zeroed.

    A part whose reducer died kept each member's own values; zeros instead
    are the same on every member that lost it, so the update those values
    would have made is skipped alike everywhere and the states stay equal.
    """
    bounds = [0]
    for t in tensors:
        bounds.append(bounds[-1] + t.numel())
    cleared = 0
    with torch.no_grad():
        for part in parts:
            if part.completed or part.end <= part.start:
                continue
            for t, lo, hi in zip(tensors, bounds, bounds[1:], strict=False):
                a, b = max(lo, part.start), min(hi, part.end)
                if a < b:
                    t.view(-1)[a - lo:b - lo].zero_()
                    cleared += b - a
    return cleared


def _contributors(outcome: AllReduceResult) -> tuple[str, ...]:
    """The group's members less those this peer's reducer excluded, as base58 ids."""
    excluded = set(outcome.excluded)
    return tuple(member.peer_id.to_base58() for i, member in enumerate(outcome.group.members)
                 if i not in excluded)


def _feedback_on(config: OptimizerConfig, node: Any) -> bool:
    """Whether ``config.error_feedback`` is on: True, or ``"auto"`` with a
    lossy codec (LOSSY_CODECS) in the all-reduce's codec policy (the
    config's, else the node's)."""
    if config.error_feedback != "auto":
        return bool(config.error_feedback)
    allreduce = config.allreduce or getattr(getattr(node, "allreduce", None), "config", None)
    codecs = getattr(allreduce, "codecs", None)
    return codecs is not None and (codecs.large in LOSSY_CODECS or codecs.small in LOSSY_CODECS)

