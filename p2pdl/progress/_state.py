"""Progress logic without I/O: the global view, the publish policy, the rate EMA.

Time is always an argument (wall-clock seconds, the clock reports are
stamped with).  The rules are DeDLOC's (Diskin et al. 2021; protocols/progress.md),
with the epoch set by a quorum rather than by the highest report:

* a peer's count is extrapolated by its rate: ``samples + (now - time) * sps``;
* peers silent for ``report_ttl`` are left out;
* the **quorum epoch** Q is the highest epoch E that more than
  ``quorum_fraction`` of the live trainers (non-client, non-auxiliary peers,
  the local one included once it has an epoch of its own, see
  :meth:`ProgressView.set_local`) report or exceed;
* a local peer that abstains follows no epoch more than one beyond its own
  (and is not ready to step while one is in view) for ``join_wait`` after it started
  tracking (its first
  :meth:`ProgressView.set_local`): a fresh peer that has heard only a liar
  claiming a far epoch waits until the swarm's reports, which vote, arrive;
  nor is it ready, in that time, before it holds a trainer's report placed
  at or after its start (reports older than that, a DHT snapshot's, may say
  an epoch the swarm has long left: a joiner that stepped on them would
  found a group of its own at its old epoch);
* the global epoch is the highest epoch of the local peer and of the
  non-client peers that is at most Q + 1 (a trainer one epoch ahead has just
  stepped); a non-client peer more than one epoch ahead of Q is **ahead**:
  it moves nobody, and its samples and rate count for nothing;
* only peers at the global epoch count towards the target; every live
  peer's rate, but those ahead, counts towards the ETA (peers behind will
  catch up);
* a peer is ready to step when the reported count reaches the target, or
  the ETA (plus ``eta_grace``) has passed, or a newer epoch exists;
* a report beyond its role's caps (:func:`check_role_caps`) is refused;
* every signed report passes :func:`screen_report` first (plausible values,
  its peer's signature, a member, no monitor), whether it was pushed or
  attached to a claim as evidence.

Clock skew: a report received straight from its peer (live) tells the
receiver that peer's clock offset (``time - received_at``, transit
included); every report of that peer is then placed on the receiver's clock
by that offset.  A report of a peer whose offset is unknown (from the DHT,
or relayed) is placed no later than when it was received.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable

from libp2p.peer.id import ID

from ..errors import LocalProtocolError
from ..service import MembershipView, Role
from ._messages import (
    PATH_KINDS,
    ROUND_OUTCOMES,
    Report,
    ReportInfo,
    round_tags,
    verify_report,
)
from .config import MAX_COUNT, MAX_GROUP, MAX_NAME_LENGTH, ROUND_TAG_SIZE, ProgressConfig

__all__ = ["GlobalProgress", "ProgressView", "PublishPolicy", "RateEMA", "PeerReport",
           "Screened", "Verdict", "check_info", "check_report_values", "check_role_caps",
           "check_last_round", "check_loss", "info_of", "path_kind",
           "quorum_epoch", "screen_report", "to_peer_report"]


class Verdict(enum.Enum):
    """What :meth:`ProgressView.offer` did with a report."""

    ACCEPTED = "accepted"
    STALE = "stale"            # not newer than what the view holds, or too old
    ABSURD = "absurd"          # values no honest peer sends
    WRONG_RUN = "wrong_run"
    FULL = "full"              # the view holds max_peers peers already
    SELF = "self"              # a report of the local peer, sent back by others
    IMPOSSIBLE = "impossible"  # beyond its role's caps (ProgressView.last_problem says how)


@dataclasses.dataclass(frozen=True)
class PeerReport:
    """A report's content as the view keeps it (signature already checked)."""

    peer_id: bytes
    epoch: int
    samples_accumulated: int
    samples_per_second: float
    time: float
    client_mode: bool = False
    auxiliary: bool = False
    #: What the peer says of itself for people (its signed ``ReportInfo``;
    #: None where it said nothing): a display name, its recent training
    #: loss, how it is reached.  Nothing counts it.
    name: str | None = None
    loss: float | None = None
    path: str | None = None
    #: its last averaging round: epoch, outcome, group size, the tags of the
    #: other members its part took (None: not said)
    round_epoch: int | None = None
    round_outcome: str | None = None
    round_group: int | None = None
    round_contributors: tuple[bytes, ...] | None = None


@dataclasses.dataclass(frozen=True)
class GlobalProgress:
    """The collaboration's progress as one peer sees it at ``time``.

    ``samples_accumulated`` is the sum of the counts reported for ``epoch``
    (facts); ``estimated_samples`` extrapolates each by its rate (a guess);
    ``eta_next_epoch`` is when the estimate reaches the target (wall clock,
    ``inf`` when nobody makes progress).  ``num_peers`` counts live peers,
    this one included.  ``quorum_epoch`` is the epoch a quorum of the live
    trainers has reached (the module docstring); ``ahead`` holds the ids of
    the peers more than one epoch ahead of it, whose reports move nobody
    (state donors are to be picked among the others).
    """

    epoch: int
    samples_accumulated: int
    estimated_samples: float
    target_batch_size: int
    num_peers: int
    num_clients: int
    num_auxiliary: int
    samples_per_second: float
    eta_next_epoch: float
    ready_to_step: bool
    time: float
    quorum_epoch: int = 0
    ahead: frozenset[bytes] = frozenset()


def check_report_values(report: PeerReport, now: float, config: ProgressConfig) -> str | None:
    """Why the report's values are absurd, or None if they are plausible."""
    if not 0 <= report.epoch <= MAX_COUNT:
        return f"epoch {report.epoch} out of range"
    if not 0 <= report.samples_accumulated <= MAX_COUNT:
        return f"samples_accumulated {report.samples_accumulated} out of range"
    sps = report.samples_per_second
    if not (math.isfinite(sps) and 0 <= sps <= config.max_samples_per_second):
        return f"samples_per_second {sps} outside [0, {config.max_samples_per_second:g}]"
    if not math.isfinite(report.time) or report.time > now + config.max_clock_skew:
        return f"time {report.time:.3f} is more than {config.max_clock_skew:g} s ahead"
    problem = check_info(report.name, report.loss, report.path)
    if problem is None and report.round_outcome is not None \
            and report.round_outcome not in ROUND_OUTCOMES:
        problem = f"its round outcome {report.round_outcome!r} is unknown"
    if problem is None and report.round_epoch is not None and report.round_epoch > report.epoch:
        problem = f"its last round (epoch {report.round_epoch}) is ahead of its epoch"
    tags = report.round_contributors
    if problem is None and tags is not None and (
            report.round_epoch is None or any(len(t) != ROUND_TAG_SIZE for t in tags)
            or any(a >= b for a, b in zip(tags, tags[1:], strict=False))):
        problem = (f"its round contributors are not distinct {ROUND_TAG_SIZE}-byte tags in "
                   f"ascending order of a round it names")
    return problem


def check_info(name: str | None, loss: float | None, path: str | None) -> str | None:
    """Why a report's info is absurd (a name that is empty, too long or not
    printable -- no control characters reach a terminal or a page --, a loss
    that is not finite, an unknown path), or None."""
    if name is not None and not (isinstance(name, str) and 0 < len(name) <= MAX_NAME_LENGTH
                                 and name.isprintable() and name.strip()):
        return f"its name is not 1 to {MAX_NAME_LENGTH} printable characters"
    if loss is not None and not (isinstance(loss, float) and math.isfinite(loss)):
        return "its loss is not a finite number"
    if path is not None and path not in PATH_KINDS:
        return f"its path {path!r} is none of {', '.join(PATH_KINDS)}"
    return None


def to_peer_report(report: Report) -> PeerReport:
    """The fields of a signed report the view keeps."""
    info = report.info
    return PeerReport(report.peer_id, report.epoch, report.samples_accumulated,
                      report.samples_per_second, report.time, report.client_mode,
                      report.auxiliary, *((None,) * 7 if info is None else (
                          info.name, info.loss, info.path, info.round_epoch, info.round_outcome,
                          info.round_group, info.round_contributors)))


def path_kind(paths: Iterable[str]) -> str | None:
    """How a peer is reached (``ReportInfo.path``), from the paths of its
    connections now: the least direct of them, None with none."""
    kinds = set(paths)
    for kind in ("relayed", "hole-punched", "direct"):
        if kind in kinds:
            return kind
    return None


def check_loss(loss: object) -> float:
    """``loss`` as a float; LocalProtocolError unless it is a finite number."""
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not math.isfinite(loss):
        raise LocalProtocolError(f"loss must be a finite number, got {loss!r}")
    return float(loss)


def check_last_round(last_round: object, reporter: bytes
                     ) -> tuple[int, str, int, tuple[bytes, ...] | None]:
    """``last_round`` -- (epoch, outcome, group size) or (epoch, outcome,
    group size, contributors), the contributors peer ids (``ID``, bytes or
    base58) -- as (epoch, outcome, group size, their :func:`round_tags` for
    ``reporter``, or None); LocalProtocolError unless it is one (an outcome
    of ROUND_OUTCOMES, counts within bounds, peer ids)."""
    ok = isinstance(last_round, tuple) and len(last_round) in (3, 4)
    tags = None
    if ok:
        epoch, outcome, group, *rest = last_round   # type: ignore[misc]
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (epoch, group)) \
            and 0 <= epoch <= MAX_COUNT and 0 <= group <= MAX_GROUP \
            and outcome in ROUND_OUTCOMES
        if ok and rest:
            try:
                tags = round_tags(reporter, (_peer_bytes(c) for c in rest[0]))
            except (TypeError, ValueError):
                ok = False
    if not ok:
        raise LocalProtocolError(f"last_round must be (epoch, one of {ROUND_OUTCOMES}, group "
                                 f"size[, contributors' peer ids]), got {last_round!r}")
    return epoch, outcome, group, tags


def _peer_bytes(peer: object) -> bytes:
    """A peer id given as ``ID``, bytes or base58, as bytes (ValueError if none)."""
    if isinstance(peer, ID):
        return peer.to_bytes()
    if isinstance(peer, bytes):
        return peer
    if isinstance(peer, str):
        return ID.from_base58(peer).to_bytes()
    raise ValueError(f"not a peer id: {peer!r}")


def info_of(report: PeerReport) -> ReportInfo | None:
    """The ``ReportInfo`` a report of ``report``'s content carries (None when
    it says nothing of itself)."""
    fields = (report.name, report.loss, report.path, report.round_epoch, report.round_outcome,
              report.round_group, report.round_contributors)
    if all(field is None for field in fields):
        return None
    return ReportInfo(*fields)


@dataclasses.dataclass(frozen=True)
class Screened:
    """What :func:`screen_report` found: the signer and its role, or why the
    report is dropped (``drop``: the counter it counts in, ``reason``: words);
    ``learnt``: the report's credential made its signer a member."""

    peer: ID | None = None
    role: Role | None = None
    drop: str | None = None
    reason: str = ""
    learnt: bool = False


def screen_report(report: Report, now: float, run_id: str, config: ProgressConfig,
                  members: MembershipView, *, learn: bool) -> Screened:
    """The checks every signed report of ``run_id`` passes before anything
    counts it, pushed or attached to a claim as evidence, in this order: its
    values are plausible (``dropped_absurd``), its signature is its peer's
    (``dropped_bad_signature``), its peer is a member of the run -- with
    ``learn``, made one by the credential the report carries where it is
    valid -- (``dropped_not_member``), and not a monitor, whose reports
    count for nothing (``ignored_monitor``)."""
    reason = check_report_values(to_peer_report(report), now, config)
    if reason is not None:
        return Screened(drop="dropped_absurd", reason=reason)
    peer = verify_report(report)
    if peer is None:
        return Screened(drop="dropped_bad_signature", reason="its signature does not verify")
    learnt = False
    if not members.is_member(peer, run_id):
        if not learn or report.credential is None \
                or not members.learn(peer, run_id, report.credential):
            return Screened(peer=peer, drop="dropped_not_member", reason="not a member")
        learnt = True
    role = members.role_of(peer, run_id)
    if role is Role.MONITOR:
        return Screened(peer=peer, role=role, drop="ignored_monitor", reason="a monitor",
                        learnt=learnt)
    return Screened(peer=peer, role=role, learnt=learnt)


def check_role_caps(report: PeerReport, previous: PeerReport | None, elapsed: float,
                    role: Role | None, target_batch_size: int,
                    config: ProgressConfig) -> tuple[str, str] | None:
    """``(kind, detail)`` when ``report`` claims more than its role allows, else None.

    ``previous`` is the last report of the same peer this node took (None if
    none), ``elapsed`` the time between the two on this node's clock.
    ``role`` is the peer's role where the run binds roles (certificate runs;
    None: the report's own flags are all there is).  Kinds: ``role_mismatch``
    (a certified auxiliary reports as a trainer), ``impossible_rate`` (a rate
    above the role's cap), ``impossible_samples`` (samples from an auxiliary
    peer, a count that grew faster than the cap allows within one epoch, or a
    first report at an epoch beyond ``first_report_factor`` targets).
    """
    if role is Role.AUXILIARY and not report.auxiliary:
        return "role_mismatch", "a certified auxiliary peer reports as a trainer"
    sps = report.samples_per_second
    if report.auxiliary:
        if report.samples_accumulated:
            return "impossible_samples", (f"an auxiliary peer reported "
                                          f"{report.samples_accumulated} samples")
        if sps:
            return "impossible_rate", f"an auxiliary peer reported {sps:g} samples/s"
        return None
    cap = (config.max_client_samples_per_second if report.client_mode
           else config.max_trainer_samples_per_second)
    if sps > cap:
        return "impossible_rate", f"{sps:g} samples/s above the cap of {cap:g}"
    samples = report.samples_accumulated
    if previous is not None and previous.epoch == report.epoch:
        allowed = previous.samples_accumulated + cap * (max(0.0, elapsed) + config.burst_seconds)
        if samples > allowed:
            grown = samples - previous.samples_accumulated
            return "impossible_samples", (f"{samples} samples at epoch {report.epoch}, {grown} "
                                          f"more than {elapsed:.2f} s before (at most "
                                          f"{allowed:.0f})")
        return None
    allowed = config.first_report_factor * target_batch_size + cap * config.burst_seconds
    if samples > allowed:
        return "impossible_samples", (f"a first report of {samples} samples at epoch "
                                      f"{report.epoch} (at most {allowed:.0f})")
    return None


def quorum_epoch(epochs: list[int], fraction: float) -> int | None:
    """The highest epoch E such that more than ``fraction`` of ``epochs`` are >= E.

    None for no epochs.  With ``fraction`` 0.5: one epoch gives itself, two
    give the lower (no strict majority exists beyond both), three the median.
    """
    if not epochs:
        return None
    ranked = sorted(epochs, reverse=True)
    share = fraction * len(ranked)
    needed = max(1, math.floor(share))   # the least count above the share, in floats
    while needed <= share:
        needed += 1
    while needed > 1 and needed - 1 > share:
        needed -= 1
    return ranked[min(needed, len(ranked)) - 1]


@dataclasses.dataclass
class _Entry:
    report: PeerReport
    anchor: float      # the report's time on this peer's clock
    received_at: float


class ProgressView:
    """Every peer's latest report in one run, and the global progress from them.

    The local peer's own state is set with :meth:`set_local` (it is never
    stale); other peers' reports come in through :meth:`offer`.
    ``last_problem`` is ``(kind, detail)`` of the latest report refused as
    :attr:`Verdict.IMPOSSIBLE`.
    """

    def __init__(self, local_peer: bytes, target_batch_size: int,
                 config: ProgressConfig | None = None) -> None:
        self.local_peer = local_peer
        self.target_batch_size = target_batch_size
        self.config = config or ProgressConfig()
        self._entries: dict[bytes, _Entry] = {}
        self._offsets: dict[bytes, float] = {}
        self.local = PeerReport(local_peer, 0, 0, 0.0, 0.0)
        self.local_votes = True
        self.tracking_since: float | None = None   # the first set_local's time
        self.last_problem: tuple[str, str] | None = None

    # -- input ----------------------------------------------------------------

    def set_local(self, report: PeerReport, *, votes: bool = True) -> None:
        """The local peer's state.  ``votes``: whether its epoch counts in the
        quorum (a peer that just started, at an epoch nobody gave it, abstains:
        its epoch is no evidence against the others').  The first call's
        ``report.time`` is when the view started tracking (``join_wait``)."""
        if self.tracking_since is None:
            self.tracking_since = report.time
        self.local = report
        self.local_votes = votes

    def offer(self, report: PeerReport, now: float, *, live: bool = False,
              role: Role | None = None) -> Verdict:
        """Take ``report`` (its signature already verified) received at ``now``.

        ``live``: it came straight from its own peer, just now, so it tells
        that peer's clock offset.  ``role``: the peer's role where the run
        binds roles (None: the report's flags are all there is); reports
        beyond the role's caps are :attr:`Verdict.IMPOSSIBLE`.
        """
        if report.peer_id == self.local_peer:
            return Verdict.SELF
        if check_report_values(report, now, self.config) is not None:
            return Verdict.ABSURD
        old = self._entries.get(report.peer_id)
        if old is not None and (report.epoch, report.time) <= (old.report.epoch, old.report.time):
            return Verdict.STALE
        # The caps are judged on this node's clock: a live report is placed at
        # its arrival (its offset is at most its own), so a peer's stamps
        # cannot stretch the time it had.
        anchor = now if live else self._anchor(report, now)
        problem = check_role_caps(report, old.report if old is not None else None,
                                  anchor - old.anchor if old is not None else 0.0, role,
                                  self.target_batch_size, self.config)
        if problem is not None:
            self.last_problem = problem
            return Verdict.IMPOSSIBLE
        if live:
            offset = report.time - now
            previous = self._offsets.get(report.peer_id)
            # The smallest offset seen is the one with the least transit delay;
            # let it drift slowly so that a clock adjustment is followed.
            self._offsets[report.peer_id] = (offset if previous is None or offset < previous
                                             else previous + 0.1 * (offset - previous))
        anchor = self._anchor(report, now)
        if now - anchor > self.config.report_ttl:
            return Verdict.STALE
        if old is None and len(self._entries) + 1 >= self.config.max_peers:
            self.expire(now)
            if len(self._entries) + 1 >= self.config.max_peers:
                return Verdict.FULL
        self._entries[report.peer_id] = _Entry(report, anchor, now)
        return Verdict.ACCEPTED

    def _anchor(self, report: PeerReport, now: float) -> float:
        offset = self._offsets.get(report.peer_id)
        if offset is not None:
            return min(report.time - offset, now)
        return min(report.time, now)

    def expire(self, now: float) -> list[bytes]:
        """Forget peers silent for ``report_ttl``; returns their ids."""
        ttl = self.config.report_ttl
        gone = [p for p, e in self._entries.items() if now - e.anchor > ttl]
        for peer in gone:
            del self._entries[peer]
            self._offsets.pop(peer, None)
        return gone

    def forget(self, peer: bytes) -> None:
        self._entries.pop(peer, None)
        self._offsets.pop(peer, None)

    # -- output ---------------------------------------------------------------

    def peers(self, now: float) -> list[PeerReport]:
        """Live reports of other peers."""
        ttl = self.config.report_ttl
        return [e.report for e in self._entries.values() if now - e.anchor <= ttl]

    def report_of(self, peer: bytes) -> PeerReport | None:
        entry = self._entries.get(peer)
        return entry.report if entry is not None else None

    def __len__(self) -> int:
        return len(self._entries)

    def global_progress(self, now: float) -> GlobalProgress:
        """The global view at ``now``, and whether the local peer is ready to step."""
        local = self.local
        others = self._live(now)
        live: list[tuple[PeerReport, float]] = [(local, now), *others]
        # A joining peer counts the votes heard since its start, if any: older
        # reports (a DHT snapshot's) may say an epoch the swarm has left.
        since = self.tracking_since if self.joining(now) else None
        voters = [r.epoch for r, _ in others if _is_trainer(r)]
        if since is not None and self._heard_since_start(others):
            voters = [r.epoch for r, anchor in others if _is_trainer(r) and anchor >= since]
        if self.local_votes and _is_trainer(local):
            voters.append(local.epoch)
        quorum = quorum_epoch(voters, self.config.quorum_fraction)
        if quorum is None:   # no trainer to ask: the local peer follows itself
            quorum = local.epoch
        # Clients never set the epoch, so a client's epoch misleads nobody.
        ahead = frozenset(r.peer_id for r, _ in others
                          if not r.client_mode and r.epoch > quorum + 1)
        epoch = local.epoch
        for report, _ in others:
            if not report.client_mode and report.epoch <= quorum + 1:
                epoch = max(epoch, report.epoch)
        # One epoch beyond is a peer that has just stepped (it moves the
        # others anyway); more is a claim a fresh peer checks with the swarm.
        # Nor does a fresh peer step on reports all older than its start (a
        # DHT snapshot's): what the swarm does now is on its way.
        held = self.joining(now) and (epoch > local.epoch + 1
                                      or not self._heard_since_start(others))
        if held:   # not yet: the swarm's reports may still be on their way
            epoch = local.epoch
        reported = 0
        estimated = 0.0
        total_sps = 0.0
        extrapolated_sps = 0.0  # the rate at which the estimate grows
        for report, anchor in live:
            if report.peer_id in ahead:
                continue
            total_sps += report.samples_per_second
            if report.epoch == epoch:
                reported += report.samples_accumulated
                estimated += report.samples_accumulated
                if now > anchor:
                    estimated += (now - anchor) * report.samples_per_second
                    extrapolated_sps += report.samples_per_second
        remaining = self.target_batch_size - estimated
        if remaining <= 0:
            # When the estimate crossed the target (a fixed time, so that
            # eta_grace can pass), not a time that moves with ``now``.
            eta = now + remaining / extrapolated_sps if extrapolated_sps > 0 else now
        elif total_sps > 0:
            eta = now + remaining / total_sps
        else:
            eta = math.inf
        ready = not held and (epoch > local.epoch or reported >= self.target_batch_size
                                 or now >= eta + self.config.eta_grace)
        return GlobalProgress(
            epoch=epoch, samples_accumulated=reported, estimated_samples=estimated,
            target_batch_size=self.target_batch_size, num_peers=len(live),
            num_clients=sum(r.client_mode for r, _ in live),
            num_auxiliary=sum(r.auxiliary for r, _ in live),
            samples_per_second=total_sps, eta_next_epoch=eta, ready_to_step=ready, time=now,
            quorum_epoch=quorum, ahead=ahead)

    def _live(self, now: float) -> list[tuple[PeerReport, float]]:
        """The reports in view that are not older than ``report_ttl``, with their anchors."""
        ttl = self.config.report_ttl
        return [(e.report, e.anchor) for e in self._entries.values() if now - e.anchor <= ttl]

    def _heard_since_start(self, others: list[tuple[PeerReport, float]]) -> bool:
        """Whether a trainer's report placed at or after the local peer started
        tracking is in view, or no trainer's at all (``others``: reports with
        their anchors): alone, it has nothing stale to step on."""
        since = self.tracking_since
        anchors = [anchor for report, anchor in others if _is_trainer(report)]
        return since is None or not anchors or any(anchor >= since for anchor in anchors)

    def joining(self, now: float) -> bool:
        """Whether the local peer abstains and started tracking less than
        ``join_wait`` ago: it follows no epoch beyond its own yet."""
        return (not self.local_votes and self.tracking_since is not None
                and now < self.tracking_since + self.config.join_wait)

    def ready_at(self, now: float) -> float:
        """When the local peer becomes ready if no new report arrives (``now`` if it is)."""
        progress = self.global_progress(now)
        if progress.ready_to_step:
            return now
        if self.joining(now) and (progress.quorum_epoch > self.local.epoch + 1
                                  or not self._heard_since_start(self._live(now))):
            assert self.tracking_since is not None
            # Then it may follow; a fresh report wakes it earlier.
            return self.tracking_since + self.config.join_wait
        return progress.eta_next_epoch + self.config.eta_grace


def _is_trainer(report: PeerReport) -> bool:
    """Trainers vote on the epoch: clients do not set it (they cannot serve
    their state), auxiliary peers only follow the trainers."""
    return not report.client_mode and not report.auxiliary


class RateEMA:
    """Samples per second, as an exponential moving average over time.

    Each :meth:`update` adds the samples processed since the previous one;
    the rate of that interval enters with weight ``1 - 2**(-dt / half_life)``.
    """

    def __init__(self, half_life: float) -> None:
        self.half_life = half_life
        self.rate = 0.0
        self.batch = 0.0          # typical samples per update, also averaged
        self.previous_batch = 0.0
        self._last: float | None = None

    def update(self, samples: int, now: float) -> None:
        if self._last is None or samples < 0:
            self._last = now
            return
        dt = now - self._last
        if dt <= 0:
            self.batch = max(self.batch, float(samples))
            return
        weight = 1.0 - 2.0 ** (-dt / self.half_life)
        if self.rate == 0.0:
            weight = 1.0
        self.rate += weight * (samples / dt - self.rate)
        self.previous_batch = self.batch
        self.batch = samples if self.batch == 0.0 else self.batch + 0.2 * (samples - self.batch)
        self._last = now

    @property
    def typical_batch(self) -> float:
        """The batch size without the latest increment's pull: an unusual jump
        is news, not a new normal (0 until two increments were seen)."""
        return min(self.batch, self.previous_batch)

    def reset_timer(self, now: float) -> None:
        """Restart the interval (after a pause, so the pause does not count as slowness)."""
        self._last = now


class PublishPolicy:
    """When a peer publishes its report (dead reckoning).

    Others extrapolate the last published report; the peer publishes again
    when that extrapolation is wrong by more than a tolerance, when its
    epoch or role changed, when the next epoch is near (by the ETA or by the
    samples still missing: every change, so the
    moment the target is reached is known from reports), and at least every
    ``heartbeat_interval``.  Never more often than ``min_publish_interval``.
    """

    def __init__(self, config: ProgressConfig) -> None:
        self.config = config
        self.last: PeerReport | None = None
        self.last_at = -math.inf

    def in_endgame(self, progress: GlobalProgress, now: float) -> bool:
        """The next epoch is near: by the ETA, or by the samples still missing
        (which does not depend on the rates being right)."""
        remaining = progress.target_batch_size - progress.estimated_samples
        return (progress.eta_next_epoch - now <= self.config.endgame_time
                or remaining <= self.config.endgame_fraction * progress.target_batch_size)

    def published(self, report: PeerReport, now: float) -> None:
        self.last = report
        self.last_at = now

    def next_publish(self, local: PeerReport, progress: GlobalProgress, typical_batch: float,
                     now: float) -> float:
        """The time the next report is due (``<= now``: publish now)."""
        due = self._due(local, progress, typical_batch, now)
        return max(due, self.last_at + self.config.min_publish_interval)

    def _due(self, local: PeerReport, progress: GlobalProgress, typical_batch: float,
             now: float) -> float:
        last = self.last
        if last is None or (local.epoch, local.client_mode, local.auxiliary) != (
                last.epoch, last.client_mode, last.auxiliary):
            return now
        heartbeat = self.last_at + self.config.heartbeat_interval
        if local.samples_accumulated == last.samples_accumulated and local.samples_per_second \
                == last.samples_per_second == 0:
            return heartbeat
        if local.samples_accumulated != last.samples_accumulated and self.in_endgame(progress,
                                                                                     now):
            return now
        tolerance = max(self.config.drift_fraction * progress.target_batch_size
                        / max(1, progress.num_peers),
                        self.config.drift_batches * typical_batch, 1.0)
        predicted = last.samples_accumulated + max(0.0, now - last.time) * last.samples_per_second
        if abs(local.samples_accumulated - predicted) > tolerance:
            return now
        due = heartbeat
        if last.samples_per_second > 0:
            # With no new samples, the prediction outruns the count at this time.
            crossing = last.time + (local.samples_accumulated + tolerance
                                    - last.samples_accumulated) / last.samples_per_second
            due = min(due, crossing)
        return due
