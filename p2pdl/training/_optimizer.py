"""``p2pdl.Optimizer``: a torch optimizer that trains with the swarm (DeDLOC).

The training loop stays the user's: ``loss.backward(); opt.step(); opt.zero_grad()``.
What happens in ``step``:

* **DeDLOC mode** (the default): the batch's gradients are added to a local
  accumulator, weighted by its samples, and the progress tracker hears the
  new count.  When the collaboration has processed ``target_batch_size``
  samples (the progress layer says "ready"), this peer forms a group
  (matchmaking), averages the accumulated gradients with it (butterfly
  all-reduce, weighted by samples), and the wrapped optimizer steps once with
  the average: synchronous SGD with the global batch.  The epoch advances.
* **DiLoCo mode** (``mode="diloco"``): every ``step`` is a local step of the
  wrapped (inner) optimizer.  When the collaboration is ready, the peers
  average their parameter deltas since the last outer step (weighted by
  samples), and an outer Nesterov-momentum SGD step moves the shared
  parameters.  ``target_batch_size`` sets how many samples pass between outer
  steps, so H (local steps per round) is about target / (peers x batch).

Around that: a peer that joins late or falls behind downloads the state
(parameters, optimizer state, epoch) from peers at the newest epoch
(``node.state_sync``); state is checkpointed atomically every N epochs and a
restart resumes from the newest of checkpoint and swarm; with
``delay_updates`` the averaging runs in the node's thread while the next
batches compute, and its result is applied one step late.

The optimizer runs on a sync :class:`p2pdl.Node` (trio in its own thread);
``step`` is called from one thread (the training loop's).
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
import io
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..averaging import AllReduceResult
from ..errors import (
    CallTimeoutError,
    CheckpointError,
    ConfigError,
    MatchmakingFailedError,
    NodeClosedError,
    P2PDLError,
    StateSyncError,
)
from ._checkpoint import CheckpointPolicy, latest_checkpoint, load_checkpoint, save_checkpoint
from .config import MAX_STEP_SAMPLES, OptimizerConfig, check_int

if TYPE_CHECKING:
    from ..progress import GlobalProgress

__all__ = ["Optimizer", "OptimizerConfig", "RoundInfo"]

logger = logging.getLogger(__name__)

#: Version of the state dictionary shared with joiners and written to checkpoints.
STATE_FORMAT = 1
#: Seconds added to a round's own limits before the training thread gives up on it.
ROUND_SLACK = 15.0
#: Failed state downloads in a row after which a peer that is behind adopts the epoch.
MAX_SYNC_FAILURES = 3
#: Seconds between consistency checks while the others have not shared the epoch yet.
CHECK_RETRY = 0.2
#: Consistency checks after which a peer stops looking for the others' state of its epoch.
MAX_CHECKS = 50
#: How often an auxiliary peer looks for the next epoch after joining a round (s).
AUXILIARY_POLL = 0.05


@dataclasses.dataclass(frozen=True)
class RoundInfo:
    """What the last averaging round did, as ``opt.last_round`` says.

    ``outcome`` is ``"averaged"`` (every part completed), ``"partial"``
    (some parts kept this peer's own values), ``"alone"`` (no other peer:
    a local step), ``"failed"`` (no group: ``on_failure`` applied).
    """

    epoch: int
    outcome: str
    group_size: int
    samples: int
    seconds: float
    error: str | None = None


class Optimizer:
    """Wrap a torch optimizer so that it trains together with the swarm.

    Args:
        node: a running :class:`p2pdl.Node`.
        run_id: the collaboration's name; every peer of the run uses the same.
        optimizer: the torch optimizer over the model's parameters (in
            DiLoCo mode, the inner optimizer).  Its parameters are the ones
            averaged, shared and checkpointed.
        target_batch_size: samples the whole swarm processes per epoch.
        batch_size_per_step: samples per ``step()`` (or pass ``batch_size``).
        scheduler: an LR scheduler of ``optimizer`` (or a callable that makes
            one from it), stepped once per global epoch.
        config: an :class:`OptimizerConfig`; keyword arguments replace its fields.

    Raises :class:`~p2pdl.ConfigError` for invalid arguments.  Every peer must
    start from the same parameters (same seed) or join a running swarm, which
    sends them.
    """

    def __init__(self, *, node: Any, run_id: str, optimizer: torch.optim.Optimizer,
                 target_batch_size: int, batch_size_per_step: int | None = None,
                 scheduler: Any = None, config: OptimizerConfig | None = None,
                 **config_fields: Any) -> None:
        if config is not None and not isinstance(config, OptimizerConfig):
            raise ConfigError("config must be an OptimizerConfig")
        config = config or OptimizerConfig()
        if batch_size_per_step is not None:
            config_fields["batch_size_per_step"] = batch_size_per_step
        if config_fields:
            known = {f.name for f in dataclasses.fields(OptimizerConfig)}
            unknown = sorted(set(config_fields) - known)
            if unknown:
                raise ConfigError(f"unknown Optimizer option(s): {', '.join(unknown)} "
                                  f"(known: {', '.join(sorted(known))})")
            config = dataclasses.replace(config, **config_fields)
        if not all(hasattr(node, name) for name in ("averaging", "progress", "state_sync")) \
                or not hasattr(node.averaging, "start_round"):
            raise ConfigError("node must be a running p2pdl.Node (the sync node); trio "
                              "programs run the training loop in a thread with a p2pdl.Node")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer, "
                              f"got {type(optimizer).__name__}")
        check_int("target_batch_size", target_batch_size, 1, 2**40)
        self.config = config
        self.node = node
        self.run_id = run_id
        self.target_batch_size = target_batch_size
        self.optimizer = optimizer
        self._params: list[torch.Tensor] = [p for group in optimizer.param_groups
                                            for p in group["params"]]
        if not self._params:
            raise ConfigError("the optimizer has no parameters")
        for p in self._params:
            if not p.is_floating_point():
                raise ConfigError(f"parameters must be floating point, got {p.dtype}")
        if callable(scheduler) and not hasattr(scheduler, "step"):
            scheduler = scheduler(optimizer)
        if scheduler is not None and not hasattr(scheduler, "state_dict"):
            raise ConfigError("scheduler must be an LR scheduler (with step and state_dict)")
        self.scheduler = scheduler
        self._epoch = 0
        self._samples = 0
        self._local_steps = 0
        self._accumulators: list[torch.Tensor] | None = None
        self._anchor: list[torch.Tensor] | None = None
        self._momentum: list[torch.Tensor] | None = None
        if config.mode == "diloco":
            self._anchor = [p.detach().clone() for p in self._params]
            self._momentum = [torch.zeros_like(p) for p in self._params]
        self._pending: concurrent.futures.Future[AllReduceResult] | None = None
        self._pending_info: tuple[int, list[torch.Tensor], int, float] | None = None
        self._grouped = threading.Event()
        self._assisted: int | None = None   # the epoch whose round an auxiliary peer joined
        self._next_sync = 0.0
        self._sync_failures = 0
        self._suspect = False         # the last round may have left this peer's state apart
        self._checks = 0
        self._next_check = 0.0
        self._shared_digest: tuple[int, bytes] | None = None
        self._last_checkpoint: int | None = None
        self._last_shared: int | None = None
        self._closed = False
        self._seen_others = time.monotonic()   # when the view last had another peer
        self.last_round: RoundInfo | None = None
        self._counters = {"rounds": 0, "averaged": 0, "partial": 0, "alone": 0, "failed": 0,
                          "state_syncs": 0, "state_sync_failures": 0, "checkpoints": 0,
                          "shared": 0, "consistency_checks": 0, "repairs": 0}
        self._policy = (CheckpointPolicy(config.checkpoint_dir, config.checkpoint_every,
                                          config.checkpoint_keep)
                        if config.checkpoint_dir is not None else None)
        resumed = self._resume_from_checkpoint()
        self._tracker = node.progress.track(run_id, target_batch_size,
                                            auxiliary=config.auxiliary)
        try:
            if self._epoch:
                self._tracker.update_epoch(self._epoch)
            if resumed:
                self._share_state(force=True)
        except BaseException:
            self._tracker.close()
            raise

    # -- what users read -----------------------------------------------------------

    @property
    def local_epoch(self) -> int:
        """The number of global steps this peer's state has taken."""
        return self._epoch

    @property
    def samples_accumulated(self) -> int:
        """Samples this peer has processed towards the current epoch."""
        return self._samples

    def global_progress(self) -> GlobalProgress:
        """The collaboration's progress as this peer sees it."""
        return self._tracker.global_progress()

    def statistics(self) -> dict[str, Any]:
        """Counters: rounds by outcome, state syncs, checkpoints, and the epoch."""
        return {"epoch": self._epoch, "local_steps": self._local_steps,
                "samples_accumulated": self._samples, **self._counters}

    # -- the training loop ---------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients, as ``torch.optim.Optimizer.zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, batch_size: int | None = None) -> bool:
        """Count this batch; step with the swarm when the global batch is full.

        Call it after ``loss.backward()``, with the batch's number of samples
        (default ``batch_size_per_step``).  Returns True when the parameters
        took a global step in this call (after averaging, or alone).  It
        blocks while a round runs (matchmaking, then the all-reduce), unless
        ``delay_updates``.  An auxiliary peer's ``step()`` waits for the next
        round (at most ``ready_timeout``) and helps reduce it.
        """
        if self._closed:
            raise NodeClosedError("the optimizer is closed")
        if self.config.auxiliary:
            return self._assist()
        samples = batch_size if batch_size is not None else self.config.batch_size_per_step
        if samples is None:
            raise ConfigError("step() needs batch_size (or set batch_size_per_step)")
        check_int("batch_size", samples, 0, MAX_STEP_SAMPLES)
        if not self._matching():
            progress = self._tracker.global_progress()
            if progress.epoch > self._epoch:
                self._catch_up(progress)
            elif self._suspect and self._pending is None and time.monotonic() >= self._next_check:
                self._check_consistency()
        if self.config.mode == "dedloc":
            self._accumulate(samples)
        else:
            self._inner_step()
        self._samples += samples
        self._local_steps += 1
        # After accumulating: applying a background round's result replaces p.grad.
        stepped = self._finish_pending(block=False)
        if self._matching():
            # A background round is still forming its group: announcing the
            # next epoch now would tell the peers that have not joined yet
            # that they are behind, and they would download state instead.
            return stepped
        self._tracker.report(self._samples, self._epoch)
        progress = self._tracker.global_progress()
        if progress.num_peers - progress.num_auxiliary > 1:
            self._seen_others = time.monotonic()
        if progress.epoch > self._epoch or not progress.ready_to_step:
            return stepped
        return self._global_step(progress) or stepped

    def _accumulate(self, samples: int) -> None:
        if samples == 0:
            return
        if self._accumulators is None:
            self._accumulators = [torch.zeros_like(p, dtype=torch.float32) for p in self._params]
        with torch.no_grad():
            for p, acc in zip(self._params, self._accumulators, strict=True):
                if p.grad is not None:
                    acc.add_(p.grad.to(torch.float32), alpha=float(samples))

    def _inner_step(self) -> None:
        self._clip()
        self.optimizer.step()

    def _clip(self) -> None:
        if self.config.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self._params, self.config.clip_grad_norm)

    # -- global steps --------------------------------------------------------------

    def _global_step(self, progress: GlobalProgress) -> bool:
        """The collaboration is ready: average, step, advance the epoch."""
        epoch, samples = self._epoch, self._samples
        if self.config.mode == "dedloc":
            vector = self._mean_gradients()
        else:
            assert self._anchor is not None
            vector = [a - p.detach().to(torch.float32)
                      for a, p in zip(self._anchor, self._params, strict=True)]
        if self._suspect:
            # Compare with the others first: a round now would carry a state
            # that may be apart into the next epoch (the check gives up after
            # MAX_CHECKS x CHECK_RETRY seconds without offers).
            return False
        alone = progress.num_peers - progress.num_auxiliary <= 1   # no other trainer
        if alone and time.monotonic() - self._seen_others < self.config.discovery_time:
            # Peers started together may not have heard of each other yet, and
            # a view that lost the others for a moment (late reports under
            # load) is not a swarm of one: stepping alone would drift apart.
            return False
        if alone:
            logger.info("run %s epoch %d: no other peer for %.0f s; stepping alone",
                        self.run_id, epoch, time.monotonic() - self._seen_others)
        if self.config.delay_updates and not alone:
            self._finish_pending(block=True)
            self._start_round(epoch, vector, samples)
            self._reset_accumulation()
            self._epoch = epoch + 1   # announced once the group has formed
            return False
        averaged, info = self._average(epoch, vector, samples, alone)
        self._apply(averaged, info)
        self._reset_accumulation()
        self._advance(epoch + 1)
        self._after_step()
        return averaged is not None

    def _mean_gradients(self) -> list[torch.Tensor]:
        if self._accumulators is None or self._samples == 0:
            return [torch.zeros_like(p, dtype=torch.float32) for p in self._params]
        return [acc / self._samples for acc in self._accumulators]

    def _round_call(self, epoch: int, vector: list[torch.Tensor], samples: int,
                    auxiliary: bool = False, grouped: threading.Event | None = None
                    ) -> concurrent.futures.Future[AllReduceResult]:
        config = self.config
        options: dict[str, Any] = {"auxiliary": auxiliary}
        for name in ("matchmaking_time", "target_group_size", "bandwidth", "reduce_rate"):
            if getattr(config, name) is not None:
                options[name] = getattr(config, name)
        if grouped is not None:
            options["on_group"] = lambda group: grouped.set()
        return self.node.averaging.start_round(self.run_id, epoch, vector, weight=float(samples),
                                               config=config.allreduce, inplace=True,
                                               **options)

    def _round_limit(self) -> float:
        node_config = self.node.config
        matchmaking = self.config.matchmaking_time or node_config.matchmaking.matchmaking_time
        allreduce = (self.config.allreduce or node_config.allreduce).averaging_timeout
        return matchmaking + allreduce + ROUND_SLACK

    def _wait_round(self, future: concurrent.futures.Future[AllReduceResult]
                    ) -> AllReduceResult | BaseException:
        try:
            return future.result(self._round_limit())
        except concurrent.futures.TimeoutError:
            future.cancel()
            return CallTimeoutError("the averaging round did not end in time")
        except P2PDLError as exc:
            return exc
        except BaseException:
            future.cancel()
            raise

    def _average(self, epoch: int, vector: list[torch.Tensor], samples: int, alone: bool
                 ) -> tuple[list[torch.Tensor] | None, RoundInfo]:
        start = time.monotonic()
        self._counters["rounds"] += 1
        if alone:
            self._counters["alone"] += 1
            return vector, RoundInfo(epoch, "alone", 1, samples, 0.0)
        outcome = self._wait_round(self._round_call(epoch, vector, samples))
        return self._judge(epoch, vector, samples, outcome, time.monotonic() - start)

    def _judge(self, epoch: int, vector: list[torch.Tensor], samples: int,
               outcome: AllReduceResult | BaseException, seconds: float
               ) -> tuple[list[torch.Tensor] | None, RoundInfo]:
        if isinstance(outcome, BaseException):
            self._counters["failed"] += 1
            level = logging.INFO if isinstance(outcome, MatchmakingFailedError) else logging.WARNING
            logger.log(level, "run %s epoch %d: averaging failed (%s); %s", self.run_id, epoch,
                       outcome, "stepping with local values" if self.config.on_failure == "local"
                       else "skipping the step")
            info = RoundInfo(epoch, "failed", 1, samples, seconds, str(outcome))
            self._suspect = True   # the others may have stepped without this peer
            return (vector if self.config.on_failure == "local" else None), info
        size = len(outcome.group.members)
        if outcome.completed:
            self._counters["averaged"] += 1
            return outcome.tensors, RoundInfo(epoch, "averaged", size, samples, seconds)
        self._counters["partial"] += 1
        self._suspect = True
        missing = [i for i, part in enumerate(outcome.parts) if not part.completed]
        logger.warning("run %s epoch %d: parts %s did not complete; they keep local values",
                       self.run_id, epoch, missing)
        return outcome.tensors, RoundInfo(epoch, "partial", size, samples, seconds,
                                          f"parts {missing} incomplete")

    def _apply(self, averaged: list[torch.Tensor] | None, info: RoundInfo) -> None:
        """One global step with ``averaged`` (None: skipped)."""
        self.last_round = info
        if self.config.mode == "dedloc":
            if averaged is not None:
                for p, g in zip(self._params, averaged, strict=True):
                    p.grad = g.to(p.dtype).view_as(p)
                self._clip()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        else:
            self._outer_step(averaged)
        if self.scheduler is not None and averaged is not None:
            self.scheduler.step()

    def _outer_step(self, delta: list[torch.Tensor] | None) -> None:
        assert self._anchor is not None and self._momentum is not None
        mu, lr = self.config.outer_momentum, self.config.outer_lr
        with torch.no_grad():
            deltas = delta if delta is not None else self._params
            for p, anchor, momentum, d in zip(self._params, self._anchor, self._momentum, deltas,
                                              strict=True):
                if delta is not None:
                    d = d.view_as(anchor)
                    momentum.mul_(mu).add_(d)
                    anchor.sub_(d + mu * momentum, alpha=lr)
                p.copy_(anchor)

    def _reset_accumulation(self) -> None:
        self._samples = 0
        if self._accumulators is not None:
            for acc in self._accumulators:
                acc.zero_()

    def _advance(self, epoch: int) -> None:
        self._epoch = epoch
        self._tracker.update_epoch(epoch)

    # -- delayed updates -----------------------------------------------------------

    def _start_round(self, epoch: int, vector: list[torch.Tensor], samples: int) -> None:
        self._counters["rounds"] += 1
        self._grouped = threading.Event()
        self._pending = self._round_call(epoch, vector, samples, grouped=self._grouped)
        self._pending_info = (epoch, vector, samples, time.monotonic())

    def _matching(self) -> bool:
        """Whether a background round is still in matchmaking."""
        return self._pending is not None and not self._grouped.is_set() \
            and not self._pending.done()

    def _finish_pending(self, block: bool) -> bool:
        """Apply a background round's result if it has ended (or wait, with ``block``)."""
        future, pending = self._pending, self._pending_info
        if future is None or pending is None:
            return False
        if not block and not future.done():
            return False
        self._pending = self._pending_info = None
        epoch, vector, samples, start = pending
        averaged, info = self._judge(epoch, vector, samples, self._wait_round(future),
                                     time.monotonic() - start)
        self._apply(averaged, info)
        self._after_step()
        return averaged is not None

    def _drop_pending(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
        self._pending = self._pending_info = None

    # -- auxiliary peers -----------------------------------------------------------

    def _assist(self) -> bool:
        """Wait for the next round and help reduce it; True if one was joined.

        An auxiliary peer never moves the epoch by itself: it follows the
        trainers' reports.  Were it to advance after every round it joined,
        a round it shared with a single trainer (say, one that started
        early) would announce an epoch the other trainers never stepped,
        and they would all think themselves behind.
        """
        deadline = time.monotonic() + self.config.ready_timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                progress = self._tracker.wait_ready(remaining)
            except CallTimeoutError:
                return False
            if progress.epoch > self._epoch:
                self._advance(progress.epoch)   # follow the trainers; then wait for readiness
                continue
            if self._assisted is None or self._epoch > self._assisted:
                break
            time.sleep(AUXILIARY_POLL)  # this epoch's round is done: wait for the next epoch
        epoch = self._epoch
        self._assisted = epoch
        shapes = [torch.zeros_like(p, dtype=torch.float32) for p in self._params]
        start = time.monotonic()
        self._counters["rounds"] += 1
        outcome = self._wait_round(self._round_call(epoch, shapes, 0, auxiliary=True))
        seconds = time.monotonic() - start
        if isinstance(outcome, BaseException):
            self._counters["failed"] += 1
            self.last_round = RoundInfo(epoch, "failed", 1, 0, seconds, str(outcome))
            return False
        self._counters["averaged"] += 1
        self.last_round = RoundInfo(epoch, "averaged", len(outcome.group.members), 0, seconds)
        return True

    # -- state: sync, checkpoints ---------------------------------------------------

    def _catch_up(self, progress: GlobalProgress) -> None:
        """The swarm is at a newer epoch: download its state (or adopt the epoch)."""
        self._drop_pending()
        if not self.config.state_sync:
            logger.info("run %s: behind (epoch %d < %d); adopting the epoch", self.run_id,
                        self._epoch, progress.epoch)
            self._reset_accumulation()
            self._advance(progress.epoch)
            return
        now = time.monotonic()
        if now < self._next_sync:
            return
        if self.sync_state(min_epoch=progress.epoch):
            self._sync_failures = 0
            return
        self._sync_failures += 1
        self._next_sync = time.monotonic() + self.config.sync_retry
        if self._sync_failures >= MAX_SYNC_FAILURES:
            logger.warning("run %s: no state after %d attempts; adopting epoch %d with this "
                           "peer's own parameters", self.run_id, self._sync_failures,
                           progress.epoch)
            self._sync_failures = 0
            self._reset_accumulation()
            self._advance(progress.epoch)

    def sync_state(self, min_epoch: int | None = None, timeout: float | None = None) -> bool:
        """Download the newest state from peers at ``min_epoch`` or later; True if loaded.

        ``min_epoch`` defaults to the newest epoch the progress view knows.
        Called by ``step`` when this peer is behind; call it yourself to
        join at once.  Failures are logged and return False.
        """
        if min_epoch is None:
            min_epoch = max(self._tracker.global_progress().epoch, self._epoch)
        donors = [r.peer_id for r in self._tracker.peers()
                  if r.epoch >= min_epoch and not r.client_mode and not r.auxiliary]
        if not donors:
            logger.info("run %s: no peer can send the state of epoch %d yet", self.run_id,
                        min_epoch)
            return False
        from libp2p.peer.id import ID

        try:
            download = self.node.state_sync.fetch(
                self.run_id, [ID(d) for d in donors], min_epoch=min_epoch,
                timeout=timeout or self.config.sync_timeout)
            state = torch.load(io.BytesIO(download.payload), map_location="cpu",
                               weights_only=True)
            self._load_full_state(state)
        except (StateSyncError, CallTimeoutError, ConfigError) as exc:
            self._counters["state_sync_failures"] += 1
            logger.warning("run %s: state sync failed: %s", self.run_id, exc)
            return False
        except Exception as exc:  # unpickling garbage from a donor
            self._counters["state_sync_failures"] += 1
            logger.warning("run %s: the downloaded state is unusable: %r", self.run_id, exc)
            return False
        self._counters["state_syncs"] += 1
        self._suspect = False
        logger.info("run %s: synced state of epoch %d from %d donor(s) in %.1f s "
                    "(%.1f MB)", self.run_id, download.epoch, len(download.donors),
                    download.seconds, len(download.payload) / 1e6)
        self._reset_accumulation()
        self._tracker.update_epoch(self._epoch)
        self._share_state(force=True)
        return True

    def _full_state(self) -> dict[str, Any]:
        diloco = None
        if self._anchor is not None and self._momentum is not None:
            diloco = {"anchor": list(self._anchor), "momentum": list(self._momentum)}
        return {"format": STATE_FORMAT, "epoch": self._epoch, "mode": self.config.mode,
                "params": [p.detach() for p in self._params],
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
                "diloco": diloco}

    def _load_full_state(self, state: Any) -> None:
        """Load a state from a peer or a checkpoint (ConfigError when it does not fit)."""
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError("the state is not a p2pdl optimizer state of this format")
        if state.get("mode") != self.config.mode:
            raise ConfigError(f"the state is of mode {state.get('mode')!r}, this optimizer "
                              f"runs {self.config.mode!r}")
        params = state.get("params")
        epoch = state.get("epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise ConfigError("the state's epoch is invalid")
        _check_like(params, self._params, "parameters")
        diloco = state.get("diloco")
        if self._anchor is not None:
            if not isinstance(diloco, dict):
                raise ConfigError("the state has no DiLoCo outer state")
            _check_like(diloco.get("anchor"), self._anchor, "DiLoCo anchor")
            _check_like(diloco.get("momentum"), self._momentum, "DiLoCo momentum")
        try:
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None and state.get("scheduler") is not None:
                self.scheduler.load_state_dict(state["scheduler"])
        except (KeyError, ValueError, TypeError, RuntimeError) as exc:
            raise ConfigError(f"the state's optimizer state does not fit: {exc}") from None
        with torch.no_grad():
            for p, value in zip(self._params, params, strict=True):
                p.copy_(value)
            if self._anchor is not None and self._momentum is not None:
                for a, value in zip(self._anchor, diloco["anchor"], strict=True):
                    a.copy_(value)
                for m, value in zip(self._momentum, diloco["momentum"], strict=True):
                    m.copy_(value)
        self._epoch = epoch

    def _share_state(self, force: bool = False) -> None:
        """Offer the current state to joiners (servers only: clients cannot be dialled)."""
        if self.config.auxiliary or self.node.client_mode:
            return
        if not force and self._epoch % self.config.share_state_every:
            return
        payload = self._serialized_state()
        self.node.state_sync.share(self.run_id, self._epoch, payload)
        self._shared_digest = (self._epoch, hashlib.sha256(payload).digest())
        self._last_shared = self._epoch
        self._counters["shared"] += 1

    def _serialized_state(self) -> bytes:
        buffer = io.BytesIO()
        torch.save(self._full_state(), buffer)
        return buffer.getvalue()

    def _state_digest(self) -> bytes:
        """SHA-256 of the state as shared: equal on every peer with the same state."""
        if self._shared_digest is not None and self._shared_digest[0] == self._epoch:
            return self._shared_digest[1]
        return hashlib.sha256(self._serialized_state()).digest()

    def _check_consistency(self) -> None:
        """After a failed or partial round: is this peer's state the swarm's?

        Every peer at this epoch that serves state says its state's digest
        (``node.state_sync.offers``).  The digest most of them and this peer
        hold wins, ties to the smallest (so that every checking peer picks
        the same); a peer that holds another downloads the winner.
        """
        self._checks += 1
        self._next_check = time.monotonic() + CHECK_RETRY
        give_up = self._checks >= MAX_CHECKS
        donors = [r.peer_id for r in self._tracker.peers()
                  if r.epoch == self._epoch and not r.client_mode and not r.auxiliary]
        from libp2p.peer.id import ID

        offers = self.node.state_sync.offers(self.run_id, [ID(d) for d in donors]) \
            if donors else {}
        same = {peer: digest for peer, (epoch, digest) in offers.items() if epoch == self._epoch}
        if not same:
            logger.debug("run %s epoch %d: no peer offers this epoch's state yet (asked %d, "
                         "offers %s)", self.run_id, self._epoch, len(donors), offers)
            if give_up:
                logger.info("run %s epoch %d: no peer offered this epoch's state to compare "
                            "with; the consistency check is dropped", self.run_id, self._epoch)
                self._suspect, self._checks = False, 0
            return   # the others have not shared this epoch yet: ask again soon
        self._counters["consistency_checks"] += 1
        self._suspect, self._checks = False, 0
        mine = self._state_digest()
        counts = collections.Counter(same.values())
        counts[mine] += 1
        winner = min(counts, key=lambda d: (-counts[d], d))
        logger.info("run %s epoch %d: consistency check: this peer's state is %s of %d "
                    "peers'", self.run_id, self._epoch,
                    "the agreed one" if winner == mine else "not the agreed one",
                    sum(counts.values()))
        if winner == mine:
            return
        holders = [peer for peer, digest in same.items() if digest == winner]
        logger.warning("run %s epoch %d: this peer's state differs from %d of %d peers' "
                       "after a failed or partial round; downloading theirs", self.run_id,
                       self._epoch, counts[winner], sum(counts.values()))
        try:
            download = self.node.state_sync.fetch(self.run_id, holders, min_epoch=self._epoch,
                                                  digest=winner,
                                                  timeout=self.config.sync_timeout)
            self._load_full_state(torch.load(io.BytesIO(download.payload), map_location="cpu",
                                             weights_only=True))
        except Exception as exc:  # the download or its content failed: train on
            self._counters["state_sync_failures"] += 1
            logger.warning("run %s: repairing the state failed: %s", self.run_id, exc)
            return
        self._counters["repairs"] += 1
        self._reset_accumulation()
        self._tracker.update_epoch(self._epoch)
        self._share_state(force=True)

    def _after_step(self) -> None:
        self._share_state()
        if self._policy is not None and self._policy.due(self._epoch, self._last_checkpoint):
            self.save_checkpoint()

    def save_checkpoint(self) -> None:
        """Write a checkpoint of the current state now (needs ``checkpoint_dir``)."""
        if self._policy is None:
            raise ConfigError("save_checkpoint needs checkpoint_dir")
        try:
            save_checkpoint(self._policy.directory, self._full_state(), self._epoch,
                            keep=self._policy.keep)
        except CheckpointError as exc:
            logger.error("run %s: checkpoint of epoch %d failed: %s", self.run_id,
                         self._epoch, exc)
            return
        self._last_checkpoint = self._epoch
        self._counters["checkpoints"] += 1

    def _resume_from_checkpoint(self) -> bool:
        if self._policy is None or latest_checkpoint(self._policy.directory) is None:
            return False
        state, epoch = load_checkpoint(self._policy.directory)
        self._load_full_state(state)
        self._last_checkpoint = epoch
        logger.info("run %s: resumed from the checkpoint of epoch %d", self.run_id, epoch)
        return True

    # -- torch-like state and lifetime ----------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the wrapped optimizer's and scheduler's state, DiLoCo's outer state."""
        state = self._full_state()
        del state["params"]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned (the parameters are the model's own)."""
        self._load_full_state({**state, "params": [p.detach() for p in self._params]})
        self._reset_accumulation()
        self._tracker.update_epoch(self._epoch)

    def close(self) -> None:
        """Finish a background round, stop reporting progress and sharing state (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._pending is not None:
                self._finish_pending(block=True)
        finally:
            try:
                self.node.state_sync.unshare(self.run_id)
            except NodeClosedError:
                pass
            self._tracker.close()

    def __enter__(self) -> Optimizer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            self._drop_pending()
        self.close()


def _check_like(values: Any, reference: Sequence[torch.Tensor], what: str) -> None:
    if not isinstance(values, (list, tuple)) or len(values) != len(reference):
        raise ConfigError(f"the state's {what} do not match this model "
                          f"({len(reference)} tensors expected)")
    for i, (value, ref) in enumerate(zip(values, reference, strict=True)):
        if not isinstance(value, torch.Tensor) or value.shape != ref.shape \
                or not value.is_floating_point() or not bool(torch.isfinite(value).all()):
            raise ConfigError(f"the state's {what} tensor {i} does not fit "
                              f"(expected finite {tuple(ref.shape)})")
