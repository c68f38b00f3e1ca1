"""The relay directory: relays announce themselves in the DHT, and nodes that
want relays find them there (sans-IO decisions, then in-memory nodes)."""

from __future__ import annotations

import random

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl import NodeConfig
from p2pdl.dht import GroupPeer
from p2pdl.dht._relays import (
    MAX_RELAY_CANDIDATES,
    MAX_RELAYS_HANDED,
    RELAY_RETRY,
    RELAYS_GROUP,
    RelayDirectory,
)
from p2pdl.testing import open_memory_swarm, wait_for_dht

pytestmark = pytest.mark.timeout(60)


def new_id() -> ID:
    return ID.from_pubkey(create_new_key_pair().public_key)


def entry(i: int, *, client_mode: bool = False, addrs: tuple[str, ...] | None = None,
          peer_id: ID | None = None) -> GroupPeer:
    if addrs is None:
        addrs = (f"/ip4/198.51.100.{i % 250 + 1}/tcp/4001",)
    return GroupPeer(peer_id or new_id(), addrs, client_mode, 1e12)


def test_a_relay_announces_at_once_then_at_half_its_ttl_and_stops_when_not_serving():
    directory = RelayDirectory(ttl=600, lookup_interval=60)
    assert not directory.announce_due(0.0, serving=False)
    assert directory.announce_due(1.0, serving=True)
    directory.announced(1.0, ok=True)
    assert not directory.announce_due(300.0, serving=True)
    assert directory.announce_due(301.0, serving=True)
    directory.announced(301.0, ok=False)   # a failed store is tried again sooner
    assert directory.announce_due(301.0 + RELAY_RETRY, serving=True)
    directory.announce_due(400.0, serving=False)
    assert directory.announce_due(401.0, serving=True)   # serving again: at once


def test_lookups_only_while_wanted_every_interval():
    directory = RelayDirectory(ttl=600, lookup_interval=60)
    assert not directory.lookup_due(0.0, wanted=False)
    assert directory.lookup_due(0.0, wanted=True)
    directory.looked_up(0.0)
    assert not directory.lookup_due(59.0, wanted=True)
    assert directory.lookup_due(60.0, wanted=True)


def test_candidates_skip_self_clients_relayed_addresses_and_repeats():
    directory = RelayDirectory(ttl=600, lookup_interval=60)
    me = new_id()
    good = [entry(i) for i in range(3)]
    found = [*good, entry(9, peer_id=me), entry(10, client_mode=True),
             entry(11, addrs=("/ip4/198.51.100.9/tcp/4001/p2p/QmRelay/p2p-circuit",)),
             entry(12, addrs=("not an address",))]
    chosen = directory.candidates(found, me)
    assert {c.peer_id for c in chosen} == {g.peer_id for g in good}
    assert all(str(a).startswith("/ip4/198.51.100.") for c in chosen for a in c.addrs)
    assert directory.candidates(found, me) == []   # each is handed over once


def test_a_flood_of_entries_yields_a_bounded_random_few():
    directory = RelayDirectory(ttl=600, lookup_interval=60, rng=random.Random(1))
    flood = [entry(i) for i in range(200)]
    first = directory.candidates(flood, new_id())
    assert len(first) == MAX_RELAY_CANDIDATES
    assert {c.peer_id for c in first} != {e.peer_id for e in flood[:MAX_RELAY_CANDIDATES]}
    handed = len(first)
    while directory.lookup_due(0.0, wanted=True):
        more = directory.candidates([entry(i) for i in range(40)], new_id())
        assert len(more) <= MAX_RELAY_CANDIDATES
        handed += len(more)
    assert handed == directory.handed == MAX_RELAYS_HANDED   # and then no more lookups


async def test_a_private_node_finds_the_relays_that_announced_themselves(autojump_clock):
    relay_config = NodeConfig.build(relay_service=True)
    async with open_memory_swarm() as swarm:
        plain = await swarm.add_nodes(3)
        relays = await swarm.add_nodes(2, relay_config)
        await wait_for_dht([*plain, *relays])
        [private] = await swarm.add_nodes(1, reachable=False)
        await wait_for_dht([private], contacts=3)
        wanted = {r.peer_id for r in relays}
        with trio.fail_after(300):
            while not wanted <= {c.peer_id for c in private.host.relay_candidates()}:
                await trio.sleep(1)
        found = {c.peer_id for c in private.host.relay_candidates()}
        assert not found & {p.peer_id for p in plain[1:]}   # only relays are listed
        entries = await private.dht.find_peers(RELAYS_GROUP)
        assert {e.peer_id for e in entries} == wanted
        stats = {n.peer_id: n.statistics()["dht"] for n in [*plain, *relays, private]}
        assert all(stats[r.peer_id]["relay_announcements"] >= 1 for r in relays)
        assert all(stats[p.peer_id]["relay_announcements"] == 0 for p in plain)
        # public nodes want no relays: they never look
        assert all(stats[n.peer_id]["relay_lookups"] == 0 for n in [*plain, *relays])
        assert stats[private.peer_id]["relays_found"] == 2
