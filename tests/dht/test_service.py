"""The DHT service: on in-memory nodes in virtual time (expiry, republishing,
lookups), and on real nodes over loopback for the real stack and the faces."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import msgpack
import pytest
import trio

import p2pdl
from p2pdl import NodeConfig
from p2pdl.dht import DHT_PROTOCOL, Item, Schema, key_of, owned_subkey
from p2pdl.dht._messages import FindNode, FindValue, Store, Stored, Value, WireItem
from p2pdl.dht._service import COUNTERS
from p2pdl.dht._state import batches as _batches
from p2pdl.dht._validation import sign
from p2pdl.dht.config import MAX_STORE_ITEMS, STORE_BATCH_BYTES
from p2pdl.errors import LocalProtocolError, RemoteError, StreamClosedError
from p2pdl.nat import NatConfig
from p2pdl.testing import (
    open_memory_nodes,
    open_memory_swarm,
    open_nodes,
    wait_for_dht,
    wait_until,
)
from p2pdl.wire import FrameKind, Message
from p2pdl.wire._frames import frame_header

pytestmark = pytest.mark.timeout(90)


def ttl(seconds: float, node=None) -> float:
    """``seconds`` from now, on ``node``'s clock (a memory node's is virtual), else the wall's."""
    return (time.time() if node is None else node.dht.now()) + seconds


def with_dht(config: NodeConfig | None = None, **fields) -> NodeConfig:
    config = config or NodeConfig()
    return dataclasses.replace(config, dht=dataclasses.replace(config.dht, **fields))


async def test_store_and_get_across_nodes():
    async with open_nodes(6) as nodes:
        await wait_for_dht(nodes)
        assert await nodes[1].dht.store("greeting", {"text": "hi", "n": [1, 2]}, ttl(60))
        for node in nodes:
            found = await node.dht.get("greeting")
            assert found is not None and found.value == {"text": "hi", "n": [1, 2]}
            assert found.expiration == pytest.approx(ttl(60), abs=2)
        assert await nodes[4].dht.get("nobody-stored-this") is None
        assert await nodes[4].dht.get("nobody-stored-this", latest=True) is None
        # A later expiration replaces the value everywhere.
        assert await nodes[2].dht.store("greeting", "bye", ttl(120))
        for node in nodes:
            assert (await node.dht.get("greeting", latest=True)).value == "bye"
        stats = nodes[0].statistics()["dht"]
        assert stats["mode"] == "server" and stats["routing_table"] == 5


async def test_writers_of_different_subkeys_are_merged_at_every_replica(autojump_clock):
    async with open_memory_nodes(6) as nodes:
        await wait_for_dht(nodes)
        async with trio.open_nursery() as nursery:
            for i, node in enumerate(nodes):
                nursery.start_soon(node.dht.store, "run/progress", {"samples": i},
                                   ttl(60, node), node.dht.own_subkey())
        for node in nodes:
            found = await node.dht.get("run/progress", latest=True)
            assert found is not None
            assert {k: e.value["samples"] for k, e in found.value.items()} == {
                owned_subkey(n.peer_id): i for i, n in enumerate(nodes)}
            assert found.expiration == max(e.expiration for e in found.value.values())
            held = node.dht.local_store.get("run/progress", node.dht.now())
            assert len(held) == len(nodes)  # replication 20 > 6 nodes: every node holds all


async def test_a_dictionary_that_outlives_a_plain_value_seen_elsewhere_is_returned_whole(
        autojump_clock):
    async with open_memory_nodes(4) as nodes:
        await wait_for_dht(nodes)
        assert await nodes[0].dht.store("mixed", "plain", ttl(20, nodes[0]))
        # Only one replica hears of later subkeys (as after a partition).
        reply = await nodes[0].call(nodes[1].peer_id, DHT_PROTOCOL, Store("mixed", [
            WireItem("x", msgpack.packb("sub-x"), ttl(40, nodes[0])),
            WireItem("y", msgpack.packb("sub-y"), ttl(50, nodes[0]))]))
        assert reply.results == ["", ""]
        found = await nodes[3].dht.get("mixed", latest=True)
        assert found.dictionary is True
        assert {k: v.value for k, v in found.value.items()} == {"x": "sub-x", "y": "sub-y"}
        assert found.expiration == pytest.approx(ttl(50, nodes[0]), abs=2)
        plain = await nodes[2].dht.get("plain-dict", latest=True)
        assert plain is None
        assert await nodes[2].dht.store("plain-dict", {"a": 1}, ttl(20, nodes[0]))
        found = await nodes[3].dht.get("plain-dict", latest=True)
        assert found.dictionary is False and found.value == {"a": 1}


async def test_a_key_of_many_subkeys_is_sent_in_several_requests(autojump_clock):
    async with open_memory_nodes(3) as nodes:
        await wait_for_dht(nodes)
        sender = nodes[0]
        items = [sender.dht._make_item("many", "v" * 1500, ttl(30, sender), f"s{i}")
                 for i in range(150)]
        assert len(_batches(items)) == 3  # over MAX_STORE_ITEMS (64) per request
        assert await sender.dht._store_items("many", items)
        for node in nodes[1:]:
            assert len(node.dht.local_store.get("many", node.dht.now())) == 150
        found = await nodes[2].dht.get("many", latest=True)
        assert len(found.value) == 150


def test_store_batches_respect_the_item_and_byte_bounds():
    def item(i, size):
        return Item(f"s{i}", b"x" * size, 1.0)

    small = [item(i, 10) for i in range(MAX_STORE_ITEMS * 2 + 1)]
    assert [len(b) for b in _batches(small)] == [MAX_STORE_ITEMS, MAX_STORE_ITEMS, 1]
    big = [item(i, STORE_BATCH_BYTES // 3) for i in range(7)]
    batches = _batches(big)
    assert [i for b in batches for i in b] == big  # order kept, nothing lost
    assert all(sum(i.size for i in b) <= STORE_BATCH_BYTES for b in batches)
    huge = [item(0, STORE_BATCH_BYTES + 1), item(1, 1)]
    assert [len(b) for b in _batches(huge)] == [1, 1]  # an oversized item goes alone
    assert _batches([]) == []


async def test_statistics_list_every_counter_from_zero(autojump_clock):
    async with open_memory_nodes(1, with_dht(mode="server")) as (node,):
        stats = node.dht.statistics()
        assert {name: stats[name] for name in COUNTERS} == dict.fromkeys(COUNTERS, 0)


async def test_a_lone_node_reports_that_no_replica_took_the_record(autojump_clock):
    async with open_memory_nodes(1, with_dht(mode="server")) as (node,):
        assert await node.dht.store("k", 1, ttl(10, node)) is False
        assert (await node.dht.get("k")).value == 1  # its own copy


async def test_expired_records_are_gone_everywhere(autojump_clock):
    async with open_memory_nodes(4) as nodes:
        await wait_for_dht(nodes)
        assert await nodes[0].dht.store("short", "lived", ttl(1.0, nodes[0]))
        assert await nodes[0].dht.store("dict", 1, ttl(1.0, nodes[0]), subkey="a")
        assert await nodes[0].dht.store("dict", 2, ttl(30, nodes[0]), subkey="b")
        assert (await nodes[3].dht.get("short")).value == "lived"
        await trio.sleep(1.3)
        for node in nodes:
            assert await node.dht.get("short", latest=True) is None
            assert set((await node.dht.get("dict", latest=True)).value) == {"b"}
            node.dht.local_store.prune(node.dht.now())
            assert "short" not in node.dht.local_store


async def test_client_mode_nodes_use_the_dht_but_are_in_no_routing_table(autojump_clock):
    clients_config = dataclasses.replace(NodeConfig(), nat=NatConfig(client_mode=True))
    async with open_memory_swarm() as swarm:
        servers = await swarm.add_nodes(4)
        await wait_for_dht(servers)
        clients = await swarm.add_nodes(2, clients_config)
        await wait_for_dht(clients, contacts=3)
        assert not any(c.dht.server_mode for c in clients)
        assert await clients[0].dht.store("from-client", 7, ttl(60, clients[0]))
        assert (await clients[1].dht.get("from-client")).value == 7
        assert (await servers[3].dht.get("from-client")).value == 7
        await clients[1].dht.get("something-else", latest=True)  # more lookups
        for server in servers:
            in_table = {c.peer for c in server.dht.routing_table.contacts()}
            assert not in_table & {c.peer_id for c in clients}
            assert "from-client" in server.dht.local_store or len(servers) > 20
        assert all(len(c.dht.local_store) == 0 for c in clients)  # clients hold nothing
        assert clients[0].statistics()["dht"]["mode"] == "client"
        # A client asked to store (by a stale table, say) refuses and says it is a client.
        reply = await servers[0].call(clients[0].peer_id, DHT_PROTOCOL, Store(
            "k", [WireItem(None, msgpack.packb(1), ttl(5, servers[0]))]))
        assert isinstance(reply, Stored) and reply.results[0].startswith("unavailable")
        assert reply.server is False


async def test_a_forged_owned_subkey_is_rejected_by_every_replica(autojump_clock):
    async with open_memory_nodes(5) as nodes:
        await wait_for_dht(nodes)
        alice, mallory = nodes[0], nodes[1]
        subkey = alice.dht.own_subkey()
        assert await alice.dht.store("votes", "alice's own", ttl(30, alice), subkey)
        raw = msgpack.packb("forged")
        expiration = ttl(60, alice)  # later, so it would win if it were accepted
        forged = WireItem(subkey, raw, expiration,
                          sign(mallory.host.libp2p.get_private_key(), "votes", subkey, raw,
                               expiration))
        for victim in nodes[2:]:
            reply = await mallory.call(victim.peer_id, DHT_PROTOCOL, Store("votes", [forged]))
            assert reply.results[0].startswith("bad_signature"), reply
        # Through the API, mallory cannot even try.
        with pytest.raises(LocalProtocolError, match="belongs to peer"):
            await mallory.dht.store("votes", "forged", ttl(60, mallory), subkey)
        for node in nodes:
            found = await node.dht.get("votes", latest=True)
            assert found.value[subkey].value == "alice's own"


async def test_a_getter_drops_forged_items_from_a_lying_replica(autojump_clock):
    async with open_memory_nodes(4, with_dht(replication=1)) as nodes:
        await wait_for_dht(nodes)
        liar, getter = nodes[0], nodes[3]
        victim_subkey = nodes[1].dht.own_subkey()
        honest = liar.dht._answer

        def lie(peer, request):
            reply = honest(peer, request)
            if isinstance(request, FindValue):
                forged = WireItem(victim_subkey, msgpack.packb("forged"), ttl(30, liar),
                                  b"\0" * 64)
                return Value([forged, WireItem("x", b"\xc1", ttl(30, liar))], reply.closer, True)
            return reply

        liar.dht._answer = lie
        assert await getter.dht.get("anything", latest=True) is None
        assert getter.dht.statistics()["invalid_items_received"] == 2


async def test_malformed_and_oversized_messages_reset_only_that_stream():
    async with open_nodes(3) as nodes:
        await wait_for_dht(nodes)
        server, attacker, honest = nodes
        assert await honest.dht.store("kept", "value", ttl(60))

        async def raw(payload: bytes) -> None:
            net_stream = await attacker.host.new_stream(server.peer_id, DHT_PROTOCOL.protocol_id)
            await net_stream.write(payload)
            with trio.fail_after(10):  # the server resets the stream
                try:
                    while await net_stream.read(65536):
                        pass
                except Exception:  # reset or EOF: the stream is gone
                    pass

        await raw(b"\x07garbage that is not a frame")
        await raw(frame_header(FrameKind.MESSAGE, 4 * 1024 * 1024) + b"\0" * 1024)  # too large
        await raw(frame_header(FrameKind.MESSAGE, 3) + b"\x93\x01\x02")  # not an envelope
        bad_types = msgpack.packb(["dht.find_node", 1, {"target": "not bytes"}])
        await raw(frame_header(FrameKind.MESSAGE, len(bad_types)) + bad_types)
        with pytest.raises((StreamClosedError, RemoteError)):
            await attacker.call(server.peer_id, DHT_PROTOCOL, FindNode(b"short"))
        with pytest.raises(RemoteError, match="bad_request"):
            await attacker.call(server.peer_id, DHT_PROTOCOL, FindValue(""))
        # The server keeps serving: everyone, the attacker included.
        assert (await honest.dht.get("kept", latest=True)).value == "value"
        reply = await attacker.call(server.peer_id, DHT_PROTOCOL,
                                    FindNode(key_of(b"x").to_bytes(32, "big")))
        assert reply.server is True
        assert server.dht.statistics()["requests"] > 0


async def test_bad_records_from_the_program_are_clear_errors(autojump_clock):
    async with open_memory_nodes(2) as (a, b):
        with pytest.raises(LocalProtocolError, match="keys are strings"):
            await a.dht.store(b"bytes", 1, ttl(10, a))
        with pytest.raises(LocalProtocolError, match="expired"):
            await a.dht.store("k", 1, a.dht.now() - 1)
        with pytest.raises(LocalProtocolError, match="too_far_ahead"):
            await a.dht.store("k", 1, ttl(10**7, a))
        with pytest.raises(LocalProtocolError, match="too_large"):
            await a.dht.store("k", "x" * 100_000, ttl(10, a))
        with pytest.raises(LocalProtocolError, match="cannot encode"):
            await a.dht.store("k", object(), ttl(10, a))
        with pytest.raises(LocalProtocolError, match="subkeys are strings"):
            await a.dht.store("k", 1, ttl(10, a), subkey=3)
        with pytest.raises(LocalProtocolError, match="belongs to peer"):
            await a.dht.store("k", 1, ttl(10, a), subkey=b.dht.own_subkey())
        with pytest.raises(LocalProtocolError, match="key"):
            await a.dht.get("")


class Member(Message, tag="test.member"):
    rank: int


async def test_schemas_are_enforced_by_replicas_and_getters(autojump_clock):
    schema = Schema("teams/", Member, dictionary=True, signed_subkeys=True)
    config = dataclasses.replace(NodeConfig(), dht_schemas=(schema,))
    async with open_memory_nodes(4, config) as nodes:
        await wait_for_dht(nodes)
        assert await nodes[0].dht.store("teams/red", Member(1), ttl(30, nodes[0]),
                                        nodes[0].dht.own_subkey())
        with pytest.raises(LocalProtocolError, match="schema"):
            await nodes[0].dht.store("teams/red", {"rank": "high"}, ttl(30, nodes[0]),
                                     nodes[0].dht.own_subkey())
        with pytest.raises(LocalProtocolError, match="owned"):
            await nodes[0].dht.store("teams/red", Member(2), ttl(30, nodes[0]), "anyone")
        reply = await nodes[0].call(nodes[1].peer_id, DHT_PROTOCOL, Store("teams/red", [
            WireItem("anyone", msgpack.packb({"rank": 2}), ttl(30, nodes[0]))]))
        assert reply.results[0].startswith("schema")
        found = await nodes[3].dht.get("teams/red", latest=True)
        assert list(found.value.values())[0].value == Member(1)


async def test_groups_announce_and_find_peers(autojump_clock):
    async with open_memory_nodes(5) as nodes:
        await wait_for_dht(nodes)
        for node in nodes[1:4]:
            assert await node.dht.announce("run-x", ttl(30, node))
        peers = await nodes[4].dht.find_peers("run-x")
        assert {p.peer_id for p in peers} == {n.peer_id for n in nodes[1:4]}
        assert all(p.addrs and not p.client_mode for p in peers)
        assert await nodes[4].dht.find_peers("no-such-run") == []
        # Their addresses went to the host: they can be called by peer id.
        for peer in peers:
            assert await nodes[4].ping(peer.peer_id) < 5


async def test_republishing_moves_a_record_to_the_nodes_now_nearest(autojump_clock):
    config = with_dht(replication=1, republish_interval=1.0)
    async with open_memory_swarm() as swarm:
        # The publisher is a client (never a replica itself) and everyone's initial peer.
        publisher = await swarm.add(with_dht(config, mode="client"))
        servers = await swarm.add_nodes(5, config)
        await wait_for_dht([*servers, publisher])
        assert await publisher.dht.store("moving", "along", ttl(60, publisher))
        holders = [n for n in servers if "moving" in n.dht.local_store]
        assert len(holders) == 1  # replication 1
        await swarm.stop(holders[0])  # the only replica leaves
        alive = [n for n in servers if n is not holders[0]]
        await wait_until(lambda: any("moving" in n.dht.local_store for n in alive), 20, step=0.2)
        assert (await alive[-1].dht.get("moving")).value == "along"
        assert publisher.dht.statistics()["republished"] >= 1


def test_sync_and_asyncio_faces():
    with p2pdl.Node(listen=["/ip4/127.0.0.1/tcp/0"]) as a, \
            p2pdl.Node(listen=["/ip4/127.0.0.1/tcp/0"], initial_peers=a.addrs[:1]) as b, \
            p2pdl.Node(listen=["/ip4/127.0.0.1/tcp/0"], initial_peers=a.addrs[:1]) as c:
        deadline = time.monotonic() + 30
        while not all(n.dht.statistics()["routing_table"] >= 2 for n in (a, b, c)):
            assert time.monotonic() < deadline, "the DHT did not fill its tables"
            time.sleep(0.05)
        assert b.dht.store("sync", [1, 2, 3], b.dht.now() + 30) is True
        assert a.dht.get("sync").value == [1, 2, 3]
        future = c.dht.get("sync", latest=True, return_future=True)
        assert future.result(30).value == [1, 2, 3]
        assert b.dht.store("owned", "x", b.dht.now() + 30, subkey=b.dht.own_subkey())
        assert b.dht.announce("sync-group", b.dht.now() + 30)
        assert [p.peer_id for p in a.dht.find_peers("sync-group")] == [b.peer_id]
        with pytest.raises(LocalProtocolError):
            a.dht.store("k", 1, a.dht.now() - 5)

        async def from_asyncio():
            assert await c.aio.dht.store("aio", {"ok": True}, c.dht.now() + 30)
            found = await a.aio.dht.get("aio", latest=True)
            peers = await c.aio.dht.find_peers("sync-group")
            assert c.aio.dht.own_subkey("x") == c.dht.own_subkey("x")
            assert abs(c.aio.dht.now() - time.time()) < 1
            assert (await c.aio.dht.statistics())["stores"] >= 1
            await c.aio.dht.register_schema(Schema("aio-strict/", dictionary=True))
            with pytest.raises(LocalProtocolError, match="schema"):
                await c.aio.dht.store("aio-strict/x", 1, c.dht.now() + 30)
            assert c.aio.dht is c.aio.dht
            return found.value, [p.peer_id for p in peers]

        assert asyncio.run(from_asyncio()) == ({"ok": True}, [b.peer_id])
        a.dht.register_schema(Schema("strict/", dictionary=False))
        with pytest.raises(LocalProtocolError, match="schema"):
            a.dht.store("strict/x", 1, a.dht.now() + 30, subkey="s")


@pytest.mark.parametrize("quorum", [2, 5])
async def test_a_store_returns_at_its_quorum_and_the_slow_replica_still_gets_the_record(
        autojump_clock, quorum):
    # Replication 6 of 6 nodes: the storer keeps a copy and sends the 5 others one.
    config = with_dht(replication=6, store_quorum=quorum, query_timeout=3.0)
    async with open_memory_nodes(6, config) as nodes:
        await wait_for_dht(nodes)
        storer, network = nodes[0], nodes[0].host.network
        replicas = [n for n in nodes if n is not storer]
        slow = replicas[-1]
        honest = slow.dht._answer

        def stall(peer, request):
            # Its answer to the store waits behind a cut link (the item is held).
            if isinstance(request, Store):
                network.partition([slow])
            return honest(peer, request)

        slow.dht._answer = stall
        started = trio.current_time()
        assert await storer.dht.store("k", "v", ttl(60, storer))
        took = trio.current_time() - started
        if quorum < 5:
            assert took < 1.0   # the four others answered at once
        else:
            assert took >= 3.0  # it waited for the stalled replica's query_timeout
        network.heal()
        await wait_until(lambda: all("k" in n.dht.local_store for n in replicas), 10, step=0.1)
        assert storer.dht.statistics()["stores_failed"] == 0
        await trio.sleep(config.dht.operation_timeout)
        assert storer.dht._background_sends == 0   # every send ended by the deadline


async def test_a_store_sends_to_the_nearest_as_the_lookup_confirms_them(autojump_clock):
    """A node among the key's nearest (not the very nearest) stalls its
    lookup answers: the store goes to the three nearest as soon as they
    answered and returns at its quorum of three, not after the stalled
    query's timeout; the lookup ends behind it and the other replicas get
    the record."""
    config = with_dht(replication=6, store_quorum=3, query_timeout=3.0)
    async with open_memory_nodes(10, config) as nodes:
        await wait_for_dht(nodes)
        storer, network = nodes[0], nodes[0].host.network
        target = key_of(b"k")
        others = sorted((n for n in nodes if n is not storer),
                        key=lambda n: n.dht._key ^ target)
        slow = others[4]
        honest = slow.dht._answer

        def stall(peer, request):
            if isinstance(request, FindNode) and peer == storer.peer_id:
                network.partition([slow])   # its answer waits behind a cut link
            return honest(peer, request)

        slow.dht._answer = stall
        started = trio.current_time()
        assert await storer.dht.store("k", "v", ttl(60, storer))
        assert trio.current_time() - started < 1.0
        assert all("k" in n.dht.local_store for n in others[:3])
        await trio.sleep(config.dht.query_timeout + 1)   # the stalled query fails
        network.heal()
        holders = {n.peer_id for n in others if "k" in n.dht.local_store}
        # the six nearest but the slow one (the storer keeps a copy if it is one)
        replicas = sorted((n for n in nodes if n is not slow),
                          key=lambda n: n.dht._key ^ target)[:6]
        assert holders == {n.peer_id for n in replicas if n is not storer}, (
            slow.peer_id in holders, others.index(slow))
        assert storer.dht.statistics()["stores_failed"] == 0
        await trio.sleep(config.dht.operation_timeout)
        assert storer.dht._background_sends == 0


async def test_a_store_quorum_must_be_positive():
    with pytest.raises(p2pdl.ConfigError, match="store_quorum"):
        with_dht(store_quorum=0)
