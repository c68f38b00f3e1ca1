"""The plan of a matchmaking round, sans-IO: who is in a group, in which order,
who leads, which ids and load plans groups get (protocols/matchmaking.md).

* The **order** of a round is by :func:`order_key`: SHA-256 over the run id,
  the epoch and the peer id.  Every peer computes the same order for the
  same peers, and a peer's place cannot be chosen without grinding ids.
* The **plan** of a view (:func:`plan_groups`): ``g = ceil(N / target)``
  groups (fewer if there are fewer non-client peers), led by the first ``g``
  non-client peers in order; the other peers, in order, are cut into ``g``
  contiguous runs whose sizes differ by at most one.  Contiguous runs move
  few peers when a view lacks one peer (only those at the boundaries).
* A peer picks whom to join with :func:`next_leader`: the effective leader of
  its own planned group (the first non-client member not known to have
  failed), then those of the other groups that are not closed, and last
  the first non-client peer in order that has not refused it (possibly
  itself: a group of leftovers).
* A leader's **load plan** (:func:`plan_fractions`): when it finalizes, the
  leader solves the load-balancing program of ``_balancing`` once over its
  members' capacities (client mode, auxiliary, bandwidth, reduce rate) and
  sends the fractions with the group, so that every member uses the very
  same floats.  The group id covers them.
* The checks of what peers say of themselves and of a leader's answer
  (:func:`check_run`, :func:`check_capacity`, :func:`check_fractions`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
from collections.abc import Callable, Collection, Iterable, Sequence

import msgpack
from libp2p.peer.id import ID

from ...service import run_id_problem
from .._balancing import PeerCapacity, equal_shares, plan_load
from .config import MAX_CAPACITY_RATIO, MAX_EPOCH, MAX_RATE, MIN_RATE

__all__ = ["ORDER_DOMAIN", "GROUP_ID_DOMAIN", "FRACTION_TOLERANCE", "GroupMemberInfo", "Group",
           "PlannedGroup", "Plan", "order_key", "compute_group_id", "plan_groups",
           "next_leader", "expected_members", "late_members", "bounded_rates", "member_capacities",
           "plan_fractions", "make_group", "check_run", "check_capacity", "check_fractions"]

logger = logging.getLogger(__name__)

#: Domain strings of the two hashes (protocols/matchmaking.md).
ORDER_DOMAIN = "p2pdl/matchmaking/order/1"
GROUP_ID_DOMAIN = "p2pdl/matchmaking/group/1"
#: A leader's fractions must sum to 1 within this much (protocols/matchmaking.md).
FRACTION_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class GroupMemberInfo:
    """A member of a group, as it joined.

    ``client_mode``: it dials out but accepts no connections, so it never
    leads or reduces.  ``auxiliary``: it reduces parts but contributes no
    vector of its own.  ``bandwidth``: bytes per second it can send and
    receive at once (None: unknown).  ``reduce_rate``: bytes of input it can
    reduce per second (None: not a bottleneck).  The last three only feed
    the leader's load plan (:func:`plan_fractions`).
    """

    peer_id: ID
    client_mode: bool = False
    auxiliary: bool = False
    bandwidth: float | None = None
    reduce_rate: float | None = None


@dataclasses.dataclass(frozen=True)
class Group:
    """An averaging group, the same for every member.

    ``members`` is ordered: the leader first, then the others by
    :func:`order_key`.  ``group_id`` is :func:`compute_group_id` of the run,
    the epoch, that list and ``fractions``.

    ``fractions``: the leader's load plan, the share of the averaged vector
    each member reduces (same order as ``members``; they sum to 1; 0 for
    client-mode members).  None when the group has no member that
    contributes a vector (every member auxiliary).
    """

    group_id: bytes
    run_id: str
    epoch: int
    members: tuple[GroupMemberInfo, ...]
    fractions: tuple[float, ...] | None = None

    @property
    def leader(self) -> ID:
        return self.members[0].peer_id

    @property
    def peer_ids(self) -> tuple[ID, ...]:
        return tuple(m.peer_id for m in self.members)

    def __len__(self) -> int:
        return len(self.members)

    def index_of(self, peer_id: ID) -> int:
        """The position of ``peer_id`` in ``members``; ValueError if it is not a member."""
        for i, member in enumerate(self.members):
            if member.peer_id == peer_id:
                return i
        raise ValueError(f"{peer_id} is not a member of this group")

    def capacities(self) -> list[PeerCapacity]:
        """The members' capacities for ``_balancing`` (see :func:`member_capacities`)."""
        return member_capacities(self.members)


def member_capacities(members: Sequence[GroupMemberInfo]) -> list[PeerCapacity]:
    """One :class:`PeerCapacity` per member, in order.  Each declared rate
    is first bounded to within MAX_CAPACITY_RATIO of the median of the
    members' declared rates of its kind (:func:`bounded_rates`); an unknown
    bandwidth then counts as the mean of the known ones (1.0 if none is
    known), as hivemind does."""
    bandwidths = bounded_rates([m.bandwidth for m in members])
    reduce_rates = bounded_rates([m.reduce_rate for m in members])
    known = [b for b in bandwidths if b is not None]
    default = math.fsum(known) / len(known) if known else 1.0
    return [PeerCapacity(default if b is None else b, r, client=m.client_mode,
                         auxiliary=m.auxiliary)
            for m, b, r in zip(members, bandwidths, reduce_rates, strict=True)]


def bounded_rates(rates: Sequence[float | None]) -> list[float | None]:
    """``rates`` (None: unknown) each bounded to
    ``[median / MAX_CAPACITY_RATIO, median * MAX_CAPACITY_RATIO]``, the
    median of the known ones (the lower median of an even count).  A member
    that declares more than its peers cannot take more than that share of
    the work (nor, declaring less, dodge below it) on its word alone."""
    known = sorted(r for r in rates if r is not None)
    if len(known) < 2:
        return list(rates)
    median = known[(len(known) - 1) // 2]
    low, high = median / MAX_CAPACITY_RATIO, median * MAX_CAPACITY_RATIO
    return [None if r is None else min(max(r, low), high) for r in rates]


def plan_fractions(members: Sequence[GroupMemberInfo]) -> tuple[float, ...] | None:
    """A leader's load plan for ``members`` (in group order): the fractions of
    ``_balancing.plan_load`` over :func:`member_capacities`; equal shares
    among the members that are not in client mode if the program cannot be
    solved; None if no member contributes a vector (every one auxiliary) or
    nobody can reduce.  The fractions do not depend on the vector's size."""
    if not members or all(m.auxiliary for m in members) \
            or all(m.client_mode for m in members):
        logger.debug("no load plan: no member contributes a vector, or none can reduce")
        return None
    capacities = member_capacities(members)
    # Any size gives the same fractions; one second of an average link keeps
    # the program's times near 1, far above the solver's tolerances.
    scale = math.fsum(c.bandwidth for c in capacities) / len(capacities)
    try:
        return plan_load(capacities, scale).fractions
    except Exception as exc:  # scipy missing, or the program failing: equal shares
        logger.warning("load plan failed (%s: %s); using equal shares",
                       type(exc).__name__, exc)
    return equal_shares(capacities, scale).fractions


def check_capacity(client_mode: object, auxiliary: object, bandwidth: object,
                   reduce_rate: object) -> str | None:
    """Why a peer's declared role and capacity are invalid, or None."""
    if not isinstance(auxiliary, bool):
        return f"auxiliary must be a bool, not {auxiliary!r}"
    if client_mode and auxiliary:
        return "a client-mode peer cannot be auxiliary (nobody can send it parts to reduce)"
    for name, value in (("bandwidth", bandwidth), ("reduce_rate", reduce_rate)):
        if value is None:
            continue
        if not isinstance(value, (int, float)) or isinstance(value, bool) \
                or not math.isfinite(value) or not MIN_RATE <= value <= MAX_RATE:
            return (f"{name} must be None or a number of bytes per second in "
                    f"{MIN_RATE}..{MAX_RATE:.0e}, not {value!r}")
    return None


def check_fractions(members: Sequence[GroupMemberInfo], fractions: Sequence[float]) -> str | None:
    """Why ``fractions`` is not a valid load plan of ``members``, or None: one
    per member, finite, >= 0, 0 for client-mode members, summing to 1 within
    FRACTION_TOLERANCE."""
    if len(fractions) != len(members):
        return f"{len(fractions)} fractions for {len(members)} members"
    for member, f in zip(members, fractions, strict=True):
        if type(f) is not float or not math.isfinite(f) or f < 0:
            return f"a fraction is not a finite float >= 0: {f!r}"
        if member.client_mode and f != 0:
            return "a client-mode member has a fraction above 0"
    if abs(math.fsum(fractions) - 1) > FRACTION_TOLERANCE:
        return f"the fractions sum to {math.fsum(fractions)!r}, not 1"
    return None


def check_run(run_id: object, epoch: object) -> str | None:
    """Why ``(run_id, epoch)`` is not a valid round, or None if it is."""
    problem = run_id_problem(run_id)
    if problem is not None:
        return problem
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch <= MAX_EPOCH:
        return f"epoch must be an integer in 0..{MAX_EPOCH}"
    return None


def order_key(run_id: str, epoch: int, peer_id: ID) -> bytes:
    """SHA-256 of ``msgpack([ORDER_DOMAIN, run_id, epoch, peer id bytes])``."""
    return hashlib.sha256(msgpack.packb([ORDER_DOMAIN, run_id, epoch, peer_id.to_bytes()],
                                        use_bin_type=True)).digest()


def compute_group_id(run_id: str, epoch: int, members: Iterable[GroupMemberInfo],
                     fractions: Sequence[float] | None = None) -> bytes:
    """SHA-256 of ``msgpack([GROUP_ID_DOMAIN, run_id, epoch, [[peer id bytes,
    client_mode, auxiliary], ...], fractions])``, members in group order,
    ``fractions`` an array of float 64 or nil."""
    entries = [[m.peer_id.to_bytes(), m.client_mode, m.auxiliary] for m in members]
    plan = None if fractions is None else [float(f) for f in fractions]
    return hashlib.sha256(msgpack.packb([GROUP_ID_DOMAIN, run_id, epoch, entries, plan],
                                        use_bin_type=True, use_single_float=False)).digest()


#: Makes a group's load plan from its members in group order (:func:`plan_fractions`).
Planner = Callable[[Sequence[GroupMemberInfo]], tuple[float, ...] | None]


def make_group(run_id: str, epoch: int, leader: GroupMemberInfo,
               others: Iterable[GroupMemberInfo], planner: Planner = plan_fractions) -> Group:
    """The group of ``leader`` and ``others``, in group order, with the load
    plan ``planner`` makes for it and its id."""
    members = (leader, *sorted(others, key=lambda m: order_key(run_id, epoch, m.peer_id)))
    fractions = planner(members)
    return Group(compute_group_id(run_id, epoch, members, fractions), run_id, epoch, members,
                 fractions)


# -- the plan ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PlannedGroup:
    """A group of a plan: its leader first, then its other members in order."""

    members: tuple[GroupMemberInfo, ...]

    @property
    def leader(self) -> ID:
        return self.members[0].peer_id

    def __contains__(self, peer_id: object) -> bool:
        return any(m.peer_id == peer_id for m in self.members)


@dataclasses.dataclass(frozen=True)
class Plan:
    """Who leads and who joins whom, computed from one view of the ready peers.

    ``left_out``: peers in no group, because too few non-client peers could
    lead groups of ``target_group_size`` for all.
    """

    groups: tuple[PlannedGroup, ...]
    left_out: tuple[GroupMemberInfo, ...] = ()
    ordered: tuple[GroupMemberInfo, ...] = ()  # every peer of the view, in order

    def group_of(self, peer_id: ID) -> PlannedGroup | None:
        for group in self.groups:
            if peer_id in group:
                return group
        return None

    @property
    def leaders(self) -> tuple[ID, ...]:
        return tuple(g.leader for g in self.groups)


def plan_groups(run_id: str, epoch: int, view: Iterable[GroupMemberInfo],
                target_group_size: int) -> Plan:
    """The deterministic plan of ``view`` (see the module docstring).

    A peer listed twice counts once, as a client if either entry says so.
    A view without non-client peers gives a plan without groups.
    """
    if target_group_size < 1:
        raise ValueError("target_group_size must be >= 1")
    peers: dict[ID, GroupMemberInfo] = {}
    for peer in view:
        seen = peers.get(peer.peer_id)
        if seen is None or (peer.client_mode and not seen.client_mode):
            peers[peer.peer_id] = peer
    ordered = sorted(peers.values(), key=lambda p: order_key(run_id, epoch, p.peer_id))
    non_clients = [p for p in ordered if not p.client_mode]
    count = min(math.ceil(len(ordered) / target_group_size), len(non_clients))
    if count == 0:
        return Plan((), tuple(ordered), tuple(ordered))
    leaders = non_clients[:count]
    leader_ids = {p.peer_id for p in leaders}
    rest = [p for p in ordered if p.peer_id not in leader_ids]
    room = count * (target_group_size - 1)
    dealt, left_out = rest[:room], rest[room:]
    size, extra = divmod(len(dealt), count)
    groups = []
    start = 0
    for i, leader in enumerate(leaders):
        end = start + size + (1 if i < extra else 0)
        groups.append(PlannedGroup((leader, *dealt[start:end])))
        start = end
    return Plan(tuple(groups), tuple(left_out), tuple(ordered))


def _effective_leader(group: PlannedGroup, excluded: Collection[ID]) -> ID | None:
    for member in group.members:
        if not member.client_mode and member.peer_id not in excluded:
            return member.peer_id
    return None


def next_leader(plan: Plan, me: GroupMemberInfo, excluded: Collection[ID],
                closed: Collection[ID] = ()) -> ID | None:
    """Whom ``me`` should join next (``me.peer_id`` itself: lead), or None.

    ``excluded``: peers known not to lead now (they failed, refused as not
    leading, or disbanded).  ``closed``: planned leaders whose planned group
    is known to be full or formed.  In order:

    1. the effective leader of my own planned group (possibly me: I was promoted);
    2. the effective leaders of the other groups;
    3. the leftovers' leader: the first non-client peer of the whole view, in
       order, that is not excluded (possibly me).  Leftovers (peers whose
       groups closed without them) thus converge on the same peer: those
       before it have refused them.
    """
    own = plan.group_of(me.peer_id)
    if own is not None and own.leader not in closed:
        leader = _effective_leader(own, excluded)
        if leader is not None:
            return leader
    for group in plan.groups:
        if group is own or group.leader in closed:
            continue
        leader = _effective_leader(group, excluded)
        if leader is not None and leader != me.peer_id:
            return leader
    for peer in plan.ordered:
        if not peer.client_mode and peer.peer_id not in excluded:
            return peer.peer_id
    return None


def expected_members(plan: Plan, me: ID, excluded: Collection[ID],
                     closed: Collection[ID] = ()) -> frozenset[ID] | None:
    """Whom ``me`` expects to join it when :func:`next_leader` says it leads:
    its planned group (less the excluded) when it leads that group, or None
    when it leads leftovers (then it waits for its deadline, or until full)."""
    own = plan.group_of(me)
    if own is None or own.leader in closed or _effective_leader(own, excluded) != me:
        return None
    return frozenset(m.peer_id for m in own.members if m.peer_id not in excluded)


def late_members(run_id: str, epoch: int, me: ID, seen: Collection[ID],
                 fresh: Iterable[GroupMemberInfo], target_group_size: int) -> frozenset[ID]:
    """Peers that announced after ``me`` planned (not in ``seen``) and whose first
    choice, by the plan of the ``fresh`` view, is to join ``me``.

    A leader whose expected members have all joined looks once more before it
    finalizes early: a peer that became ready a moment later computes the
    same plan from the fresh view, asks its first choice first, and would
    otherwise find the group formed without it.
    """
    fresh = list(fresh)
    plan = plan_groups(run_id, epoch, fresh, target_group_size)
    return frozenset(peer.peer_id for peer in plan.ordered
                     if peer.peer_id not in seen and peer.peer_id != me
                     and next_leader(plan, peer, ()) == me)
