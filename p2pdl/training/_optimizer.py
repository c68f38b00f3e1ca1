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
(``node.statesync``), and so does a peer whose round found no group while
the others stepped that epoch without it (rather than a local step that
would drift apart); state is checkpointed atomically every N epochs and a
restart resumes from the newest of checkpoint and swarm; with
``delay_updates`` the averaging runs in the node's thread while the next
batches compute, and its result is applied one step late (DiLoCo: the inner
steps taken meanwhile are carried over to the new anchor).

This module is the facade: it decides when to do what, and three parts it
owns do it -- ``strategy`` (the mode: ``_strategies``), ``rounds`` (starting,
waiting for and judging rounds: ``_rounds``) and ``state_keeper`` (the epoch
and full state: share, fetch, consistency checks, checkpoints:
``_state_keeping``).  The optimizer runs on a sync :class:`p2pdl.Node` (trio in
its own thread), used only through :class:`~p2pdl.training.TrainingNode`;
``step`` is called from one thread (the training loop's).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from ..errors import ConfigError, NodeClosedError
from ._devices import HostStaging
from ._node_api import TrainingNode, TrainingTracker, check_training_node
from ._rounds import RoundInfo, RoundResult, Rounds
from ._state_keeping import CatchUp, StateKeeper
from ._strategies import Strategy, clip_total_norm, make_strategy
from .config import MAX_STEP_SAMPLES, OptimizerConfig, check_int

if TYPE_CHECKING:
    from ..progress import GlobalProgress

__all__ = ["Optimizer", "OptimizerConfig", "RoundInfo"]

logger = logging.getLogger(__name__)

#: A peer's progress report at most this old (s) counts it as present at its epoch
#: when a round's group is compared with the peers seen (a gone peer's report ages).
FRESH_REPORT = 3.0


class Optimizer(torch.optim.Optimizer):
    """Wrap a torch optimizer so that it trains together with the swarm.

    It is a :class:`torch.optim.Optimizer` itself, so that training code that
    checks for one takes it (torch's LR schedulers, ``torch.amp.GradScaler``):
    ``param_groups`` and ``state`` are the wrapped
    optimizer's own (a scheduler that sets ``lr`` here sets it there),
    ``defaults`` its defaults; ``step(closure=None)`` evaluates the closure
    first, as torch optimizers do; step hooks
    (``register_step_pre_hook``/``register_step_post_hook``) run around
    every ``step``; ``zero_grad``, ``state_dict`` and ``load_state_dict``
    work as below.  ``add_param_group`` is refused: the parameters averaged
    are those the wrapped optimizer had when it was wrapped.

    Args:
        node: a running :class:`p2pdl.Node` (anything with the members of
            :class:`~p2pdl.training.TrainingNode`).
        run_id: the collaboration's name; every peer of the run uses the same.
        optimizer: the torch optimizer over the model's parameters (in
            DiLoCo mode, the inner optimizer).  Its parameters are the ones
            averaged, shared and checkpointed.
        target_batch_size: samples the whole swarm processes per epoch.
        batch_size_per_step: samples per ``step()`` (or pass ``batch_size``).
        scheduler: an LR scheduler of ``optimizer``, or a callable that makes
            one from this optimizer (``lambda opt: CosineAnnealingLR(opt,
            1000)``; the parameter groups are the same): p2pdl steps it once
            per global epoch, and its state is part of the shared state.
            Training code must not step it too.
        config: an :class:`OptimizerConfig`; keyword arguments replace its fields.
        model: the module whose buffers (the persistent ones, which its
            ``state_dict`` holds: BatchNorm's running statistics and the
            like) train with the parameters: averaged at every global
            step (the values, weighted by samples, by the round's rule;
            integer buffers rounded to the nearest integer), and part of the
            state that joiners download and checkpoints keep.  Every peer of
            a run passes a model with the same buffers, or none.  Without it
            buffers stay each peer's own.

    Raises :class:`~p2pdl.ConfigError` for invalid arguments.  Every peer must
    start from the same parameters (same seed) or join a running swarm, which
    sends them.

    Its parts, for tools and tests: ``strategy`` (a
    :class:`~p2pdl.training.Strategy`), ``rounds``
    (:class:`~p2pdl.training.Rounds`) and ``state_keeper``
    (:class:`~p2pdl.training.StateKeeper`).
    """

    def __init__(self, *, node: TrainingNode, run_id: str, optimizer: torch.optim.Optimizer,
                 target_batch_size: int, batch_size_per_step: int | None = None,
                 scheduler: Any = None, config: OptimizerConfig | None = None,
                 model: torch.nn.Module | None = None, **config_fields: Any) -> None:
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
        node = check_training_node(node)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ConfigError(f"optimizer must be a torch.optim.Optimizer, "
                              f"got {type(optimizer).__name__}")
        check_int("target_batch_size", target_batch_size, 1, 2**40)
        self.config = config
        self.node = node
        self.run_id = run_id
        self.target_batch_size = target_batch_size
        self.optimizer = optimizer
        self._torch_face(optimizer)
        self._params: list[torch.Tensor] = [p for group in optimizer.param_groups
                                            for p in group["params"]]
        if not self._params:
            raise ConfigError("the optimizer has no parameters")
        for p in self._params:
            if not p.is_floating_point():
                raise ConfigError(f"parameters must be floating point, got {p.dtype}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        #: the model's buffers that train with the parameters (model=)
        self._buffers: list[torch.Tensor] = [] if model is None else persistent_buffers(model)
        if callable(scheduler) and not hasattr(scheduler, "step"):
            scheduler = scheduler(self)   # its param_groups are the wrapped optimizer's
        if scheduler is not None and not hasattr(scheduler, "state_dict"):
            raise ConfigError("scheduler must be an LR scheduler (with step and state_dict)")
        self.scheduler = scheduler
        self._samples = 0
        self._local_steps = 0
        self._stale_batches = 0   # batches dropped: computed before a state download
        self._loss: float | None = None   # the training loss the reports carry
        self._closed = False
        self.last_round: RoundInfo | None = None
        self.strategy: Strategy = make_strategy(config, optimizer, self._params)
        #: host buffers for what rounds send from a device (GPU) peer
        self._staging = HostStaging()
        self.rounds = Rounds(node, run_id, config)
        self.state_keeper = StateKeeper(node, run_id, config, optimizer=optimizer,
                                        params=self._params, scheduler=scheduler,
                                        strategy=self.strategy, buffers=self._buffers)
        resumed = self.state_keeper.resume()
        self._tracker: TrainingTracker = node.progress.track(
            run_id, target_batch_size, auxiliary=config.auxiliary,
            **({} if config.display_name is None else {"name": config.display_name}))
        self.rounds.tracker = self._tracker   # its reports back the rounds' weights
        try:
            if self.state_keeper.epoch:
                self._tracker.update_epoch(self.state_keeper.epoch)
            if resumed:
                self.state_keeper.share(force=True)
        except BaseException:
            self._tracker.close()
            raise

    def _torch_face(self, optimizer: torch.optim.Optimizer) -> None:
        """What ``torch.optim.Optimizer.__init__`` sets up, but the parameter
        groups and state (the wrapped optimizer's, by the properties below):
        the hooks' registries and the profiler's wrapping of ``step``."""
        self.defaults = optimizer.defaults
        self._optimizer_step_pre_hooks = OrderedDict()
        self._optimizer_step_post_hooks = OrderedDict()
        self._optimizer_state_dict_pre_hooks = OrderedDict()
        self._optimizer_state_dict_post_hooks = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = OrderedDict()
        self._optimizer_load_state_dict_post_hooks = OrderedDict()
        self._patch_step_function()
        self._warned_capturable_if_run_uncaptured = True

    @property   # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        """The wrapped optimizer's parameter groups (the same list)."""
        return self.optimizer.param_groups

    @property   # type: ignore[override]
    def state(self) -> Any:
        """The wrapped optimizer's per-parameter state (the same mapping)."""
        return self.optimizer.state

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Refused: the swarm averages, shares and checks the parameters the
        wrapped optimizer had when it was wrapped (add them to the wrapped
        optimizer first, then wrap it)."""
        raise ConfigError("p2pdl.Optimizer cannot take new parameters: add the group to the "
                          "wrapped torch optimizer before wrapping it")

    def __repr__(self) -> str:
        return (f"p2pdl.Optimizer(run_id={self.run_id!r}, mode={self.config.mode!r}, "
                f"target_batch_size={self.target_batch_size}, "
                f"optimizer={type(self.optimizer).__name__})")

    # -- what users read -----------------------------------------------------------

    @property
    def local_epoch(self) -> int:
        """The number of global steps this peer's state has taken."""
        return self.state_keeper.epoch

    @property
    def samples_accumulated(self) -> int:
        """Samples this peer has processed towards the current epoch."""
        return self._samples

    def global_progress(self) -> GlobalProgress:
        """The collaboration's progress as this peer sees it."""
        return self._tracker.global_progress()

    def round_history(self) -> list[RoundInfo]:
        """The last rounds this optimizer took part in (at most ``ROUND_HISTORY``),
        oldest first: each one's epoch, outcome, group size, weight and contributors."""
        return list(self.rounds.history)

    def statistics(self) -> dict[str, Any]:
        """Counters: rounds by outcome, state syncs, checkpoints, the epoch, and
        ``stale_batches`` (batches dropped because a state download replaced the
        parameters they were computed on)."""
        return {"epoch": self.state_keeper.epoch, "local_steps": self._local_steps,
                "samples_accumulated": self._samples, "stale_batches": self._stale_batches,
                **self.rounds.statistics(),
                **self.state_keeper.statistics()}

    # -- the training loop ---------------------------------------------------------

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the parameters' gradients, as ``torch.optim.Optimizer.zero_grad``."""
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Callable[[], Any] | None = None, *,   # type: ignore[override]
             batch_size: int | None = None, loss: float | torch.Tensor | None = None) -> bool:
        """Count this batch; step with the swarm when the global batch is full.

        Call it after ``loss.backward()``, with the batch's number of samples
        (``batch_size``; default ``batch_size_per_step``), or pass a
        ``closure`` that computes the loss and its gradients: it is called
        first, with gradients enabled (as torch optimizers do; its loss is
        not returned).  Returns True when the parameters
        took a global step in this call (after averaging, or alone).  It
        blocks while a round runs (matchmaking, then the all-reduce), unless
        ``delay_updates``.  An auxiliary peer's ``step()`` waits for the next
        round (at most ``ready_timeout``) and helps reduce it.  A batch whose
        gradients were computed before this call downloaded the swarm's state
        (catching up, or a repair) is dropped, not counted: counter
        ``stale_batches``.  ``loss``: this peer's recent training loss (a
        number or a one-value tensor; the batch's, or a moving average), which
        its progress reports carry for people watching the run; a loss that
        is not finite is not reported.
        """
        if self._closed:
            raise NodeClosedError("the optimizer is closed")
        if loss is not None:
            self._note_loss(loss)
        if closure is not None:
            if not callable(closure):
                raise ConfigError(f"step(closure): the closure must be callable, got "
                                  f"{type(closure).__name__} (pass batch_size=... by name)")
            with torch.enable_grad():
                closure()
        if self.config.auxiliary:
            return self._assist()
        samples = batch_size if batch_size is not None else self.config.batch_size_per_step
        if samples is None:
            raise ConfigError("step() needs batch_size (or set batch_size_per_step)")
        check_int("batch_size", samples, 0, MAX_STEP_SAMPLES)
        keeper = self.state_keeper
        if not self.rounds.matching():
            progress = self._tracker.global_progress()
            replaced = False
            if progress.epoch > keeper.epoch:
                replaced = self._catch_up(progress.epoch)
            elif self.rounds.pending is None and keeper.check_due():
                if keeper.check_consistency(self._tracker):
                    self._took_state()
                    replaced = True
            if replaced:
                # This batch's gradients were computed on the parameters the
                # download just replaced: averaged with the others' they would
                # pull the new state back towards the old one.  Drop them.
                self._stale_batches += 1
                logger.debug("run %s: dropped a batch computed before a state download",
                             self.run_id)
                return False
        self.strategy.on_batch(samples)
        self._samples += samples
        self._local_steps += 1
        # After the batch: applying a background round's result replaces p.grad.
        stepped = self._finish_pending(block=False)
        if self.rounds.matching():
            # A background round is still forming its group: announcing the
            # next epoch now would tell the peers that have not joined yet
            # that they are behind, and they would download state instead.
            return stepped
        said = self._said()
        if self._loss is not None:
            said["loss"] = self._loss
        self._tracker.report(self._samples, keeper.epoch, **said)
        progress = self._tracker.global_progress()
        self.rounds.observe(progress)
        if progress.epoch > keeper.epoch or not progress.ready_to_step:
            return stepped
        return self._global_step(progress) or stepped

    def _note_loss(self, loss: float | torch.Tensor) -> None:
        """Keep ``loss`` for the next report (a finite number only)."""
        if isinstance(loss, torch.Tensor):
            if loss.numel() != 1:
                raise ConfigError(f"step(loss=...): a tensor of one value, got shape "
                                  f"{tuple(loss.shape)}")
            value = float(loss.detach())
        elif isinstance(loss, (int, float)) and not isinstance(loss, bool):
            value = float(loss)
        else:
            raise ConfigError(f"step(loss=...): a number or a tensor, got "
                              f"{type(loss).__name__}")
        if math.isfinite(value):
            self._loss = value

    async def astep(self, closure: Callable[[], Any] | None = None, *,
                    batch_size: int | None = None,
                    loss: float | torch.Tensor | None = None) -> bool:
        """:meth:`step` for asyncio and trio programs: it runs in a worker
        thread (``asyncio.to_thread`` or ``trio.to_thread.run_sync``, whichever
        loop awaits it), so the event loop goes on while a round runs.  The
        same rules as ``step``: one call at a time; the gradients are the
        ones ``backward`` left in the parameters.  Cancelling the awaiting
        task waits for the step to end (a round is bounded by its limits).
        """
        def call() -> bool:
            return self.step(closure, batch_size=batch_size, loss=loss)

        import asyncio

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            import trio

            return await trio.to_thread.run_sync(call)
        return await asyncio.to_thread(call)

    # -- global steps --------------------------------------------------------------

    def _global_step(self, progress: GlobalProgress) -> bool:
        """The collaboration is ready: average, step, advance the epoch."""
        keeper = self.state_keeper
        epoch, samples = keeper.epoch, self._samples
        if keeper.suspect:
            # Compare with the others first: a round now would carry a state
            # that may be apart into the next epoch (the check gives up after
            # MAX_CHECKS x CHECK_RETRY seconds without offers).
            return False
        alone = self.rounds.alone(progress)   # no other trainer
        if alone and self.rounds.discovering():
            return False
        if self.config.delay_updates and self.config.mode == "diloco":
            # The last outer step first: the delta is taken from the anchor it
            # moves, and the parameters it carries over.
            self._finish_pending(block=True)
        sent = self.strategy.round_tensors(samples, epoch)
        clip_total_norm(sent, self.config.clip_sent_norm)
        sent += [b.detach().to(torch.float32, copy=b.device.type == "cpu")
                 for b in self._buffers]
        sent = self._staging.stage(sent)   # device tensors into host buffers
        if self.config.delay_updates and not alone:
            self._finish_pending(block=True)
            self.rounds.start_background(epoch, sent, samples)
            self._reset_accumulation()
            keeper.epoch = epoch + 1   # announced once the group has formed
            return False
        serving = self._serving_peers_at(epoch)
        result = self.rounds.run(epoch, sent, samples, alone=alone)
        if result.info.outcome in ("averaged", "partial") and result.servers < serving:
            # Peers this one saw at the epoch averaged in another group: the
            # groups may now hold different states.  Compare, once their
            # offers are in (StateKeeper.expect_offers).
            logger.info("run %s epoch %d: a group of %d serving peers, %d seen at the "
                        "epoch; comparing states after the step", self.run_id, epoch,
                        result.servers, serving)
            keeper.expect_offers(serving)
        elif result.info.outcome in ("averaged", "partial") and self._lost_members(result):
            # A member is gone now: it may have died while sending its part's
            # results, after some members got them and before others did.
            logger.info("run %s epoch %d: a member of the group is gone; comparing states "
                        "after the step", self.run_id, epoch)
            keeper.mark_suspect()
        if result.info.outcome == "failed":
            swarm_epoch = self._tracker.global_progress().epoch
            if swarm_epoch > epoch:
                # The others formed this epoch's group without this peer and stepped:
                # a local step would only drift apart, so take their state instead.
                logger.info("run %s epoch %d: the swarm stepped to %d without this peer; "
                            "taking its state instead of a local step", self.run_id, epoch,
                            swarm_epoch)
                self.last_round = result.info
                self._reset_accumulation()
                self._catch_up(swarm_epoch)
                return False
        stepped = self._conclude(result)
        self._reset_accumulation()
        self._advance(epoch + 1)
        keeper.after_step()
        keeper.check_routinely(serving)
        return stepped

    def _serving_peers_at(self, epoch: int) -> int:
        """Peers that serve state (this one included if it does) whose fresh
        report (at most FRESH_REPORT s old) puts them at ``epoch``."""
        now = time.time()
        others = sum(1 for r in self._tracker.peers()
                     if r.epoch == epoch and not r.client_mode and not r.auxiliary
                     and now - r.time <= FRESH_REPORT)
        return others + (0 if self.node.client_mode else 1)

    def _lost_members(self, result: RoundResult) -> bool:
        """Whether a member of the round's group that accepts connections is no
        longer connected to this node (a node without ``connected_peers``: never)."""
        connected = getattr(self.node, "connected_peers", None)
        me = getattr(self.node, "peer_id", None)
        if connected is None or not result.reachable:
            return False
        try:
            live = set(connected())
        except Exception:   # the node is closing: nothing to compare with anyway
            return False
        return any(peer != me and peer not in live for peer in result.reachable)

    def _conclude(self, result: RoundResult) -> bool:
        """Apply a judged round: the global step; True if the parameters stepped."""
        info = result.info
        self.last_round = info
        if info.outcome in ("failed", "partial"):
            self.state_keeper.mark_suspect()   # the others may have stepped without this peer
        elif result.disputed:
            # A member said after the round that it lacks parts this peer got,
            # while their reducer is alive: the two now hold different states.
            logger.info("run %s epoch %d: parts %s are lacked by another member; comparing "
                        "states after the step", self.run_id, info.epoch,
                        list(result.disputed))
            self.state_keeper.mark_suspect()
        own = len(result.sent) - len(self._buffers)   # the strategy's tensors, then buffers
        if info.outcome == "failed":
            update = self.strategy.on_failure(result.sent[:own])
        else:
            update = result.averaged[:own] if result.averaged is not None else None
            # A partial round zeroes the parts that did not complete (no update
            # there, alike everywhere): zero is no buffer value, so each peer
            # keeps its own buffers then (the consistency check follows).
            if result.averaged is not None and self._buffers and info.outcome != "partial":
                self._take_buffers(result.averaged[own:])
        self.strategy.apply(update)
        if self.scheduler is not None and update is not None:
            self.scheduler.step()
        return update is not None

    def _take_buffers(self, averaged: list[torch.Tensor]) -> None:
        """The round's averages of the buffers (integer ones rounded)."""
        with torch.no_grad():
            for b, value in zip(self._buffers, averaged, strict=True):
                value = value.view_as(b)
                if not b.is_floating_point():
                    value = value.round()
                b.copy_(value.to(b.dtype))

    def _finish_pending(self, block: bool) -> bool:
        """Apply a background round's result if it has ended (or wait, with ``block``)."""
        result = self.rounds.finish(block)
        if result is None:
            return False
        stepped = self._conclude(result)
        self.state_keeper.after_step()
        return stepped

    def _reset_accumulation(self) -> None:
        self._samples = 0
        self.strategy.reset()

    def _advance(self, epoch: int) -> None:
        self.state_keeper.epoch = epoch
        self._tracker.update_epoch(epoch, **self._said())   # the new epoch, and its round

    def _said(self) -> dict[str, Any]:
        """What this peer's reports say of its last round, for people and monitors:
        (epoch, outcome, group size, the contributors its own part took)."""
        if not self.rounds.history:
            return {}
        last = self.rounds.history[-1]
        return {"last_round": (last.epoch, last.outcome, last.group_size, last.contributors)}

    def _assist(self) -> bool:
        """An auxiliary peer's step: help reduce the next round; True if one was joined."""
        epoch, info = self.rounds.assist(self._tracker, self.state_keeper.epoch,
                                         [*self._params, *self._buffers])
        self.state_keeper.epoch = epoch
        if info is None:
            return False
        self.last_round = info
        self._tracker.update_epoch(epoch, **self._said())   # the contributors it took
        return info.outcome == "averaged"

    # -- state from the swarm --------------------------------------------------------

    def _catch_up(self, swarm_epoch: int) -> bool:
        """The swarm is at a newer epoch: download its state (or adopt the epoch).
        True if the parameters were replaced by a download."""
        self.rounds.drop()
        verdict = self.state_keeper.catch_up(self._tracker, swarm_epoch)
        if verdict is CatchUp.SYNCED:
            self._took_state()
            return True
        if verdict is CatchUp.ADOPT:
            self._reset_accumulation()
            self._advance(swarm_epoch)
        return False

    def _took_state(self) -> None:
        """The state keeper loaded the swarm's state: train on from it, and offer it."""
        self._reset_accumulation()
        self._tracker.update_epoch(self.state_keeper.epoch)
        self.state_keeper.share(force=True)

    def sync_state(self, min_epoch: int | None = None, timeout: float | None = None) -> bool:
        """Download the newest state from peers at ``min_epoch`` or later; True if loaded.

        ``min_epoch`` defaults to the newest epoch the progress view knows.
        Called by ``step`` when this peer is behind; call it yourself to
        join at once.  Failures are logged and return False.
        """
        if min_epoch is None:
            min_epoch = max(self._tracker.global_progress().epoch, self.state_keeper.epoch)
        if not self.state_keeper.download(self._tracker, min_epoch, timeout):
            return False
        self._took_state()
        return True

    def save_checkpoint(self) -> None:
        """Write a checkpoint of the current state now (needs ``checkpoint_dir``)."""
        self.state_keeper.save_checkpoint()

    # -- torch-like state and lifetime ----------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the wrapped optimizer's and scheduler's state, DiLoCo's outer
        state, the buffers (``model=``).  The state-dict hooks
        (``register_state_dict_pre_hook``/``_post_hook``) run as torch's do."""
        for pre_hook in self._optimizer_state_dict_pre_hooks.values():
            pre_hook(self)
        state = self.state_keeper.full_state(own=True)
        del state["params"]
        for post_hook in self._optimizer_state_dict_post_hooks.values():
            hooked = post_hook(self, state)
            if hooked is not None:
                state = hooked
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` returned (the parameters are the model's
        own), after the load hooks' pre hooks and before their post hooks."""
        state = dict(state)
        for pre_hook in self._optimizer_load_state_dict_pre_hooks.values():
            hooked = pre_hook(self, state)
            if hooked is not None:
                state = hooked
        self.state_keeper.load({**state, "params": [p.detach() for p in self._params]})
        self._reset_accumulation()
        self._tracker.update_epoch(self.state_keeper.epoch)
        for post_hook in self._optimizer_load_state_dict_post_hooks.values():
            post_hook(self)

    def close(self) -> None:
        """Finish a background round, stop reporting progress and sharing state (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.rounds.pending is not None:
                self._finish_pending(block=True)
        finally:
            try:
                self.state_keeper.unshare()
            except NodeClosedError:
                pass
            self._tracker.close()

    def __enter__(self) -> Optimizer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is not None:
            self.rounds.drop()
        self.close()


def persistent_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    """``model``'s buffers that its ``state_dict`` holds, each once, in the
    order of ``model.modules()`` (non-persistent ones, such as masks derived
    from the configuration, are left out)."""
    seen: set[int] = set()
    out = []
    for module in model.modules():
        for name, buffer in module._buffers.items():
            if buffer is None or name in module._non_persistent_buffers_set \
                    or id(buffer) in seen:
                continue
            seen.add(id(buffer))
            out.append(buffer)
    return out
