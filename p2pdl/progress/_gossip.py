"""What a tracker knows of one run's gossip and how it judges it, sans-IO.

:class:`RunGossip` holds, for one run on one node: the view
(:class:`~p2pdl.progress._state.ProgressView`), the signed reports it
accepted, the members (contacts) and until when each is one, the evidence of
samples by epoch, the state of the pushes to each member (failures, rests,
who is in sync), and the tracker's counters.  It decides:

* whether a report enters the view (:meth:`RunGossip.absorb`: the run, the
  staleness, :func:`~p2pdl.progress._state.screen_report`, the view's caps),
  and who is flagged for it;
* whether a report attached to a claim is taken as evidence
  (:meth:`RunGossip.take_evidence`), with the checks of a pushed report,
  including one older than its peer's newest (a round with delayed updates);
* what a push is answered with (:meth:`RunGossip.missing_at`) and what its
  digest lists (:meth:`RunGossip.digest`);
* which members a push goes to (:meth:`RunGossip.push_targets`) and how long
  a failing one rests (:meth:`RunGossip.push_failed`);
* which peers are flagged as ahead of the quorum (:meth:`RunGossip.judge`).

No trio, no sockets: times are arguments (``now``: the wall clock reports are
stamped with; ``clock``: the tracker's monotonic clock for rests).  The
tracker (``_service``) signs, sends, schedules and wakes up.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Collection

from ..service import FlagBook, MembershipView, Statistics
from ._messages import DigestEntry, Push, Report
from ._state import (
    GlobalProgress,
    PeerReport,
    ProgressView,
    Verdict,
    check_role_caps,
    screen_report,
    to_peer_report,
)
from .config import MAX_DIGEST, MAX_REPORTS, ProgressConfig

__all__ = ["RunGossip", "Absorbed", "TrackerStatistics", "TRACKER_COUNTERS",
           "MAX_PUSH_BACKOFF"]

logger = logging.getLogger(__name__)

#: Longest rest of a member whose pushes keep failing (s); see max_push_failures.
MAX_PUSH_BACKOFF = 60.0


@dataclasses.dataclass(frozen=True)
class TrackerStatistics(Statistics):
    """What ``ProgressTracker.statistics()`` says: the view's size and counters
    (every one present, from 0).

    ``evidence_received``: reports handed in as the evidence of a claim
    (:meth:`ProgressService.weight_evidence`); ``evidence_refused``: those
    not taken (another peer's, or dropped by the checks of a pushed report,
    each also counted under its ``dropped_*`` reason).
    """

    run_id: str
    peers: int
    members: int
    reports_published: int = 0
    reports_received: int = 0
    reports_accepted: int = 0
    reports_stale: int = 0
    dropped_bad_signature: int = 0
    dropped_absurd: int = 0
    dropped_wrong_run: int = 0
    dropped_full: int = 0
    dropped_not_member: int = 0
    dropped_impossible: int = 0
    ignored_monitor: int = 0
    credentials_learnt: int = 0
    evidence_received: int = 0
    evidence_refused: int = 0
    flagged_epoch_ahead: int = 0
    pushes_sent: int = 0
    pushes_failed: int = 0
    syncs: int = 0
    snapshots_stored: int = 0
    snapshots_failed: int = 0
    snapshot_fetches: int = 0


#: The counters of :meth:`ProgressTracker.statistics` (all present, from 0).
TRACKER_COUNTERS = TrackerStatistics.counter_names()


@dataclasses.dataclass(frozen=True)
class Absorbed:
    """What :meth:`RunGossip.absorb` made of one report.

    ``verdict``: the view's (None: dropped before the view); ``changed``: the
    view took it (wake whoever waits on the view); ``introduce``: a new member
    heard of through a third peer, to push to at once, so that membership
    spreads in one round trip.
    """

    verdict: Verdict | None
    changed: bool = False
    introduce: bytes | None = None


class RunGossip:
    """One run's gossip on one node, sans-IO (see the module).

    ``flags`` is the node's flag book (peers caught beyond their caps or
    ahead of the quorum are written there); ``members`` its membership.
    """

    def __init__(self, local_peer: bytes, run_id: str, target_batch_size: int,
                 config: ProgressConfig, *, members: MembershipView, flags: FlagBook,
                 now: float) -> None:
        self.run_id = run_id
        self.target_batch_size = target_batch_size
        self.config = config
        self.view = ProgressView(local_peer, target_batch_size, config)
        self.counters = dict.fromkeys(TRACKER_COUNTERS, 0)
        #: wall time of the last report received straight from its peer
        self.last_live = now
        #: the local epoch (evidence is kept for it and the epochs beside it)
        self.epoch = 0
        self._members = members
        self._flags = flags
        self._signed: dict[bytes, Report] = {}
        self._contacts: dict[bytes, float] = {}   # peer -> wall time its membership ends
        self._failures: dict[bytes, int] = collections.defaultdict(int)
        self._retry_at: dict[bytes, float] = {}   # peer -> clock time its pushes resume
        self._synced: set[bytes] = set()
        self._evidence: dict[int, dict[bytes, int]] = {}   # epoch -> peer -> most samples
        self._flagged_ahead: dict[bytes, int] = {}          # peer -> quorum epoch flagged at
        #: every report the view accepted since the last :meth:`take_accepted`,
        #: for a reader that asked (:meth:`keep_accepted`; None: nobody did)
        self.accepted: collections.deque[PeerReport] | None = None

    @property
    def local_peer(self) -> bytes:
        return self.view.local_peer

    def statistics(self) -> TrackerStatistics:
        """Counters (every one present, from 0) and the view's size."""
        return TrackerStatistics(self.run_id, len(self.view), len(self._contacts),
                                 **self.counters)

    # -- members ----------------------------------------------------------------

    def members(self) -> list[bytes]:
        """The peers this node pushes to: reports in the view, or unexpired snapshot entries."""
        return list(self._contacts)

    def synced(self) -> list[bytes]:
        """The members that know what this node knows: a push with a reply
        went to or came from each since it became a member."""
        return list(self._synced)

    def is_member(self, peer: bytes) -> bool:
        return peer in self._contacts

    def add_contact(self, peer: bytes, until: float, now: float) -> bool:
        """Keep ``peer`` as a member until ``until``; True if it is a new one."""
        if peer == self.local_peer:
            return False
        new = peer not in self._contacts
        if new and len(self._contacts) >= self.config.max_peers:
            self.expire(now)
            if len(self._contacts) >= self.config.max_peers:
                return False
        self._contacts[peer] = max(until, self._contacts.get(peer, -math.inf))
        return new

    def expire(self, now: float) -> None:
        """Forget members whose membership ended and reports the view dropped."""
        for peer in [p for p, until in self._contacts.items() if until < now]:
            del self._contacts[peer]
            self._signed.pop(peer, None)
            self._synced.discard(peer)
            self._failures.pop(peer, None)
            self._retry_at.pop(peer, None)
        for peer in self.view.expire(now):
            self._signed.pop(peer, None)

    # -- pushing ----------------------------------------------------------------

    def push_targets(self, connected: Collection[bytes], clock: float) -> list[bytes]:
        """Members worth a push: not resting, and reachable (a client only while
        ``connected``)."""
        out = []
        for peer in self._contacts:
            if self._retry_at.get(peer, -math.inf) > clock:
                continue
            report = self.view.report_of(peer)
            if report is not None and report.client_mode and peer not in connected:
                continue
            out.append(peer)
        return out

    def wants_reply(self, peer: bytes) -> bool:
        """Whether a push to ``peer`` should ask what it knows (not yet in sync)."""
        return peer not in self._synced

    def push(self, own: Report | None, want_reply: bool) -> Push:
        """The push to send: this peer's own report, with a digest when a reply is wanted."""
        return Push(self.run_id, (own,) if own is not None else (), want_reply,
                    self.digest() if want_reply else ())

    def push_failed(self, peer: bytes, connected: bool, clock: float) -> None:
        """A push to ``peer`` failed (``connected``: a connection to it is left).

        A peer no longer connected leaves the view at once rather than after
        ``report_ttl`` (killed, shut down: it moves no quorum, counts for no
        readiness; its next report brings it back).  After
        ``max_push_failures`` failures in a row it rests, doubling up to
        MAX_PUSH_BACKOFF s, then is tried again."""
        self.counters["pushes_failed"] += 1
        self._failures[peer] += 1
        if not connected:
            self.view.forget(peer)
        excess = self._failures[peer] - self.config.max_push_failures
        if excess >= 0:
            self._retry_at[peer] = clock + min(MAX_PUSH_BACKOFF,
                                               self.config.sync_interval * 2.0 ** excess)

    def push_succeeded(self, peer: bytes) -> None:
        self.counters["pushes_sent"] += 1
        self._failures.pop(peer, None)
        self._retry_at.pop(peer, None)
        self._synced.add(peer)

    def pushed_by(self, sender: bytes, was_member: bool, want_reply: bool) -> bool:
        """After the reports of ``sender``'s push were absorbed: a member's pushes
        work again; True when the reply brings a new member in sync (no push
        of our own to it is needed then)."""
        if sender not in self._contacts:
            return False
        self._failures.pop(sender, None)
        self._retry_at.pop(sender, None)
        if not was_member and want_reply:
            self._synced.add(sender)   # the reply tells it what we know
            return True
        return False

    def digest(self) -> tuple[DigestEntry, ...]:
        """What a push with a wanted reply lists: each report held and its time."""
        entries = [DigestEntry(p, r.time) for p, r in self._signed.items()]
        return tuple(entries[:MAX_DIGEST])

    def missing_at(self, digest: tuple[DigestEntry, ...], exclude: bytes, own: Report | None,
                   now: float) -> tuple[Report, ...]:
        """Reports this peer holds that are newer than what ``digest`` lists (own first)."""
        known = {entry.peer_id: entry.time for entry in digest}
        out: list[Report] = []
        candidates = [own] if own is not None else []
        candidates += [r for p, r in self._signed.items() if p != exclude]
        live = {r.peer_id for r in self.view.peers(now)}
        for report in candidates:
            if report.peer_id != self.local_peer and report.peer_id not in live:
                continue
            if report.time > known.get(report.peer_id, -math.inf):
                out.append(report)
                if len(out) == MAX_REPORTS:
                    break
        return tuple(out)

    # -- receiving --------------------------------------------------------------

    def absorb(self, report: Report, sender: bytes | None, now: float) -> Absorbed:
        """Check and take one report (``sender``: the peer that sent it, None
        for a DHT snapshot's)."""
        self.counters["reports_received"] += 1
        if report.run_id != self.run_id:
            self.counters["dropped_wrong_run"] += 1
            return Absorbed(None)
        known = self._signed.get(report.peer_id)
        if known is not None and (report.epoch, report.time) <= (known.epoch, known.time):
            self.counters["reports_stale"] += 1
            return Absorbed(Verdict.STALE)
        if report.peer_id == self.local_peer:
            return Absorbed(Verdict.SELF)
        screened = screen_report(report, now, self.run_id, self.config, self._members,
                                 learn=True)
        if screened.learnt:
            self.counters["credentials_learnt"] += 1
        if screened.drop is not None:
            self.counters[screened.drop] += 1
            if screened.drop == "ignored_monitor":
                # A monitor follows the run: it gets the gossip, its reports count
                # for nothing (not in the view, not forwarded, no evidence).
                self.add_contact(report.peer_id, now + self.config.report_ttl, now)
            else:
                logger.debug("run %s: dropped a report of %s (from %s): %s", self.run_id,
                             short(report.peer_id), short(sender), screened.reason)
            return Absorbed(None)
        peer = screened.peer
        assert peer is not None
        live = sender is not None and sender == report.peer_id
        kept = to_peer_report(report)
        verdict = self.view.offer(kept, now, live=live, role=screened.role)
        if verdict is Verdict.ACCEPTED:
            self.counters["reports_accepted"] += 1
            if self.accepted is not None:
                self.accepted.append(kept)
            self._signed[report.peer_id] = report
            self._record_evidence(report)
            new = self.add_contact(report.peer_id, now + self.config.report_ttl, now)
            if live:
                self.last_live = now
            # Heard of it through a third peer: introduce ourselves.
            return Absorbed(verdict, changed=True,
                            introduce=report.peer_id if new and not live else None)
        if verdict is Verdict.STALE:
            self.counters["reports_stale"] += 1
        elif verdict is Verdict.FULL:
            self.counters["dropped_full"] += 1
        elif verdict is Verdict.ABSURD:
            self.counters["dropped_absurd"] += 1
        elif verdict is Verdict.IMPOSSIBLE:
            self.counters["dropped_impossible"] += 1
            kind, detail = self.view.last_problem or ("impossible_samples", "")
            self._flags.flag(peer, self.run_id, kind, now, detail)
        return Absorbed(verdict)

    def take_evidence(self, report: Report, sender: bytes, now: float) -> Absorbed:
        """A report ``sender`` attached to a claim of its own: taken like its push.
        The result's verdict says what the view made of it; ``counters``
        count the refusals (``evidence_refused``)."""
        self.counters["evidence_received"] += 1
        taken = False
        absorbed = Absorbed(None)
        if report.peer_id != sender:
            logger.debug("run %s: %s attached a report of another peer (%s) to its claim",
                         self.run_id, short(sender), short(report.peer_id))
        else:
            known = self._signed.get(report.peer_id)
            absorbed = self.absorb(report, sender, now)
            verdict = absorbed.verdict
            # Stale because this node holds it or a newer one: nothing new, not refused
            # (a report older than report_ttl is refused).
            taken = verdict is Verdict.ACCEPTED or (
                verdict is Verdict.STALE and known is not None
                and (report.epoch, report.time) <= (known.epoch, known.time))
            if verdict is Verdict.STALE and known is not None and report.epoch < known.epoch:
                # The peer already reports a later epoch (its round of this one
                # runs with delayed updates) and the push of this report may
                # have been overtaken: still evidence for its own epoch.
                taken = self._take_late_evidence(report, now)
        if not taken:
            self.counters["evidence_refused"] += 1
        return absorbed

    def _take_late_evidence(self, report: Report, now: float) -> bool:
        """Record the samples of a report older than its peer's newest one (not
        for the view): the checks of a pushed report, its count capped as a
        first report at its epoch."""
        if abs(report.epoch - self.epoch) > 1:
            return True   # no evidence is kept for that epoch: nothing to take
        screened = screen_report(report, now, self.run_id, self.config, self._members,
                                 learn=False)
        if screened.drop is not None:
            self.counters[screened.drop] += 1
            return False
        problem = check_role_caps(to_peer_report(report), None, 0.0, screened.role,
                                  self.target_batch_size, self.config)
        if problem is not None:
            self.counters["dropped_impossible"] += 1
            self._flags.flag(screened.peer, self.run_id, problem[0], now, problem[1])
            return False
        self._record_evidence(report)
        return True

    # -- evidence ---------------------------------------------------------------

    def keep_accepted(self, limit: int) -> None:
        """Keep every report the view accepts from now on (at most ``limit``
        until they are taken; the oldest are dropped first): for a reader
        that must see every claim, not only the latest of each peer (a
        monitor's accounting)."""
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.accepted = collections.deque(maxlen=limit)

    def take_accepted(self) -> list[PeerReport]:
        """The reports accepted since the last call (:meth:`keep_accepted`), oldest first."""
        if self.accepted is None:
            return []
        taken = list(self.accepted)
        self.accepted.clear()
        return taken

    def set_epoch(self, epoch: int) -> None:
        """The local epoch moved: evidence is kept for it and the epochs beside it."""
        self.epoch = epoch
        for old in [e for e in self._evidence if abs(e - epoch) > 1]:
            del self._evidence[old]

    def reported_samples(self, peer: bytes, epoch: int) -> int:
        """The largest count of ``peer``'s accepted reports at ``epoch`` (0: none);
        not for the local peer."""
        best = self._evidence.get(epoch, {}).get(peer, 0)
        report = self.view.report_of(peer)
        if report is not None and report.epoch == epoch:
            best = max(best, report.samples_accumulated)
        return best

    def _record_evidence(self, report: Report) -> None:
        if abs(report.epoch - self.epoch) > 1:
            return
        counts = self._evidence.setdefault(report.epoch, {})
        counts[report.peer_id] = max(counts.get(report.peer_id, 0), report.samples_accumulated)

    # -- judging ----------------------------------------------------------------

    def judge(self, progress: GlobalProgress, now: float) -> None:
        """Flag the peers ahead of the quorum, once per quorum epoch each."""
        for peer in progress.ahead:
            if self._flagged_ahead.get(peer) == progress.quorum_epoch:
                continue
            self._flagged_ahead[peer] = progress.quorum_epoch
            report = self.view.report_of(peer)
            claimed = report.epoch if report is not None else "?"
            self.counters["flagged_epoch_ahead"] += 1
            self._flags.flag(peer, self.run_id, "epoch_ahead", now,
                             f"reports epoch {claimed}, the quorum is at "
                             f"{progress.quorum_epoch}")
        if len(self._flagged_ahead) > self.config.max_peers:
            for peer in [p for p in self._flagged_ahead if p not in progress.ahead]:
                del self._flagged_ahead[peer]


def short(peer: bytes | None) -> str:
    """The end of a peer id, for logs."""
    if peer is None:
        return "the DHT"
    from libp2p.peer.id import ID

    try:
        return str(ID(peer))[-8:]
    except Exception:
        return peer[-6:].hex()
