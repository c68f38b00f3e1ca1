"""Interoperability with other libp2p implementations: identify over a relay, standard ping."""

from __future__ import annotations

import dataclasses
from contextlib import asynccontextmanager

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.host.ping import ID as LIBP2P_PING_ID
from libp2p.host.ping import PingService
from libp2p.identity.identify.pb.identify_pb2 import Identify
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.utils.varint import read_length_prefixed_protobuf

from p2pdl import NodeConfig, open_node
from p2pdl.nat import NatConfig
from p2pdl.net import BackoffPolicy
from p2pdl.net._interop import relayed_observed_addr
from p2pdl.net._relay import is_circuit
from p2pdl.testing import LOOPBACK, wait_until

FAST = BackoffPolicy(initial=0.2, maximum=1.0)


def private_config(relays: list[str]) -> NodeConfig:
    config = NodeConfig.build(listen=LOOPBACK, initial_peers=relays, reservation_retry=FAST,
                              reconnect_check_interval=0.2, initial_peer_backoff=FAST,
                              relay_reservations=1, hole_punching=False)
    return dataclasses.replace(config, nat=NatConfig(enabled=False))


async def test_identify_over_a_relayed_connection_reports_the_relay_path():
    """What a js-libp2p peer reaching the node through a relay reads in identify:
    ``<relay transport address>/p2p/<relay>/p2p-circuit``, not the node's own id
    where the relay's belongs (js-libp2p rejected that reply as a whole)."""
    async with open_node(NodeConfig.build(listen=LOOPBACK, relay_service=True)) as relay, \
            open_node(private_config(relay.addrs[:1])) as target, \
            open_node(private_config(relay.addrs[:1])) as remote:
        await wait_until(lambda: any(is_circuit(x) for x in target.addrs), 10.0)
        circuit = next(x for x in target.addrs if is_circuit(x))
        await remote.connect(circuit)
        assert target.host.path(remote.peer_id) == "relayed"
        stream = await remote.host.libp2p.new_stream(target.peer_id, ["/ipfs/id/1.0.0"])
        with trio.fail_after(10):
            reply = Identify()
            reply.ParseFromString(await read_length_prefixed_protobuf(stream, True))
        observed = multiaddr.Multiaddr(reply.observed_addr)
        relay_transport = relay.addrs[0].split("/p2p/")[0]
        assert str(observed) == f"{relay_transport}/p2p/{relay.peer_id}/p2p-circuit"
        assert target.host.path(remote.peer_id) == "relayed"  # still known as relayed
        assert await remote.ping(target.peer_id) < 5


def test_relayed_observed_addresses_are_correct_or_none():
    relay, own = (str(_peer_id()) for _ in range(2))
    own_id = _peer_id()
    good = multiaddr.Multiaddr(f"/ip4/10.0.0.1/tcp/4001/p2p/{relay}/p2p-circuit/p2p/{own}")
    assert str(relayed_observed_addr(good, own_id)) == \
        f"/ip4/10.0.0.1/tcp/4001/p2p/{relay}/p2p-circuit"
    # py-libp2p's own form: no transport part, this node where the relay belongs
    wrong = multiaddr.Multiaddr(f"/p2p/{own_id}/p2p-circuit/p2p/{relay}")
    assert relayed_observed_addr(wrong, own_id) is None
    direct = multiaddr.Multiaddr("/ip4/10.0.0.2/tcp/1")
    assert relayed_observed_addr(direct, own_id) is direct


def _peer_id():
    from libp2p.peer.id import ID
    return ID.from_pubkey(create_new_key_pair().public_key)


@asynccontextmanager
async def ipfs_ping_only_host():
    """A bare py-libp2p host that serves ``/ipfs/ping/1.0.0`` and nothing of p2pdl."""
    key_pair = create_new_key_pair()
    listen = [multiaddr.Multiaddr(LOOPBACK[0])]
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    host = new_host(key_pair=key_pair, sec_opt={NOISE_ID: noise},
                    muxer_opt={YAMUX_ID: Yamux}, listen_addrs=listen)
    host.set_stream_handler(LIBP2P_PING_ID, PingService(host).handle_ping)
    async with host.run(listen):
        yield host
        for listener in host.get_network().listeners.values():
            await listener.close()


async def test_a_peer_serving_only_the_standard_ping_is_pinged_with_it():
    async with open_node(NodeConfig.build(listen=LOOPBACK)) as node, \
            ipfs_ping_only_host() as other:
        assert "/p2pdl/ping/1.0.0" not in [str(p) for p in other.get_mux().get_protocols()]
        await node.connect(f"{other.get_addrs()[0]}")
        with trio.fail_after(15):
            rtt = await node.ping(other.get_id())
        assert 0 < rtt < 5
