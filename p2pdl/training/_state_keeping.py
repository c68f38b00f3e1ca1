"""The training state as peers and checkpoints see it: :class:`StateKeeper`.

The full state is one dictionary (format :data:`STATE_FORMAT`): the epoch,
the mode, the parameters, the wrapped optimizer's and the scheduler's state,
and what the strategy adds (DiLoCo's anchor and momentum), every tensor on
the CPU whatever device training uses.  It serializes deterministically, so
peers with equal states have equal SHA-256 digests, a peer that trains on a
GPU and one that trains on the CPU included; a state that comes in is copied
onto the devices of this peer's parameters and optimizer state.

:class:`StateKeeper` holds the epoch with it and does everything that moves
the state in or out of this peer:

* offer it to joiners after each global step (``node.statesync.share``);
* download the one the donors agree on when this peer is behind (catch-up),
  up to the progress quorum's epoch + 1; it never trains on at the swarm's
  epoch with parameters of its own (unless ``state_sync=False``);
* after a failed or partial round, compare digests with the peers at the
  same epoch (``node.statesync.offers``) and download the agreed one if
  this peer's differs (the consistency check);
* when the peers at an epoch agree on no state, download every state they
  offer and merge them (``_merge``): every peer that does so from the same
  offers ends with the same state, joiners included;
* write checkpoints every N epochs and resume from the newest
  (``_checkpoint``).

It decides and reports; the :class:`~p2pdl.Optimizer` resets its
accumulation and tells the progress tracker when a new state came in.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import io
import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import torch
from libp2p.peer.id import ID

from ..errors import CallTimeoutError, CheckpointError, ConfigError, StateSyncError
from ..statesync import vote_on_state
from ._checkpoint import CheckpointPolicy, latest_checkpoint, load_checkpoint, save_checkpoint
from ._merge import merge_states
from ._node_api import TrainingNode, TrainingTracker
from ._strategies import Strategy, check_like
from .config import OptimizerConfig

__all__ = ["StateKeeper", "CatchUp", "STATE_FORMAT", "CHECK_RETRY", "MAX_CHECKS",
           "MAX_MERGED_STATES", "on_device"]

logger = logging.getLogger(__name__)

#: Version of the state dictionary shared with joiners and written to checkpoints.
STATE_FORMAT = 1
#: The most distinct states a merge downloads (those offered by the most peers).
MAX_MERGED_STATES = 8
#: Seconds between consistency checks while the others have not shared the epoch yet.
CHECK_RETRY = 0.2
#: Consistency checks after which a peer stops looking for the others' state of its epoch.
MAX_CHECKS = 50
#: Consistency checks (of CHECK_RETRY s) a peer waits, at most, for the offers of the
#: peers it expects at its epoch (``expect_offers``) before it compares with fewer.
SPLIT_CHECKS = 10
#: This peer's own vote in the consistency check.
_THIS_PEER = object()


class CatchUp(enum.Enum):
    """What a peer that is behind does now (:meth:`StateKeeper.catch_up`)."""

    #: The swarm's state was downloaded and loaded.
    SYNCED = "synced"
    #: Take the swarm's epoch with this peer's own parameters (``state_sync=False`` only).
    ADOPT = "adopt"
    #: Nothing yet: the last download failed a moment ago.
    WAIT = "wait"


class StateKeeper:
    """The epoch and the full state of one run: share, fetch, check, checkpoint.

    ``epoch`` is the number of global steps the state has taken; ``suspect``
    says that the last round may have left this peer's state apart from the
    others' (a consistency check is due); ``unconfirmed``, that the state
    came from a lone donor (the check is due after the next round).  Called
    from the training thread.
    """

    def __init__(self, node: TrainingNode, run_id: str, config: OptimizerConfig, *,
                 optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                 scheduler: Any, strategy: Strategy,
                 buffers: Sequence[torch.Tensor] = ()) -> None:
        self.node = node
        self.run_id = run_id
        self.config = config
        self.optimizer = optimizer
        self.params = list(params)
        #: the model's buffers that are part of the state (Optimizer's model=)
        self.buffers = list(buffers)
        self.scheduler = scheduler
        self.strategy = strategy
        self.epoch = 0
        self.suspect = False
        self.unconfirmed = False
        self.policy = (CheckpointPolicy(config.checkpoint_dir, config.checkpoint_every,
                                        config.checkpoint_keep)
                       if config.checkpoint_dir is not None else None)
        self._checks = 0
        self._expected = 0   # offers awaited at this epoch, this peer's included
        self._routine = False   # the check due is a routine one (check_routinely)
        self._next_check = 0.0
        self._next_sync = 0.0
        self._sync_failures = 0
        self._shared_digest: tuple[int, bytes] | None = None
        self._last_checkpoint: int | None = None
        self._counters = {"state_syncs": 0, "state_sync_failures": 0, "checkpoints": 0,
                          "shared": 0, "consistency_checks": 0, "repairs": 0,
                          "unconfirmed_syncs": 0, "merges": 0}

    def statistics(self) -> dict[str, int]:
        """State syncs (and failures, and those from a lone donor), checkpoints, shares,
        consistency checks, repairs, merges of states nobody agreed on."""
        return dict(self._counters)

    # -- the full state -----------------------------------------------------------------

    def full_state(self, *, own: bool = False) -> dict[str, Any]:
        """The state as shared (``own``: as checkpointed, with this peer's own
        parts): its tensors on the CPU (the live ones where they are there
        already, copies of the others); the model's buffers under
        ``"buffers"`` where it has them.  The parameters are the strategy's
        shared ones (DiLoCo with delayed updates or several fragments: the
        anchor; the inner steps since are this peer's own).  In DiLoCo mode
        the shared state's ``"optimizer"`` is None: the inner optimizer's
        state is each peer's own (its moments follow its own batches), so
        peers that share every outer step have equal states and digests."""
        shared = self.strategy.shared_params()
        inner = own or self.strategy.shares_optimizer_state()
        state = {
            "format": STATE_FORMAT, "epoch": self.epoch, "mode": self.config.mode,
            "params": [p.detach() for p in (self.params if shared is None else shared)],
            "optimizer": self.optimizer.state_dict() if inner else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "diloco": self.strategy.extra_state()}
        if self.buffers:
            state["buffers"] = [b.detach() for b in self.buffers]
        return on_device(state, torch.device("cpu"))

    def load(self, state: Any) -> None:
        """Load a state from a peer or a checkpoint (ConfigError when it does not fit).

        Everything is checked before anything is loaded.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise ConfigError("the state is not a p2pdl optimizer state of this format")
        if state.get("mode") != self.config.mode:
            raise ConfigError(f"the state is of mode {state.get('mode')!r}, this optimizer "
                              f"runs {self.config.mode!r}")
        params = state.get("params")
        epoch = state.get("epoch")
        if not isinstance(epoch, int) or epoch < 0:
            raise ConfigError("the state's epoch is invalid")
        check_like(params, self.params, "parameters")
        buffers = state.get("buffers")
        _check_buffers(buffers, self.buffers)
        extra = state.get("diloco")
        self.strategy.check_extra_state(extra)
        if state.get("optimizer") is None and self.strategy.shares_optimizer_state():
            raise ConfigError("the state has no optimizer state")
        try:
            if state.get("optimizer") is not None:   # None: DiLoCo's inner state stays own
                self.optimizer.load_state_dict(state["optimizer"])
            if self.scheduler is not None and state.get("scheduler") is not None:
                self.scheduler.load_state_dict(state["scheduler"])
        except (KeyError, ValueError, TypeError, RuntimeError) as exc:
            raise ConfigError(f"the state's optimizer state does not fit: {exc}") from None
        with torch.no_grad():
            for p, value in zip(self.params, cast(Sequence[torch.Tensor], params), strict=True):
                p.copy_(value)
            for b, value in zip(self.buffers, buffers or (), strict=True):
                b.copy_(value)
        self.strategy.load_extra_state(extra)
        self.epoch = epoch
        self._shared_digest = None   # the digest of the state shared before, not this one

    def serialized(self) -> bytes:
        """The full state as ``torch.save`` writes it."""
        buffer = io.BytesIO()
        torch.save(self.full_state(), buffer)
        return buffer.getvalue()

    def digest(self) -> bytes:
        """SHA-256 of the state as shared: equal on every peer with the same state."""
        if self._shared_digest is not None and self._shared_digest[0] == self.epoch:
            return self._shared_digest[1]
        return hashlib.sha256(self.serialized()).digest()

    # -- sharing ------------------------------------------------------------------------

    def share(self, force: bool = False) -> None:
        """Offer the current state to joiners, every ``share_state_every`` epochs
        (``force``: now).  Servers only: clients cannot be dialled; auxiliary
        peers have no state of their own.  Not a state from a lone donor
        before the next round: offering it would make this peer a second
        voice for a state nobody confirmed."""
        if self.config.auxiliary or self.node.client_mode or self.unconfirmed:
            return
        if not force and self.epoch % self.config.share_state_every:
            return
        payload = self.serialized()
        self.node.statesync.share(self.run_id, self.epoch, payload)
        self._shared_digest = (self.epoch, hashlib.sha256(payload).digest())
        self._counters["shared"] += 1

    def unshare(self) -> None:
        """Stop offering the state (NodeClosedError when the node is gone)."""
        self.node.statesync.unshare(self.run_id)

    def after_step(self) -> None:
        """A global step was taken: share the new state, checkpoint it when due; a state
        from a lone donor is checked against the others' now."""
        if self.unconfirmed:
            self.unconfirmed = False
            self.mark_suspect()
        self.share()
        if self.policy is not None and self.policy.due(self.epoch, self._last_checkpoint):
            self.save_checkpoint()

    # -- downloading --------------------------------------------------------------------

    def download(self, tracker: TrainingTracker, min_epoch: int,
                 timeout: float | None = None) -> bool:
        """Download and load the state the serving peers of the tracker's view agree
        on, at ``min_epoch`` or later; True if loaded.  Failures are logged.

        The newest epoch asked for is the progress quorum's epoch + 1 (the
        view's epoch where the tracker has no quorum), or ``min_epoch`` if
        that is later: a donor that claims a newer one does not count and is
        flagged by state sync.  Of the epochs allowed, state sync takes the
        newest where enough donors agree on one state (``fetch``).  A state
        only one donor vouched for (it was the only one) is loaded but
        unconfirmed: the consistency check runs after the next round.
        """
        donors, max_epoch = _donors(tracker, min_epoch)
        if not donors:
            logger.info("run %s: no peer can send the state of epoch %d yet", self.run_id,
                        min_epoch)
            return False
        try:
            download = self.node.statesync.fetch(
                self.run_id, [ID(d) for d in donors], min_epoch=min_epoch,
                max_epoch=max_epoch, timeout=timeout or self.config.sync_timeout)
            if hashlib.sha256(download.payload).digest() != download.digest:
                raise StateSyncError("the downloaded state does not match its digest")
            state = torch.load(io.BytesIO(download.payload), map_location="cpu",
                               weights_only=True)
            self.load(state)
        except (StateSyncError, CallTimeoutError, ConfigError) as exc:
            self._counters["state_sync_failures"] += 1
            logger.warning("run %s: state sync failed: %s", self.run_id, exc)
            return False
        except Exception as exc:  # unpickling garbage from a donor
            self._counters["state_sync_failures"] += 1
            logger.warning("run %s: the downloaded state is unusable: %r", self.run_id, exc)
            return False
        self._counters["state_syncs"] += 1
        self.suspect = False
        self.unconfirmed = not getattr(download, "confirmed", True)
        if self.unconfirmed:
            self._counters["unconfirmed_syncs"] += 1
        logger.info("run %s: synced state of epoch %d from %d donor(s) in %.1f s "
                    "(%.1f MB)%s", self.run_id, download.epoch, len(download.donors),
                    download.seconds, len(download.payload) / 1e6,
                    "; unconfirmed (one donor): checked after the next round"
                    if self.unconfirmed else "")
        return True

    def catch_up(self, tracker: TrainingTracker, swarm_epoch: int) -> CatchUp:
        """The swarm is at ``swarm_epoch``, past this peer: download its state, or say
        to adopt the epoch (``state_sync=False`` only), or to wait (``sync_retry``
        between attempts).

        When the download fails because the donors at an epoch agree on no
        state, this peer merges their states as they do (:meth:`merge_offered`).
        It never takes the swarm's epoch with parameters of its own: trained
        on, they would be a state nobody else holds.
        """
        if not self.config.state_sync:
            logger.info("run %s: behind (epoch %d < %d); adopting the epoch", self.run_id,
                        self.epoch, swarm_epoch)
            return CatchUp.ADOPT
        if time.monotonic() < self._next_sync:
            return CatchUp.WAIT
        if self.download(tracker, min_epoch=swarm_epoch) \
                or self._merge_split(tracker, swarm_epoch):
            self._sync_failures = 0
            return CatchUp.SYNCED
        self._sync_failures += 1
        self._next_sync = time.monotonic() + self.config.sync_retry
        logger.info("run %s: behind (epoch %d < %d), no state after %d attempt(s); "
                    "trying again in %.1f s", self.run_id, self.epoch, swarm_epoch,
                    self._sync_failures, self.config.sync_retry)
        return CatchUp.WAIT

    def _merge_split(self, tracker: TrainingTracker, min_epoch: int) -> bool:
        """A joiner's fallback: when the donors at the newest epoch from ``min_epoch``
        on (at most the quorum's + 1) offer several states and none has a
        majority, merge them as the peers there do; True if a state was loaded."""
        donors, max_epoch = _donors(tracker, min_epoch)
        if len(donors) < 2:
            return False
        offers = self.node.statesync.offers(self.run_id, [ID(d) for d in donors])
        epochs = sorted({e for e, _ in offers.values() if min_epoch <= e <= max_epoch},
                        reverse=True)
        for epoch in epochs:
            at = {p: d for p, (e, d) in offers.items() if e == epoch}
            if len(at) < 2:
                continue
            if vote_on_state({p: (epoch, d) for p, d in at.items()},
                             min_epoch=epoch, max_epoch=epoch).won:
                return False   # they agree: the download failed for another reason
            return self.merge_offered(epoch, at, mine=None)
        return False

    def merge_offered(self, epoch: int, offers: dict[ID, bytes], mine: bytes | None) -> bool:
        """Merge the states the peers at ``epoch`` offer (``{peer: digest}``; ``mine``:
        this peer's own digest, counted as one more holder, or None) and load
        the result; True if loaded.

        Each distinct state (at most :data:`MAX_MERGED_STATES`: those with the
        most holders, then the smallest digests) is downloaded from its
        holders and weighted by their number; :func:`~p2pdl.training._merge.merge_states`
        takes the weighted lower median of every floating value.  Any
        download or check that fails cancels the merge: a merge of fewer
        states would not be the one the others compute.  The merged state is
        not offered before the next global step: this peer keeps offering the
        state it held, so that every peer that checks sees the same offers and
        computes the same merge; after that step, it is checked again.
        """
        holders: dict[bytes, list[Any]] = {}
        for peer, digest in offers.items():
            holders.setdefault(digest, []).append(peer)
        if mine is not None:
            holders.setdefault(mine, []).append(_THIS_PEER)
        chosen = sorted(holders, key=lambda d: (-len(holders[d]), d))[:MAX_MERGED_STATES]
        chosen.sort()
        states, weights = [], []
        try:
            for digest in chosen:
                if digest == mine:
                    states.append(self.full_state())
                else:
                    states.append(self._fetch_exact(epoch, digest,
                                                    [p for p in holders[digest]
                                                     if p is not _THIS_PEER]))
                weights.append(float(len(holders[digest])))
            merged = merge_states(states, weights)
            self.load(merged)
        except Exception as exc:  # a download, a state or the merge failed
            self._counters["state_sync_failures"] += 1
            logger.warning("run %s epoch %d: merging the %d states the peers hold failed: %s",
                           self.run_id, epoch, len(chosen), exc)
            return False
        self._counters["merges"] += 1
        self.suspect = False
        self.unconfirmed = True   # offered after the next step, and checked again then
        logger.warning("run %s epoch %d: the peers agree on no state; merged the %d states "
                       "of %d peer(s) (weighted median of every value)", self.run_id, epoch,
                       len(chosen), sum(len(holders[d]) for d in chosen))
        return True

    def _fetch_exact(self, epoch: int, digest: bytes, donors: list[ID]) -> dict[str, Any]:
        """The state of ``digest`` at ``epoch`` from ``donors``, checked (StateSyncError,
        ConfigError)."""
        download = self.node.statesync.fetch(self.run_id, donors, min_epoch=epoch,
                                              digest=digest, timeout=self.config.sync_timeout)
        if hashlib.sha256(download.payload).digest() != digest:
            raise StateSyncError("a downloaded state does not match its digest")
        state = torch.load(io.BytesIO(download.payload), map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or state.get("epoch") != epoch \
                or state.get("format") != STATE_FORMAT or state.get("mode") != self.config.mode:
            raise ConfigError(f"a state offered for epoch {epoch} is not one of it")
        check_like(state.get("params"), self.params, "parameters")
        self.strategy.check_extra_state(state.get("diloco"))
        return state

    # -- the consistency check ----------------------------------------------------------

    def mark_suspect(self) -> None:
        """The last round failed or was partial: check before the next round."""
        self.suspect = True
        self._routine = False

    def expect_offers(self, peers: int) -> None:
        """The last round's group left out peers seen at its epoch (``peers``
        serving peers in all, this one included): they averaged in another
        group, perhaps to another state.  Check before the next round, once
        their offers are in (at most :data:`SPLIT_CHECKS` tries)."""
        self._expected = max(self._expected, peers)
        self.suspect = True
        self._routine = False

    def check_routinely(self, peers: int) -> None:
        """After a global step that went well: every ``check_state_every`` epochs,
        at an epoch where the peers offer their states, compare anyway, once
        the offers of the ``peers`` serving peers seen at the last epoch are
        in (a split that no round noticed, e.g. a view that missed the other
        group, would otherwise last)."""
        every = self.config.check_state_every
        others = peers - (0 if self.node.client_mode else 1)
        if not every or self.epoch % every or self.epoch % self.config.share_state_every \
                or self.config.auxiliary or self.suspect or others < 1:
            return
        self.expect_offers(peers)
        self._routine = True   # gives up after SPLIT_CHECKS tries without offers

    def check_due(self) -> bool:
        """Whether a consistency check should run now."""
        return self.suspect and time.monotonic() >= self._next_check

    def check_consistency(self, tracker: TrainingTracker) -> bool:
        """Is this peer's state the swarm's?  True if it was replaced by the agreed one.

        Every peer at this epoch that serves state says its state's digest
        (``node.statesync.offers``).  They and this peer vote
        (``p2pdl.statesync.vote_on_state``): the digest that at least two
        hold, and more than half, wins.  With none (no tie rule: a liar could
        win a split by grinding a small digest), this peer merges the offered
        states (:meth:`merge_offered`), as every peer that checks from the
        same offers does; a merge that fails is tried again.  With only one
        other peer, one against one, the smaller digest wins, so that both
        pick the same.  A peer that holds another state downloads the
        winner.  While no peer offers this epoch, it asks again after
        :data:`CHECK_RETRY` s, and gives up after :data:`MAX_CHECKS` tries
        (a routine check, :meth:`check_routinely`: :data:`SPLIT_CHECKS`).
        """
        self._checks += 1
        self._next_check = time.monotonic() + CHECK_RETRY
        give_up = self._checks >= (SPLIT_CHECKS if self._routine else MAX_CHECKS)
        donors = [r.peer_id for r in tracker.peers()
                  if r.epoch == self.epoch and not r.client_mode and not r.auxiliary]
        offers = self.node.statesync.offers(self.run_id, [ID(d) for d in donors]) \
            if donors else {}
        same = {peer: digest for peer, (epoch, digest) in offers.items() if epoch == self.epoch}
        if len(same) + 1 < self._expected and self._checks < SPLIT_CHECKS:
            logger.debug("run %s epoch %d: %d of the %d peers expected offer this epoch's "
                         "state yet", self.run_id, self.epoch, len(same) + 1, self._expected)
            return False   # the other group's offers are on their way
        if not same:
            logger.debug("run %s epoch %d: no peer offers this epoch's state yet (asked %d, "
                         "offers %s)", self.run_id, self.epoch, len(donors), offers)
            if give_up:
                logger.info("run %s epoch %d: no peer offered this epoch's state to compare "
                            "with; the consistency check is dropped", self.run_id, self.epoch)
                self.suspect, self._checks, self._expected = False, 0, 0
            return False   # the others have not shared this epoch yet: ask again soon
        self._counters["consistency_checks"] += 1
        checks, self.suspect, self._checks = self._checks, False, 0
        self._expected = 0
        mine = self.digest()
        if len(same) == 1:
            # One other peer: one against one, the smallest digest wins, so that
            # both pick the same (neither can outvote a liar here).
            ((peer, theirs),) = same.items()
            winner = min(mine, theirs)
            holders = [peer] if winner != mine else []
            agreed = 2 if theirs == mine else 1
        else:
            vote = vote_on_state({**{p: (self.epoch, d) for p, d in same.items()},
                                  _THIS_PEER: (self.epoch, mine)},
                                 min_epoch=self.epoch, max_epoch=self.epoch)
            if not vote.won:
                logger.warning("run %s epoch %d: consistency check: the %d peers at this "
                               "epoch agree on no state (%s); merging them", self.run_id,
                               self.epoch, len(same) + 1, vote.reason)
                if self.merge_offered(self.epoch, same, mine):
                    return True
                # Try again soon (the offers may have changed), MAX_CHECKS times at most.
                self.suspect, self._checks = not give_up, 0 if give_up else checks
                return False
            winner = cast(bytes, vote.digest)
            holders = [p for p in vote.holders if p is not _THIS_PEER]
            agreed = len(vote.holders)
        logger.info("run %s epoch %d: consistency check: this peer's state is %s of %d "
                    "peers'", self.run_id, self.epoch,
                    "the agreed one" if winner == mine else "not the agreed one",
                    len(same) + 1)
        if winner == mine:
            return False
        logger.warning("run %s epoch %d: this peer's state differs from %d of %d peers' "
                       "after a failed or partial round; downloading theirs", self.run_id,
                       self.epoch, agreed, len(same) + 1)
        try:
            download = self.node.statesync.fetch(self.run_id, holders, min_epoch=self.epoch,
                                                  digest=winner,
                                                  timeout=self.config.sync_timeout)
            self.load(torch.load(io.BytesIO(download.payload), map_location="cpu",
                                 weights_only=True))
        except Exception as exc:  # the download or its content failed: train on
            self._counters["state_sync_failures"] += 1
            logger.warning("run %s: repairing the state failed: %s", self.run_id, exc)
            return False
        self._counters["repairs"] += 1
        return True

    # -- checkpoints --------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """Write a checkpoint of the current state now (ConfigError without
        ``checkpoint_dir``; a failed write is logged)."""
        if self.policy is None:
            raise ConfigError("save_checkpoint needs checkpoint_dir")
        try:
            save_checkpoint(self.policy.directory, self.full_state(own=True), self.epoch,
                            keep=self.policy.keep)
        except CheckpointError as exc:
            logger.error("run %s: checkpoint of epoch %d failed: %s", self.run_id,
                         self.epoch, exc)
            return
        self._last_checkpoint = self.epoch
        self._counters["checkpoints"] += 1

    def resume(self) -> bool:
        """Load the newest intact checkpoint of ``checkpoint_dir``, else of
        ``resume_from``, if any; True if one was loaded.  A ``resume_from``
        that holds none is a ConfigError (the user named it to start from)."""
        if self.policy is not None and latest_checkpoint(self.policy.directory) is not None:
            state, epoch = load_checkpoint(self.policy.directory)
            self.load(state)
            self._last_checkpoint = epoch
            logger.info("run %s: resumed from the checkpoint of epoch %d", self.run_id, epoch)
            return True
        source = self.config.resume_from
        if source is None:
            return False
        if latest_checkpoint(source) is None:
            raise ConfigError(f"resume_from {source}: no intact checkpoint there")
        state, epoch = load_checkpoint(source)
        self.load(state)
        logger.info("run %s: started from the checkpoint of epoch %d in %s", self.run_id,
                    epoch, source)
        return True


def _donors(tracker: TrainingTracker, min_epoch: int) -> tuple[list[bytes], int]:
    """The serving peers of the tracker's view at ``min_epoch`` or later, and the
    newest epoch to take from them: the progress quorum's + 1 (the view's epoch
    where the tracker has no quorum), or ``min_epoch`` if that is later."""
    donors = [r.peer_id for r in tracker.peers()
              if r.epoch >= min_epoch and not r.client_mode and not r.auxiliary]
    progress = tracker.global_progress()
    quorum = getattr(progress, "quorum_epoch", progress.epoch)
    return donors, max(min_epoch, quorum + 1)


def on_device(state: Any, device: torch.device) -> Any:
    """``state`` (tensors in dicts, lists and tuples) with every tensor on
    ``device``: ``state`` itself when they all are there already (so that it
    serializes to the same bytes), else copies of the containers that hold
    a tensor elsewhere, that tensor moved."""
    if isinstance(state, torch.Tensor):
        return state if state.device == device else state.to(device)
    if isinstance(state, dict):
        moved = {k: on_device(v, device) for k, v in state.items()}
        if all(moved[k] is v for k, v in state.items()):
            return state
        out = copy.copy(state)   # its own type (OrderedDict, defaultdict, ...)
        out.update(moved)
        return out
    if isinstance(state, (list, tuple)):
        items = [on_device(v, device) for v in state]
        if all(a is b for a, b in zip(items, state, strict=True)):
            return state
        return items if isinstance(state, list) else type(state)(items) \
            if type(state) is tuple else type(state)(*items)
    return state


def _check_buffers(values: Any, reference: Sequence[torch.Tensor]) -> None:
    """ConfigError unless ``values`` are the model's buffers' like (shapes,
    dtypes, finite): a state without buffers fits only a model without any."""
    if not reference:
        if values is not None:
            raise ConfigError("the state has model buffers; this optimizer has no model= "
                              "(every peer of a run passes the same)")
        return
    if not isinstance(values, (list, tuple)) or len(values) != len(reference):
        raise ConfigError(f"the state's model buffers do not match this model "
                          f"({len(reference)} buffers expected)")
    for i, (value, ref) in enumerate(zip(values, reference, strict=True)):
        if not isinstance(value, torch.Tensor) or value.shape != ref.shape \
                or value.dtype != ref.dtype \
                or (value.is_floating_point() and not bool(torch.isfinite(value).all())):
            raise ConfigError(f"the state's model buffer {i} does not fit (expected finite "
                              f"{ref.dtype} of {tuple(ref.shape)})")
