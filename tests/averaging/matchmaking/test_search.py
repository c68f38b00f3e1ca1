"""p2pdl.averaging.matchmaking: whom a peer asks, one after another, in a round
(LeaderSearch), and the peers left out of a run's views for showing no membership in
time (UnresponsivePeers); sans-IO."""

from __future__ import annotations

import hashlib

from libp2p.peer.id import ID

from p2pdl.averaging.matchmaking import GroupMemberInfo, next_leader, plan_groups
from p2pdl.averaging.matchmaking._state import LeaderSearch, UnresponsivePeers

RUN, EPOCH = "search-run", 3


def peer(i: int, client_mode: bool = False) -> GroupMemberInfo:
    return GroupMemberInfo(ID(b"\x00\x20" + hashlib.sha256(bytes([i])).digest()), client_mode)


PEERS = [peer(i) for i in range(6)]


def search(me: GroupMemberInfo, view=PEERS, target=3, attempts=3, fetches=2) -> LeaderSearch:
    return LeaderSearch(RUN, EPOCH, me, target, {p.peer_id: p for p in view},
                        max_join_attempts=attempts, max_view_fetches=fetches)


def leaders() -> list[ID]:
    return list(plan_groups(RUN, EPOCH, PEERS, 3).leaders)


def test_a_planned_leader_leads_its_planned_group_and_a_member_joins_its_leader():
    leader = next(p for p in PEERS if p.peer_id == leaders()[0])
    step = search(leader).next()
    planned = {m.peer_id for m in plan_groups(RUN, EPOCH, PEERS, 3).group_of(
        leader.peer_id).members}
    assert step.action == "lead" and step.expected == frozenset(planned)
    member = next(p for p in PEERS if p.peer_id in planned and p.peer_id != leader.peer_id)
    step = search(member).next()
    assert step.action == "join" and step.leader == leader.peer_id


def test_a_full_leader_closes_its_group_and_the_next_leader_is_asked_until_none_is_left():
    plan = plan_groups(RUN, EPOCH, PEERS, 3)
    member = next(p for p in PEERS if p.peer_id not in plan.leaders)
    s = search(member, attempts=10)
    steps = []
    while True:
        step = s.next()
        steps.append(step)
        if step.action == "join":
            s.join_failed(step.leader, "full")
        elif step.action == "lead":
            s.led_nothing()
        else:
            break
    asked = [st.leader for st in steps if st.action == "join"]
    # the planned leaders first, once each (a full one closes its group, so
    # none of its members is promoted); then the leftovers' leaders in the
    # plan's order, this peer among them (it leads, forms nothing, moves on)
    leaders = len(plan.leaders)
    assert set(asked[:leaders]) == set(plan.leaders) and len(asked) == len(set(asked))
    order = [p.peer_id for p in plan.ordered if p.peer_id not in plan.leaders]
    turns = [st.leader if st.action == "join" else member.peer_id
             for st in steps[leaders:] if st.action in ("join", "lead")]
    assert turns == order
    assert [st.expected for st in steps if st.action == "lead"] == [None]
    # nobody left to ask: it reads the view again, then gives up
    assert steps[-1].action == "fetch"
    s.fetched({})
    assert s.next().action == "give_up" and s.next().note == "no leader left to ask"


def test_a_peer_gives_up_after_its_join_attempts_but_leads_when_its_turn_comes():
    plan = plan_groups(RUN, EPOCH, PEERS, 3)
    for member in [p for p in PEERS if p.peer_id not in plan.leaders]:
        s = search(member, attempts=1)
        first = s.next()
        assert first.action == "join"
        s.join_failed(first.leader, "failed")   # its member next in line is promoted
        step = s.next()
        if next_leader(plan, member, {first.leader}) == member.peer_id:
            assert step.action == "lead"
        else:
            assert step.action == "give_up" and step.note == "1 join attempts made"


def test_a_view_that_grew_is_planned_again():
    alone = PEERS[0]
    s = search(alone, view=[alone], target=3)
    assert s.next().action == "lead"   # alone in its view: it leads (leftovers)
    s.led_nothing()
    assert s.next().action == "fetch"
    s.fetched({p.peer_id: p for p in PEERS})
    expected = next_leader(plan_groups(RUN, EPOCH, PEERS, 3), alone, {alone.peer_id})
    step = s.next()
    assert step.action == "join" and step.leader == expected


def test_a_peer_that_showed_no_membership_is_left_out_without_a_new_wait_for_a_while():
    a, b, c = (p.peer_id for p in PEERS[:3])
    left = UnresponsivePeers(ttl=60.0, limit=2)
    assert left.to_ask([a, b], "run", now=0.0) == [a, b]
    left.left_out(a, "run", now=0.0)
    assert left.to_ask([a, b], "run", now=59.0) == [b]     # a: no new wait
    assert left.to_ask([a], "other", now=59.0) == [a]      # another run asks again
    assert left.to_ask([a, b], "run", now=60.0) == [a, b]  # its time is over
    # bounded: the oldest is forgotten first
    for i, peer in enumerate((a, b, c)):
        left.left_out(peer, "run", now=100.0 + i)
    assert len(left) == 2 and left.to_ask([a, b, c], "run", now=103.0) == [a]
