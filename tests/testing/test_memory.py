"""The in-memory transport of p2pdl.testing: streams, hosts, the network, the swarm."""

from __future__ import annotations

import dataclasses
import random

import pytest
import trio
import trio.testing
from libp2p.network.stream.exceptions import StreamClosed, StreamEOF, StreamReset

from p2pdl import NodeConfig, open_node
from p2pdl.errors import (
    CallTimeoutError,
    ConfigError,
    PeerUnreachableError,
    ProtocolNotSupportedError,
    StreamClosedError,
)
from p2pdl.net import HostConfig
from p2pdl.testing import (
    Link,
    MemoryNetwork,
    memory_stream_pair,
    open_memory_host,
    open_memory_nodes,
    open_memory_swarm,
    task_names,
    trio_clock,
    wait_for_dht,
    wait_until,
)
from p2pdl.wire import PING, PingRequest, open_framed_stream

pytestmark = pytest.mark.timeout(60)


def pair(**kwargs):
    return memory_stream_pair("/test/1.0.0", ("a", "b"), **kwargs)


async def read_all(stream) -> bytes:
    out = bytearray()
    while True:
        try:
            out += await stream.read(random.randint(1, 5000))
        except StreamEOF:
            return bytes(out)


# -- streams ----------------------------------------------------------------------


async def test_streams_deliver_every_byte_in_order_and_name_the_peer(autojump_clock):
    a, b = pair(window=1000)
    assert a.muxed_conn.peer_id == "b" and b.muxed_conn.peer_id == "a"
    assert a.get_protocol() == b.get_protocol() == "/test/1.0.0"
    data = random.Random(1).randbytes(50_000)
    received = {}

    async def reader():
        received["b"] = await read_all(b)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        for start in range(0, len(data), 777):  # writes larger than the window wait
            await a.write(data[start:start + 777])
        await a.close_write()
    assert received["b"] == data
    assert a.bytes_written == len(data) and a.buffered == 0


async def test_half_close_ends_one_direction_only(autojump_clock):
    a, b = pair()
    await a.write(b"last words")
    await a.close_write()
    await a.close_write()  # idempotent
    with pytest.raises(StreamClosed):
        await a.write(b"more")
    assert await b.read(100) == b"last words"
    with pytest.raises(StreamEOF):
        await b.read(100)
    with pytest.raises(StreamEOF):  # and again: EOF stays
        await b.read(100)
    await b.write(b"reply")  # the other direction still works
    assert await a.read() == b"reply"
    assert not a.done
    await b.close()
    assert a.done and not a.is_reset


async def test_read_returns_at_most_n_bytes_and_the_rest_stays(autojump_clock):
    a, b = pair()
    await a.write(b"0123456789")
    assert await b.read(3) == b"012"
    assert await b.read(-1) == b"3456789"


async def test_reset_fails_both_ends_and_wakes_a_waiting_reader(autojump_clock):
    a, b = pair()
    await a.write(b"never read")
    failures = []

    async def waiting_reader():
        await b.read(10)
        try:
            await b.read(10)
        except StreamReset:
            failures.append("read")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiting_reader)
        await trio.testing.wait_all_tasks_blocked()
        await a.reset()
    assert failures == ["read"]
    for end in (a, b):
        assert end.is_reset and end.done
        with pytest.raises(StreamReset):
            await end.read(1)
        with pytest.raises(StreamReset):
            await end.write(b"x")
    await a.reset()  # never raises
    await b.close_write()  # nothing to close any more


async def test_buffers_are_bounded_and_a_full_one_holds_the_writer(autojump_clock):
    a, b = pair(window=100)
    await a.write(b"x" * 100)
    assert a.buffered == 100
    with trio.move_on_after(5) as scope:
        await a.write(b"y")
    assert scope.cancelled_caught  # the reader took nothing: the writer waits
    assert a.buffered == 100
    assert await b.read(30) == b"x" * 30
    with trio.fail_after(1):
        await a.write(b"y" * 30)
    assert a.buffered == 100


async def test_latency_delays_bytes_and_the_half_close(autojump_clock):
    a, b = pair(latency=0.25)
    start = trio.current_time()
    await a.write(b"hello")
    await a.close_write()
    assert await b.read(10) == b"hello"
    assert trio.current_time() - start == pytest.approx(0.25)
    with pytest.raises(StreamEOF):
        await b.read(10)


async def test_a_link_that_is_down_holds_bytes_until_it_is_up(autojump_clock):
    up = [False]
    a, b = pair(link=Link(lambda: up[0]))
    await a.write(b"waits")
    with trio.move_on_after(10) as scope:
        await b.read(10)
    assert scope.cancelled_caught
    up[0] = True
    a.wake()
    assert await b.read(10) == b"waits"


async def test_a_cancelled_read_takes_nothing(autojump_clock):
    a, b = pair()
    with trio.move_on_after(1):
        await b.read(10)
    await a.write(b"kept")
    assert await b.read(10) == b"kept"


def test_stream_pairs_check_their_arguments():
    with pytest.raises(ValueError, match="window"):
        pair(window=0)
    with pytest.raises(ValueError, match="latency"):
        pair(latency=-1)
    with pytest.raises(ConfigError):
        MemoryNetwork(latency=-1)


# -- hosts and the network -----------------------------------------------------------


async def echo(stream) -> None:
    try:
        while True:
            await stream.write(await stream.read(65536))
    except StreamEOF:
        await stream.close_write()


async def test_hosts_connect_open_streams_and_map_errors(autojump_clock):
    network = MemoryNetwork()
    async with open_memory_host(network) as a, open_memory_host(network) as b:
        assert a.peer_id != b.peer_id and a.addrs() != b.addrs()
        assert a.addrs()[0].endswith(f"/p2p/{a.peer_id}")
        assert a.addrs()[0].startswith("/ip4/127.")  # loopback, never opened as a socket
        b.set_stream_handler("/echo/1.0.0", echo)
        with pytest.raises(PeerUnreachableError, match="no known address"):
            await a.new_stream(b.peer_id, "/echo/1.0.0")
        with pytest.raises(ConfigError, match="own address"):
            await a.connect(a.addrs()[0])
        assert await a.connect(b.addrs()[0]) == b.peer_id
        assert a.is_connected(b.peer_id) and b.connected_peers() == [a.peer_id]
        assert a.paths() == {b.peer_id: "direct"} and a.observed_ip(b.peer_id) == b.ip
        stream = await a.new_stream(b.peer_id, "/echo/1.0.0")
        await stream.write(b"ping")
        assert await stream.read(10) == b"ping"
        await stream.close_write()
        with pytest.raises(StreamEOF):
            await stream.read(10)
        with pytest.raises(ProtocolNotSupportedError):
            await a.new_stream(b.peer_id, "/nobody/serves/this")
        # Addresses learnt elsewhere (the DHT) let a peer be reached by id.
        async with open_memory_host(network) as c:
            c.set_stream_handler("/echo/1.0.0", echo)
            assert a.add_addrs(c.peer_id, [*c.addrs(), "not an address"]) == 1
            assert a.known_addrs(c.peer_id) == [c.addrs()[0].split("/p2p/")[0]]
            await a.new_stream(c.peer_id, "/echo/1.0.0")
            assert a.is_connected(c.peer_id)
        await wait_until(lambda: not a.is_connected(c.peer_id), 1)  # c left
        with pytest.raises(PeerUnreachableError, match="refused"):
            await a.ensure_connected(c.peer_id)
        # A wrong peer id at an address fails like a failed handshake.
        wrong = b.addrs()[0].replace(str(b.peer_id), str(c.peer_id))
        with pytest.raises(PeerUnreachableError, match="the host there is"):
            await a.connect(wrong)


async def test_a_host_limits_the_streams_one_peer_has_open_to_its_handlers(autojump_clock):
    network = MemoryNetwork()
    release = trio.Event()

    async def hold(stream):
        await release.wait()

    async with open_memory_host(network, HostConfig(max_inbound_streams_per_peer=2)) as a, \
            open_memory_host(network) as b:
        a.set_stream_handler("/hold/1.0.0", hold)
        await b.connect(a.addrs()[0])
        streams = [await b.new_stream(a.peer_id, "/hold/1.0.0") for _ in range(3)]
        await trio.testing.wait_all_tasks_blocked()
        assert [s.is_reset for s in streams] == [False, False, True]
        release.set()


async def test_a_killed_peer_s_streams_fail_and_it_refuses_dials(autojump_clock):
    network = MemoryNetwork()
    async with open_memory_host(network) as a:
        ended = trio.Event()
        streams = {}

        async def victim(task_status=trio.TASK_STATUS_IGNORED):
            async with open_memory_host(network) as b:
                b.set_stream_handler("/echo/1.0.0", echo)
                task_status.started(b)
                await trio.sleep_forever()
            ended.set()  # killing cancelled the block, quietly

        async with trio.open_nursery() as nursery:
            b = await nursery.start(victim)
            await a.connect(b.addrs()[0])
            streams["s"] = await a.new_stream(b.peer_id, "/echo/1.0.0")
            network.kill(b.peer_id)
        assert ended.is_set() and not b.alive
        with pytest.raises(StreamReset):
            await streams["s"].read(1)
        assert not a.is_connected(b.peer_id)
        with pytest.raises(PeerUnreachableError, match="refused"):
            await a.connect(b.addrs()[0])
        assert network.host(b.peer_id) is None  # it left the network


async def test_a_partition_stalls_streams_and_dials_until_it_heals(autojump_clock):
    network = MemoryNetwork()
    config = HostConfig(dial_timeout=3.0)
    async with open_memory_host(network, config) as a, open_memory_host(network) as b, \
            open_memory_host(network) as c:
        b.set_stream_handler("/echo/1.0.0", echo)
        await a.connect(b.addrs()[0])
        stream = await a.new_stream(b.peer_id, "/echo/1.0.0")
        network.partition([a], [b, c])
        assert not network.reachable(a, b) and network.reachable(b, c)
        await stream.write(b"across")
        with trio.move_on_after(30) as scope:
            await stream.read(10)
        assert scope.cancelled_caught  # no answer, but the connection stays
        assert a.is_connected(b.peer_id)
        start = trio.current_time()
        with pytest.raises(PeerUnreachableError, match="within 3.0 s"):
            await a.connect(c.addrs()[0])
        assert trio.current_time() - start == pytest.approx(3.0)
        with pytest.raises(PeerUnreachableError, match="no answer"):
            await a.probe(c.addrs()[0], c.peer_id, 2.0)
        network.heal()
        assert await stream.read(10) == b"across"  # held, then delivered
        await a.connect(c.addrs()[0])
        await a.probe(c.addrs()[0], c.peer_id, 2.0)


async def test_disconnect_resets_the_connection_and_initial_peers_are_redialled(autojump_clock):
    network = MemoryNetwork()
    async with open_memory_host(network) as a:
        a.set_stream_handler("/echo/1.0.0", echo)
        config = HostConfig(initial_peers=(a.addrs()[0],), reconnect_check_interval=1.0)
        async with open_memory_host(network, config) as b:
            await wait_until(lambda: b.is_connected(a.peer_id), 5)
            stream = await b.new_stream(a.peer_id, "/echo/1.0.0")
            assert network.disconnect(a, b)
            assert not network.disconnect(a, b)
            with pytest.raises(StreamReset):
                await stream.write(b"x")
            await wait_until(lambda: b.is_connected(a.peer_id), 5)  # redialled


async def test_a_host_behind_nat_dials_out_but_is_not_dialled_nor_probed(autojump_clock):
    network = MemoryNetwork()
    async with open_memory_host(network) as public, \
            open_memory_host(network, HostConfig(dial_timeout=2.0), reachable=False) as hidden:
        with pytest.raises(PeerUnreachableError):
            await public.connect(hidden.addrs()[0], timeout=2.0)
        await hidden.connect(public.addrs()[0])
        assert public.is_connected(hidden.peer_id)
        with pytest.raises(PeerUnreachableError, match="no answer"):
            await public.probe(hidden.addrs()[0], hidden.peer_id, 2.0)
        await hidden.probe(public.addrs()[0], public.peer_id, 2.0)
        with pytest.raises(PeerUnreachableError, match="not a direct TCP address"):
            await hidden.probe("/ip4/127.1.0.1/udp/1", public.peer_id, 2.0)


async def test_framed_streams_and_rpc_run_over_memory_hosts(autojump_clock):
    async with open_memory_nodes(2) as (a, b):
        assert await a.ping(b.peer_id) == 0.0
        response = await a.call(b.peer_id, PING, PingRequest(7))
        assert response.nonce == 7
        net_stream = await a.host.new_stream(b.peer_id, "/ipfs/ping/1.0.0")
        async with open_framed_stream(net_stream) as stream:  # any INetStream user
            assert stream.peer_id == b.peer_id and stream.protocol == "/ipfs/ping/1.0.0"
            await stream.reset()


# -- nodes and the swarm ----------------------------------------------------------------


async def test_memory_nodes_settle_in_virtual_time_and_leave_nothing_behind(autojump_clock):
    before = set(task_names())
    network = MemoryNetwork(latency=0.01)
    async with open_memory_nodes(5, network=network) as nodes:
        await wait_for_dht(nodes)
        assert all(n.reachability.value == "public" and n.dht.server_mode for n in nodes)
        assert all(len(n.connected_peers()) >= 1 for n in nodes)
        # An hour of maintenance, heartbeats and expiries passes in virtual time.
        assert await nodes[0].dht.store("hour", 1, nodes[0].dht.now() + 3600)
        await trio.sleep(3600 + 5)
        assert await nodes[1].dht.get("hour", latest=True) is None
        assert network.statistics().streams > 0
    assert network.statistics() == dataclasses.replace(network.statistics(), hosts=0, alive=0,
                                                       connections=0, streams=0)
    assert network.open_streams() == []
    assert set(task_names()) <= before


async def test_trio_clock_follows_trio_time(autojump_clock):
    clock = trio_clock(1000.0)
    assert clock() == 1000.0
    await trio.sleep(86400)
    assert clock() == 1000.0 + 86400
    async with open_memory_nodes(1, clock=clock) as (node,):
        assert node.dht.now() == clock()


async def test_a_node_behind_nat_finds_itself_private_and_becomes_a_client(autojump_clock):
    async with open_memory_swarm() as swarm:
        servers = await swarm.add_nodes(3)
        (hidden,) = await swarm.add_nodes(1, reachable=False)
        await wait_for_dht(servers)
        await wait_until(lambda: hidden.client_mode, 120, step=0.5)
        assert hidden.reachability.value == "private" and not hidden.dht.server_mode
        assert hidden.host.wants_relays
        assert await hidden.dht.store("from-behind-nat", 1, hidden.dht.now() + 60)
        assert (await servers[2].dht.get("from-behind-nat")).value == 1


async def test_a_swarm_kills_and_stops_single_nodes(autojump_clock):
    async with open_memory_swarm() as swarm:
        a, b, c = await swarm.add_nodes(3)
        swarm.kill(b)
        await wait_until(lambda: b not in swarm.nodes, 1)
        assert not swarm.network.host(b.peer_id)
        with pytest.raises((PeerUnreachableError, StreamClosedError, CallTimeoutError)):
            await a.ping(b.peer_id)
        await swarm.stop(c)
        assert swarm.nodes == [a]
        assert a.connected_peers() == []


async def test_open_node_takes_a_host_or_a_key_pair(autojump_clock):
    from libp2p.crypto.ed25519 import create_new_key_pair

    async with open_memory_host(MemoryNetwork()) as host:
        with pytest.raises(ConfigError, match="not both"):
            async with open_node(host=host, key_pair=create_new_key_pair()):
                pass
        async with open_node(NodeConfig(), host=host) as node:
            assert node.host is host and node.peer_id == host.peer_id
