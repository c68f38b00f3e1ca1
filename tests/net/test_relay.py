"""Circuit relay v2, reservations, relayed dialling and hole punching (loopback).

The same scenarios across real NATs are in tests/netlab/.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from p2pdl import NodeConfig, open_node
from p2pdl.nat import NatConfig
from p2pdl.net import BackoffPolicy
from p2pdl.net._relay import NOT_A_RELAY_RETRY, ReservationBook, is_circuit
from p2pdl.testing import LOOPBACK, wait_until

FAST = BackoffPolicy(initial=0.2, maximum=1.0)


def peer(n: int) -> PeerInfo:
    return PeerInfo(ID.from_pubkey(create_new_key_pair().public_key), [])


# -- the reservation book (sans-IO) -----------------------------------------------------

def test_book_reserves_up_to_target_refreshes_and_backs_off():
    book = ReservationBook(target=1, retry=FAST, rng=random.Random(0))
    r1, r2 = peer(1), peer(2)
    book.add_candidate(r1)
    book.add_candidate(r2)
    assert book.next_action(0.0, wanted=False).kind == "wait"
    action = book.next_action(0.0, wanted=True)
    assert (action.kind, action.relay) == ("reserve", r1)
    book.on_reserved(r1.peer_id, 0.0, ttl=100)
    assert book.active(1.0) == [r1]
    wait = book.next_action(1.0, wanted=True)
    assert wait.kind == "wait" and wait.delay == pytest.approx(79)  # refresh at 80% of the TTL
    assert book.next_action(80.0, wanted=True) == type(wait)("reserve", r1)
    # r1's connection drops: the book turns to r2 at once
    assert book.on_lost(r1.peer_id)
    assert book.next_action(81.0, wanted=True).relay == r1  # r1 may be retried immediately...
    delay = book.on_failed(r1.peer_id, 81.0)
    assert 0.1 < delay <= 1.0
    assert book.next_action(81.0, wanted=True).relay == r2  # ...and r2 is next while r1 waits


def test_book_forgets_expired_reservations_and_parks_non_relays():
    book = ReservationBook(target=2, retry=FAST)
    r1, r2 = peer(1), peer(2)
    book.add_candidate(r1)
    book.add_candidate(r2)
    book.on_reserved(r1.peer_id, 0.0, ttl=10)
    assert book.on_failed(r2.peer_id, 0.0, not_a_relay=True) == NOT_A_RELAY_RETRY
    assert book.active(11.0) == []
    assert book.next_action(11.0, wanted=True).relay == r1
    assert book.next_action(11.0, wanted=False).kind == "wait"


# -- real nodes on loopback -------------------------------------------------------------------

def relay_config(**fields) -> NodeConfig:
    return NodeConfig.build(listen=LOOPBACK, relay_service=True, **fields)


def private_config(relays: list[str], **fields) -> NodeConfig:
    """A node that holds reservations: on loopback every node would find itself
    public and drop them, so the reachability check is off (it stays unknown)."""
    config = NodeConfig.build(listen=LOOPBACK, initial_peers=relays, reservation_retry=FAST,
                              reconnect_check_interval=0.2, initial_peer_backoff=FAST, **fields)
    return dataclasses.replace(config, nat=NatConfig(enabled=False))


async def test_private_node_reserves_and_is_reached_through_the_relay():
    async with open_node(relay_config()) as relay, \
            open_node(private_config(relay.addrs[:1], relay_reservations=1,
                                     hole_punching=False)) as a, \
            open_node(private_config(relay.addrs[:1], hole_punching=False)) as b:
        await wait_until(lambda: any(is_circuit(x) for x in a.addrs), 10.0)
        circuit = next(x for x in a.addrs if is_circuit(x))
        assert circuit == f"{relay.addrs[0]}/p2p-circuit/p2p/{a.peer_id}"
        assert a.host.relay_reservations() == [relay.peer_id]
        assert await b.connect(circuit) == a.peer_id
        assert b.host.path(a.peer_id) == "relayed"
        assert a.host.path(b.peer_id) == "relayed"
        assert await b.ping(a.peer_id) < 5
        assert b.host.path(relay.peer_id) == "direct"


async def test_relayed_connection_is_upgraded_by_dcutr():
    """On loopback DCUtR's first step, a plain dial to the peer's addresses,
    upgrades the circuit: no NAT was crossed, so the path is ``direct``
    (a real hole punch through NATs is in tests/nat/test_nat_netlab.py)."""
    async with open_node(relay_config()) as relay, \
            open_node(private_config(relay.addrs[:1])) as a, \
            open_node(private_config(relay.addrs[:1])) as b:
        await wait_until(lambda: any(is_circuit(x) for x in a.addrs), 10.0)
        circuit = next(x for x in a.addrs if is_circuit(x))
        await b.connect(circuit)
        assert b.host.path(a.peer_id) == "relayed"
        await wait_until(lambda: b.host.path(a.peer_id) == "direct", timeout=15)
        await wait_until(lambda: a.host.path(b.peer_id) == "direct", timeout=15)
        assert await b.ping(a.peer_id) < 5


async def test_failover_to_another_relay_and_the_peer_is_found_again():
    """r1 dies: A reserves on r2 at once, and B, which knew A only through r1,
    reaches A by its peer id through r2 (a relay B is connected to)."""
    async with open_node(relay_config()) as r2, open_node(relay_config()) as r1:
        a_config = private_config([r1.addrs[0], r2.addrs[0]], relay_reservations=1,
                                  hole_punching=False)
        async with open_node(a_config) as a, \
                open_node(private_config([r2.addrs[0]], hole_punching=False)) as b:
            await wait_until(lambda: a.host.relay_reservations() == [r1.peer_id], 10.0)
            await b.connect(f"{r1.addrs[0]}/p2p-circuit/p2p/{a.peer_id}")
            assert b.host.path(a.peer_id) == "relayed"

            await kill(r1)
            start = trio.current_time()
            await wait_until(lambda: a.host.relay_reservations() == [r2.peer_id], 10.0)
            reserved_after = trio.current_time() - start
            with trio.fail_after(15):
                while True:
                    try:
                        await b.ping(a.peer_id, timeout=2)
                        break
                    except Exception:
                        await trio.sleep(0.1)
            reached_after = trio.current_time() - start
            assert b.host.path(a.peer_id) == "relayed"
            assert reserved_after < 5 and reached_after < 10, (reserved_after, reached_after)


async def kill(node) -> None:
    """Close a node's connections and listeners under it, as a crash looks to its peers."""
    await node.host.libp2p.get_network().close()


async def test_an_initial_peer_that_is_no_relay_gets_no_reservation():
    async with open_node(listen=LOOPBACK) as plain, \
            open_node(private_config(plain.addrs[:1])) as a:
        await a.wait_for_peers(1)
        await trio.sleep(0.5)
        assert a.host.relay_reservations() == []
        assert not any(is_circuit(x) for x in a.addrs)


async def test_public_node_drops_its_wish_for_relays():
    async with open_node(relay_config()) as relay, \
            open_node(private_config(relay.addrs[:1], relay_reservations=1)) as a:
        await wait_until(lambda: a.host.relay_reservations() != [], 10.0)
        a.host.set_wants_relays(False)
        assert a.host.relay_reservations()  # held until it expires; not refreshed
        assert a.host._reservations.book.next_action(trio.current_time(), False).kind == "wait"


async def test_a_relayed_peer_dialled_by_its_direct_address_is_reached_direct_not_punched():
    """A plain dial that replaces a circuit is ``direct``; only a DCUtR exchange punches."""
    async with open_node(relay_config()) as relay, \
            open_node(private_config(relay.addrs[:1], relay_reservations=1,
                                     hole_punching=False)) as a, \
            open_node(private_config(relay.addrs[:1], hole_punching=False)) as b:
        await wait_until(lambda: any(is_circuit(x) for x in a.addrs), 10.0)
        circuit = next(x for x in a.addrs if is_circuit(x))
        await b.connect(circuit)
        assert b.host.path(a.peer_id) == "relayed"
        direct = next(x for x in a.addrs if not is_circuit(x))
        assert await b.connect(direct) == a.peer_id
        assert b.host.path(a.peer_id) == "direct"
        await wait_until(lambda: a.host.path(b.peer_id) == "direct", 10.0)
        assert await b.ping(a.peer_id) < 5


async def test_unspecified_addresses_never_enter_the_peerstore():
    """Identify carries a peer's ``0.0.0.0`` listen address; dialling it reaches ourselves."""
    from multiaddr import Multiaddr

    async with open_node(relay_config()) as relay:
        store = relay.host._host.get_peerstore()
        other = peer(0).peer_id
        store.add_addrs(other, [Multiaddr("/ip4/0.0.0.0/tcp/4001"),
                                Multiaddr("/ip4/10.1.2.3/tcp/4001")], 60)
        store.add_addr(other, Multiaddr("/ip6/::/tcp/4001"), 60)
        assert [str(a) for a in store.addrs(other)] == ["/ip4/10.1.2.3/tcp/4001"]
        assert relay.host.known_addrs(other) == ["/ip4/10.1.2.3/tcp/4001"]
