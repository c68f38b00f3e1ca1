"""The progress service of a node: gossip of signed reports, DHT snapshots.

One :class:`ProgressService` per node answers ``/p2pdl/progress/1.0.0`` and
holds the runs this node tracks; :meth:`ProgressService.track` opens a
:class:`ProgressTracker` for one run.  A tracker runs three tasks:

* **publisher** -- signs the local report when :class:`PublishPolicy` says so
  and pushes it to every member of the run (one coalescing push loop per
  member: a member that is slow gets the newest report, never a queue);
* **anti-entropy** -- every ``sync_interval`` a push with a digest to one
  random member, whose answer carries the reports this peer lacks;
* **snapshots** -- the signed report stored under ``p2pdl/progress/<run>``
  in the DHT (at start, then every ``snapshot_interval``); read at
  start (late joiners), while the peer knows no member, and when no live
  report came for ``partition_timeout`` (gossip partitioned).

Members are the peers whose reports the view holds or whose snapshot
entries have not expired.  A report enters the view only if its peer is a
member of the run as the node's membership says (``context.members``; a
credential the report carries is offered to it first), and only within its
role's caps; a monitor's reports count for nothing.  Peers caught beyond
their caps or far ahead of the quorum's epoch are written in the node's
flag book (``context.flags``).  The logic is sans-IO: the view and the
checks in ``_state``, what a tracker knows of its run in ``_gossip``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio
from libp2p.peer.id import ID

from .._concurrency import open_service_nursery
from ..dht import DHTService, Schema
from ..errors import CallTimeoutError, ConfigError, LocalProtocolError, P2PDLError
from ..net import Host
from ..service import (
    Call,
    FlagBook,
    MembershipView,
    ReachabilityView,
    RpcEndpoint,
    ServiceContext,
    Statistics,
    check_run_id,
    run_of_request,
    serve_nothing,
)
from ..wire import Message, RequestContext
from ._gossip import Absorbed, RunGossip, TrackerStatistics, short
from ._messages import (
    PROGRESS_PROTOCOL,
    Push,
    Report,
    Reports,
    SnapshotEntry,
    sign_report,
)
from ._state import (
    GlobalProgress,
    PeerReport,
    PublishPolicy,
    RateEMA,
    Verdict,
    check_info,
    check_last_round,
    check_loss,
    info_of,
    path_kind,
)
from .config import (
    MAX_ADDRS,
    MAX_CREDENTIAL_SIZE,
    SNAPSHOT_PREFIX,
    ProgressConfig,
)

__all__ = ["ProgressService", "ProgressTracker", "SNAPSHOT_SCHEMA", "ProgressStatistics",
           "ALONE_READ_INTERVAL"]

logger = logging.getLogger(__name__)

#: Built into every node: snapshot records hold one signed subkey per peer.
SNAPSHOT_SCHEMA = Schema(SNAPSHOT_PREFIX, SnapshotEntry, dictionary=True, signed_subkeys=True)



@dataclasses.dataclass(frozen=True)
class ProgressStatistics(Statistics):
    """What ``ProgressService.statistics()`` says: the ``runs`` tracked and the
    reports dropped because this node tracks no run of theirs."""

    runs: list[str]
    reports_unknown_run: int = 0


#: While it knows no member, a peer that started tracking less than ``join_wait``
#: ago reads the DHT snapshot this often (s): a joiner hears the swarm at once.
ALONE_READ_INTERVAL = 0.25


@dataclasses.dataclass(frozen=True)
class _Dependencies:
    """What a tracker uses of its node, handed over by the service."""

    host: Host
    call: Call
    clock: Callable[[], float]
    dht: DHTService
    reachability: ReachabilityView
    members: MembershipView
    flags: FlagBook


class ProgressService:
    """Answers progress pushes and holds this node's trackers (``node.progress``)."""

    def __init__(self, context: ServiceContext, config: ProgressConfig | None = None, *,
                 dht: DHTService, reachability: ReachabilityView) -> None:
        self._deps = _Dependencies(context.host, context.call, context.clock, dht,
                                   reachability, context.members, context.flags)
        self.config = config or ProgressConfig()
        self._trackers: dict[str, ProgressTracker] = {}
        self._unknown_run = 0
        # A run's snapshot key (prefix + run id) is that run's: on a node that
        # guards the run, stored and served to its members only.
        dht.scope_run_keys(SNAPSHOT_PREFIX, lambda rest: rest)
        dht.register_schema(SNAPSHOT_SCHEMA)

    def statistics(self) -> ProgressStatistics:
        """``runs`` tracked and ``reports_unknown_run`` (dropped: no tracker for their run)."""
        return ProgressStatistics(sorted(self._trackers), self._unknown_run)

    def endpoints(self) -> list[RpcEndpoint]:
        """``/p2pdl/progress/1.0.0``: run-scoped, each push names its run."""
        return [RpcEndpoint(PROGRESS_PROTOCOL, self.handle, run_id_of=run_of_request)]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """No background work of its own: each tracker runs its tasks in its block."""
        await serve_nothing(task_status)

    def tracker(self, run_id: str) -> ProgressTracker | None:
        return self._trackers.get(run_id)

    def reported_samples(self, run_id: str, peer: ID, epoch: int) -> int | None:
        """What ``peer``'s own signed reports say it processed at ``epoch``.

        None when this node tracks no progress for ``run_id`` (no evidence
        either way); otherwise the largest ``samples_accumulated`` over the
        reports of ``peer`` at ``epoch`` that this node accepted, 0 when it
        has none.  Kept for the local epoch and the ones just before and
        after it, so that a round right after a step can still be judged.
        """
        tracker = self._trackers.get(run_id)
        return None if tracker is None else tracker.reported_samples(peer, epoch)

    def weight_evidence(self, run_id: str, peer: ID, epoch: int,
                        report: Report | None = None) -> int | None:
        """:meth:`reported_samples`, after taking ``report`` as evidence.

        ``report`` is what ``peer`` itself attached to its claim (an
        all-reduce ``ar.begin``), ``peer`` being the authenticated peer of
        that stream.  It goes through exactly the checks of a pushed report
        (run, values, signature, membership, role caps, staleness) and, if
        accepted, enters the view like one; a report of another peer than
        ``peer`` is refused.  Refused reports are counted
        (``evidence_refused``) and change nothing.  None when this node
        tracks no progress for ``run_id``.
        """
        tracker = self._trackers.get(run_id)
        if tracker is None:
            return None
        if report is not None:
            tracker.take_evidence(report, peer)
        return tracker.reported_samples(peer, epoch)

    def signed_report(self, run_id: str, epoch: int) -> Report | None:
        """This node's own last signed report for ``run_id`` at ``epoch``.

        Kept for the node's two latest epochs (a round of epoch ``e`` may run
        while the tracker already is at ``e + 1``); None when the node tracks
        no such run or signed no report at that epoch.
        """
        tracker = self._trackers.get(run_id)
        return None if tracker is None else tracker.own_report(epoch)

    async def handle(self, ctx: RequestContext, request: Message) -> Message:
        assert isinstance(request, Push)
        tracker = self._trackers.get(request.run_id)
        if tracker is None:
            self._unknown_run += len(request.reports)
            return Reports()
        return tracker.on_push(ctx.peer_id, request)

    @asynccontextmanager
    async def track(self, run_id: str, target_batch_size: int, *, auxiliary: bool = False,
                    client_mode: bool | None = None, config: ProgressConfig | None = None,
                    name: str | None = None) -> AsyncIterator[ProgressTracker]:
        """Take part in run ``run_id``'s progress for the duration of the block.

        ``auxiliary`` peers reduce but process no samples: they publish
        reports with no samples (so that they count as members and get the
        gossip) and follow the epoch.  ``client_mode`` overrides the node's
        (None: the node's own, as reachability decides).  ``config``
        overrides the node's :class:`ProgressConfig` for this run.  ``name``:
        a display name the reports carry (1 to MAX_NAME_LENGTH printable
        characters), for people watching the run.  On exit the tasks end and
        reports for the run are no longer accepted.

        Raises :class:`ConfigError` for a bad run id, target or name, or when
        the node already tracks ``max_runs`` runs or this one.
        """
        check_run_id(run_id)
        if name is not None and check_info(name, None, None) is not None:
            raise ConfigError(f"name: {check_info(name, None, None)}, got {name!r}")
        if isinstance(target_batch_size, bool) or not isinstance(target_batch_size, int) \
                or target_batch_size < 1:
            raise ConfigError(f"target_batch_size must be a positive integer, "
                              f"got {target_batch_size!r}")
        if run_id in self._trackers:
            raise ConfigError(f"this node already tracks run {run_id!r}")
        config = config or self.config
        if len(self._trackers) >= config.max_runs:
            raise ConfigError(f"this node already tracks {len(self._trackers)} runs "
                              f"(max_runs)")
        async with open_service_nursery() as nursery:
            tracker = ProgressTracker(self._deps, run_id, target_batch_size, auxiliary,
                                      client_mode, config, nursery, name)
            self._trackers[run_id] = tracker
            try:
                tracker.start()
                yield tracker
            finally:
                del self._trackers[run_id]
                tracker.close()
                nursery.cancel_scope.cancel()


class ProgressTracker:
    """This peer's part in one run's progress.  Open it with :meth:`ProgressService.track`.

    Call :meth:`report` after each local step; read :meth:`global_progress`
    or await :meth:`wait_ready`; call :meth:`update_epoch` after the step.
    What it knows and decides of the run's gossip is a
    :class:`~p2pdl.progress._gossip.RunGossip` (sans-IO); the tracker signs,
    pushes, schedules and wakes up.
    """

    def __init__(self, deps: _Dependencies, run_id: str, target_batch_size: int,
                 auxiliary: bool, client_mode: bool | None, config: ProgressConfig,
                 nursery: trio.Nursery, name: str | None = None) -> None:
        self._deps = deps
        self.run_id = run_id
        self.target_batch_size = target_batch_size
        self.auxiliary = auxiliary
        self._client_mode = client_mode
        self.config = config
        self._nursery = nursery
        self._host = deps.host
        self._clock = deps.clock
        self._peer_id: ID = deps.host.peer_id
        self._key = deps.host.libp2p.get_private_key()
        self._gossip = RunGossip(self._peer_id.to_bytes(), run_id, target_batch_size, config,
                                 members=deps.members, flags=deps.flags, now=self._clock())
        self._view = self._gossip.view
        self._policy = PublishPolicy(config)
        self._ema = RateEMA(config.rate_half_life)
        self._epoch = 0
        self._samples = 0
        self._rate_override: float | None = None
        self.name = name
        self._loss: float | None = None
        self._last_round: tuple[int, str, int, tuple[bytes, ...] | None] | None = None
        self._own: Report | None = None
        self._own_by_epoch: dict[int, Report] = {}   # the two latest epochs' last own reports
        self._pending: dict[bytes, bool] = {}     # peer -> a push is due (with a reply wanted)
        self._inflight: set[bytes] = set()
        self._limiter = trio.Semaphore(config.max_concurrent_pushes)
        self._changed = trio.Event()
        self._wakeup = trio.Event()
        self._snapshot_due = trio.Event()
        self._closed = False
        self._votes = False          # the local epoch counts in the quorum (see _state)
        self._credential_warned = False

    def start(self) -> None:
        """Start the tracker's tasks (publishing, anti-entropy, snapshots) in its nursery."""
        self._nursery.start_soon(self._publisher)
        self._nursery.start_soon(self._anti_entropy)
        self._nursery.start_soon(self._snapshots)

    def close(self) -> None:
        """Stop publishing and pushing (the service cancels the tasks)."""
        self._closed = True

    def own_report(self, epoch: int) -> Report | None:
        """This peer's last signed report at ``epoch`` (its two latest epochs kept)."""
        return self._own_by_epoch.get(epoch)

    def members(self) -> list[bytes]:
        """The peers this tracker pushes to (reports in the view, or unexpired
        DHT snapshot entries)."""
        return self._gossip.members()

    @property
    def gossip(self) -> RunGossip:
        """What this tracker knows and decides of the run's gossip (sans-IO; read it,
        do not change it)."""
        return self._gossip

    # -- the local peer ---------------------------------------------------------

    @property
    def peer_id(self) -> ID:
        return self._peer_id

    @property
    def local_epoch(self) -> int:
        return self._epoch

    @property
    def samples_accumulated(self) -> int:
        return self._samples

    @property
    def client_mode(self) -> bool:
        if self._client_mode is not None:
            return self._client_mode
        return self._deps.reachability.client_mode

    @property
    def loss(self) -> float | None:
        """The training loss this peer's reports carry (:meth:`report`)."""
        return self._loss

    def report(self, samples_accumulated: int, epoch: int | None = None, *,
               samples_per_second: float | None = None, loss: float | None = None,
               last_round: tuple | None = None) -> None:
        """Say that this peer has ``samples_accumulated`` samples towards ``epoch``.

        ``epoch`` defaults to the current local epoch.  The rate is measured
        from successive calls (an EMA) unless ``samples_per_second`` is
        given.  ``loss``: this peer's recent training loss, and
        ``last_round``: its last averaging round (epoch, outcome -- one of
        ``ROUND_OUTCOMES`` --, group size and optionally the peer ids whose
        values its part took), which its reports carry from now on for
        people watching (a monitor credits the contributors they name).
        Publishing follows the publish policy; this never blocks.
        Raises :class:`LocalProtocolError` for negative or non-integer values,
        an epoch going back, samples from an auxiliary peer, or a loss that
        is not a finite number.
        """
        epoch = self._epoch if epoch is None else epoch
        for name, value in (("samples_accumulated", samples_accumulated), ("epoch", epoch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise LocalProtocolError(f"{name} must be an integer >= 0, got {value!r}")
        if epoch < self._epoch:
            raise LocalProtocolError(f"epoch {epoch} is behind the local epoch {self._epoch}")
        if self.auxiliary and samples_accumulated:
            raise LocalProtocolError("an auxiliary peer processes no samples")
        if samples_per_second is not None:
            if not (isinstance(samples_per_second, (int, float)) and
                    0 <= samples_per_second <= self.config.max_samples_per_second):
                raise LocalProtocolError(f"samples_per_second must be in [0, "
                                         f"{self.config.max_samples_per_second:g}]")
            self._rate_override = float(samples_per_second)
        if loss is not None:
            self._loss = check_loss(loss)
        if last_round is not None:
            self._last_round = check_last_round(last_round, self._peer_id.to_bytes())
        now = self._clock()
        if epoch == self._epoch and samples_accumulated >= self._samples:
            self._ema.update(samples_accumulated - self._samples, now)
        else:
            self._ema.reset_timer(now)
        if epoch != self._epoch:
            # An epoch of its own (a step, a download, a resumed checkpoint):
            # from now on the local epoch is evidence in the quorum.  A peer
            # still at the epoch it started with abstains (a joiner at 0 is
            # no evidence against the swarm it joins).
            self._votes = True
            self._gossip.set_epoch(epoch)
        self._epoch, self._samples = epoch, samples_accumulated
        self._local_changed()

    def update_epoch(self, epoch: int | None = None, *, last_round: tuple | None = None) -> int:
        """Move to ``epoch`` (default: the next one) with no samples, as :meth:`report`."""
        self.report(0, epoch := self._epoch + 1 if epoch is None else epoch, last_round=last_round)
        return epoch

    def _local_report(self, now: float) -> PeerReport:
        rate = self._rate_override if self._rate_override is not None else self._ema.rate
        client = self.client_mode
        return PeerReport(self._peer_id.to_bytes(), self._epoch, self._samples,
                          0.0 if self.auxiliary else rate,
                          now, client, self.auxiliary, self.name, self._loss,
                          path_kind(self._host.paths().values()),
                          *(self._last_round or (None,) * 4))

    def _set_local(self, now: float) -> PeerReport:
        local = self._local_report(now)
        self._view.set_local(local, votes=self._votes)
        return local

    def _local_changed(self) -> None:
        self._set_local(self._clock())
        self._wakeup.set()
        self._changed.set()

    def publish_now(self) -> None:
        """Sign and push a report of the local state now, whatever the publish policy says.

        For a peer about to claim its samples (an all-reduce weight is checked
        against the sender's own signed reports at that epoch): the pushes
        start at once and run in the background; this never blocks.  A report
        with the same content as the last one, published less than
        ``min_publish_interval`` ago, is not signed again.
        """
        if self._closed:
            raise LocalProtocolError("the tracker is closed")
        now = self._clock()
        local = self._set_local(now)
        last = self._policy.last
        if last is not None and now - self._policy.last_at < self.config.min_publish_interval \
                and (last.epoch, last.samples_accumulated, last.client_mode, last.auxiliary) \
                == (local.epoch, local.samples_accumulated, local.client_mode, local.auxiliary):
            return
        self._publish(local, now)

    # -- the global view --------------------------------------------------------

    def global_progress(self) -> GlobalProgress:
        """The collaboration's progress now, as this peer sees it."""
        now = self._clock()
        self._set_local(now)
        progress = self._view.global_progress(now)
        self._gossip.judge(progress, now)
        return progress

    @property
    def ready_to_step(self) -> bool:
        return self.global_progress().ready_to_step

    def peers(self) -> list[PeerReport]:
        """The live reports of the other peers."""
        return self._view.peers(self._clock())

    async def wait_changed(self, timeout: float) -> None:
        """Return when a report or the local state changes, or after ``timeout`` s."""
        with trio.move_on_after(timeout):
            await self._changed.wait()

    async def wait_ready(self, timeout: float | None = None) -> GlobalProgress:
        """Wait until this peer is ready to step; returns the global progress then.

        Raises :class:`CallTimeoutError` after ``timeout`` seconds (None: no limit).
        """
        deadline = trio.current_time() + (math.inf if timeout is None else timeout)
        while True:
            progress = self.global_progress()
            if progress.ready_to_step:
                return progress
            now = trio.current_time()
            if now >= deadline:
                raise CallTimeoutError(
                    f"not ready within {timeout:.1f} s: {progress.samples_accumulated} of "
                    f"{progress.target_batch_size} samples for epoch {progress.epoch}")
            wait = min(deadline - now, self._view.ready_at(progress.time) - progress.time, 5.0)
            self._changed = trio.Event() if self._changed.is_set() else self._changed
            with trio.move_on_after(max(wait, 0.001)):
                await self._changed.wait()

    def reported_samples(self, peer: ID | bytes, epoch: int) -> int:
        """The largest count of ``peer``'s accepted reports at ``epoch`` (0: none).

        See :meth:`ProgressService.reported_samples`.  The local peer's own
        count is its current one.
        """
        key = peer.to_bytes() if isinstance(peer, ID) else bytes(peer)
        if key == self._view.local_peer:
            return self._samples if epoch == self._epoch else 0
        return self._gossip.reported_samples(key, epoch)

    def statistics(self) -> TrackerStatistics:
        """Counters (every one present, from 0) and the view's size."""
        return self._gossip.statistics()

    # -- receiving --------------------------------------------------------------

    def _absorb(self, report: Report, sender: ID | None, now: float) -> Verdict | None:
        """Take one report (``RunGossip.absorb``) and act on what it made of it."""
        return self._acted(self._gossip.absorb(
            report, None if sender is None else sender.to_bytes(), now))

    def _acted(self, absorbed: Absorbed) -> Verdict | None:
        if absorbed.introduce is not None:
            self._schedule_push(absorbed.introduce)
        if absorbed.changed:
            self._changed.set()
            self._wakeup.set()
        return absorbed.verdict

    def take_evidence(self, report: Report, sender: ID) -> None:
        """A report ``sender`` attached to a claim of its own: taken like its push
        (``RunGossip.take_evidence``)."""
        self._acted(self._gossip.take_evidence(report, sender.to_bytes(), self._clock()))

    def on_push(self, sender: ID, request: Push) -> Reports:
        """Answer ``sender``'s push (the service's handler, for this run)."""
        now = self._clock()
        sender_key = sender.to_bytes()
        was_member = self._gossip.is_member(sender_key)
        for report in request.reports:
            self._absorb(report, sender, now)
        if self._gossip.pushed_by(sender_key, was_member, request.want_reply):
            self._pending.pop(sender_key, None)
        if not request.want_reply:
            return Reports()
        return Reports(self._gossip.missing_at(request.digest, sender_key, self._own, now))

    # -- pushing ----------------------------------------------------------------

    def _push_targets(self) -> list[bytes]:
        connected = {p.to_bytes() for p in self._host.connected_peers()}
        return self._gossip.push_targets(connected, trio.current_time())

    def _schedule_push(self, peer: bytes, want_reply: bool = False) -> None:
        if self._closed:
            return
        self._pending[peer] = want_reply or self._pending.get(peer, False)
        if peer not in self._inflight:
            self._inflight.add(peer)
            self._nursery.start_soon(self._push_loop, peer)

    async def _push_loop(self, peer: bytes) -> None:
        try:
            while peer in self._pending:
                want_reply = self._pending.pop(peer) or self._gossip.wants_reply(peer)
                async with self._limiter:
                    await self._push(peer, want_reply)
        finally:
            self._inflight.discard(peer)

    async def _push(self, peer: bytes, want_reply: bool) -> bool:
        request = self._gossip.push(self._own, want_reply)
        try:
            response = await self._deps.call(ID(peer), PROGRESS_PROTOCOL, request,
                                             self.config.push_timeout, run_id=self.run_id)
        except P2PDLError as exc:
            self._gossip.push_failed(peer, self._host.is_connected(ID(peer)),
                                     trio.current_time())
            logger.debug("run %s: push to %s failed: %s", self.run_id, short(peer), exc)
            return False
        self._gossip.push_succeeded(peer)
        assert isinstance(response, Reports)
        now = self._clock()
        for report in response.reports:
            self._absorb(report, ID(peer), now)
        return True

    # -- tasks ------------------------------------------------------------------

    async def _publisher(self) -> None:
        while True:
            now = self._clock()
            local = self._set_local(now)
            progress = self._view.global_progress(now)
            self._gossip.judge(progress, now)
            due = self._policy.next_publish(local, progress, self._ema.typical_batch, now)
            if due <= now:
                self._publish(local, now)
                continue
            self._wakeup = trio.Event()
            with trio.move_on_after(min(due - now, self.config.heartbeat_interval)):
                await self._wakeup.wait()

    def _publish(self, local: PeerReport, now: float) -> None:
        previous = self._own
        self._own = sign_report(self._key, self._peer_id, self.run_id, local.epoch,
                                local.samples_accumulated, local.samples_per_second, now,
                                local.client_mode, local.auxiliary,
                                credential=self._credential(), info=info_of(local))
        self._own_by_epoch[local.epoch] = self._own
        for epoch in sorted(self._own_by_epoch)[:-2]:
            del self._own_by_epoch[epoch]
        self._policy.published(local, now)
        self._gossip.counters["reports_published"] += 1
        if previous is None:
            self._snapshot_due.set()
        self._gossip.expire(now)
        for peer in self._push_targets():
            self._schedule_push(peer)

    def _credential(self) -> bytes | None:
        """This node's proof of membership of the run, to ride on its own reports."""
        credential = self._deps.members.credential(self.run_id)
        if credential is not None and len(credential) > MAX_CREDENTIAL_SIZE:
            if not self._credential_warned:
                self._credential_warned = True
                logger.warning("run %s: the membership credential (%d bytes) exceeds %d bytes "
                               "and is not attached to reports", self.run_id, len(credential),
                               MAX_CREDENTIAL_SIZE)
            return None
        return credential

    async def _anti_entropy(self) -> None:
        while True:
            await trio.sleep(self.config.sync_interval * random.uniform(0.8, 1.2))
            targets = self._push_targets()
            if targets:
                self._gossip.counters["syncs"] += 1
                self._schedule_push(random.choice(targets), want_reply=True)

    async def _snapshots(self) -> None:
        dht = self._deps.dht
        key = SNAPSHOT_PREFIX + self.run_id
        started = trio.current_time()
        await self._read_snapshot(dht, key)
        next_store = -math.inf
        alone_backoff = 1.0
        next_read = trio.current_time() + ALONE_READ_INTERVAL
        while True:
            clock = trio.current_time()
            if (self._snapshot_due.is_set() or clock >= next_store) and self._own is not None:
                self._snapshot_due = trio.Event()
                await self._store_snapshot(dht, key)
                next_store = trio.current_time() + self.config.snapshot_interval
            now = self._clock()
            alone = not self._gossip.members()
            partitioned = now - self._gossip.last_live > self.config.partition_timeout
            if clock >= next_read and (alone or partitioned):
                if alone and self._own is not None:
                    # A store made before the DHT knew any other node stayed
                    # here only; store again so the others' reads can find us.
                    await self._store_snapshot(dht, key)
                await self._read_snapshot(dht, key, latest=alone)
                joining = trio.current_time() < started + self.config.join_wait
                if alone and not self._gossip.members() and not joining:
                    alone_backoff = min(alone_backoff * 2, self.config.sync_interval * 2)
                elif not alone or self._gossip.members():
                    alone_backoff = 1.0
                    # give gossip a partition_timeout to resume
                    self._gossip.last_live = self._clock()
                next_read = trio.current_time() + (
                    ALONE_READ_INTERVAL if joining and not self._gossip.members()
                    else alone_backoff)
            wake = min(next_store, next_read) - trio.current_time()
            with trio.move_on_after(max(wake, 0.05)):
                await self._snapshot_due.wait()

    async def _store_snapshot(self, dht: DHTService, key: str) -> None:
        assert self._own is not None
        entry = SnapshotEntry(self._own, tuple(self._host.addrs()[:MAX_ADDRS]))
        try:
            ok = await dht.store(key, entry, self._clock() + self.config.snapshot_ttl,
                                 subkey=dht.own_subkey())
        except P2PDLError as exc:
            ok = False
            logger.debug("run %s: storing the snapshot failed: %s", self.run_id, exc)
        self._gossip.counters["snapshots_stored" if ok else "snapshots_failed"] += 1

    async def _read_snapshot(self, dht: DHTService, key: str, latest: bool = False) -> None:
        self._gossip.counters["snapshot_fetches"] += 1
        try:
            # A replica's copy: pushes fill in the rest.  While alone, ask the
            # nearest nodes (latest): this node's own copy may hold only itself.
            found = await dht.get(key, latest=latest)
        except P2PDLError as exc:
            logger.debug("run %s: reading the snapshot failed: %s", self.run_id, exc)
            return
        if found is None or not found.dictionary:
            return
        now = self._clock()
        fresh = []
        for entry in found.value.values():
            value = entry.value
            if not isinstance(value, SnapshotEntry):
                continue
            peer = value.report.peer_id
            if peer == self._view.local_peer:
                continue
            if self._absorb(value.report, None, now) is None:
                continue
            if not self._gossip.is_member(peer):
                fresh.append(peer)
            self._gossip.add_contact(peer, entry.expiration, now)
            try:
                self._host.add_addrs(ID(peer), value.addrs)
            except Exception:  # an address that does not parse: the peer may be dialled otherwise
                logger.debug("run %s: bad addresses in %s's snapshot", self.run_id, short(peer))
        for peer in fresh:
            self._schedule_push(peer, want_reply=True)
