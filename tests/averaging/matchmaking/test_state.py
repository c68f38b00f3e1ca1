"""Matchmaking logic without a network: the plan, a leader, a round, answers."""

from __future__ import annotations

import hashlib
import itertools
import math
import random

import msgpack
import pytest
from libp2p.peer.id import ID

from p2pdl.averaging import (
    GROUP_ID_DOMAIN,
    ORDER_DOMAIN,
    GroupMemberInfo,
    LeaderState,
    MatchmakingConfig,
    MatchmakingRound,
    PeerCapacity,
    compute_group_id,
    next_leader,
    order_key,
    plan_groups,
)
from p2pdl.averaging.matchmaking import Group, plan_fractions
from p2pdl.averaging.matchmaking._plan import (
    FRACTION_TOLERANCE,
    bounded_rates,
    check_capacity,
    check_fractions,
    check_run,
    expected_members,
    late_members,
    make_group,
    member_capacities,
)
from p2pdl.averaging.matchmaking._state import ACCEPTED, HOLD, Phase, Refusal, group_from_formed
from p2pdl.errors import ConfigError, LocalProtocolError, RemoteProtocolError

pytestmark = pytest.mark.timeout(60)

RUN, EPOCH = "run-a", 7


def peer(i: int) -> ID:
    """A valid (identity-multihash-shaped) peer id, distinct for each i."""
    return ID(b"\x00\x24" + hashlib.sha256(str(i).encode()).digest() + b"\x00\x00\x00\x00")


def members(n: int, clients: set[int] = frozenset()) -> list[GroupMemberInfo]:
    return [GroupMemberInfo(peer(i), i in clients) for i in range(n)]


def key(p: ID) -> bytes:
    return order_key(RUN, EPOCH, p)


# -- the order and the group id ----------------------------------------------------------


def test_order_key_and_group_id_are_the_documented_hashes():
    p = peer(1)
    assert order_key(RUN, EPOCH, p) == hashlib.sha256(
        msgpack.packb([ORDER_DOMAIN, RUN, EPOCH, p.to_bytes()], use_bin_type=True)).digest()
    group = [GroupMemberInfo(peer(1)), GroupMemberInfo(peer(2), True)]
    entries = [[peer(1).to_bytes(), False, False], [peer(2).to_bytes(), True, False]]
    assert compute_group_id(RUN, EPOCH, group) == hashlib.sha256(msgpack.packb(
        [GROUP_ID_DOMAIN, RUN, EPOCH, entries, None], use_bin_type=True)).digest()
    assert compute_group_id(RUN, EPOCH, group, (1.0, 0.0)) == hashlib.sha256(msgpack.packb(
        [GROUP_ID_DOMAIN, RUN, EPOCH, entries, [1.0, 0.0]], use_bin_type=True)).digest()
    # Any change of run, epoch, order, client mode, auxiliary flag or fractions changes it.
    ids = {compute_group_id(RUN, EPOCH, group), compute_group_id("run-b", EPOCH, group),
           compute_group_id(RUN, EPOCH + 1, group), compute_group_id(RUN, EPOCH, group[::-1]),
           compute_group_id(RUN, EPOCH, [group[0], GroupMemberInfo(peer(2))]),
           compute_group_id(RUN, EPOCH, [GroupMemberInfo(peer(1), auxiliary=True), group[1]]),
           compute_group_id(RUN, EPOCH, group, (1.0, 0.0)),
           compute_group_id(RUN, EPOCH, group, (0.5, 0.5))}
    assert len(ids) == 8
    # Capacities are not covered: the fractions are what members must agree on.
    fast = [GroupMemberInfo(peer(1), bandwidth=1e9, reduce_rate=5e8), group[1]]
    assert compute_group_id(RUN, EPOCH, fast) == compute_group_id(RUN, EPOCH, group)
    assert order_key(RUN, EPOCH, p) != order_key(RUN, EPOCH + 1, p)


# -- the plan ----------------------------------------------------------------------------


@pytest.mark.parametrize("n,target", [(1, 8), (2, 8), (7, 8), (8, 8), (9, 8), (16, 8), (17, 8),
                                      (100, 16), (31, 4), (5, 1), (256, 256)])
def test_plans_are_balanced_bounded_and_cover_everyone(n, target):
    view = members(n)
    plan = plan_groups(RUN, EPOCH, view, target)
    assert len(plan.groups) == math.ceil(n / target)
    sizes = [len(g.members) for g in plan.groups]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= target
    everyone = [m.peer_id for g in plan.groups for m in g.members]
    assert sorted(everyone, key=key) == sorted((m.peer_id for m in view), key=key)
    assert plan.left_out == ()
    for group in plan.groups:  # leader first, then the rest in order
        rest = [key(m.peer_id) for m in group.members[1:]]
        assert rest == sorted(rest)
    # Leaders are the first peers in order (all non-clients here).
    ordered = sorted((m.peer_id for m in view), key=key)
    assert list(plan.leaders) == ordered[:len(plan.groups)]


def test_sixteen_peers_with_target_eight_make_two_groups_of_eight():
    plan = plan_groups(RUN, EPOCH, members(16), 8)
    assert [len(g.members) for g in plan.groups] == [8, 8]


def test_the_plan_does_not_depend_on_the_order_of_the_view_or_duplicates():
    view = members(20, clients={3, 5})
    plans = set()
    for seed in range(5):
        shuffled = view + view[:4]
        random.Random(seed).shuffle(shuffled)
        plans.add(plan_groups(RUN, EPOCH, shuffled, 6))
    assert len(plans) == 1
    # A peer seen once as a client counts as a client.
    twice = members(4) + [GroupMemberInfo(peer(0), True)]
    plan = plan_groups(RUN, EPOCH, twice, 8)
    assert GroupMemberInfo(peer(0), True) in plan.groups[0].members
    assert plan.groups[0].members[0].peer_id != peer(0)


def test_client_mode_peers_never_lead_and_are_still_placed():
    clients = set(range(0, 20, 2))
    view = members(20, clients)
    plan = plan_groups(RUN, EPOCH, view, 5)
    assert len(plan.groups) == 4
    assert all(not g.members[0].client_mode for g in plan.groups)
    placed = {m.peer_id for g in plan.groups for m in g.members}
    assert placed == {m.peer_id for m in view}
    # Whatever the order says: the first non-clients lead.
    non_clients = sorted((m.peer_id for m in view if not m.client_mode), key=key)
    assert list(plan.leaders) == non_clients[:4]


def test_too_few_non_clients_leave_peers_out_and_none_means_no_groups():
    plan = plan_groups(RUN, EPOCH, members(10, clients=set(range(1, 10))), 4)
    assert len(plan.groups) == 1 and len(plan.groups[0].members) == 4
    assert len(plan.left_out) == 6 and all(m.client_mode for m in plan.left_out)
    nobody = plan_groups(RUN, EPOCH, members(5, clients=set(range(5))), 4)
    assert nobody.groups == () and len(nobody.left_out) == 5
    me = GroupMemberInfo(peer(0), True)
    assert next_leader(nobody, me, set()) is None


def test_views_that_lack_one_peer_mostly_agree():
    """Contiguous dealing: a view without one peer moves few peers to another leader."""
    full = members(32)
    plan = plan_groups(RUN, EPOCH, full, 8)
    moved = []
    for missing in range(32):
        view = [m for m in full if m.peer_id != peer(missing)]
        other = plan_groups(RUN, EPOCH, view, 8)
        assert other.leaders == plan.leaders or peer(missing) in plan.leaders
        if peer(missing) in plan.leaders:
            continue
        moved.append(sum(1 for m in view
                         if plan.group_of(m.peer_id).leader != other.group_of(m.peer_id).leader))
    assert max(moved) <= 3  # at most g - 1 boundary peers move (g = 4 groups)


def test_plan_rejects_a_bad_target():
    with pytest.raises(ValueError):
        plan_groups(RUN, EPOCH, members(3), 0)


# -- whom to join next -------------------------------------------------------------------


def test_followers_of_a_failed_leader_agree_on_the_next_one():
    view = members(12)
    plan = plan_groups(RUN, EPOCH, view, 6)
    group = plan.groups[0]
    leader, promoted = group.members[0].peer_id, group.members[1].peer_id
    for m in group.members[1:]:
        assert next_leader(plan, m, set()) == leader
        assert next_leader(plan, m, {leader}) == promoted  # the same for all of them
    # The promoted one leads its planned group, less the failed leader.
    assert expected_members(plan, promoted, {leader}) == \
        {m.peer_id for m in group.members} - {leader}
    # A client never becomes the effective leader: the next non-client does.
    clients_first = GroupMemberInfo(group.members[1].peer_id, True)
    view2 = [clients_first if m.peer_id == clients_first.peer_id else m for m in view]
    plan2 = plan_groups(RUN, EPOCH, view2, 6)
    g2 = plan2.group_of(leader)
    firsts = [m.peer_id for m in g2.members[1:] if not m.client_mode]
    assert next_leader(plan2, clients_first, {leader}) == firsts[0]


def test_closed_groups_send_a_peer_to_other_groups_then_to_the_leftovers_leader():
    view = members(12)
    plan = plan_groups(RUN, EPOCH, view, 6)
    first, second = plan.groups
    me = first.members[3]
    # My group is full without me: ask the other group's leader.
    assert next_leader(plan, me, {first.leader}, {first.leader}) == second.leader
    # Both closed: the first non-client in order that has not refused me (here the
    # first follower of the first group), and every leftover computes the same.
    excluded = {first.leader, second.leader}
    closed = {first.leader, second.leader}
    target = next_leader(plan, me, excluded, closed)
    ordered = [m.peer_id for m in plan.ordered if m.peer_id not in excluded]
    assert target == ordered[0]
    assert next_leader(plan, second.members[2], excluded, closed) == target
    # Leading leftovers expects nobody in particular.
    assert expected_members(plan, target, excluded, closed) is None
    # When everyone refused, a non-client leads itself last; a client finds nobody.
    everyone_else = {m.peer_id for m in view} - {me.peer_id}
    assert next_leader(plan, me, everyone_else, closed) == me.peer_id
    assert next_leader(plan, me, everyone_else | {me.peer_id}, closed) is None


# -- a leader ----------------------------------------------------------------------------


def leader_state(target=4, min_size=2, expected=None, finalize_at=10.0, robust=False):
    return LeaderState(RUN, EPOCH, GroupMemberInfo(peer(0)), target, min_size, expected,
                       finalize_at, robust=robust)


def test_a_leader_accepts_first_come_up_to_the_target_and_refuses_the_rest():
    state = leader_state(target=3)
    assert state.offer(peer(1), False, 3, 5.0, now=0.0) is ACCEPTED
    assert state.offer(peer(2), True, 3, 5.0, now=0.1) is ACCEPTED
    assert state.ready(0.2)  # full
    refusal = state.offer(peer(3), False, 3, 5.0, now=0.2)
    assert isinstance(refusal, Refusal) and refusal.code == "full"
    # A repeated request takes no second place.
    assert state.offer(peer(2), True, 3, 6.0, now=0.3) is ACCEPTED and state.size == 3
    group = state.finalize(0.4)
    assert group.peer_ids[0] == peer(0)
    assert set(group.peer_ids) == {peer(0), peer(1), peer(2)}
    assert group.members[group.index_of(peer(2))].client_mode is True
    assert group.group_id == compute_group_id(RUN, EPOCH, group.members, group.fractions)
    assert group.fractions[group.index_of(peer(2))] == 0.0  # the client reduces nothing
    assert state.outcome(peer(1)) == group
    assert state.offer(peer(3), False, 3, 5.0, now=0.5).code == "finalized"
    with pytest.raises(ValueError):
        group.index_of(peer(9))


def test_a_leader_finalizes_when_its_plan_joined_or_at_its_deadline():
    state = leader_state(target=8, expected={peer(1), peer(2)}, finalize_at=10.0)
    assert not state.ready(0.0)
    state.offer(peer(1), False, 8, 20.0, now=0.1)
    assert not state.ready(0.1)
    state.offer(peer(5), False, 8, 20.0, now=0.2)  # not planned: welcome all the same
    assert not state.ready(0.2)
    state.offer(peer(2), False, 8, 20.0, now=0.3)
    assert state.ready(0.3)
    # A plan that gives a leader too few members: it waits for others until its deadline.
    alone = leader_state(target=8, min_size=2, expected=set(), finalize_at=10.0)
    assert not alone.ready(0.0)
    alone.offer(peer(4), False, 8, 20.0, now=0.1)
    assert alone.ready(0.1)
    # Leading leftovers (no expectations): only full or the deadline end it.
    leftovers = leader_state(target=8, expected=None, finalize_at=10.0)
    leftovers.offer(peer(1), False, 8, 20.0, now=0.1)
    assert not leftovers.ready(9.9) and leftovers.ready(10.0)


def test_a_leader_about_to_finalize_early_waits_for_late_announcers_that_pick_it():
    # The leader planned from two peers; a third announced a moment later.
    early = members(2)
    late = GroupMemberInfo(peer(2))
    first = plan_groups(RUN, EPOCH, early, 8).groups[0]
    leader = first.leader
    fresh = [*early, late]
    got = late_members(RUN, EPOCH, leader, {m.peer_id for m in early}, fresh, 8)
    fresh_plan = plan_groups(RUN, EPOCH, fresh, 8)
    # it is awaited exactly when its own first choice, from the fresh plan, is this leader
    assert got == ({late.peer_id} if next_leader(fresh_plan, late, ()) == leader else set())
    # never the peers it planned from, nor itself; nobody new: nobody awaited
    assert late_members(RUN, EPOCH, leader, {m.peer_id for m in early}, early, 8) == set()
    # a fresh view of many peers in several groups: only those planned into its group
    many = members(20)
    seen = {m.peer_id for m in many[:10]}
    lead = plan_groups(RUN, EPOCH, many[:10], 4).groups[0].leader
    awaited = late_members(RUN, EPOCH, lead, seen, many, 4)
    big = plan_groups(RUN, EPOCH, many, 4)
    assert awaited == {m.peer_id for m in many[10:] if next_leader(big, m, ()) == lead}
    # the leader's state (peer 0 leads): ready once the plan joined; expecting more
    # holds it open
    state = leader_state(target=8, expected={peer(1)}, finalize_at=10.0)
    state.offer(peer(1), False, 8, 20.0, now=0.1)
    assert state.ready(0.1) and state.waits_only_for_expected(0.1)
    state.expect({peer(2), peer(0)})   # the leader itself is never awaited
    assert not state.ready(0.2) and state.expected == {peer(1), peer(2)}
    state.offer(peer(2), False, 8, 20.0, now=0.3)
    assert state.ready(0.3)
    # full or at the deadline it is not waiting only for the expected
    assert not state.waits_only_for_expected(10.0)


def test_finalizing_drops_joiners_that_stopped_waiting_or_disconnected():
    state = leader_state(target=8, min_size=2)
    state.offer(peer(1), False, 8, wait_until=5.0, now=0.0)
    state.offer(peer(2), False, 8, wait_until=20.0, now=0.0)
    state.offer(peer(3), False, 8, wait_until=20.0, now=0.0)
    group = state.finalize(6.0, alive=lambda p: p != peer(3))
    assert set(group.peer_ids) == {peer(0), peer(2)}
    assert state.outcome(peer(1)).code == "expired"
    assert state.outcome(peer(3)).code == "expired"
    assert state.outcome(peer(2)) == group


def test_a_joiner_that_refuses_a_member_the_leader_suspects_keeps_it_out():
    """Joiner 1 banned peer 3; the leader flagged 3 too: 3 is left out, 1 stays."""
    state = leader_state(target=8, min_size=2)
    for i in (1, 2, 3):
        state.offer(peer(i), False, 8, 20.0, now=0.0, refuses=[peer(3)] if i == 1 else ())
    group = state.finalize(6.0, suspect=lambda p: p == peer(3))
    assert set(group.peer_ids) == {peer(0), peer(1), peer(2)}
    assert state.outcome(peer(3)).code == "excluded"
    assert "evidence against it" in state.outcome(peer(3)).detail
    assert state.outcome(peer(1)) == group


def test_a_joiners_word_alone_removes_only_itself():
    """Without evidence of its own (or when the leader is refused) the leader
    leaves out the joiner that refuses, never the member it names."""
    state = leader_state(target=8, min_size=2)
    state.offer(peer(1), False, 8, 20.0, now=0.0, refuses=[peer(2), peer(3)])
    state.offer(peer(2), False, 8, 20.0, now=0.0)
    state.offer(peer(3), False, 8, 20.0, now=0.0)
    group = state.finalize(6.0, suspect=lambda p: p == peer(3))   # 2 is not suspected
    assert set(group.peer_ids) == {peer(0), peer(2), peer(3)}
    assert state.outcome(peer(1)).code == "excluded"
    state = leader_state(target=8, min_size=2)
    state.offer(peer(1), False, 8, 20.0, now=0.0, refuses=[peer(0)])
    state.offer(peer(2), False, 8, 20.0, now=0.0, refuses=[peer(9), peer(2)])  # absent, itself
    group = state.finalize(6.0, suspect=lambda p: True)
    assert set(group.peer_ids) == {peer(0), peer(2)}
    assert state.outcome(peer(1)).code == "excluded"


def test_under_a_robust_rule_a_refused_member_is_never_one_of_two_contributors():
    """Joiner 1 banned peer 2; the leader has not.  Leaving 1 out would leave
    the leader alone with 2, where no robust rule outvotes 2: 2 goes too."""
    state = leader_state(target=8, min_size=2, robust=True)
    state.offer(peer(1), False, 8, 20.0, now=0.0, refuses=[peer(2)])
    state.offer(peer(2), False, 8, 20.0, now=0.0)
    assert state.finalize(6.0) is None
    assert state.status == "disbanded"
    assert state.outcome(peer(1)).code == "disbanded"   # below min_group_size
    # with a third contributor the rule outvotes 2: only the refuser goes
    state = leader_state(target=8, min_size=2, robust=True)
    for i in (1, 2, 3):
        state.offer(peer(i), False, 8, 20.0, now=0.0, refuses=[peer(2)] if i == 1 else ())
    assert set(state.finalize(6.0).peer_ids) == {peer(0), peer(2), peer(3)}
    # an auxiliary member contributes nothing: leader, 2 and an auxiliary 3 are two
    state = leader_state(target=8, min_size=2, robust=True)
    state.offer(peer(1), False, 8, 20.0, now=0.0, refuses=[peer(2)])
    state.offer(peer(2), False, 8, 20.0, now=0.0)
    state.offer(peer(3), False, 8, 20.0, now=0.0, auxiliary=True)
    group = state.finalize(6.0)
    assert set(group.peer_ids) == {peer(0), peer(3)}
    assert state.outcome(peer(2)).code == "excluded"
    assert "two contributors" in state.outcome(peer(2)).detail
    # a refused leader with one other contributor gives the group up
    state = leader_state(target=8, min_size=2, robust=True)
    state.offer(peer(1), False, 8, 20.0, now=0.0, refuses=[peer(0)])
    state.offer(peer(2), False, 8, 20.0, now=0.0)
    assert state.finalize(6.0) is None
    assert state.outcome(peer(2)).code == "disbanded"
    assert "two contributors" in state.outcome(peer(2)).detail
    # under the mean (no rule to outvote anyone) the pair stays
    state = leader_state(target=8, min_size=2)
    state.offer(peer(1), False, 8, 20.0, now=0.0, refuses=[peer(2)])
    state.offer(peer(2), False, 8, 20.0, now=0.0)
    assert set(state.finalize(6.0).peer_ids) == {peer(0), peer(2)}


def test_refusals_are_resolved_in_order_of_arrival():
    """1 refuses 2 (suspected): 2 goes, and 2's own refusal of 3 no longer counts."""
    state = leader_state(target=8, min_size=2)
    state.offer(peer(1), False, 8, 20.0, now=0.0, refuses=[peer(2)])
    state.offer(peer(2), False, 8, 20.0, now=0.0, refuses=[peer(3)])
    state.offer(peer(3), False, 8, 20.0, now=0.0)
    group = state.finalize(6.0, suspect=lambda p: p == peer(2))
    assert set(group.peer_ids) == {peer(0), peer(1), peer(3)}
    # a repeated request replaces what the joiner refuses
    state = leader_state(target=8, min_size=2)
    state.offer(peer(1), False, 8, 20.0, now=0.0, refuses=[peer(2)])
    state.offer(peer(2), False, 8, 20.0, now=0.0)
    state.offer(peer(1), False, 8, 20.0, now=1.0)
    assert set(state.finalize(6.0).peer_ids) == {peer(0), peer(1), peer(2)}


def test_a_full_leader_makes_room_for_a_new_joiner_when_an_old_one_stopped_waiting():
    state = leader_state(target=2)
    state.offer(peer(1), False, 2, wait_until=1.0, now=0.0)
    assert state.offer(peer(2), False, 2, 9.0, now=0.5).code == "full"
    assert state.offer(peer(2), False, 2, 9.0, now=1.5) is ACCEPTED
    assert state.finalize(2.0).peer_ids[1] == peer(2)


def test_a_group_below_the_minimum_is_disbanded_and_its_joiners_told():
    state = leader_state(target=8, min_size=3)
    state.offer(peer(1), False, 8, 20.0, now=0.0)
    assert state.finalize(1.0) is None
    assert state.status == "disbanded"
    assert state.outcome(peer(1)).code == "disbanded"
    assert state.offer(peer(2), False, 8, 20.0, now=1.1).code == "disbanded"


def test_a_leader_refuses_a_mismatched_size_and_itself():
    state = leader_state(target=4)
    assert state.offer(peer(1), False, 5, 9.0, now=0.0).code == "mismatch"
    assert state.offer(peer(0), False, 4, 9.0, now=0.0).code == "not_leader"
    with pytest.raises(ValueError):
        LeaderState(RUN, EPOCH, GroupMemberInfo(peer(0), True), 4, 2, None, 1.0)


# -- a round -----------------------------------------------------------------------------


def test_a_round_holds_joins_until_its_role_is_known():
    round_ = MatchmakingRound(RUN, EPOCH, GroupMemberInfo(peer(0)), 4, 2)
    assert round_.on_join(peer(1), False, 4, 9.0, 0.0) is HOLD
    round_.follow()
    assert round_.phase is Phase.JOINING
    assert round_.on_join(peer(1), False, 4, 9.0, 0.0) is HOLD  # it may be promoted yet
    version = round_.version
    state = round_.lead({peer(1)}, finalize_at=5.0)
    assert round_.version > version
    assert round_.on_join(peer(1), False, 4, 9.0, 0.1) is ACCEPTED
    assert round_.outcome(peer(1)) is None
    group = state.finalize(0.2)
    round_.finish(group)
    assert round_.outcome(peer(1)) == group
    assert round_.on_join(peer(2), False, 4, 9.0, 0.3).code == "finalized"
    assert round_.closed_code() == "finalized"


def test_a_round_that_gave_up_leading_refuses_and_tells_its_joiners():
    round_ = MatchmakingRound(RUN, EPOCH, GroupMemberInfo(peer(0)), 4, 3)
    round_.lead(None, finalize_at=1.0)
    assert round_.on_join(peer(1), False, 4, 9.0, 0.0) is ACCEPTED
    assert round_.leader.finalize(1.0) is None  # 2 < 3
    round_.give_up_leading("too small")
    assert round_.phase is Phase.JOINING
    assert round_.outcome(peer(1)).code == "disbanded"
    assert round_.on_join(peer(2), False, 4, 9.0, 1.1).code == "not_leader"
    with pytest.raises(RuntimeError):
        round_.lead(None, 2.0)  # one leadership per round
    round_.finish(None)
    assert round_.on_join(peer(2), False, 4, 9.0, 1.2).code == "not_leader"


def test_a_leader_refuses_joiners_that_average_with_another_rule():
    from p2pdl.averaging import Aggregator

    clip = Aggregator("centered_clip").digest()
    round_ = MatchmakingRound(RUN, EPOCH, GroupMemberInfo(peer(0)), 4, 2, aggregation=clip)
    round_.lead(None, finalize_at=1.0)
    for other in (None, Aggregator("centered_clip", tau=2.0).digest(),
                  Aggregator("median").digest()):
        assert round_.on_join(peer(1), False, 4, 9.0, 0.0, aggregation=other).code == \
            "mismatch"
    assert round_.on_join(peer(1), False, 4, 9.0, 0.0, aggregation=clip) is ACCEPTED
    # a mean leader (the default) refuses a robust joiner, accepts a mean one
    mean = MatchmakingRound(RUN, EPOCH, GroupMemberInfo(peer(0)), 4, 2)
    mean.lead(None, finalize_at=1.0)
    assert mean.on_join(peer(2), False, 4, 9.0, 0.0, aggregation=clip).code == "mismatch"
    assert mean.on_join(peer(2), False, 4, 9.0, 0.0) is ACCEPTED


def test_a_follower_or_client_round_refuses_joins():
    client = MatchmakingRound(RUN, EPOCH, GroupMemberInfo(peer(0), True), 4, 2)
    assert client.on_join(peer(1), False, 4, 9.0, 0.0).code == "not_leader"
    follower = MatchmakingRound(RUN, EPOCH, GroupMemberInfo(peer(0)), 4, 2)
    follower.follow()
    follower.finish(make_group(RUN, EPOCH, GroupMemberInfo(peer(5)), [GroupMemberInfo(peer(0))]))
    assert follower.on_join(peer(1), False, 4, 9.0, 0.0).code == "not_leader"
    # A cancelled leader disbands: its held joiners are refused.
    leader = MatchmakingRound(RUN, EPOCH, GroupMemberInfo(peer(0)), 4, 2)
    leader.lead(None, 5.0)
    leader.on_join(peer(1), False, 4, 9.0, 0.0)
    leader.finish(None, "cancelled")
    assert leader.outcome(peer(1)) == Refusal("disbanded", "cancelled")


def test_two_followers_and_a_leader_wired_back_to_back_agree():
    """Three rounds exchange joins through plain calls: the same group for all."""
    view = members(3)
    plan = plan_groups(RUN, EPOCH, view, 4)
    rounds = {m.peer_id: MatchmakingRound(RUN, EPOCH, m, 4, 2) for m in view}
    leader = plan.groups[0].leader
    state = rounds[leader].lead(expected_members(plan, leader, set()), finalize_at=5.0)
    answers = {}
    for m in view:
        if m.peer_id == leader:
            continue
        target = next_leader(plan, m, set())
        assert target == leader
        assert rounds[target].on_join(m.peer_id, m.client_mode, 4, 9.0, 0.1) is ACCEPTED
    assert state.ready(0.2)
    group = state.finalize(0.2)
    assert group.fractions is not None
    for m in view:
        if m.peer_id != leader:
            outcome = rounds[leader].outcome(m.peer_id)
            answers[m.peer_id] = group_from_formed(RUN, EPOCH, leader, m, 4, outcome.group_id,
                                                   wire_entries(outcome), outcome.fractions)
    assert set(answers.values()) == {group}


# -- checking a leader's answer ----------------------------------------------------------


def wire_entries(group: Group) -> list[tuple]:
    """The members of ``group`` as a leader's answer lists them."""
    return [(m.peer_id.to_bytes(), m.client_mode, m.auxiliary, m.bandwidth, m.reduce_rate)
            for m in group.members]


def test_a_follower_accepts_only_a_consistent_answer():
    leader, me = GroupMemberInfo(peer(0), bandwidth=4e8), GroupMemberInfo(peer(1), True)
    group = make_group(RUN, EPOCH, leader, [me, GroupMemberInfo(peer(2), bandwidth=1e8)])
    entries = wire_entries(group)
    fractions = group.fractions
    assert fractions is not None and fractions[group.index_of(peer(1))] == 0.0

    def check(entries=entries, group_id=group.group_id, target=4, who=me, lead=peer(0),
              fractions=fractions):
        return group_from_formed(RUN, EPOCH, lead, who, target, group_id, entries, fractions)

    assert check() == group
    assert check(entries=[e[:2] for e in entries], fractions=None,
                 group_id=compute_group_id(RUN, EPOCH, group.members)).fractions is None
    mine = group.index_of(peer(1))
    bad = {
        "group id": dict(group_id=b"\0" * 32),
        "not listed": dict(who=GroupMemberInfo(peer(7))),
        "client mode": dict(who=GroupMemberInfo(peer(1), False)),
        "my bandwidth": dict(who=GroupMemberInfo(peer(1), True, bandwidth=1e6)),
        "too many": dict(target=2),
        "not the leader": dict(lead=peer(2)),
        "twice": dict(entries=entries + [entries[1]]),
        "order": dict(entries=[entries[0], entries[2], entries[1]]),
        "leader client": dict(entries=[(entries[0][0], True), *entries[1:]]),
        "client and auxiliary": dict(entries=[
            e if i != mine else (e[0], True, True, *e[3:]) for i, e in enumerate(entries)]),
        "auxiliary not covered": dict(entries=[(*entries[0][:2], True, *entries[0][3:]),
                                               *entries[1:]]),
        "bad id": dict(entries=[entries[0], (b"\xff\xff", False)]),
        "empty": dict(entries=[]),
        "fractions dropped": dict(fractions=None),
        "fractions changed": dict(fractions=tuple(reversed(fractions))),
    }
    for name, changes in bad.items():
        with pytest.raises(RemoteProtocolError):
            check(**changes)
        assert name  # each case is its own


def test_a_follower_refuses_bad_fractions_even_under_a_matching_id():
    """The id covers the fractions, but a leader can hash bad ones: they are checked."""
    leader, me, client = (GroupMemberInfo(peer(0)), GroupMemberInfo(peer(1)),
                          GroupMemberInfo(peer(2), True))
    group = make_group(RUN, EPOCH, leader, [me, client], planner=lambda _: None)
    entries = wire_entries(group)
    client_at = group.index_of(peer(2))

    def with_fractions(fractions):
        group_id = compute_group_id(RUN, EPOCH, group.members, fractions)
        return group_from_formed(RUN, EPOCH, peer(0), me, 4, group_id, entries, fractions)

    good = [0.25, 0.25, 0.25]
    good[client_at] = 0.0
    good[next(i for i in range(3) if i != client_at)] = 0.75
    assert with_fractions(tuple(good)).fractions == tuple(good)
    to_client = list(good)
    to_client[client_at] = 0.25
    to_client[next(i for i in range(3) if i != client_at)] = 0.5
    for fractions in [(0.5, 0.5), (0.25, 0.25, 0.25, 0.25), tuple(to_client),
                      tuple(f * 0.9 for f in good), tuple(-f if f else 1.0 for f in good),
                      tuple(float("nan") if f else 0.0 for f in good),
                      tuple(1 if f == 0.75 else f for f in good)]:
        with pytest.raises(RemoteProtocolError):
            with_fractions(fractions)
    # The tolerance: a sum off by less than FRACTION_TOLERANCE passes.
    close = tuple(f + FRACTION_TOLERANCE / 4 if f else 0.0 for f in good)
    assert with_fractions(close).fractions == close


def test_checks_of_capacities_and_fractions():
    assert check_capacity(False, False, None, None) is None
    assert check_capacity(False, True, 1e8, 5e7) is None
    assert check_capacity(True, False, 1.0, 1e12) is None
    for args in [(True, True, None, None), (False, "yes", None, None), (False, 1, None, None),
                 (False, False, 0, None), (False, False, -5.0, None),
                 (False, False, float("nan"), None), (False, False, float("inf"), None),
                 (False, False, 1e13, None), (False, False, None, 0.5),
                 (False, False, "fast", None), (False, False, True, None)]:
        assert check_capacity(*args), args
    two = [GroupMemberInfo(peer(0)), GroupMemberInfo(peer(1), True)]
    assert check_fractions(two, (1.0, 0.0)) is None
    assert "client-mode" in check_fractions(two, (0.5, 0.5))
    assert "fractions for" in check_fractions(two, (1.0,))
    assert "sum" in check_fractions(two, (0.9, 0.0))
    assert "float" in check_fractions(two, (1, 0.0))


# -- the load plan -----------------------------------------------------------------------


def test_capacities_fill_unknown_bandwidths_with_the_mean_of_the_known():
    group = [GroupMemberInfo(peer(0), bandwidth=1e8), GroupMemberInfo(peer(1), bandwidth=3e8),
             GroupMemberInfo(peer(2), True), GroupMemberInfo(peer(3), auxiliary=True,
                                                             reduce_rate=5e7)]
    assert member_capacities(group) == [
        PeerCapacity(1e8), PeerCapacity(3e8), PeerCapacity(2e8, client=True),
        PeerCapacity(2e8, 5e7, auxiliary=True)]
    assert [c.bandwidth for c in member_capacities(members(3))] == [1.0] * 3
    made = make_group(RUN, EPOCH, group[0], group[1:])
    assert made.capacities() == member_capacities(made.members)


def test_a_declared_rate_counts_at_most_a_bounded_factor_from_the_median():
    """A member that claims 10^12 bytes/s among peers of 10^7 gets the share of
    8 x 10^7, no more; one that claims 1 byte/s is counted at 10^7 / 8."""
    assert bounded_rates([1e7, 2e7, 1e12, None, 1.0]) == [1e7, 2e7, 8e7, None, 1.25e6]
    assert bounded_rates([5.0, None]) == [5.0, None]     # one known: nothing to compare
    assert bounded_rates([4.0, 1e9]) == [4.0, 32.0]      # the lower median of two
    liar = [GroupMemberInfo(peer(i), bandwidth=b) for i, b in enumerate((1e7, 1e7, 1e7, 1e12))]
    honest = [GroupMemberInfo(peer(i), bandwidth=b) for i, b in enumerate((1e7, 1e7, 1e7, 8e7))]
    assert plan_fractions(liar) == plan_fractions(honest)
    assert [c.reduce_rate for c in member_capacities(
        [GroupMemberInfo(peer(i), reduce_rate=r) for i, r in enumerate((1e6, 2e6, 1e3))])] \
        == [1e6, 2e6, 1.25e5]


def test_the_leaders_plan_favours_fast_members_and_gives_clients_nothing():
    group = [GroupMemberInfo(peer(0), bandwidth=1e8), GroupMemberInfo(peer(1), bandwidth=4e8),
             GroupMemberInfo(peer(2), True, bandwidth=1e8)]
    fractions = plan_fractions(group)
    assert len(fractions) == 3 and math.isclose(math.fsum(fractions), 1, abs_tol=1e-12)
    assert fractions[2] == 0.0 and fractions[1] > fractions[0]
    assert all(type(f) is float for f in fractions)
    # Unknown capacities: equal shares among those that can reduce.
    same = plan_fractions([*members(3), GroupMemberInfo(peer(3), True)])
    assert same[3] == 0.0 and all(math.isclose(f, 1 / 3, rel_tol=1e-5) for f in same[:3])
    # A compute-bound fast peer shares its load.
    fast_link = [GroupMemberInfo(peer(0), bandwidth=1e8), GroupMemberInfo(peer(1), bandwidth=4e8),
                 GroupMemberInfo(peer(2), bandwidth=1e8)]
    assert plan_fractions(fast_link) == (0.0, 1.0, 0.0)
    fast_link[1] = GroupMemberInfo(peer(1), bandwidth=4e8, reduce_rate=1e8)
    slow_cpu = plan_fractions(fast_link)
    assert 0 < slow_cpu[0] < slow_cpu[1] < 1 and slow_cpu[2] > 0
    # Nobody contributes a vector: no plan.
    assert plan_fractions([GroupMemberInfo(peer(0), auxiliary=True)]) is None
    assert plan_fractions([]) is None
    assert plan_fractions(members(1)) == (1.0,)


def test_the_plan_falls_back_to_equal_shares_when_the_program_fails(monkeypatch):
    import p2pdl.averaging.matchmaking._plan as mm

    def broken(peers, vector_bytes):
        raise LocalProtocolError("the load-balancing program failed: infeasible")

    monkeypatch.setattr(mm, "plan_load", broken)
    group = [GroupMemberInfo(peer(0), bandwidth=1e8), GroupMemberInfo(peer(1), bandwidth=4e8),
             GroupMemberInfo(peer(2), True), GroupMemberInfo(peer(3), auxiliary=True)]
    assert plan_fractions(group) == (1 / 3, 1 / 3, 0.0, 1 / 3)


def test_a_leader_plans_with_the_capacities_its_joiners_declared():
    state = LeaderState(RUN, EPOCH, GroupMemberInfo(peer(0), bandwidth=1e8), 4, 2, None, 5.0)
    assert state.offer(peer(1), False, 4, 9.0, 0.0, bandwidth=1e6) is ACCEPTED
    # A repeated request updates what the joiner declared.
    assert state.offer(peer(1), False, 4, 9.0, 0.1, bandwidth=8e8, reduce_rate=1e12) is ACCEPTED
    assert state.offer(peer(2), True, 4, 9.0, 0.2, bandwidth=1e7) is ACCEPTED
    assert state.offer(peer(3), False, 4, 9.0, 0.3, auxiliary=True) is ACCEPTED
    group = state.finalize(1.0)
    joined = group.members[group.index_of(peer(1))]
    assert (joined.bandwidth, joined.reduce_rate) == (8e8, 1e12)
    assert group.members[group.index_of(peer(3))].auxiliary
    assert group.fractions == plan_fractions(group.members)
    assert group.fractions[group.index_of(peer(2))] == 0.0
    assert group.fractions[group.index_of(peer(1))] == max(group.fractions)
    assert group.group_id == compute_group_id(RUN, EPOCH, group.members, group.fractions)
    # Through a round, and with a planner of one's own.
    round_ = MatchmakingRound(RUN, EPOCH, GroupMemberInfo(peer(0)), 4, 2,
                              planner=lambda ms: tuple(1.0 if i == 0 else 0.0
                                                       for i in range(len(ms))))
    round_.lead(None, 5.0)
    assert round_.on_join(peer(1), False, 4, 9.0, 0.0, auxiliary=True, bandwidth=2e8,
                          reduce_rate=3e8) is ACCEPTED
    group = round_.leader.finalize(5.0)
    assert group.members[1] == GroupMemberInfo(peer(1), False, True, 2e8, 3e8)
    assert group.fractions == (1.0, 0.0)


def test_run_ids_and_epochs_are_checked():
    assert check_run("r", 0) is None
    for run_id, epoch in [("", 0), ("r", -1), ("r", 2**53 + 1), (7, 0), ("r", True),
                          ("é" * 65, 0)]:
        assert check_run(run_id, epoch)


def test_config_rejects_bad_values_with_clear_messages():
    MatchmakingConfig()
    for fields in [dict(target_group_size=0), dict(target_group_size=257),
                   dict(min_group_size=0), dict(min_group_size=17), dict(matchmaking_time=0),
                   dict(matchmaking_time=float("nan")), dict(gather_time=-1),
                   dict(join_window=0), dict(max_join_attempts=0), dict(max_rounds=0),
                   dict(target_group_size=True)]:
        with pytest.raises(ConfigError, match="MatchmakingConfig"):
            MatchmakingConfig(**fields)


def test_many_random_views_never_put_a_peer_in_two_groups():
    rng = random.Random(5)
    for n, target in itertools.product((1, 3, 17, 40), (1, 2, 5, 16)):
        clients = {i for i in range(n) if rng.random() < 0.3}
        plan = plan_groups(RUN, EPOCH, members(n, clients), target)
        seen = [m.peer_id for g in plan.groups for m in g.members] + \
            [m.peer_id for m in plan.left_out]
        assert len(seen) == len(set(seen)) == n
        assert all(len(g.members) <= target and not g.members[0].client_mode
                   for g in plan.groups)
