"""Matchmaking: on in-memory nodes in virtual time (timeouts, retries, leaders
that vanish), and on real nodes over loopback for the real stack."""

from __future__ import annotations

import dataclasses
import functools
import itertools
import time

import msgpack
import pytest
import trio

from p2pdl import NodeConfig, P2PDLError
from p2pdl.averaging import (
    MATCHMAKING_PROTOCOL,
    Group,
    GroupMemberInfo,
    MatchmakingConfig,
    compute_group_id,
    plan_groups,
    round_key,
)
from p2pdl.averaging.matchmaking import plan_fractions
from p2pdl.averaging.matchmaking._messages import Formed, Join, MemberEntry, Rejected
from p2pdl.errors import (
    ConfigError,
    LocalProtocolError,
    MatchmakingFailedError,
    RemoteError,
    StreamClosedError,
)
from p2pdl.nat import NatConfig
from p2pdl.testing import open_memory_nodes, open_memory_swarm, open_nodes, wait_for_dht
from p2pdl.wire import FrameKind
from p2pdl.wire._frames import frame_header

pytestmark = pytest.mark.timeout(90)


def mm_config(config: NodeConfig | None = None, **fields) -> NodeConfig:
    config = config or NodeConfig()
    return dataclasses.replace(config, matchmaking=MatchmakingConfig(**fields))


def info(node) -> GroupMemberInfo:
    return GroupMemberInfo(node.peer_id, node.client_mode)


def choose_run(infos, target, wanted, prefix="run") -> str:
    """The first run id ``prefix-<n>`` whose plan of ``infos`` satisfies ``wanted(plan)``."""
    for n in itertools.count():
        run_id = f"{prefix}-{n}"
        if wanted(plan_groups(run_id, 1, infos, target)):
            return run_id
    raise AssertionError("unreachable")


async def form_all(nodes, run_id, epoch=1, **kwargs) -> dict[int, Group | Exception]:
    results: dict[int, Group | Exception] = {}

    async def one(i, node):
        try:
            results[i] = await node.matchmaking.form_group(run_id, epoch, **kwargs)
        except MatchmakingFailedError as exc:
            results[i] = exc

    async with trio.open_nursery() as nursery:
        for i, node in enumerate(nodes):
            nursery.start_soon(one, i, node)
    return results


def groups_of(nodes, results) -> dict[bytes, Group]:
    """Check that every member of each group holds the same group; return them by id."""
    groups: dict[bytes, Group] = {}
    for i, result in results.items():
        if isinstance(result, Exception):
            continue
        assert nodes[i].peer_id in result.peer_ids
        assert groups.setdefault(result.group_id, result) == result  # identical, in order
    for group in groups.values():
        assert group.group_id == compute_group_id(group.run_id, group.epoch, group.members,
                                                  group.fractions)
        assert not group.members[0].client_mode  # the leader accepts connections
        members = {n.peer_id: i for i, n in enumerate(nodes)}
        for peer_id in group.peer_ids:
            if peer_id in members:  # every member it lists got this same group
                assert results[members[peer_id]] == group
    everyone = [p for g in groups.values() for p in g.peer_ids]
    assert len(everyone) == len(set(everyone))  # nobody is in two groups
    return groups


async def test_sixteen_peers_with_target_eight_form_two_identical_groups(autojump_clock):
    # A long join window: a leader finalizes once its plan joined, not when it ends.
    config = mm_config(target_group_size=8, matchmaking_time=30, join_window=10)
    async with open_memory_nodes(16, config) as nodes:
        await wait_for_dht(nodes)
        start = trio.current_time()
        results = await form_all(nodes, "sixteen", 3)
        took = trio.current_time() - start
        assert not [r for r in results.values() if isinstance(r, Exception)], results
        groups = groups_of(nodes, results)
        assert sorted(len(g) for g in groups.values()) == [8, 8]
        assert {p for g in groups.values() for p in g.peer_ids} == {n.peer_id for n in nodes}
        assert took < 30  # matchmaking_time
        led = sum(n.matchmaking.statistics()["led"] for n in nodes)
        assert led == 2
        stats = nodes[0].statistics()["matchmaking"]
        assert stats["rounds"] == 1 and stats["active_rounds"] == 0 and stats["held_joins"] == 0


async def test_client_mode_peers_join_groups_and_never_lead(autojump_clock):
    config = mm_config(target_group_size=4, matchmaking_time=10)
    client_config = dataclasses.replace(config, nat=NatConfig(client_mode=True))
    async with open_memory_swarm() as swarm:
        servers = await swarm.add_nodes(6, config)
        clients = await swarm.add_nodes(4, client_config)
        await wait_for_dht(servers)
        await wait_for_dht(clients, contacts=3)
        nodes = servers + clients
        assert [n.client_mode for n in nodes] == [False] * 6 + [True] * 4
        # A run whose order puts a client first: it must still not lead.
        run_id = choose_run([info(n) for n in nodes], 4,
                            lambda plan: plan.ordered[0].client_mode, prefix="clients")
        results = await form_all(nodes, run_id)
        assert not [r for r in results.values() if isinstance(r, Exception)], results
        groups = groups_of(nodes, results)
        assert sorted(len(g) for g in groups.values()) == [3, 3, 4]
        client_ids = {c.peer_id for c in clients}
        for group in groups.values():
            assert group.leader not in client_ids
            for member in group.members:
                assert member.client_mode == (member.peer_id in client_ids)
        assert all(c.matchmaking.statistics()["led"] == 0 for c in clients)
        # Nobody may ask a client to lead.
        reply = await servers[0].call(clients[0].peer_id, MATCHMAKING_PROTOCOL,
                                      Join(run_id, 1, 4, False, 5.0))
        assert isinstance(reply, Rejected) and reply.code in ("not_leader", "unknown_run")
        # Nobody can send a client parts to reduce: it cannot be auxiliary.
        with pytest.raises(ConfigError, match="client mode"):
            await clients[0].matchmaking.form_group(run_id, 2, auxiliary=True)


async def test_members_capacities_give_every_member_the_leaders_load_plan(autojump_clock):
    config = mm_config(target_group_size=4, matchmaking_time=10)
    client_config = dataclasses.replace(config, nat=NatConfig(client_mode=True))
    async with open_memory_swarm() as swarm:
        servers = await swarm.add_nodes(3, config)
        (client,) = await swarm.add_nodes(1, client_config)
        await wait_for_dht(servers)
        await wait_for_dht([client], contacts=2)
        slow, fast, aux = servers
        nodes = [slow, fast, aux, client]
        declared = {slow.peer_id: dict(bandwidth=5e7),
                    fast.peer_id: dict(bandwidth=4e8, reduce_rate=1e9),
                    aux.peer_id: dict(auxiliary=True, bandwidth=1e8),
                    client.peer_id: dict(bandwidth=1e8)}
        results: dict[int, Group | Exception] = {}

        async def one(i, node):
            results[i] = await node.matchmaking.form_group("capacities", 1,
                                                           **declared[node.peer_id])

        async with trio.open_nursery() as nursery:
            for i, node in enumerate(nodes):
                nursery.start_soon(one, i, node)
        groups = groups_of(nodes, results)
        assert len(groups) == 1
        group = next(iter(groups.values()))
        assert set(group.peer_ids) == {n.peer_id for n in nodes}
        assert {results[i].fractions for i in range(4)} == {group.fractions}  # the same floats
        for member in group.members:  # every member as it declared itself
            wanted = {"auxiliary": False, "bandwidth": None, "reduce_rate": None,
                      **declared[member.peer_id]}
            assert {k: getattr(member, k) for k in wanted} == wanted
        fractions = dict(zip(group.peer_ids, group.fractions, strict=True))
        assert fractions[client.peer_id] == 0.0
        assert fractions[fast.peer_id] == max(fractions.values())
        assert fractions[fast.peer_id] > fractions[slow.peer_id]
        assert abs(sum(group.fractions) - 1) < 1e-9
        assert group.fractions == plan_fractions(group.members)
        assert group.capacities()[group.index_of(client.peer_id)].client


async def test_a_leader_killed_while_groups_form_leaves_the_others_to_form_groups(
        autojump_clock):
    target, mm_time, window = 4, 15.0, 3.0
    config = mm_config(target_group_size=target, matchmaking_time=mm_time, join_window=window)
    async with open_memory_swarm() as swarm:
        nodes = await swarm.add_nodes(7, config)
        (doomed,) = await swarm.add_nodes(1, config)
        await wait_for_dht([*nodes, doomed])
        child = doomed.peer_id
        everyone = [info(n) for n in nodes] + [GroupMemberInfo(child)]
        # A run in which the child leads a group: its followers must find another leader.
        run_id = choose_run(everyone, target, lambda plan: child in plan.leaders, "kill")
        followers = plan_groups(run_id, 1, everyone, target).group_of(child).members[1:]
        announced = trio.Event()
        announce = doomed.dht.announce

        async def announce_and_say(*args):
            ok = await announce(*args)
            announced.set()
            return ok

        doomed.dht.announce = announce_and_say

        async def doomed_round():
            try:
                await doomed.matchmaking.form_group(run_id, 1)
            except P2PDLError:
                pass  # it is killed before it could form a group

        doomed.nursery.start_soon(doomed_round)  # dies with the node
        results: dict[int, Group | Exception] = {}

        async def kill_once_announced():
            await announced.wait()
            swarm.kill(doomed)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_once_announced)

            async def run_all():
                results.update(await form_all(nodes, run_id))
            nursery.start_soon(run_all)
        assert not doomed.host.alive and doomed not in swarm.nodes
        assert not [r for r in results.values() if isinstance(r, Exception)], results
        groups = groups_of(nodes, results)
        assert all(child not in g.peer_ids for g in groups.values())
        assert sorted(len(g) for g in groups.values()) == [3, 4]
        # The dead leader's followers formed their group under the next peer in order.
        orphans = {m.peer_id for m in followers}
        assert any(set(g.peer_ids) == orphans for g in groups.values())


async def test_a_planned_leader_that_is_not_matchmaking_is_skipped(autojump_clock):
    async with open_memory_nodes(5, mm_config(target_group_size=8,
                                              matchmaking_time=10)) as nodes:
        await wait_for_dht(nodes)
        ghost, real = nodes[0], nodes[1:]
        run_id = choose_run([info(n) for n in nodes], 8,
                            lambda plan: plan.leaders == (ghost.peer_id,), "ghost")
        assert await ghost.dht.announce(round_key(run_id, 1), ghost.dht.now() + 30)
        start = trio.current_time()
        results = await form_all(real, run_id)
        groups = groups_of(real, results)
        assert [set(g.peer_ids) for g in groups.values()] == [{n.peer_id for n in real}]
        assert trio.current_time() - start < 8  # no waiting for the ghost's window
        assert ghost.matchmaking.statistics()["joins_refused"] >= 3  # unknown_run


@pytest.mark.parametrize("evidence", [True, False])
async def test_a_joiner_that_banned_a_member_is_not_split_off(autojump_clock, evidence):
    """Joiner A banned X; the leader has not.  With a strike of its own against
    X the leader leaves X out and A averages with the others; without one it
    leaves A out (A's word alone removes nobody else)."""
    async with open_memory_nodes(4, mm_config(target_group_size=4,
                                              matchmaking_time=10)) as nodes:
        await wait_for_dht(nodes)
        everyone = [info(n) for n in nodes]
        # nodes[0] leads all four, and the three the joiner sees
        run_id = next(r for r in (f"refused-{n}" for n in itertools.count())
                      if plan_groups(r, 1, everyone, 4).leaders == (nodes[0].peer_id,)
                      and plan_groups(r, 1, everyone[:3], 4).leaders == (nodes[0].peer_id,))
        leader, joiner, other, banned = nodes
        joiner.flags.ban(banned.peer_id, run_id, time.time(), "test")
        if evidence:
            leader.flags.flag(banned.peer_id, run_id, "outlier_values", 0.0)
        results = await form_all(nodes, run_id)
        kept, left = ((leader, joiner, other), banned) if evidence \
            else ((leader, other, banned), joiner)
        groups = groups_of(nodes, results)
        assert [set(g.peer_ids) for g in groups.values()] == [{n.peer_id for n in kept}]
        assert isinstance(results[nodes.index(left)], MatchmakingFailedError)
        assert "excluded" in str(results[nodes.index(left)])
        assert leader.matchmaking.statistics()["refusals_resolved"] == 1


@pytest.mark.parametrize("robust", [True, False])
async def test_a_refused_peer_never_gets_one_of_two_votes_under_a_robust_rule(
        autojump_clock, robust):
    """Joiner A banned M; the leader L has not.  Leaving A out would leave L
    alone with M, where a robust rule outvotes nobody: L leaves M out too, and
    later in the round turns down a group of two with M (as M's follower).
    Under the mean the pair forms as before."""
    async with open_memory_nodes(3, mm_config(target_group_size=4,
                                              matchmaking_time=10)) as nodes:
        await wait_for_dht(nodes)
        everyone = [info(n) for n in nodes]
        run_id = choose_run(everyone, 4, lambda plan: plan.leaders == (nodes[0].peer_id,),
                            "disputed")
        leader, joiner, banned = nodes
        joiner.flags.ban(banned.peer_id, run_id, time.time(), "test")
        results = await form_all(nodes, run_id, aggregation=b"r" * 32 if robust else None)
        if not robust:
            groups = groups_of(nodes, results)
            assert [set(g.peer_ids) for g in groups.values()] == [
                {leader.peer_id, banned.peer_id}]
            return
        # M may form a group with L on its side; L (and A) never average with M
        for honest in (0, 1):
            assert isinstance(results[honest], MatchmakingFailedError) or \
                banned.peer_id not in results[honest].peer_ids, results[honest]
        # L ends alone (having turned M's pair down) or with A, never with M
        assert "whom a member refused" in str(results[0]) or \
            set(results[0].peer_ids) == {leader.peer_id, joiner.peer_id}


async def test_a_late_arrival_joins_a_group_that_is_still_open(autojump_clock):
    config = mm_config(target_group_size=8, matchmaking_time=12, join_window=4)
    async with open_memory_nodes(5, config) as nodes:
        await wait_for_dht(nodes)
        early, ghost, late = nodes[:3], nodes[3], nodes[4]
        # The ghost announced and vanished: the leader waits for it until its window ends,
        # and the leader is the same in the early peers' view and in the late one's.
        infos = [info(n) for n in nodes]
        run_id = choose_run(infos, 8, lambda plan: plan.leaders[0] in {n.peer_id for n in early},
                            "late")
        assert await ghost.dht.announce(round_key(run_id, 1), ghost.dht.now() + 30)
        results: dict[int, Group | Exception] = {}

        async def late_one():
            await trio.sleep(1.0)
            results.update({3: await late.matchmaking.form_group(run_id, 1)})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(late_one)
            results.update(await form_all(early, run_id))
        members = [*early, late]
        groups = groups_of(members, results)
        assert [set(g.peer_ids) for g in groups.values()] == [{n.peer_id for n in members}]


async def test_a_late_arrival_after_the_groups_formed_fails_cleanly_and_in_time(autojump_clock):
    config = mm_config(target_group_size=8, matchmaking_time=6, join_window=2)
    async with open_memory_nodes(4, config) as nodes:
        await wait_for_dht(nodes)
        results = await form_all(nodes[:3], "after", 2)
        groups = groups_of(nodes[:3], results)
        assert len(groups) == 1 and len(next(iter(groups.values()))) == 3
        start = trio.current_time()
        with pytest.raises(MatchmakingFailedError, match="'after' epoch 2"):
            await nodes[3].matchmaking.form_group("after", 2)
        assert trio.current_time() - start < 6.5
        # The others' groups are unchanged, and they refused at once.
        refused = sum(n.matchmaking.statistics()["joins_refused"] for n in nodes[:3])
        assert refused >= 1


async def test_join_requests_are_answered_by_the_documented_codes(autojump_clock):
    config = mm_config(target_group_size=2, matchmaking_time=6, join_window=2)
    async with open_memory_nodes(2, config) as (leader, asker):
        await wait_for_dht([leader, asker])

        async def join(run_id="codes", epoch=1, target=2, wait=5.0):
            return await asker.call(leader.peer_id, MATCHMAKING_PROTOCOL,
                                    Join(run_id, epoch, target, False, wait))

        assert (await join()).code == "unknown_run"
        result = {}

        async def lead():
            result["group"] = await leader.matchmaking.form_group("codes", 1)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(lead)
            await trio.sleep(0.2)
            assert (await join(epoch=2)).code == "wrong_epoch"
            assert (await join(target=3)).code == "mismatch"
            formed = await join()  # held while the leader gathers, then accepted
        assert isinstance(formed, Formed)
        group = result["group"]
        assert formed.group_id == group.group_id
        assert [MemberEntry(leader.peer_id.to_bytes(), False),
                MemberEntry(asker.peer_id.to_bytes(), False)] == formed.members
        assert tuple(formed.fractions) == group.fractions and sum(group.fractions) == 1
        assert (await join()).code == "finalized"  # the round is over
        stats = leader.matchmaking.statistics()
        assert stats["joins_accepted"] == 1 and stats["led"] == 1


async def test_a_cancelled_leader_refuses_its_held_joiners(autojump_clock):
    config = mm_config(target_group_size=4, matchmaking_time=10, join_window=3)
    async with open_memory_nodes(2, config) as (leader, asker):
        await wait_for_dht([leader, asker])
        async with trio.open_nursery() as nursery:
            # It leads, and waits for a third member until its window ends.
            nursery.start_soon(functools.partial(leader.matchmaking.form_group, "cancel", 1,
                                                 min_group_size=3))
            await trio.sleep(1.0)
            with trio.fail_after(5):
                async with trio.open_nursery() as inner:
                    async def ask():
                        reply = await asker.call(leader.peer_id, MATCHMAKING_PROTOCOL,
                                                 Join("cancel", 1, 4, False, 5.0))
                        assert reply.code == "disbanded"
                    inner.start_soon(ask)
                    await trio.sleep(0.5)
                    assert leader.matchmaking.statistics()["held_joins"] == 1
                    nursery.cancel_scope.cancel()
        assert leader.matchmaking.statistics()["held_joins"] == 0


async def test_a_group_below_the_minimum_fails_for_every_member(autojump_clock):
    config = mm_config(target_group_size=8, min_group_size=4, matchmaking_time=4,
                       join_window=1)
    async with open_memory_nodes(3, config) as nodes:
        await wait_for_dht(nodes)
        results = await form_all(nodes, "small")
        assert all(isinstance(r, MatchmakingFailedError) for r in results.values()), results
        # With a minimum of one, a lone peer forms a group of itself at once.
        group = await nodes[0].matchmaking.form_group("solo", 1, min_group_size=1,
                                                      target_group_size=1)
        assert group.peer_ids == (nodes[0].peer_id,)


async def test_forged_answers_are_refused_and_the_liar_keeps_serving(caplog, autojump_clock):
    config = mm_config(target_group_size=2, matchmaking_time=4, join_window=1)
    async with open_memory_nodes(2, config) as nodes:
        await wait_for_dht(nodes)
        run_id = choose_run([info(n) for n in nodes], 2,
                            lambda plan: plan.leaders == (nodes[0].peer_id,), "forged")
        liar, victim = nodes
        honest = liar.matchmaking._answer
        # The liar is in the round's view (so the victim asks it) and answers with lies.
        assert await liar.dht.announce(round_key(run_id, 1), liar.dht.now() + 30)

        async def lie(peer, request):
            # A group that lists the victim, but whose id covers another list.
            members = [MemberEntry(liar.peer_id.to_bytes(), False),
                       MemberEntry(peer.to_bytes(), False)]
            return Formed(b"\x01" * 32, members)

        liar.matchmaking._answer = lie
        with pytest.raises(MatchmakingFailedError, match="bad answer"):
            await victim.matchmaking.form_group(run_id, 1)
        assert victim.matchmaking.statistics()["bad_answers"] == 1

        async def lie_about_fractions(peer, request):
            # A consistent id, but fractions that do not sum to 1.
            members = [GroupMemberInfo(liar.peer_id), GroupMemberInfo(peer)]
            fractions = [0.5, 0.25]
            return Formed(compute_group_id(run_id, 1, members, fractions),
                          [MemberEntry(m.peer_id.to_bytes(), False) for m in members],
                          fractions)

        liar.matchmaking._answer = lie_about_fractions
        with pytest.raises(MatchmakingFailedError, match="bad answer"):
            await victim.matchmaking.form_group(run_id, 1)  # the same round once more
        assert victim.matchmaking.statistics()["bad_answers"] == 2
        assert "the fractions sum to 0.75" in caplog.text
        # The liar's node still serves: honest again, the next round forms.
        liar.matchmaking._answer = honest
        results = await form_all(nodes, run_id, epoch=2)
        assert len(groups_of(nodes, results)) == 1
        assert not [r for r in results.values() if isinstance(r, Exception)]


async def test_malformed_join_requests_reset_only_their_stream():
    async with open_nodes(3, mm_config(target_group_size=2, matchmaking_time=6)) as nodes:
        await wait_for_dht(nodes)
        server, attacker, honest = nodes

        async def raw(payload: bytes) -> None:
            net_stream = await attacker.host.new_stream(server.peer_id,
                                                        MATCHMAKING_PROTOCOL.protocol_id)
            await net_stream.write(payload)
            with trio.fail_after(10):  # the server resets the stream
                try:
                    while await net_stream.read(65536):
                        pass
                except Exception:  # reset or EOF: the stream is gone
                    pass

        await raw(b"\x07not a frame")
        bad_types = msgpack.packb(["mm.join", 1, {"run_id": 5, "epoch": 1,
                                                  "target_group_size": 2,
                                                  "client_mode": False, "wait": 1.0}])
        await raw(frame_header(FrameKind.MESSAGE, len(bad_types)) + bad_types)
        negative = msgpack.packb(["mm.join", 1, {"run_id": "r", "epoch": -1,
                                                 "target_group_size": 2,
                                                 "client_mode": False, "wait": 1.0}])
        await raw(frame_header(FrameKind.MESSAGE, len(negative)) + negative)
        with pytest.raises((StreamClosedError, RemoteError)):
            await attacker.call(server.peer_id, MATCHMAKING_PROTOCOL, Join("", 1, 2, False, 1.0))
        with pytest.raises((StreamClosedError, RemoteError)):  # a client cannot be auxiliary
            await attacker.call(server.peer_id, MATCHMAKING_PROTOCOL,
                                Join("r", 1, 2, True, 1.0, auxiliary=True))
        too_fast = msgpack.packb(["mm.join", 1, {"run_id": "r", "epoch": 1,
                                                 "target_group_size": 2, "client_mode": False,
                                                 "wait": 1.0, "bandwidth": 1e13}])
        await raw(frame_header(FrameKind.MESSAGE, len(too_fast)) + too_fast)
        for refuses in ([b"p"] * 17, [b"p" * 65], "not a list"):   # MAX_REFUSED, a peer id
            refusing = msgpack.packb(["mm.join", 1, {"run_id": "r", "epoch": 1,
                                                     "target_group_size": 2,
                                                     "client_mode": False, "wait": 1.0,
                                                     "refuses": refuses}])
            await raw(frame_header(FrameKind.MESSAGE, len(refusing)) + refusing)
        # The server keeps serving everyone, the attacker included.
        results = await form_all([server, honest], "after-attack")
        assert len(groups_of([server, honest], results)) == 1
        reply = await attacker.call(server.peer_id, MATCHMAKING_PROTOCOL,
                                    Join("after-attack", 1, 2, False, 1.0))
        assert reply.code in ("finalized", "not_leader")


async def test_bad_arguments_are_clear_errors():
    async with open_nodes(1) as (node,):
        form = node.matchmaking.form_group
        for args, kwargs, match in [
                (("", 1), {}, "run_id"), ((7, 1), {}, "run_id"), (("r", -1), {}, "epoch"),
                (("r", 1.5), {}, "epoch"), (("r", 1), {"target_group_size": 0}, "target"),
                (("r", 1), {"min_group_size": 0}, "min_group_size"),
                (("r", 1), {"target_group_size": 2, "min_group_size": 3}, "min_group_size"),
                (("r", 1), {"matchmaking_time": 0}, "matchmaking_time"),
                (("r", 1), {"matchmaking_time": float("inf")}, "matchmaking_time"),
                (("r", 1), {"bandwidth": 0}, "bandwidth"),
                (("r", 1), {"bandwidth": float("nan")}, "bandwidth"),
                (("r", 1), {"bandwidth": 1e13}, "bandwidth"),
                (("r", 1), {"bandwidth": "fast"}, "bandwidth"),
                (("r", 1), {"reduce_rate": -1.0}, "reduce_rate"),
                (("r", 1), {"auxiliary": "yes"}, "auxiliary")]:
            with pytest.raises(ConfigError, match=match):
                await form(*args, **kwargs)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(form, "twice", 1)
            await trio.sleep(0.1)
            with pytest.raises(LocalProtocolError, match="already forms a group"):
                await form("twice", 1)
            nursery.cancel_scope.cancel()
        assert node.matchmaking.statistics()["active_rounds"] == 0


def test_effective_waits_follow_matchmaking_time_and_stay_below_the_wire_limit():
    from p2pdl.averaging.matchmaking._service import JOIN_SLACK, _Params

    default = _Params(MatchmakingConfig(), 16, 2, 15.0, max_hold=59.0)
    assert (default.gather_time, default.join_window, default.join_wait) == (0.5, 4.0, 5.5)
    short = _Params(MatchmakingConfig(), 16, 2, 3.0, max_hold=59.0)
    assert short.gather_time == pytest.approx(0.3) and short.join_window == pytest.approx(1.0)
    long = _Params(MatchmakingConfig(matchmaking_time=600, join_window=300, gather_time=1),
                   16, 2, 600.0, max_hold=59.0)
    assert long.join_window == pytest.approx(59.0 - 1.0 - JOIN_SLACK)
    assert long.join_wait <= 59.0
