"""Matchmaking's rounds, sans-IO: a leader's bookkeeping, a peer's round, the
search for a leader (protocols/matchmaking.md).

No trio, no sockets: times are arguments (``now``, seconds of any monotonic
clock), so the rules are tested without a network and can drive a simulator.
``_service`` wraps them (docs/matchmaking.md); the plan they follow is
``_plan``'s.

* A **leader** (:class:`LeaderState`) takes joiners first-come up to the
  target size and finalizes when its plan's members have all joined (if
  they make at least ``min_group_size``), when it is full, or at its
  deadline.  At finalization it drops joiners whose wait ended or whose
  connection is gone, and keeps apart the pairs where one refuses the other
  (:meth:`LeaderState.finalize`); a group smaller than ``min_group_size``
  is disbanded.
* A **round** (:class:`MatchmakingRound`) is one peer's part in one
  (run, epoch): gathering, then leading or joining, then done.  Join requests
  that arrive while its role is undecided are held, not refused.
* :class:`LeaderSearch` drives the choice of :func:`~._plan.next_leader`
  through a round: whom to ask next, when to lead, when to read the view
  again, when to give up.
* :class:`UnresponsivePeers`: the peers left out of a run's views for a
  while because they showed no membership in time.
* :func:`group_from_formed`: the group a leader's answer describes, checked.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import multihash  # py-libp2p's dependency: checks the structure of peer ids
from libp2p.peer.id import ID

from ...errors import RemoteProtocolError
from ._plan import (
    Group,
    GroupMemberInfo,
    Plan,
    Planner,
    check_capacity,
    check_fractions,
    compute_group_id,
    expected_members,
    make_group,
    next_leader,
    order_key,
    plan_fractions,
    plan_groups,
)
from .config import MAX_PEER_ID_SIZE

__all__ = ["LeaderState", "LeaderSearch", "Step", "UnresponsivePeers", "MatchmakingRound",
           "Phase", "Refusal", "HOLD", "ACCEPTED", "group_from_formed"]

logger = logging.getLogger(__name__)


# -- verdicts ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Refusal:
    """A join request turned down: ``code`` (protocols/matchmaking.md) and why."""

    code: str
    detail: str = ""


class _Token(enum.Enum):
    HOLD = "hold"
    ACCEPTED = "accepted"


#: The round cannot answer yet (its role is undecided): ask again when it changes.
HOLD = _Token.HOLD
#: The joiner has a place; its outcome comes at finalization.
ACCEPTED = _Token.ACCEPTED

Verdict = _Token | Refusal
Outcome = Group | Refusal


# -- a leader ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Joiner:
    info: GroupMemberInfo
    wait_until: float
    refuses: frozenset[ID] = frozenset()


class LeaderState:
    """A leader's bookkeeping for one group (sans-IO).

    Args:
        run_id, epoch: the round.
        leader: this peer (never a client-mode peer).
        target_group_size, min_group_size: the bounds of the group.
        expected: the members the plan gives this leader (it finalizes early
            once all have joined); None: wait for ``finalize_at`` (or until full).
        finalize_at: when it finalizes at the latest.
        planner: makes the group's load plan at finalization (default
            :func:`plan_fractions`).
        robust: the group averages under a robust rule (not the mean): a
            refusal the leader cannot judge then never leaves the refused
            member one of only two contributors (:meth:`finalize`).
    """

    def __init__(self, run_id: str, epoch: int, leader: GroupMemberInfo,
                 target_group_size: int, min_group_size: int, expected: Iterable[ID] | None,
                 finalize_at: float, planner: Planner = plan_fractions, *,
                 robust: bool = False) -> None:
        if leader.client_mode:
            raise ValueError("a client-mode peer cannot lead")
        self.run_id, self.epoch, self.leader = run_id, epoch, leader
        self.target_group_size, self.min_group_size = target_group_size, min_group_size
        self.expected = None if expected is None else frozenset(expected) - {leader.peer_id}
        self.finalize_at = finalize_at
        self.planner = planner
        self.robust = robust
        # members a joiner refused that this leader could not judge (it left
        # the joiner out instead): under a robust rule, never one of two
        self.disputed: set[ID] = set()
        self.joiners: dict[ID, _Joiner] = {}  # in order of arrival
        # joiners left out at finalization for a refusal, and why
        self.excluded: dict[ID, Refusal] = {}
        self.status = "open"  # then "finalized" or "disbanded"
        self.group: Group | None = None
        self.disband_detail = ""

    @property
    def size(self) -> int:
        return 1 + len(self.joiners)

    def offer(self, peer: ID, client_mode: bool, target_group_size: int, wait_until: float,
              now: float, *, auxiliary: bool = False, bandwidth: float | None = None,
              reduce_rate: float | None = None, refuses: Iterable[ID] = ()) -> Verdict:
        """A join request from ``peer`` that waits until ``wait_until``, with
        the role and capacity it declared (checked by :func:`check_capacity`)
        and the peers it refuses to average with."""
        if self.status == "finalized":
            return Refusal("finalized", "the group was already formed")
        if self.status == "disbanded":
            return Refusal("disbanded", self.disband_detail)
        if target_group_size != self.target_group_size:
            return Refusal("mismatch", f"this leader forms groups of at most "
                                       f"{self.target_group_size}, not {target_group_size}")
        if peer == self.leader.peer_id:
            return Refusal("not_leader", "a peer cannot join itself")
        info = GroupMemberInfo(peer, client_mode, auxiliary, bandwidth, reduce_rate)
        joiner = self.joiners.get(peer)
        if joiner is not None:  # a repeated request (the first one timed out, say)
            joiner.info = info
            joiner.wait_until = max(joiner.wait_until, wait_until)
            joiner.refuses = frozenset(refuses)
            return ACCEPTED
        if self.size >= self.target_group_size:
            self._drop_expired(now)
        if self.size >= self.target_group_size:
            return Refusal("full", f"the group has {self.size} of {self.target_group_size}")
        self.joiners[peer] = _Joiner(info, wait_until, frozenset(refuses))
        return ACCEPTED

    def _drop_expired(self, now: float) -> None:
        for peer in [p for p, j in self.joiners.items() if j.wait_until <= now]:
            del self.joiners[peer]

    def expect(self, peers: Iterable[ID]) -> None:
        """Wait for ``peers`` too (late announcers whose plan sends them here), until
        they join, the group is full, or the deadline."""
        more = frozenset(peers) - {self.leader.peer_id}
        self.expected = more if self.expected is None else self.expected | more

    def waits_only_for_expected(self, now: float) -> bool:
        """Whether :meth:`ready` holds only because every expected member joined
        (not full, deadline not reached)."""
        return self.ready(now) and self.size < self.target_group_size \
            and now < self.finalize_at

    def ready(self, now: float) -> bool:
        """Whether to finalize now: full, the deadline, or every expected member
        joined (and the group is not below ``min_group_size``: a leader whose plan
        gives it too few members waits for others until its deadline)."""
        return self.status == "open" and (
            self.size >= self.target_group_size or now >= self.finalize_at
            or (self.expected is not None and self.expected <= self.joiners.keys()
                and self.size >= self.min_group_size))

    def finalize(self, now: float, alive: Callable[[ID], bool] = lambda _: True,
                 suspect: Callable[[ID], bool] = lambda _: False) -> Group | None:
        """Form the group of the leader and the joiners still waiting and
        connected (``alive``), with its load plan (``planner``); None (the
        group is disbanded) if it is smaller than ``min_group_size``.

        A joiner that refuses another member (a peer it banned) would refuse
        the group: such pairs are kept apart, in order of arrival.  Where
        the leader holds evidence against every member the joiner refuses
        (``suspect``: it flagged them too), those members are left out;
        otherwise (or where it refuses the leader) the joiner is.  So a
        joiner's word alone never removes anyone but itself -- except under
        a robust rule, where it would leave a member it refused one of the
        group's two contributors: two cannot outvote each other, so that
        member is left out too (the group is disbanded if it is the
        leader).  Whoever is left out is answered ``excluded``."""
        if self.status != "open":
            return self.group
        self._drop_expired(now)
        for peer in [p for p in self.joiners if not alive(p)]:
            del self.joiners[peer]
        disputed = self._keep_apart(suspect)
        self.disputed |= disputed
        if self.robust and disputed and self._no_majority_with(disputed):
            return None
        if self.size < self.min_group_size:
            self.disband(f"only {self.size} member(s); at least {self.min_group_size} needed")
            return None
        self.group = make_group(self.run_id, self.epoch, self.leader,
                                (j.info for j in self.joiners.values()), self.planner)
        self.status = "finalized"
        return self.group

    def _keep_apart(self, suspect: Callable[[ID], bool]) -> set[ID]:
        """Leave out joiners, or the members they refuse (:meth:`finalize`);
        return the members refused by a joiner that was left out instead."""
        leader = self.leader.peer_id
        disputed: set[ID] = set()
        for peer in list(self.joiners):
            joiner = self.joiners.get(peer)
            if joiner is None:   # left out by an earlier joiner's refusal
                continue
            refused = [p for p in joiner.refuses
                       if p != peer and (p == leader or p in self.joiners)]
            if not refused:
                continue
            if leader in refused or not all(suspect(p) for p in refused):
                del self.joiners[peer]
                self.excluded[peer] = Refusal(
                    "excluded", f"it refuses {len(refused)} member(s) this leader holds no "
                                f"evidence against")
                disputed.update(refused)
                continue
            for p in refused:
                del self.joiners[p]
                self.excluded[p] = Refusal(
                    "excluded", "a member refuses it, and this leader holds evidence "
                                "against it too")
        return disputed

    def _no_majority_with(self, disputed: set[ID]) -> bool:
        """Under a robust rule, leave out the members in ``disputed`` that would
        be one of the group's only two contributors (non-auxiliary members):
        the rule bounds a minority, and one of two is none.  Return whether
        the group was disbanded for it (the leader is one of them)."""
        members = [self.leader] + [j.info for j in self.joiners.values()]
        contributors = {m.peer_id for m in members if not m.auxiliary}
        if len(contributors) != 2 or not disputed & contributors:
            return False
        if self.leader.peer_id in disputed:
            self.disband("a member refused this leader, which would be one of only two "
                         "contributors: a robust rule cannot outvote either")
            return True
        for p in disputed & contributors:
            del self.joiners[p]
            self.excluded[p] = Refusal(
                "excluded", "a member refuses it, and without that member it would be one "
                            "of only two contributors: a robust rule cannot outvote either")
        return False

    def disband(self, detail: str) -> None:
        """Give the group up before it formed: every held joiner is refused."""
        if self.status == "open":
            self.status = "disbanded"
            self.disband_detail = detail

    def outcome(self, peer: ID) -> Outcome | None:
        """What an accepted joiner is answered; None while the group is open."""
        if self.status == "open":
            return None
        if self.status == "disbanded":
            return Refusal("disbanded", self.disband_detail)
        assert self.group is not None
        if peer in self.group.peer_ids:
            return self.group
        if peer in self.excluded:
            return self.excluded[peer]
        return Refusal("expired", "the request's wait ended, or its connection closed, "
                                  "before the group formed")


# -- a peer's round ----------------------------------------------------------------------


class Phase(enum.Enum):
    GATHERING = "gathering"  # announced; reading the view; role undecided
    JOINING = "joining"      # asking leaders; the role may still change to leading
    LEADING = "leading"
    DONE = "done"


class MatchmakingRound:
    """One peer's part in one (run, epoch), as seen by join requests (sans-IO).

    The service moves it through its phases (:meth:`lead`, :meth:`follow`,
    :meth:`give_up_leading`, :meth:`finish`) and asks :meth:`on_join` what to
    do with each join request.  ``version`` grows at every change.
    """

    def __init__(self, run_id: str, epoch: int, me: GroupMemberInfo, target_group_size: int,
                 min_group_size: int, planner: Planner = plan_fractions, *,
                 aggregation: bytes | None = None) -> None:
        self.run_id, self.epoch, self.me = run_id, epoch, me
        self.aggregation = aggregation or None  # the digest of our aggregation rule; None: mean
        self.target_group_size, self.min_group_size = target_group_size, min_group_size
        self.planner = planner
        self.phase = Phase.GATHERING
        self.leader: LeaderState | None = None
        self.group: Group | None = None  # the group this peer ended in
        self.version = 0

    def _changed(self) -> None:
        self.version += 1

    def on_join(self, peer: ID, client_mode: bool, target_group_size: int, wait_until: float,
                now: float, *, auxiliary: bool = False, bandwidth: float | None = None,
                reduce_rate: float | None = None, aggregation: bytes | None = None,
                refuses: Iterable[ID] = ()) -> Verdict:
        """HOLD, ACCEPTED or a :class:`Refusal` for a join request from ``peer``.

        ``aggregation``: the digest of the joiner's aggregation rule (None:
        the mean); a rule other than ours is refused ``mismatch``: a group
        averages with one rule, and mixing them silently would let a member
        opt out of the run's robust aggregation.
        """
        if self.me.client_mode:
            return Refusal("not_leader", "a client-mode peer never leads")
        if (aggregation or None) != self.aggregation:
            return Refusal("mismatch", "this peer averages with another aggregation rule")
        if self.phase is Phase.LEADING:
            assert self.leader is not None
            verdict = self.leader.offer(peer, client_mode, target_group_size, wait_until, now,
                                        auxiliary=auxiliary, bandwidth=bandwidth,
                                        reduce_rate=reduce_rate, refuses=refuses)
            if verdict is ACCEPTED:
                self._changed()
            return verdict
        if self.phase is Phase.DONE:
            return Refusal(self.closed_code(), "this peer's round is over")
        if self.leader is not None:  # it led, gave up, and now asks others
            return Refusal("not_leader", "this peer gave up leading")
        return HOLD

    def closed_code(self) -> str:
        """What a finished round answers: ``finalized`` if it led a group that
        formed, else ``not_leader``."""
        return "finalized" if self.leader is not None and self.leader.status == "finalized" \
            else "not_leader"

    def outcome(self, peer: ID) -> Outcome | None:
        """The answer to an accepted joiner; None while undecided."""
        if self.leader is None:
            return None
        return self.leader.outcome(peer)

    def lead(self, expected: Iterable[ID] | None, finalize_at: float) -> LeaderState:
        if self.phase not in (Phase.GATHERING, Phase.JOINING) or self.leader is not None:
            raise RuntimeError(f"cannot start leading in phase {self.phase.value}")
        self.leader = LeaderState(self.run_id, self.epoch, self.me, self.target_group_size,
                                  self.min_group_size, expected, finalize_at, self.planner,
                                  robust=self.aggregation is not None)
        self.phase = Phase.LEADING
        self._changed()
        return self.leader

    def follow(self) -> None:
        if self.phase is Phase.GATHERING:
            self.phase = Phase.JOINING
            self._changed()

    def give_up_leading(self, detail: str) -> None:
        """Stop leading (held joiners are refused ``disbanded``); ask others next."""
        if self.phase is Phase.LEADING:
            assert self.leader is not None
            self.leader.disband(detail)
            self.phase = Phase.JOINING
            self._changed()

    def pairs_with_disputed(self, group: Group) -> ID | None:
        """The other of ``group``'s two contributors, where this round averages
        under a robust rule and, leading earlier in the round, left out a
        joiner that refused that peer (:meth:`LeaderState.finalize`); else
        None.  A follower turns such a group down: the refused peer, left
        out of the first group, must not get one of two votes in the next."""
        if self.aggregation is None or self.leader is None or not self.leader.disputed:
            return None
        others = [m.peer_id for m in group.members
                  if not m.auxiliary and m.peer_id != self.me.peer_id]
        contributes = not self.me.auxiliary
        if contributes and len(others) == 1 and others[0] in self.leader.disputed:
            return others[0]
        return None

    def finish(self, group: Group | None, detail: str = "the round ended") -> None:
        """The round is over, with ``group`` or without one."""
        if self.leader is not None:
            self.leader.disband(detail)
        self.group = group
        self.phase = Phase.DONE
        self._changed()


# -- checking a leader's answer ----------------------------------------------------------


def group_from_formed(run_id: str, epoch: int, leader: ID, me: GroupMemberInfo,
                      target_group_size: int, group_id: bytes,
                      entries: Iterable[Sequence[Any]],
                      fractions: Sequence[float] | None = None) -> Group:
    """The group a leader's answer describes, after checking everything a
    follower can check; :class:`RemoteProtocolError` if any check fails.

    ``entries``: one tuple per member, ``(peer id bytes, client_mode[,
    auxiliary[, bandwidth[, reduce_rate]]])`` (the omitted ones take their
    defaults); ``fractions``: the leader's load plan, or None.
    """

    def bad(why: str) -> RemoteProtocolError:
        return RemoteProtocolError(f"mm.formed from {leader}: {why}")

    members = []
    for raw, client_mode, *capacity in entries:
        if len(raw) > MAX_PEER_ID_SIZE or not _valid_peer_id(raw):
            raise bad("a member's peer id is not a valid multihash")
        member = GroupMemberInfo(ID(raw), client_mode, *capacity)
        problem = check_capacity(member.client_mode, member.auxiliary, member.bandwidth,
                                 member.reduce_rate)
        if problem:
            raise bad(problem)
        members.append(member)
    if not 1 <= len(members) <= target_group_size:
        raise bad(f"{len(members)} members; expected 1..{target_group_size}")
    if len({m.peer_id for m in members}) != len(members):
        raise bad("a member is listed twice")
    if members[0].peer_id != leader:
        raise bad("the first member is not the leader")
    if members[0].client_mode:
        raise bad("the leader is listed as a client-mode peer")
    if me not in members:
        raise bad("this peer is not listed (or not as it joined: its client mode, "
                  "auxiliary flag, bandwidth and reduce rate)")
    keys = [order_key(run_id, epoch, m.peer_id) for m in members[1:]]
    if keys != sorted(keys):
        raise bad("the members after the leader are not in order")
    plan = None if fractions is None else tuple(fractions)
    if plan is not None:
        problem = check_fractions(members, plan)
        if problem:
            raise bad(problem)
    if compute_group_id(run_id, epoch, members, plan) != group_id:
        raise bad("the group id does not match the members and fractions")
    return Group(group_id, run_id, epoch, tuple(members), plan)


@dataclasses.dataclass(frozen=True)
class Step:
    """What a peer does next in a round (:meth:`LeaderSearch.next`).

    ``action``: ``"lead"`` (lead, expecting ``expected``: its planned
    members, None for leftovers), ``"join"`` (ask ``leader``), ``"fetch"``
    (read the round's DHT key again: nobody is left to ask in this view) or
    ``"give_up"`` (``note`` says why).
    """

    action: str
    leader: ID | None = None
    expected: frozenset[ID] | None = None
    note: str = ""


class LeaderSearch:
    """Whom a peer asks to join, one after another, in one round (sans-IO).

    From the view (the peers announced under the round's key, all averaging
    members), the plan (:func:`plan_groups`) says whom to join or whether to
    lead (:func:`next_leader`).  A leader that refused (full, finalized) or
    failed is excluded, and the leader of a planned group that is full or
    finalized is closed; a peer that led and formed no group excludes itself
    and asks the others.  After ``max_join_attempts`` joins it gives up; with
    nobody left to ask it reads the view again, at most ``max_view_fetches``
    views in all, and re-plans when it grew.  The service does the I/O
    (announce, read, lead, join) and tells the search what came of it.
    """

    def __init__(self, run_id: str, epoch: int, me: GroupMemberInfo, target_group_size: int,
                 view: dict[ID, GroupMemberInfo], *, max_join_attempts: int,
                 max_view_fetches: int) -> None:
        self.run_id = run_id
        self.epoch = epoch
        self.me = me
        self.target_group_size = target_group_size
        self.view = dict(view)
        self.max_join_attempts = max_join_attempts
        self.max_view_fetches = max_view_fetches
        #: views read so far (the first one included), joins asked
        self.fetches = 1
        self.attempts = 0
        self.excluded: set[ID] = set()
        self.closed: set[ID] = set()
        self._plan: Plan | None = None

    def next(self) -> Step:
        """The next step, from the view and what came of the steps before."""
        plan = self._plan = plan_groups(self.run_id, self.epoch, self.view.values(),
                                        self.target_group_size)
        me = self.me.peer_id
        choice = next_leader(plan, self.me, self.excluded, self.closed)
        if choice is None:
            if self.fetches < self.max_view_fetches:
                return Step("fetch")
            return Step("give_up", note="no leader left to ask")
        if choice == me:
            return Step("lead", expected=expected_members(plan, me, self.excluded, self.closed))
        if self.attempts >= self.max_join_attempts:
            return Step("give_up", note=f"{self.attempts} join attempts made")
        self.attempts += 1
        return Step("join", leader=choice)

    def fetched(self, view: dict[ID, GroupMemberInfo]) -> None:
        """The view was read again (after a ``"fetch"`` step)."""
        self.fetches += 1
        self.view.update(view)

    def led_nothing(self) -> None:
        """Leading formed no group: ask the others."""
        self.excluded.add(self.me.peer_id)

    def join_failed(self, leader: ID, outcome: str) -> None:
        """Asking ``leader`` formed no group (``outcome``: ``"full"`` and
        ``"finalized"`` close its planned group too)."""
        self.excluded.add(leader)
        if outcome in ("full", "finalized") and self._plan is not None:
            planned = self._plan.group_of(leader)
            if planned is not None:
                self.closed.add(planned.leader)


class UnresponsivePeers:
    """Peers left out of a run's views because they showed no membership in
    time (sans-IO; ``now``: any monotonic clock).

    In a run that checks membership, the entries of peers not yet known as
    averaging members are introduced to before anyone plans with them; one
    that did not answer in time is left out of that run's views for ``ttl``
    seconds without a new wait (an outsider announced under the run's key
    that answers slowly delays one view, not every round).  At most
    ``limit`` are remembered, the oldest forgotten first.
    """

    def __init__(self, ttl: float, limit: int) -> None:
        self.ttl = ttl
        self.limit = limit
        self._until: collections.OrderedDict[tuple[ID, str], float] = (
            collections.OrderedDict())

    def __len__(self) -> int:
        return len(self._until)

    def to_ask(self, unknown: Iterable[ID], run_id: str, now: float) -> list[ID]:
        """Of the peers of ``run_id`` not known as members, those worth an
        introduction now (not left out lately)."""
        for key in [k for k, until in self._until.items() if until <= now]:
            del self._until[key]
        return [p for p in unknown if (p, run_id) not in self._until]

    def left_out(self, peer: ID, run_id: str, now: float) -> None:
        """``peer`` was asked and showed no membership of ``run_id`` in time."""
        self._until[(peer, run_id)] = now + self.ttl
        self._until.move_to_end((peer, run_id))
        while len(self._until) > self.limit:
            self._until.popitem(last=False)


def _valid_peer_id(raw: bytes) -> bool:
    try:
        multihash.decode(raw)
    except Exception:  # untrusted bytes
        return False
    return True
