"""The host: Noise/Yamux only, identity, addresses, reuse, initial peers."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import stat
from contextlib import asynccontextmanager

import multiaddr
import pytest
import trio
import trio.lowlevel
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.rsa import create_new_key_pair as create_rsa_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.insecure.transport import PLAINTEXT_PROTOCOL_ID, InsecureTransport
from libp2p.security.secio import transport as secio
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
from libp2p.stream_muxer.yamux.yamux import Yamux

from p2pdl import NodeConfig, open_node
from p2pdl.errors import ConfigError, IdentityError, PeerUnreachableError
from p2pdl.nat import NatConfig
from p2pdl.net import BackoffPolicy, load_identity, load_or_create_identity
from p2pdl.testing import LOOPBACK, open_nodes

PLAINTEXT = "plaintext"
SECIO = "secio"


@asynccontextmanager
async def insecure_host(kind: str):
    """A bare py-libp2p host offering only plaintext or only SECIO."""
    key_pair = create_new_key_pair()
    sec = ({PLAINTEXT_PROTOCOL_ID: InsecureTransport(key_pair)} if kind == PLAINTEXT
           else {secio.ID: secio.Transport(key_pair)})
    listen = [multiaddr.Multiaddr(LOOPBACK[0])]
    host = new_host(key_pair=key_pair, sec_opt=sec, muxer_opt={YAMUX_ID: Yamux},
                    listen_addrs=listen)
    async with host.run(listen):
        yield host
        for listener in host.get_network().listeners.values():
            await listener.close()


@pytest.mark.parametrize("kind", [PLAINTEXT, SECIO])
async def test_dialer_offering_only_insecure_channels_is_refused(kind):
    async with open_nodes(1) as (node,), insecure_host(kind) as attacker:
        with pytest.raises(Exception) as failure, trio.fail_after(15):  # noqa: B017
            await attacker.connect(info_from_p2p_addr(multiaddr.Multiaddr(node.addrs[0])))
        assert "negotiate" in repr(failure.value) or "connect" in repr(failure.value)
        assert node.connected_peers() == []
        assert attacker.get_network().connections.get(node.peer_id) in (None, [])


@pytest.mark.parametrize("kind", [PLAINTEXT, SECIO])
async def test_node_never_dials_an_insecure_listener(kind):
    async with open_nodes(1) as (node,), insecure_host(kind) as listener:
        addr = f"{listener.get_addrs()[0]}"
        with pytest.raises(PeerUnreachableError):
            await node.connect(addr, timeout=10)


async def test_connection_is_noise_and_yamux(two_nodes):
    a, b = two_nodes
    (conn,) = b.host.libp2p.get_network().connections[a.peer_id]
    muxed = conn.muxed_conn
    assert type(muxed).__name__ == "Yamux"
    assert muxed.secured_conn.negotiated_security_protocol == "/noise"


async def test_calls_and_streams_reuse_one_connection(two_nodes):
    a, b = two_nodes
    for _ in range(20):
        await b.ping(a.peer_id)
    async def noop(stream):
        pass

    a.set_stream_handler("/test/noop/1.0.0", noop)
    for _ in range(5):
        async with b.open_stream(a.peer_id, "/test/noop/1.0.0"):
            pass
    await b.connect(a.addrs[0])
    assert len(b.host.libp2p.get_network().connections[a.peer_id]) == 1
    assert len(a.host.libp2p.get_network().connections[b.peer_id]) == 1


# -- identity -------------------------------------------------------------------------

async def test_identity_is_created_0600_and_reused(tmp_path):
    path = tmp_path / "keys" / "identity.key"
    async with open_node(listen=LOOPBACK, identity_path=path) as node:
        first = node.peer_id
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    async with open_node(listen=LOOPBACK, identity_path=str(path)) as node:
        assert node.peer_id == first


@pytest.mark.parametrize("content", [b"", b"garbage", b"\x08\x01\x12\x05short", bytes(10_000)])
async def test_corrupt_identity_is_rejected_and_left_untouched(tmp_path, content):
    path = tmp_path / "identity.key"
    path.write_bytes(content)
    with pytest.raises(IdentityError, match="identity file"):
        async with open_node(listen=LOOPBACK, identity_path=path):
            pass
    assert path.read_bytes() == content


def test_identity_of_the_wrong_key_type_or_unreadable(tmp_path):
    rsa = tmp_path / "rsa.key"
    rsa.write_bytes(create_rsa_key_pair().private_key.serialize())
    with pytest.raises(IdentityError, match="ed25519"):
        load_identity(rsa)
    with pytest.raises(IdentityError, match="cannot read"):
        load_or_create_identity(tmp_path)  # a directory
    with pytest.raises(IdentityError, match="cannot create"):
        load_or_create_identity("/proc/p2pdl-cannot-write-here/identity.key")


def test_group_readable_identity_is_used_with_a_warning(tmp_path, caplog):
    path = tmp_path / "id.key"
    key = load_or_create_identity(path)
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING):
        again = load_identity(path)
    assert again.public_key.serialize() == key.public_key.serialize()
    assert "chmod 600" in caplog.text


# -- addresses and user input ---------------------------------------------------------

async def test_printed_addresses_are_full_and_dialable(two_nodes):
    a, b = two_nodes
    for addr in a.addrs:
        assert addr.endswith(f"/p2p/{a.peer_id}")
    assert await b.connect(a.addrs[0]) == a.peer_id


async def test_wildcard_listen_is_expanded_to_interfaces():
    async with open_node(listen=["/ip4/0.0.0.0/tcp/0"]) as node:
        assert any(a.startswith("/ip4/127.0.0.1/tcp/") for a in node.addrs)
        assert not any("0.0.0.0" in a for a in node.addrs)


async def test_announce_replaces_listen_addresses():
    async with open_node(listen=LOOPBACK, announce=["/ip4/203.0.113.9/tcp/4001"]) as node:
        assert node.addrs == [f"/ip4/203.0.113.9/tcp/4001/p2p/{node.peer_id}"]


@pytest.mark.parametrize("kwargs, reason", [
    (dict(initial_peers=["not-an-address"]), "not a multiaddr"),
    (dict(initial_peers=["/ip4/127.0.0.1/tcp/1"]), "no /p2p/"),
    (dict(initial_peers="/ip4/1.2.3.4/tcp/1/p2p/x"), "not a valid multiaddr"),
    (dict(listen=["/ip4/127.0.0.1/udp/1"]), "must be /ip4"),
    (dict(lisen=["/ip4/127.0.0.1/tcp/0"]), "unknown node option"),
    (dict(dial_timeout=0), "dial_timeout must be positive"),
])
async def test_bad_user_input_is_a_clear_config_error(kwargs, reason):
    with pytest.raises(ConfigError, match=reason):
        async with open_node(**{"listen": LOOPBACK, **kwargs}):
            pass


async def test_port_in_use_is_a_config_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ConfigError, match="cannot listen"):
            async with open_node(listen=[f"/ip4/127.0.0.1/tcp/{port}"]):
                pass


async def test_connecting_to_self_is_refused(two_nodes):
    a, _ = two_nodes
    with pytest.raises(ConfigError, match="own address"):
        await a.connect(a.addrs[0])


# -- initial peers ---------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_initial_peer_that_starts_late_is_reached_by_retries():
    key_pair = create_new_key_pair()
    port = free_port()
    from libp2p.peer.id import ID
    peer_id = ID.from_pubkey(key_pair.public_key)
    address = f"/ip4/127.0.0.1/tcp/{port}/p2p/{peer_id}"
    fast = BackoffPolicy(initial=0.1, maximum=0.5)
    config = NodeConfig.build(listen=LOOPBACK, initial_peers=[address],
                              initial_peer_backoff=fast, reconnect_check_interval=0.2)
    async with open_node(config) as follower:
        await trio.sleep(1.0)  # several failed attempts
        assert follower.connected_peers() == []
        async with open_node(listen=[f"/ip4/127.0.0.1/tcp/{port}"], key_pair=key_pair) as boot:
            await follower.wait_for_peers(1, timeout=10)
            assert boot.connected_peers() == [follower.peer_id]
        # the bootstrap node restarts: the follower reconnects on its own
        await trio.sleep(0.5)
        async with open_node(listen=[f"/ip4/127.0.0.1/tcp/{port}"], key_pair=key_pair) as boot:
            with trio.fail_after(10):
                while follower.peer_id not in boot.connected_peers():
                    await trio.sleep(0.05)


async def test_initial_peer_is_given_up_after_the_retry_budget(caplog):
    address = f"/ip4/127.0.0.1/tcp/{free_port()}/p2p/{create_new_key_pair_id()}"
    config = NodeConfig.build(listen=LOOPBACK, initial_peers=[address], initial_peer_retries=3,
                              initial_peer_backoff=BackoffPolicy(initial=0.05, maximum=0.1))
    with caplog.at_level(logging.INFO, logger="p2pdl"):
        async with open_node(config):
            with trio.fail_after(10):
                while "giving up" not in caplog.text:
                    await trio.sleep(0.05)
    assert caplog.text.count("unreachable (attempt") == 2


def create_new_key_pair_id() -> str:
    from libp2p.peer.id import ID
    return str(ID.from_pubkey(create_new_key_pair().public_key))


async def test_inbound_streams_per_peer_are_bounded():
    # no dial-back probing: its RPC streams would count against the limit too
    config = dataclasses.replace(NodeConfig.build(max_inbound_streams_per_peer=3),
                                 nat=NatConfig(enabled=False))
    async with open_nodes(2, config) as (a, b):
        hold = trio.Event()
        opened = []

        async def slow(stream):
            opened.append(1)
            await hold.wait()

        a.set_stream_handler("/test/slow/1.0.0", slow)
        refused = 0
        for _ in range(5):
            try:
                await b.host.libp2p.new_stream(a.peer_id, ["/test/slow/1.0.0"])
            except Exception:  # reset by the server during or after negotiation
                refused += 1
        await trio.sleep(0.5)
        assert len(opened) == 3
        assert refused == 2
        hold.set()
        await trio.sleep(2.5)  # the handlers end; their streams linger up to CLOSE_LINGER
        assert await b.ping(a.peer_id) < 5  # then the peer is served again


async def test_a_node_that_stops_closes_its_connections_at_once():
    # py-libp2p's host.run() leaves connections open when it ends; a node in a
    # process that goes on must not look alive to its peers.
    async with open_nodes(3) as peers:
        async with open_node(NodeConfig.build(listen=LOOPBACK,
                                              initial_peers=peers[0].addrs[:1])) as leaving:
            for peer in peers[1:]:
                await leaving.connect(peer.addrs[0])
            assert all(p.host.is_connected(leaving.peer_id) for p in peers)
        with trio.fail_after(3):
            while any(p.host.is_connected(leaving.peer_id) for p in peers):
                await trio.sleep(0.02)


async def test_known_addresses_are_remembered_and_bad_ones_skipped(two_nodes):
    a, b = two_nodes
    peer = ID.from_pubkey(create_new_key_pair().public_key)
    kept = a.host.add_addrs(peer, ["/ip4/127.0.0.1/tcp/1", "not an address",
                                   f"/ip4/127.0.0.1/tcp/2/p2p/{peer}"])
    assert kept == 2
    assert a.host.known_addrs(peer) == ["/ip4/127.0.0.1/tcp/1", "/ip4/127.0.0.1/tcp/2"]
    assert b.host.known_addrs(a.peer_id) == [a.addrs[0].split("/p2p/")[0]]  # b dialled a
