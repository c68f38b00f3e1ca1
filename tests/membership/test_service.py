"""The membership service on nodes: the handshake, the gate of every run-scoped
protocol, allowlists, expiry and revocation in virtual time, bad input."""

from __future__ import annotations

import dataclasses
import hashlib

import msgpack
import pytest
import torch
import trio

from p2pdl import (
    AllowlistRun,
    Authority,
    CertificateRun,
    OpenRun,
    Role,
    open_node,
)
from p2pdl.averaging import (
    MATCHMAKING_PROTOCOL,
    AllReduceConfig,
    CodecPolicy,
    Group,
    GroupMemberInfo,
    average_round,
    round_key,
)
from p2pdl.averaging.matchmaking._messages import Join
from p2pdl.dht import DHT_PROTOCOL, GROUP_PREFIX
from p2pdl.dht._messages import FindValue, Store, WireItem
from p2pdl.errors import MatchmakingFailedError, RemoteError, StreamClosedError
from p2pdl.membership import MEMBERSHIP_PROTOCOL, MembershipConfig
from p2pdl.membership._messages import GetRevocations, Hello
from p2pdl.progress import PROGRESS_PROTOCOL, SNAPSHOT_PREFIX
from p2pdl.progress._messages import Push
from p2pdl.service import NOT_ADMITTED
from p2pdl.statesync import STATESYNC_PROTOCOL
from p2pdl.statesync._messages import GetManifest
from p2pdl.testing import loopback_config, open_memory_nodes, wait_for_dht

pytestmark = pytest.mark.timeout(120)

RUN = "closed-run"


def enrol(nodes, authority, run_id=RUN, role=Role.TRAINER, **issue):
    """Give each node a certificate of ``run_id`` and the run's policy."""
    for node in nodes:
        cert = authority.issue(run_id, node.peer_id, role, now=node.dht.now(), **issue)
        node.membership.add_run(CertificateRun(run_id, authority.id, cert))


def guard(nodes, authority, run_id=RUN):
    """The run's policy without a certificate (a node that only checks others)."""
    for node in nodes:
        node.membership.add_run(CertificateRun(run_id, authority.id))


#: One request per run-scoped request/response protocol, for ``RUN``.
RUN_REQUESTS = {
    "progress": (PROGRESS_PROTOCOL, Push(RUN, ())),
    "matchmaking": (MATCHMAKING_PROTOCOL, Join(RUN, 3, 4, False, 1.0)),
    "statesync": (STATESYNC_PROTOCOL, GetManifest(RUN)),
    "dht snapshot": (DHT_PROTOCOL, FindValue(SNAPSHOT_PREFIX + RUN)),
    "dht rendezvous": (DHT_PROTOCOL, FindValue(GROUP_PREFIX + round_key(RUN, 3))),
    "dht store": (DHT_PROTOCOL, Store(SNAPSHOT_PREFIX + RUN,
                                      [WireItem("x", msgpack.packb(1), 2e9)])),
}


def served_state(node):
    """What a node's services hold: unchanged by anything an outsider sends."""
    stats = node.statistics()
    return {name: stats[name].as_dict() for name in ("progress", "matchmaking", "statesync")} | {
        "records": len(node.dht.local_store), "members": node.membership.members(RUN)}


async def test_an_outsider_is_refused_on_every_run_scoped_protocol(autojump_clock):
    authority = Authority.generate()
    async with open_memory_nodes(3) as (server, member, outsider):
        enrol([server, member], authority)
        before = served_state(server)
        for name, (protocol, request) in RUN_REQUESTS.items():
            with pytest.raises(RemoteError) as refused:
                await outsider.call(server.peer_id, protocol, request, timeout=10)
            assert refused.value.code == NOT_ADMITTED, name
            assert RUN not in refused.value.message and "epoch" not in refused.value.message
        assert served_state(server) == before
        # A member is admitted on each (answered, or refused for reasons of its own).
        for name, (protocol, request) in RUN_REQUESTS.items():
            try:
                await member.call(server.peer_id, protocol, request, timeout=10)
            except RemoteError as exc:
                assert exc.code != NOT_ADMITTED, name
        assert set(server.membership.members(RUN)) == {str(server.peer_id), str(member.peer_id)}
        assert server.membership.members(RUN)[str(member.peer_id)].role is Role.TRAINER
        stats = server.membership.statistics()
        assert stats.certificates_accepted >= 1 and stats.refused >= len(RUN_REQUESTS)
        # A run this node has no policy for stays open, DHT keys included.
        await outsider.call(server.peer_id, PROGRESS_PROTOCOL, Push("other", ()), timeout=10)
        await outsider.call(server.peer_id, DHT_PROTOCOL, FindValue(SNAPSHOT_PREFIX + "other"),
                            timeout=10)


async def test_the_all_reduce_refuses_an_outsider_and_members_average(autojump_clock):
    authority = Authority.generate()
    exact = AllReduceConfig(codecs=CodecPolicy(large="none"), chunk_values=1024,
                            sender_timeout=5.0, reducer_timeout=10.0, averaging_timeout=30.0)
    async with open_memory_nodes(3) as nodes:
        enrol(nodes[:2], authority)   # nodes[2] is the outsider
        members = tuple(GroupMemberInfo(n.peer_id) for n in nodes)
        group = Group(hashlib.sha256(b"closed").digest(), RUN, 1, members)
        xs = [[torch.full((3000,), float(i + 1))] for i in range(3)]
        results = {}
        # The members introduce themselves to each other, as matchmaking does.
        await nodes[0].membership.introduce(nodes[1].peer_id, RUN)

        async def one(i):
            results[i] = await nodes[i].allreduce.all_reduce(group, xs[i], config=exact)

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(one, i)
        assert nodes[0].allreduce.statistics()["streams_rejected"] >= 1
        for i in (0, 1):
            part = results[i].parts[i]
            assert part.completed
            assert all(2 not in c.contributors for c in part.contributions)
            assert torch.allclose(results[i].tensors[0][part.start:part.end], torch.tensor(1.5))


async def test_members_of_a_certificate_run_form_groups_and_average(autojump_clock):
    authority = Authority.generate()
    async with open_memory_nodes(4) as nodes:
        await wait_for_dht(nodes)
        enrol(nodes[:3], authority)
        enrol(nodes[3:], authority, role=Role.MONITOR)
        results, groups = {}, {}

        async def one(i):
            try:
                results[i] = await average_round(
                    nodes[i].matchmaking, nodes[i].allreduce, RUN, 1,
                    [torch.full((100,), float(i))], weight=1.0, target_group_size=4,
                    matchmaking_time=10.0, on_group=lambda g: groups.setdefault(i, g))
            except MatchmakingFailedError as exc:
                results[i] = exc

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
        assert isinstance(results[3], MatchmakingFailedError)  # a monitor never averages
        for i in range(3):
            outcome = results[i]
            assert not isinstance(outcome, Exception), outcome
            assert set(groups[i].peer_ids) == {n.peer_id for n in nodes[:3]}
            assert torch.allclose(outcome.tensors[0], torch.tensor(1.0))


async def test_allowlist_runs_admit_only_listed_peers(autojump_clock):
    async with open_memory_nodes(3) as (server, listed, stranger):
        policy = AllowlistRun(RUN, [listed.peer_id, server.peer_id])
        server.membership.add_run(policy)
        assert await listed.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        with pytest.raises(RemoteError) as refused:
            await stranger.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        assert refused.value.code == NOT_ADMITTED
        assert server.membership.members(RUN).keys() == {str(listed.peer_id),
                                                         str(server.peer_id)}
        assert server.membership.role_of(listed.peer_id, RUN) is None
        assert server.membership.runs() == (policy,)
        # An explicit open run admits everyone, as a run without a policy does.
        server.membership.add_run(OpenRun(RUN))
        await stranger.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)


async def test_an_expired_certificate_stops_working_without_a_new_handshake(autojump_clock):
    authority = Authority.generate()
    skew = MembershipConfig().allowed_clock_skew
    async with open_memory_nodes(2) as (server, member):
        enrol([server], authority)
        enrol([member], authority, expires_in=100)
        await member.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        handshakes = server.membership.statistics().handshakes_answered
        await trio.sleep(100 + skew - 5)
        await member.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        await trio.sleep(5)  # the documented bound: expires_at + allowed_clock_skew
        with pytest.raises(RemoteError) as refused:
            await member.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        assert refused.value.code == NOT_ADMITTED
        assert not server.membership.is_member(member.peer_id, RUN)
        # (the refused call tried one fresh handshake, which the server refused as expired)
        assert server.membership.statistics().hellos_refused == 1
        assert server.membership.statistics().handshakes_answered == handshakes + 1


async def test_a_revoked_member_is_refused_within_the_revocation_interval(autojump_clock):
    authority = Authority.generate()
    interval = MembershipConfig().revocation_interval
    async with open_memory_nodes(4) as nodes:
        await wait_for_dht(nodes)
        server, member, other, operator = nodes
        enrol([server, member, other], authority)
        guard([operator], authority)
        await member.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        serial = member.membership.runs()[0].certificate.serial
        revoked = authority.revocation_list(RUN, [serial], sequence=1, now=operator.dht.now())
        start = trio.current_time()
        assert await operator.membership.publish_revocations(revoked)
        while server.membership.is_member(member.peer_id, RUN):
            assert trio.current_time() - start <= interval + 30  # + a DHT lookup
            await trio.sleep(1)
        with pytest.raises(RemoteError) as refused:
            await member.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        assert refused.value.code == NOT_ADMITTED
        # The others still work together.
        await other.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        assert server.membership.statistics().revocations_accepted == 1


async def test_a_newer_revocation_list_spreads_in_the_handshake(autojump_clock):
    authority = Authority.generate()
    async with open_memory_nodes(3) as (a, b, c):
        enrol([a, b, c], authority)
        serial = c.membership.runs()[0].certificate.serial
        revoked = authority.revocation_list(RUN, [serial], sequence=3, now=a.dht.now())
        a.membership.add_run(CertificateRun(RUN, authority.id,
                                            a.membership.runs()[0].certificate, revoked))
        # a (newer list) introduces itself to b: b fetches a's list at once.
        await a.call(b.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        await trio.sleep(1)
        assert b.membership.statistics().revocations_accepted == 1
        # b now refuses c, whose certificate the list revokes ...
        with pytest.raises(RemoteError) as refused:
            await c.call(b.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        assert refused.value.code == NOT_ADMITTED
        # ... and c, answering b's hello (which says sequence 3), fetches the list too.
        await b.call(c.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        await trio.sleep(1)
        assert c.membership.statistics().revocations_accepted == 1
        assert c.membership.statistics().revocation_fetches == 1


async def test_bad_membership_messages_reset_their_stream_and_the_node_keeps_serving(
        autojump_clock):
    from p2pdl.wire import FrameKind
    from p2pdl.wire._frames import frame_header

    authority = Authority.generate()
    async with open_memory_nodes(3) as (server, attacker, honest):
        enrol([server, honest], authority)
        enrol([attacker], authority, run_id="another-run")

        async def raw(payload: bytes) -> None:
            net_stream = await attacker.host.new_stream(server.peer_id,
                                                        MEMBERSHIP_PROTOCOL.protocol_id)
            await net_stream.write(payload)
            with trio.fail_after(10):  # the server resets the stream
                try:
                    while await net_stream.read(65536):
                        pass
                except Exception:  # reset or EOF: the stream is gone
                    pass

        await raw(b"\x07not a frame")
        for fields in ({"run_id": 5, "certificate": None},
                       {"run_id": RUN, "certificate": "text"},
                       {"run_id": RUN, "certificate": b"x" * 5000},
                       {"run_id": RUN, "certificate": None, "revocation_sequence": -5},
                       {"run_id": RUN, "certificate": None, "revocation_sequence": 1.5}):
            bad = msgpack.packb(["membership.hello", 1, fields])
            await raw(frame_header(FrameKind.MESSAGE, len(bad)) + bad)
        # Junk certificate bytes: the stream is reset (RemoteProtocolError on the server).
        for junk in (b"\x00\x01", msgpack.packb([1, 2, 3])):
            with pytest.raises((StreamClosedError, RemoteError)):
                await attacker.call(server.peer_id, MEMBERSHIP_PROTOCOL, Hello(RUN, junk),
                                    timeout=10)
        assert server.membership.statistics().bad_messages == 2
        # Well-formed but not the attacker's: another peer's, another run's, forged, none.
        theirs = authority.issue(RUN, honest.peer_id, "trainer", now=server.dht.now())
        forged = dataclasses.replace(authority.issue(RUN, attacker.peer_id, "monitor",
                                                     now=server.dht.now()), role=Role.TRAINER)
        other_run = attacker.membership.runs()[0].certificate
        impostor = Authority.generate().issue(RUN, attacker.peer_id, "trainer",
                                              now=server.dht.now())
        for cert in (theirs.to_bytes(), forged.to_bytes(), other_run.to_bytes(),
                     impostor.to_bytes(), None):
            with pytest.raises(RemoteError) as refused:
                await attacker.call(server.peer_id, MEMBERSHIP_PROTOCOL, Hello(RUN, cert),
                                    timeout=10)
            assert refused.value.code == NOT_ADMITTED
        assert not server.membership.is_member(attacker.peer_id, RUN)
        assert str(attacker.peer_id) not in server.membership.members(RUN)
        assert server.membership.statistics().hellos_refused == 5
        # The server keeps serving everyone, the attacker included.
        reply = await attacker.call(server.peer_id, MEMBERSHIP_PROTOCOL, GetRevocations(RUN),
                                    timeout=10)
        assert reply.revocations == b""
        await honest.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        assert server.membership.is_member(honest.peer_id, RUN)


async def test_a_learnt_certificate_is_checked_like_a_presented_one(autojump_clock):
    authority = Authority.generate()
    async with open_memory_nodes(3, connect=False) as (a, b, c):
        enrol([a, b], authority)
        credential = b.membership.credential(RUN)
        assert credential == b.membership.runs()[0].certificate.to_bytes()
        assert not a.membership.learn(c.peer_id, RUN, credential)  # b's, not c's
        assert not a.membership.learn(c.peer_id, RUN, b"junk")
        assert a.membership.learn(b.peer_id, RUN, credential)
        assert a.membership.is_member(b.peer_id, RUN)
        assert a.membership.credential("open-run") is None


async def test_runs_given_to_open_node_are_guarded():
    authority = Authority.generate()
    from libp2p.crypto.ed25519 import create_new_key_pair

    key_pair = create_new_key_pair()
    from libp2p.peer.id import ID

    cert = authority.issue(RUN, ID.from_pubkey(key_pair.public_key), "auxiliary")
    policy = CertificateRun(RUN, authority.id, cert)
    async with open_node(loopback_config(), key_pair=key_pair, runs=[policy]) as node, \
            open_node(loopback_config()) as outsider:
        await outsider.connect(node.addrs[0])
        assert node.membership.runs() == (policy,)
        assert node.membership.role_of(node.peer_id, RUN) is Role.AUXILIARY
        with pytest.raises(RemoteError) as refused:
            await outsider.call(node.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        assert refused.value.code == NOT_ADMITTED
        assert node.statistics()["membership"]["certificate_runs"] == 1


def test_the_sync_and_asyncio_faces():
    import asyncio

    import p2pdl

    authority = Authority.generate()
    with p2pdl.Node(loopback_config(), runs=[AllowlistRun("listed", [])]) as node:
        cert = authority.issue(RUN, node.peer_id, "trainer")
        node.membership.add_run(CertificateRun(RUN, authority.id, cert))
        assert [p.run_id for p in node.membership.runs()] == ["listed", RUN]
        assert node.membership.members(RUN)[str(node.peer_id)].role is Role.TRAINER
        revoked = authority.revocation_list(RUN, [cert.serial + 1], sequence=1)
        node.membership.publish_revocations(revoked, timeout=5)  # alone: nobody stores it
        assert node.membership.statistics().revocations_accepted == 1

        async def use_aio():
            assert (await node.aio.membership.members("listed")) == {}
            return await node.aio.membership.statistics()

        assert asyncio.run(use_aio()).certificate_runs == 1


async def test_a_gate_of_ones_own_is_asked_before_the_membership():
    from p2pdl import Refusal

    class Refuse:
        def admit(self, peer, protocol_id, run_id):
            return Refusal("banned") if run_id == "banned-run" else None

    async with open_node(loopback_config(), admission=Refuse()) as server, \
            open_node(loopback_config()) as client, open_node(loopback_config()) as stranger:
        for node in (client, stranger):
            await node.connect(server.addrs[0])
        server.membership.add_run(AllowlistRun(RUN, [client.peer_id]))
        await client.call(server.peer_id, PROGRESS_PROTOCOL, Push(RUN, ()), timeout=10)
        for who, run_id in ((client, "banned-run"), (stranger, RUN)):
            with pytest.raises(RemoteError) as refused:
                await who.call(server.peer_id, PROGRESS_PROTOCOL, Push(run_id, ()), timeout=10)
            assert refused.value.code == NOT_ADMITTED
        assert server.statistics().admission.refused == 2


def slow_handshakes(monkeypatch):
    """A node whose ``membership.slow`` is set answers membership requests only
    after a long wait (an outsider that stalls the handshakes)."""
    from p2pdl.membership import MembershipService

    original = MembershipService.handle

    async def handle(self, ctx, request):
        if getattr(self, "slow", False):
            await trio.sleep(1000)
        return await original(self, ctx, request)

    monkeypatch.setattr(MembershipService, "handle", handle)


async def test_an_outsider_announced_under_the_run_key_delays_no_round(monkeypatch,
                                                                         autojump_clock):
    """An uninvited peer announces itself under the run's matchmaking key (its own
    DHT node keeps the entry; the members' refuse it) and answers handshakes
    only after a long wait.  One member's replica holds the entry all the same
    (a malicious member's may serve any validly signed entry).  The members
    leave it out of their views (no plan names it, nobody waits on it) and
    stop introducing themselves to the outsider: every round forms with the
    three members."""
    slow_handshakes(monkeypatch)
    authority = Authority.generate()
    async with open_memory_nodes(4) as nodes:
        await wait_for_dht(nodes)
        members, outsider = nodes[:3], nodes[3]
        enrol(members, authority)
        outsider.membership.slow = True
        for epoch in range(1, 4):
            await outsider.dht.announce(round_key(RUN, epoch), outsider.dht.now() + 300)
            key = GROUP_PREFIX + round_key(RUN, epoch)
            entries = outsider.dht.local_store.get(key, outsider.dht.now())
            assert entries and not members[0].dht.local_store.get(key, outsider.dht.now())
            for item in entries:
                assert members[0].dht.local_store.put(key, item, members[0].dht.now()) == ""
        took = []
        for epoch in range(1, 4):
            results, groups = {}, {}
            start = trio.current_time()

            async def one(i, epoch=epoch, results=results, groups=groups):
                try:
                    results[i] = await average_round(
                        members[i].matchmaking, members[i].allreduce, RUN, epoch,
                        [torch.full((100,), float(i))], weight=1.0, target_group_size=4,
                        matchmaking_time=10.0, on_group=lambda g: groups.setdefault(i, g))
                except MatchmakingFailedError as exc:
                    results[i] = exc

            async with trio.open_nursery() as nursery:
                for i in range(3):
                    nursery.start_soon(one, i)
            took.append(trio.current_time() - start)
            for i in range(3):
                assert not isinstance(results[i], Exception), results[i]
                assert set(groups[i].peer_ids) == {n.peer_id for n in members}
        # The outsider's entry was seen and left out.  Its slow handshake cost the
        # first round one DHT query (query_timeout, 5 s); then it is not asked
        # again for unanswered_ttl, and rounds take what they take without it.
        assert all(n.matchmaking.statistics()["non_members_ignored"] >= 1 for n in members)
        assert all(n.membership.statistics()["handshakes_slow"] >= 1 for n in members)
        assert took[0] < 10.0 and max(took[1:]) <= 1.0, took


async def test_a_peer_that_answers_handshakes_slowly_is_waited_for_once_per_ttl(
        monkeypatch, autojump_clock):
    slow_handshakes(monkeypatch)
    authority = Authority.generate()
    async with open_memory_nodes(2) as (member, slow):
        enrol([member], authority)
        slow.membership.slow = True
        config = member.membership.config

        async def introduce():
            start = trio.current_time()
            await member.membership.introduce(slow.peer_id, RUN)
            return trio.current_time() - start

        assert await introduce() == pytest.approx(config.handshake_timeout)
        assert member.membership.statistics()["handshakes_slow"] == 1
        assert await introduce() == 0          # unanswering: not asked again
        assert not member.membership.is_member(slow.peer_id, RUN)
        # a caller that gives up before handshake_timeout marks it too
        await trio.sleep(config.unanswered_ttl)
        with trio.move_on_after(config.slow_handshake + 0.5):
            await introduce()
        assert member.membership.statistics()["handshakes_slow"] == 2
        assert await introduce() == 0
        # once the ttl is over, it is asked again
        await trio.sleep(config.unanswered_ttl)
        slow.membership.slow = False
        enrol([slow], authority)
        await introduce()
        assert member.membership.is_member(slow.peer_id, RUN)


async def test_a_closed_runs_records_are_held_and_served_by_its_members_only(autojump_clock):
    """Three members and two outsiders, all DHT servers (five nodes: every one of
    them is among a key's ``replication`` nearest).  The members' rendezvous
    entries go to members only: the outsiders' stores hold nothing of the run,
    the members find each other, and an outsider that looks finds nobody."""
    authority = Authority.generate()
    async with open_memory_nodes(5) as nodes:
        await wait_for_dht(nodes)
        members, outsiders = nodes[:3], nodes[3:]
        enrol(members, authority)
        key = round_key(RUN, 1)
        for node in members:
            assert await node.dht.announce(key, node.dht.now() + 300)
        for outsider in outsiders:
            assert not outsider.dht.local_store.get(GROUP_PREFIX + key, outsider.dht.now())
        expected = {n.peer_id for n in members}
        for node in members:
            assert len(node.dht.local_store.get(GROUP_PREFIX + key, node.dht.now())) == 3
            assert {p.peer_id for p in await node.dht.find_peers(key)} == expected
        for outsider in outsiders:
            assert await outsider.dht.find_peers(key) == []
        # An open run's keys (no policy anywhere) still go to every node.
        assert await members[0].dht.announce(round_key("open-run", 1), nodes[0].dht.now() + 300)
        assert any(o.dht.local_store.get(GROUP_PREFIX + round_key("open-run", 1),
                                         o.dht.now()) for o in outsiders)
