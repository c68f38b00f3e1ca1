"""Reachability by dial-back, and client mode."""

from __future__ import annotations

import dataclasses
import socket

import pytest
import trio

from p2pdl import NodeConfig, RemoteError, open_node
from p2pdl.nat import (
    DIALBACK,
    DialBackRequest,
    NatConfig,
    Reachability,
    ReachabilityTracker,
)
from p2pdl.testing import LOOPBACK, open_nodes

CONFIG = NatConfig(min_failures=2, result_ttl=100)


# -- the tracker (sans-IO) -----------------------------------------------------------------

def test_one_successful_dial_back_makes_public():
    t = ReachabilityTracker(CONFIG)
    t.set_addresses(["/ip4/1.2.3.4/tcp/1", "/ip4/10.0.0.1/tcp/1"])
    assert t.status(0, probers_available=3) is Reachability.UNKNOWN
    t.record("p1", "/ip4/10.0.0.1/tcp/1", False, 1)
    t.record("p1", "/ip4/1.2.3.4/tcp/1", True, 1)
    assert t.status(2, 3) is Reachability.PUBLIC
    assert t.status(200, 3) is Reachability.UNKNOWN  # the result expired


def test_private_needs_failures_from_distinct_probers():
    t = ReachabilityTracker(CONFIG)
    t.set_addresses(["/ip4/1.2.3.4/tcp/1"])
    t.record("p1", "/ip4/1.2.3.4/tcp/1", False, 1)
    assert t.status(1, probers_available=3) is Reachability.UNKNOWN
    assert t.status(1, probers_available=1) is Reachability.PRIVATE  # the only prober there is
    t.record("p2", "/ip4/1.2.3.4/tcp/1", False, 2)
    assert t.status(2, 3) is Reachability.PRIVATE


def test_new_addresses_start_over_and_no_address_is_private():
    t = ReachabilityTracker(CONFIG)
    t.set_addresses(["/ip4/1.2.3.4/tcp/1"])
    t.record("p1", "/ip4/1.2.3.4/tcp/1", True, 1)
    assert t.set_addresses(["/ip4/1.2.3.4/tcp/2"])
    assert not t.set_addresses(["/ip4/1.2.3.4/tcp/2"])
    assert t.status(2, 3) is Reachability.UNKNOWN
    t.set_addresses([])
    assert t.status(2, 0) is Reachability.PRIVATE


def test_probers_are_asked_in_turn():
    t = ReachabilityTracker(CONFIG)
    t.set_addresses(["/ip4/1.2.3.4/tcp/1"])
    assert t.choose_prober([], 0) is None
    first = t.choose_prober(["a", "b"], 0)
    t.record(first, "/ip4/1.2.3.4/tcp/1", False, 0)
    assert t.choose_prober(["a", "b"], 1) != first


# -- nodes on loopback -----------------------------------------------------------------------

async def wait_status(node, status: Reachability, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while node.reachability is not status:
            await node.host.wait_connections_changed(0.2)


async def test_reachable_nodes_find_themselves_public_and_are_not_clients():
    async with open_nodes(3) as nodes:
        for node in nodes:
            await wait_status(node, Reachability.PUBLIC)
            assert not node.client_mode
            assert node.statistics()["reachability"] == "public"


def dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("announce", [
    "/ip4/127.0.0.1/tcp/{dead}",  # right IP, nobody listening
    "/ip4/198.51.100.7/tcp/4001",  # not where the connection comes from
])
async def test_a_dead_announced_address_is_never_public(announce):
    async with open_nodes(2) as (a, b):
        config = NodeConfig.build(listen=LOOPBACK, initial_peers=[a.addrs[0], b.addrs[0]],
                                  announce=[announce.format(dead=dead_port())])
        async with open_node(config) as node:
            await wait_status(node, Reachability.PRIVATE)
            assert node.client_mode
            for _ in range(10):  # and it stays so
                await trio.sleep(0.1)
                assert node.reachability is Reachability.PRIVATE


async def test_dial_back_server_bounds():
    config = dataclasses.replace(NodeConfig(), nat=NatConfig(
        enabled=False, server_min_interval=30, max_addrs=2))
    async with open_nodes(2, config) as (a, b):
        good = b.addrs[0]
        response = await b.call(a.peer_id, DIALBACK, DialBackRequest(
            [good, "/ip4/198.51.100.7/tcp/1", good]))
        assert [r.status for r in response.results] == ["ok", "refused", "refused"]
        assert "not the IP your connection comes from" in response.results[1].detail
        assert "too many" in response.results[2].detail
        with pytest.raises(RemoteError, match="unavailable"):  # rate limit per peer
            await b.call(a.peer_id, DIALBACK, DialBackRequest([good]))
        assert len(a.host.libp2p.get_network().connections[b.peer_id]) == 1  # no leftovers


async def test_client_mode_can_be_forced():
    config = dataclasses.replace(NodeConfig.build(listen=LOOPBACK),
                                 nat=NatConfig(client_mode=True))
    async with open_node(config) as node:
        assert node.client_mode
