"""Request/response over real hosts on loopback."""

from __future__ import annotations

import random

import pytest
import torch
import trio

from p2pdl import NodeConfig
from p2pdl.errors import (
    CallTimeoutError,
    LocalProtocolError,
    PeerUnreachableError,
    ProtocolNotSupportedError,
    RemoteError,
    RemoteProtocolError,
    RequestError,
    StreamClosedError,
)
from p2pdl.nat import NatConfig
from p2pdl.testing import open_nodes
from p2pdl.wire import PING, Message, MessageSet, PingRequest, RpcProtocol, WireConfig

from .test_messages import Hello


class Work(Message, tag="test.work"):
    value: int
    delay: float = 0.0
    mode: str = "ok"


class Result(Message, tag="test.result"):
    value: int


WORK = RpcProtocol.define("/test/work/1.0.0", [Work], [Result])


def serve_work(node, log=None, concurrency=None):
    state = {"now": 0, "max": 0}

    async def handler(ctx, req: Work):
        state["now"] += 1
        state["max"] = max(state["max"], state["now"])
        try:
            if log is not None:
                log.append(ctx)
            await trio.sleep(req.delay)
            if req.mode == "reject":
                raise RequestError("bad_request", "value is odd")
            if req.mode == "crash":
                raise ValueError("boom")
            if req.mode == "wrong-type":
                return Hello(1, "not a result")
            return Result(req.value * 2)
        finally:
            state["now"] -= 1

    node.serve(WORK, handler)
    return state


async def test_call_returns_the_response(two_nodes):
    a, b = two_nodes
    serve_work(a)
    assert await b.call(a.peer_id, WORK, Work(21)) == Result(42)
    assert await b.call(str(a.peer_id), WORK, Work(1)) == Result(2)


async def test_concurrent_calls_are_matched_by_request_id_on_one_stream(two_nodes):
    a, b = two_nodes
    log: list = []
    serve_work(a, log)
    results = {}

    async def one(i):
        results[i] = await b.call(a.peer_id, WORK, Work(i, delay=random.random() * 0.2))

    async with trio.open_nursery() as nursery:
        for i in range(100):
            nursery.start_soon(one, i)
    assert results == {i: Result(2 * i) for i in range(100)}
    assert len({ctx.request_id for ctx in log}) == 100
    # One connection, one RPC stream for all of them.
    assert len(b.host.libp2p.get_network().connections[a.peer_id]) == 1
    assert sum(key[1] == WORK.protocol_id for key in b._rpc._channels) == 1


async def test_server_bounds_requests_in_flight_per_stream():
    config = NodeConfig(wire=WireConfig(max_inflight_requests=4))
    async with open_nodes(2, config) as (a, b):
        state = serve_work(a)
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(b.call, a.peer_id, WORK, Work(i, delay=0.05))
        assert state["max"] == 4


async def test_error_replies(two_nodes):
    a, b = two_nodes
    serve_work(a)
    with pytest.raises(RemoteError) as info:
        await b.call(a.peer_id, WORK, Work(1, mode="reject"))
    assert (info.value.code, info.value.message) == ("bad_request", "value is odd")
    with pytest.raises(RemoteError, match="internal"):
        await b.call(a.peer_id, WORK, Work(1, mode="crash"))
    with pytest.raises(RemoteError, match="invalid response"):
        await b.call(a.peer_id, WORK, Work(1, mode="wrong-type"))
    assert await b.call(a.peer_id, WORK, Work(5)) == Result(10)  # the stream survived


async def test_handler_timeout_is_an_error_reply():
    config = NodeConfig(wire=WireConfig(handler_timeout=0.2))
    async with open_nodes(2, config) as (a, b):
        serve_work(a)
        with pytest.raises(RemoteError, match="timeout"):
            await b.call(a.peer_id, WORK, Work(1, delay=5))


async def test_call_timeout_then_the_stream_is_still_usable(two_nodes):
    a, b = two_nodes
    serve_work(a)
    start = trio.current_time()
    with pytest.raises(CallTimeoutError):
        await b.call(a.peer_id, WORK, Work(1, delay=2), timeout=0.3)
    assert trio.current_time() - start < 1.5
    assert await b.call(a.peer_id, WORK, Work(3)) == Result(6)


async def test_a_handler_rejecting_a_request_resets_only_that_stream(two_nodes):
    a, b = two_nodes

    async def strict(ctx, req: Work):
        if req.value < 0:
            raise RemoteProtocolError("negative values are against the protocol")
        return Result(req.value)

    a.serve(WORK, strict)
    for _ in range(5):  # the caller learns at once, and the connection stays usable
        start = trio.current_time()
        with pytest.raises(StreamClosedError):
            await b.call(a.peer_id, WORK, Work(-1), timeout=10)
        assert trio.current_time() - start < 2
        assert await b.call(a.peer_id, WORK, Work(7)) == Result(7)
    assert len(b.host.libp2p.get_network().connections[a.peer_id]) == 1


async def test_cancelled_sends_never_break_the_connection(two_nodes):
    # py-libp2p's Noise layer advances its nonce before writing: a write cut
    # short by cancellation used to break every stream of the connection.
    a, b = two_nodes
    received: list[int] = []

    async def sink(stream):
        while (item := await stream.receive(MessageSet())) is not None:
            received.append(len(item.data))

    a.set_stream_handler("/test/sink/1.0.0", sink)
    for delay in (0.0, 0.001, 0.01, 0.05):
        with trio.move_on_after(delay):
            async with b.open_stream(a.peer_id, "/test/sink/1.0.0") as stream:
                await stream.send_tensor(torch.zeros(4 << 20))
        assert await b.ping(a.peer_id, timeout=5) < 5
    assert len(b.host.libp2p.get_network().connections[a.peer_id]) == 1


async def test_unsupported_protocol(two_nodes):
    a, b = two_nodes
    with pytest.raises(ProtocolNotSupportedError, match="does not support /test/work"):
        await b.call(a.peer_id, WORK, Work(1))


async def test_unreachable_peers(two_nodes):
    a, b = two_nodes
    async with open_nodes(1, connect=False) as (gone,):
        gone_addr, gone_id = gone.addrs[0], gone.peer_id
    with pytest.raises(PeerUnreachableError):
        await b.connect(gone_addr, timeout=5)
    with pytest.raises(PeerUnreachableError):
        await b.call(gone_id, PING, PingRequest(1), timeout=5)
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID
    stranger = ID.from_pubkey(create_new_key_pair().public_key)
    with pytest.raises(PeerUnreachableError, match="no known address"):
        await b.call(stranger, PING, PingRequest(1))


async def test_request_type_is_checked_locally(two_nodes):
    a, b = two_nodes
    with pytest.raises(LocalProtocolError):
        await b.call(a.peer_id, WORK, Result(1))


async def test_idle_rpc_stream_is_closed_and_reopened():
    config = NodeConfig(wire=WireConfig(rpc_idle_timeout=0.3),
                        nat=NatConfig(enabled=False))
    async with open_nodes(2, config) as (a, b):
        serve_work(a)
        await b.call(a.peer_id, WORK, Work(1))
        assert b.statistics()["rpc_channels"] == 1
        with trio.fail_after(5):
            while b.statistics()["rpc_channels"]:
                await trio.sleep(0.05)
        assert await b.call(a.peer_id, WORK, Work(2)) == Result(4)


async def test_server_going_away_fails_pending_calls_quickly():
    outcome: list = []
    async with open_nodes(1) as (b,), trio.open_nursery() as nursery:
        async with open_nodes(1) as (a,):
            serve_work(a)
            await b.connect(a.addrs[0])

            async def pending():
                try:
                    await b.call(a.peer_id, WORK, Work(1, delay=30), timeout=20)
                except (StreamClosedError, PeerUnreachableError) as exc:
                    outcome.append(exc)

            nursery.start_soon(pending)
            await trio.sleep(0.3)
        # node `a` is shut down now, with the call still waiting for its answer
        with trio.fail_after(10):
            while not outcome:
                await trio.sleep(0.05)


async def test_server_closes_a_stream_that_asks_nothing():
    config = NodeConfig(wire=WireConfig(rpc_idle_timeout=0.3),
                        nat=NatConfig(enabled=False))
    async with open_nodes(2, config) as (a, b):
        raw = await b.host.libp2p.new_stream(a.peer_id, ["/p2pdl/ping/1.0.0"])
        start = trio.current_time()
        with trio.fail_after(10):
            while True:  # the server half-closes, then resets after its linger
                try:
                    if not await raw.read(65536):
                        break
                except Exception:  # reset
                    break
        assert trio.current_time() - start < 5
        assert await b.ping(a.peer_id) < 5


async def test_a_violation_after_a_valid_request_is_one_quiet_line(caplog):
    import logging

    from p2pdl.wire import FrameKind, encode_message
    from p2pdl.wire._frames import frame_header

    config = NodeConfig(nat=NatConfig(enabled=False))
    async with open_nodes(2, config) as (a, b):
        serve_work(a)
        with caplog.at_level(logging.DEBUG):
            for _ in range(10):
                raw = await b.host.libp2p.new_stream(a.peer_id, [WORK.protocol_id])
                request = encode_message(Work(1, delay=0.2), 1)
                unknown = encode_message(Hello(1, "x"), 2)  # not a request of the protocol
                await raw.write(frame_header(FrameKind.MESSAGE, len(request)) + request
                                + frame_header(FrameKind.MESSAGE, len(unknown)) + unknown)
                with trio.fail_after(10):
                    while True:
                        try:
                            if not await raw.read(65536):
                                break
                        except Exception:  # reset
                            break
            await trio.sleep(0.5)
        loud = [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
        assert not loud, [r.getMessage() for r in loud]
        assert a.host.statistics().inbound.protocol_errors[WORK.protocol_id] == 10
