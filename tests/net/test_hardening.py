"""Bad bytes from strangers: the node keeps serving, its memory stays bounded.

One test (at least) per patch of ``p2pdl.net._hardening`` and per rule of
``p2pdl.net._inbound``; ``simulations/fuzz_wire.py`` attacks all of them at
scale (``tests/test_fuzz_wire.py`` runs a short form of it).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import pathlib
import struct

import pytest
import trio
from libp2p.network.stream.exceptions import StreamError
from libp2p.stream_muxer.exceptions import MuxedStreamError
from libp2p.utils.varint import encode_uvarint

from p2pdl import NodeConfig, open_node
from p2pdl.errors import PeerUnreachableError, StreamClosedError
from p2pdl.nat import NatConfig
from p2pdl.net import HostConfig, open_host
from p2pdl.net._hardening import MAX_MULTISTREAM_MESSAGES
from p2pdl.testing import LOOPBACK

MULTISTREAM = b"/multistream/1.0.0\n"
IDENTIFY = "/ipfs/id/1.0.0"
IDENTIFY_PUSH = "/ipfs/id/push/1.0.0"
HOP = "/libp2p/circuit/relay/0.2.0/hop"


def node_config(**fields) -> NodeConfig:
    # No dial-back probing: its streams are not what these tests count.
    return dataclasses.replace(NodeConfig.build(listen=LOOPBACK, **fields),
                               nat=NatConfig(enabled=False))


def delimited(message: bytes) -> bytes:
    return encode_uvarint(len(message)) + message


async def raw_stream(attacker, node):
    """A Yamux stream to ``node`` with no negotiation: the attacker writes what it likes."""
    (conn,) = attacker.libp2p.get_network().connections[node.peer_id]
    return await conn.muxed_conn.open_stream()


async def read_until_closed(stream, timeout: float) -> bytes:
    """Everything the node sends until it resets or closes the stream (at most ``timeout``)."""
    received = b""
    with trio.fail_after(timeout):
        while True:
            try:
                data = await stream.read(65536)
            except (StreamError, MuxedStreamError):
                return received
            if not data:
                return received
            received += data


async def still_serving(node, honest) -> None:
    with trio.fail_after(10):
        assert await honest.ping(node.peer_id) < 5


# -- multistream-select ---------------------------------------------------------------

async def test_a_message_that_is_not_utf8_resets_the_stream_not_the_node():
    async with open_node(node_config()) as node, open_node(node_config()) as honest, \
            open_host(HostConfig(listen=LOOPBACK)) as attacker:
        await attacker.connect(node.addrs[0])
        await honest.connect(node.addrs[0])
        stream = await raw_stream(attacker, node)
        await stream.write(b"\x02\xff\x0a")
        await read_until_closed(stream, timeout=10)
        await still_serving(node, honest)
        assert attacker.is_connected(node.peer_id)  # only the stream paid
        stats = node.host.statistics().inbound
        assert stats.failed_negotiations >= 1


@pytest.mark.parametrize("message", [
    encode_uvarint(2000) + b"x" * 1999 + b"\n",     # longer than any protocol id
    b"\x80\x80\x01" + MULTISTREAM,                  # a three-byte length prefix
    delimited(b"/multistream/1.0.0"),               # no trailing newline
    b"\x00",                                        # an empty message
    delimited(MULTISTREAM)[:5],                     # the stream ends inside it
])
async def test_malformed_negotiation_messages_are_refused(message):
    async with open_node(node_config()) as node, open_node(node_config()) as honest, \
            open_host(HostConfig(listen=LOOPBACK)) as attacker:
        await attacker.connect(node.addrs[0])
        await honest.connect(node.addrs[0])
        stream = await raw_stream(attacker, node)
        await stream.write(message)
        if len(message) < 8:
            await stream.close()
        answer = await read_until_closed(stream, timeout=15)
        assert answer in (b"", delimited(MULTISTREAM))
        await still_serving(node, honest)


async def test_one_negotiation_reads_a_bounded_number_of_proposals():
    async with open_node(node_config()) as node, \
            open_host(HostConfig(listen=LOOPBACK)) as attacker:
        await attacker.connect(node.addrs[0])
        stream = await raw_stream(attacker, node)
        await stream.write(delimited(MULTISTREAM) + delimited(b"/nope/1.0.0\n") * 200)
        answer = await read_until_closed(stream, timeout=15)
        assert answer.count(b"na\n") == MAX_MULTISTREAM_MESSAGES - 1


async def test_a_hostile_peer_answering_our_negotiation_with_bad_bytes():
    async with open_node(node_config()) as node, \
            open_host(HostConfig(listen=LOOPBACK)) as hostile:

        async def answer_badly(stream) -> None:
            await stream.write(b"\x02\xff\x0a")
            await trio.sleep(1)

        hostile.libp2p.get_network().set_stream_handler(answer_badly)
        await node.connect(hostile.addrs()[0])
        with pytest.raises(StreamClosedError):
            await node.host.new_stream(hostile.peer_id, "/p2pdl/ping/1.0.0")
        assert node.host.is_connected(hostile.peer_id)


async def test_a_listener_answering_the_connection_upgrade_with_bad_bytes():
    async def answer_badly(conn: trio.SocketStream) -> None:
        with trio.move_on_after(5):
            await conn.receive_some(1024)
            await conn.send_all(b"\x02\xff\x0a")
            await conn.receive_some(1024)

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            functools.partial(trio.serve_tcp, answer_badly, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        async with open_node(node_config()) as node:
            fake_id = "12D3KooWLfVv9TkjKm52zLfkGc4Te2Eq3nRzrQkCqVb2pW1mnpkV"
            with pytest.raises(PeerUnreachableError):
                await node.connect(f"/ip4/127.0.0.1/tcp/{port}/p2p/{fake_id}", timeout=10)
        nursery.cancel_scope.cancel()


# -- Yamux receive windows ---------------------------------------------------------------

async def test_data_beyond_a_stream_window_closes_that_peers_connection():
    async with open_node(node_config()) as node, open_node(node_config()) as honest, \
            open_host(HostConfig(listen=LOOPBACK)) as attacker:

        async def never_reads(stream) -> None:
            await trio.sleep(30)

        node.host.set_stream_handler("/test/never-reads/1.0.0", never_reads)
        await attacker.connect(node.addrs[0])
        await honest.connect(node.addrs[0])
        net_stream = await attacker.libp2p.new_stream(node.peer_id, ["/test/never-reads/1.0.0"])
        stream = net_stream.muxed_stream
        chunk = bytes(256 * 1024)
        with trio.move_on_after(20):
            # py-libp2p grows a stream's window up to 16 MiB: send twice that,
            # without waiting for window updates; the node must not keep it.
            for _ in range(128):
                header = struct.pack("!BBHII", 0, 0, 0, stream.stream_id, len(chunk))
                try:
                    await stream.conn._write_frame(header + chunk)
                except Exception:  # the node closed the connection
                    break
        with trio.fail_after(10):
            while node.host.is_connected(attacker.peer_id):
                await trio.sleep(0.05)
        await still_serving(node, honest)


# -- inbound streams ----------------------------------------------------------------------

async def test_streams_to_libp2p_protocols_count_against_the_per_peer_limit():
    async with open_node(node_config(max_inbound_streams_per_peer=8)) as node, \
            open_node(node_config()) as honest, \
            open_host(HostConfig(listen=LOOPBACK)) as attacker:
        await attacker.connect(node.addrs[0])
        await honest.connect(node.addrs[0])
        opened = []
        for _ in range(40):  # identify push streams that push nothing
            try:
                opened.append(await attacker.libp2p.new_stream(node.peer_id, [IDENTIFY_PUSH]))
            except Exception:  # refused: reset before negotiation
                pass
        await trio.sleep(0.5)
        stats = node.host.statistics().inbound
        assert stats.open_streams <= 8
        assert stats.refused_streams >= 30
        await still_serving(node, honest)


async def test_an_unanswered_relay_stream_is_reset_after_the_handshake_timeout():
    async with open_node(node_config(relay_service=True, inbound_handshake_timeout=1.0)) as node, \
            open_host(HostConfig(listen=LOOPBACK)) as attacker:
        await attacker.connect(node.addrs[0])
        stream = await attacker.libp2p.new_stream(node.peer_id, [HOP])
        start = trio.current_time()
        await read_until_closed(stream, timeout=10)  # py-libp2p alone waited 30 s
        assert trio.current_time() - start < 5
        assert node.host.statistics().inbound.timeouts.get(HOP) == 1


async def test_a_finished_identify_stream_does_not_keep_what_the_peer_sends():
    async with open_node(node_config()) as node, \
            open_host(HostConfig(listen=LOOPBACK)) as attacker:
        await attacker.connect(node.addrs[0])
        stream = await attacker.libp2p.new_stream(node.peer_id, [IDENTIFY])
        start = trio.current_time()
        with trio.move_on_after(10):
            while True:  # never close: py-libp2p alone kept this for the connection's life
                try:
                    await stream.write(bytes(64 * 1024))
                except (StreamError, MuxedStreamError):
                    break
                await trio.sleep(0.01)
        assert trio.current_time() - start < 8


async def test_bad_input_is_logged_once_and_never_as_a_traceback(caplog):
    async with open_node(node_config()) as node, \
            open_host(HostConfig(listen=LOOPBACK)) as attacker:
        await attacker.connect(node.addrs[0])
        with caplog.at_level(logging.DEBUG):
            for _ in range(20):
                stream = await attacker.libp2p.new_stream(node.peer_id, ["/p2pdl/ping/1.0.0"])
                await stream.write(b"\x01\x00\x00\x00\x03\xc1\xc1\xc1")  # not msgpack
                await read_until_closed(stream, timeout=10)
            await trio.sleep(0.5)
        records = [r for r in caplog.records if r.levelno >= logging.INFO
                   and r.name.startswith(("p2pdl", "libp2p"))]
        assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]
        assert not [r for r in records if r.levelno >= logging.WARNING]
        assert sum("protocol error" in r.getMessage() for r in records) == 1
        assert node.host.statistics().inbound.protocol_errors["/p2pdl/ping/1.0.0"] == 20


# -- the specs state these bounds ---------------------------------------------------------

def _definitions(name: str) -> dict[str, str]:
    text = (pathlib.Path(__file__).resolve().parents[2] / "protocols" / name).read_text()
    rows = {}
    for line in text.split("## Definitions", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2:
            rows[cells[0]] = cells[1].split()[0]
    return rows


def test_the_transport_and_wire_specs_state_the_bounds_of_the_code():
    from p2pdl.net._hardening import MAX_MULTISTREAM_MESSAGE, WINDOW_SLACK
    from p2pdl.net._inbound import CLOSE_LINGER
    from p2pdl.wire import WireConfig

    host, wire = HostConfig(), WireConfig()
    transport = _definitions("transport.md")
    expected = {
        "stream_open_timeout": host.stream_open_timeout,
        "MAX_MULTISTREAM_MESSAGE": MAX_MULTISTREAM_MESSAGE,
        "MAX_MULTISTREAM_MESSAGES": MAX_MULTISTREAM_MESSAGES,
        "max_inbound_streams_per_peer": host.max_inbound_streams_per_peer,
        "inbound_handshake_timeout": host.inbound_handshake_timeout,
        "CLOSE_LINGER": CLOSE_LINGER,
        "WINDOW_SLACK": WINDOW_SLACK,
        "input_budget_per_peer": host.input_budget_per_peer,
        "input_budget_per_node": host.input_budget_per_node,
    }
    for name, value in expected.items():
        assert float(transport[name]) == value, name
    rows = _definitions("wire.md")
    assert float(rows["frame_timeout"]) == wire.frame_timeout
    assert float(rows["input_budget_per_peer"]) == host.input_budget_per_peer
    assert float(rows["input_budget_per_node"]) == host.input_budget_per_node


@pytest.mark.parametrize("reply", [b"\x02\xff\x0a", encode_uvarint(2**31) + b"x" * 100,
                                   encode_uvarint(50) + bytes(range(50)), b""])
async def test_identifying_a_peer_that_answers_garbage(reply):
    """The node identifies every peer it connects to (in a py-libp2p system task,
    where an escaping error would end the whole run)."""
    async with open_node(node_config()) as node, open_node(node_config()) as honest, \
            open_host(HostConfig(listen=LOOPBACK)) as hostile:

        async def bad_identify(stream) -> None:
            await stream.write(reply)
            await stream.close()

        hostile.libp2p.get_mux().add_handler(IDENTIFY, bad_identify)
        await node.connect(hostile.addrs()[0])
        await honest.connect(node.addrs[0])
        await trio.sleep(1)
        await still_serving(node, honest)
