"""FramedStream over real libp2p hosts on loopback."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import struct

import pytest
import torch
import trio
import trio.lowlevel
from libp2p.network.stream.exceptions import StreamError

from p2pdl import NodeConfig, open_node
from p2pdl.errors import LocalProtocolError, RemoteProtocolError, StreamClosedError
from p2pdl.nat import NatConfig
from p2pdl.wire import FrameDecoder, FrameKind, MessageSet, TensorChunk, WireConfig, encode_message
from p2pdl.wire._frames import frame_header

from .test_messages import Hello

SINK = "/test/sink/1.0.0"
HELLO = MessageSet(Hello)
MiB = 1 << 20


def digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


async def test_messages_and_tensors_arrive_intact(two_nodes):
    a, b = two_nodes
    source = torch.randn(3 * MiB // 4 + 123)
    got: dict = {}

    async def handler(stream):
        rid, hello = await stream.receive_message(HELLO)
        out = torch.empty(source.numel())
        while True:
            item = await stream.receive(HELLO)
            if item is None:
                break
            assert isinstance(item, TensorChunk)
            h = item.header
            out[h.offset:h.offset + h.count] = item.to_tensor()
        got.update(rid=rid, hello=hello, digest=digest(out), stats=stream.statistics())
        await stream.send_message(Hello(2, "done"), rid)

    a.set_stream_handler(SINK, handler)
    async with b.open_stream(a.peer_id, SINK) as stream:
        await stream.send_message(Hello(1, "start"), request_id=7)
        frames = await stream.send_tensor(source, part=1, chunk_size=256 * 1024)
        await stream.close_write()
        rid, reply = await stream.receive_message(HELLO)
    assert frames == 13  # 3 MiB + 123 floats in 256 KiB chunks
    assert got["rid"] == 7 == rid and got["hello"] == Hello(1, "start") and reply.name == "done"
    assert got["digest"] == digest(source)
    assert got["stats"].frames_received == 14
    # the tensor bytes moved and when (what a node's capacity estimate reads)
    received, first, last = got["stats"].tensor_received
    sent = stream.statistics()
    assert 0 < received == sent.tensor_sent[0] < sent.bytes_sent   # the messages: not counted
    assert sent.tensor_sent[1] <= first <= last   # one clock: written, then read
    assert sent.tensor_received is None           # the reply is a message


@pytest.mark.timeout(60)
async def test_consumer_busy_for_10s_never_resets_the_stream(two_nodes):
    """The receiver stops consuming for 10 s mid-transfer; the sender waits on
    credit (well past Yamux's 5 s write timeout) and the data arrives intact."""
    a, b = two_nodes
    source = torch.randn(24 * MiB // 4)  # three times the receive window
    result: dict = {}

    async def slow_consumer(stream):
        out = torch.empty(source.numel())
        received = 0
        while True:
            item = await stream.receive(HELLO)
            if item is None:
                break
            h = item.header
            out[h.offset:h.offset + h.count] = item.to_tensor()
            received += 1
            if received == 2:
                result["stall_start"] = trio.current_time()
                await trio.sleep(10)  # a training step that holds the consumer
        result["digest"] = digest(out)
        await stream.send_message(Hello(0, "ok"))

    a.set_stream_handler(SINK, slow_consumer)
    async with b.open_stream(a.peer_id, SINK) as stream:
        await stream.send_tensor(source)
        sent_at = trio.current_time()
        await stream.close_write()
        await stream.receive_message(HELLO)
    assert result["digest"] == digest(source)
    assert sent_at - result["stall_start"] >= 9.5  # the sender really was held back


@pytest.mark.timeout(30)
async def test_upstream_yamux_resets_a_writer_whose_reader_stalls(two_nodes):
    """Why p2pdl needs credit flow control: bare py-libp2p streams fail when the
    reader pauses for more than 5 s.  If this starts failing, upstream fixed it."""
    a, b = two_nodes
    stalled = trio.Event()

    async def lazy(net_stream):
        await net_stream.read(1)
        stalled.set()
        await trio.sleep(8)

    a.host.libp2p.set_stream_handler("/test/lazy/1.0.0", lazy)
    raw = await b.host.libp2p.new_stream(a.peer_id, ["/test/lazy/1.0.0"])
    with pytest.raises(StreamError):
        for _ in range(64):
            await raw.write(bytes(MiB))


async def test_a_held_chunk_is_never_overwritten_by_later_frames(two_nodes):
    a, b = two_nodes
    held = []

    async def keep_all(stream):
        while (item := await stream.receive(HELLO)) is not None:
            held.append(item.to_tensor())
        await stream.send_message(Hello(0, "ok"))

    a.set_stream_handler(SINK, keep_all)
    chunks = [torch.full((MiB // 4,), float(i)) for i in range(12)]
    async with b.open_stream(a.peer_id, SINK) as stream:
        for i, c in enumerate(chunks):
            await stream.send_tensor(c, part=i)
        await stream.close_write()
        await stream.receive_message(HELLO)
    assert [float(t[0]) for t in held] == [float(i) for i in range(12)]
    assert all(torch.equal(t, c) for t, c in zip(held, chunks, strict=True))


# -- bad input from the network -----------------------------------------------------

async def _expect_reset(raw) -> None:
    with trio.fail_after(10):
        with pytest.raises(StreamError):
            while True:
                if not await raw.read(65536):
                    raise StreamError("eof")


async def _serve_hello(a, log):
    async def handler(stream):
        try:
            while (item := await stream.receive(HELLO)) is not None:
                if not isinstance(item, TensorChunk):
                    await stream.send_message(item[1], item[0])
        except RemoteProtocolError as exc:
            log.append(exc)
            raise
    a.set_stream_handler(SINK, handler)


@pytest.mark.parametrize("garbage, reason", [
    (frame_header(FrameKind.MESSAGE, 2 * MiB), "exceeds the limit"),
    (b"\x09\x00\x00\x00\x01z", "unknown frame kind"),
    (frame_header(FrameKind.MESSAGE, 3) + b"\xc1\xc1\xc1", "malformed"),
    (frame_header(FrameKind.MESSAGE, 20) + encode_message(Hello(1, "x"))[:20], "malformed"),
    (struct.pack(">BI", FrameKind.MESSAGE, 13) + b"\x93\xa3bad\x01\x81\xa1x\x01\x90\x90\x90",
     "malformed|unexpected"),
    (frame_header(FrameKind.CREDIT, 4) + b"\x00\x00\x00\x00", "zero"),
])
async def test_bad_frames_reset_only_that_stream(three_nodes, garbage, reason):
    a, attacker, honest = three_nodes
    errors: list = []
    await _serve_hello(a, errors)
    good = await attacker.host.libp2p.new_stream(a.peer_id, [SINK])  # attacker's other stream
    raw = await attacker.host.libp2p.new_stream(a.peer_id, [SINK])
    await raw.write(garbage)
    await _expect_reset(raw)
    with trio.fail_after(5):  # the handler sees the error once its reset went out
        while not errors:
            await trio.sleep(0.01)
    assert any(re.search(reason, str(e)) for e in errors), errors
    # The node keeps serving: the honest peer, and the attacker's other stream.
    async with honest.open_stream(a.peer_id, SINK) as stream:
        await stream.send_message(Hello(1, "still there"), 1)
        assert await stream.receive_message(HELLO) == (1, Hello(1, "still there"))
    payload = encode_message(Hello(3, "g"), 2)
    await good.write(frame_header(FrameKind.MESSAGE, len(payload)) + payload)
    decoder = FrameDecoder(max_message_size=MiB, max_tensor_frame_size=MiB)
    with trio.fail_after(5):
        frames = []
        while not any(f.kind is FrameKind.MESSAGE for f in frames):
            frames += decoder.feed(await good.read(65536))
    assert [bytes(f.payload) for f in frames if f.kind is FrameKind.MESSAGE] == [payload]


async def test_sender_ignoring_credit_is_cut_off(three_nodes):
    a, attacker, honest = three_nodes
    errors: list = []
    release = trio.Event()

    async def stalled(stream):
        try:
            await release.wait()
            await stream.receive(HELLO)
        except RemoteProtocolError as exc:
            errors.append(exc)
            raise

    a.set_stream_handler(SINK, stalled)
    raw = await attacker.host.libp2p.new_stream(a.peer_id, [SINK])
    payload = encode_message(Hello(1, "x" * 16))
    burst = (frame_header(FrameKind.MESSAGE, len(payload)) + payload) * (MiB // 100)
    with trio.move_on_after(10):
        try:
            for _ in range(2 * WireConfig().receive_window // len(burst)):
                await raw.write(burst)
        except StreamError:
            pass
    await _expect_reset(raw)
    release.set()
    assert await honest.ping(a.peer_id) < 5
    with trio.fail_after(5):
        while not errors:
            await trio.sleep(0.01)
    assert "flow control" in str(errors[0])


async def test_truncated_stream_is_a_protocol_error(two_nodes):
    a, b = two_nodes
    errors: list = []
    await _serve_hello(a, errors)
    raw = await b.host.libp2p.new_stream(a.peer_id, [SINK])
    await raw.write(frame_header(FrameKind.MESSAGE, 100) + b"partial")
    await raw.close_write()
    with trio.fail_after(5):
        while not errors:
            await trio.sleep(0.01)
    assert "ended inside a frame" in str(errors[0])


async def test_peer_reset_ends_a_waiting_receive(two_nodes):
    """py-libp2p reports a remote reset as end-of-stream; either way nothing hangs."""
    a, b = two_nodes
    outcome = []

    async def handler(stream):
        try:
            outcome.append(await stream.receive(HELLO))
        except StreamClosedError as exc:
            outcome.append(exc)

    a.set_stream_handler(SINK, handler)
    raw = await b.host.libp2p.new_stream(a.peer_id, [SINK])
    await raw.reset()
    with trio.fail_after(5):
        while not outcome:
            await trio.sleep(0.01)
    assert outcome[0] is None or isinstance(outcome[0], StreamClosedError)


async def test_oversized_message_is_refused_locally_before_sending(two_nodes):
    a, b = two_nodes
    a.set_stream_handler(SINK, lambda stream: stream.receive(HELLO))
    async with b.open_stream(a.peer_id, SINK) as stream:
        with pytest.raises(LocalProtocolError, match="exceeds max_message_size"):
            await stream.send_message(Hello(1, "x", blob=bytes(2 * MiB)))
        assert stream.statistics().bytes_sent == 0


# -- bounded input: budgets and timeouts ----------------------------------------------

def _budget_config(**wire) -> NodeConfig:
    config = NodeConfig.build(listen=["/ip4/127.0.0.1/tcp/0"],
                              input_budget_per_peer=6 * MiB, input_budget_per_node=64 * MiB)
    return dataclasses.replace(config, wire=WireConfig(**wire),
                               nat=NatConfig(enabled=False))


async def test_announced_but_unsent_frames_hold_no_memory():
    async with open_node(_budget_config()) as a, open_node(_budget_config()) as attacker:
        a.set_stream_handler(SINK, lambda stream: stream.receive(HELLO))
        await attacker.connect(a.addrs[0])
        raws = [await attacker.host.libp2p.new_stream(a.peer_id, [SINK]) for _ in range(32)]
        for raw in raws:  # a 4 MiB TENSOR frame announced, nothing of it sent
            await raw.write(frame_header(FrameKind.TENSOR, 4 * MiB))
        await trio.sleep(0.5)
        stats = a.host.statistics()
        assert stats.buffered_input < 32 * 1024
        assert stats.input_budget_refusals == 0


async def test_a_peer_holding_more_than_its_budget_has_its_stream_reset():
    async with open_node(_budget_config()) as a, open_node(_budget_config()) as attacker, \
            open_node(_budget_config()) as honest:
        errors: list = []
        await _serve_hello(a, errors)
        await attacker.connect(a.addrs[0])
        await honest.connect(a.addrs[0])
        raws = [await attacker.host.libp2p.new_stream(a.peer_id, [SINK]) for _ in range(3)]
        for raw in raws:  # three frames of 4 MiB, each one byte short: 12 MiB held > 6 MiB
            try:
                await raw.write(frame_header(FrameKind.TENSOR, 4 * MiB) + bytes(4 * MiB - 1))
            except StreamError:  # that one was reset
                pass
        with trio.fail_after(10):
            while not errors:
                await trio.sleep(0.05)
        assert "input budget" in str(errors[0])
        stats = a.host.statistics()
        assert stats.input_budget_refusals >= 1
        assert stats.buffered_input <= 6 * MiB
        async with honest.open_stream(a.peer_id, SINK) as stream:  # others are served
            await stream.send_message(Hello(1, "still there"), 1)
            assert await stream.receive_message(HELLO) == (1, Hello(1, "still there"))
    assert a.host.statistics().buffered_input == 0


async def test_a_half_sent_frame_times_out():
    async with open_node(_budget_config(frame_timeout=0.5)) as a, \
            open_node(_budget_config()) as b:
        errors: list = []
        await _serve_hello(a, errors)
        await b.connect(a.addrs[0])
        raw = await b.host.libp2p.new_stream(a.peer_id, [SINK])
        await raw.write(frame_header(FrameKind.MESSAGE, 100) + b"partial")
        start = trio.current_time()
        await _expect_reset(raw)
        assert trio.current_time() - start < 5
        assert "left unfinished" in str(errors[0])
        assert a.host.statistics().buffered_input == 0


async def test_large_frames_arrive_without_a_copy_and_small_ones_cost_no_window_update(
        two_nodes, monkeypatch):
    """The receive fast path (``net.read_owned``) on real Yamux streams: tensor
    frames are views of the buffers taken from Yamux, and a stream of small
    messages does not send a Yamux window update per read."""
    from libp2p.stream_muxer.yamux import yamux

    a, b = two_nodes
    updates = []
    original = yamux.YamuxStream.send_window_update

    async def counted(self, *args, **kwargs):
        updates.append(self.stream_id)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(yamux.YamuxStream, "send_window_update", counted)
    owners: list[str] = []
    messages = []

    async def handler(stream):
        while (item := await stream.receive(HELLO)) is not None:
            if isinstance(item, TensorChunk):
                owners.append(type(item.data.obj).__name__)
            else:
                messages.append(int(item[1].name))
        await stream.send_message(Hello(0, "done"), 0)

    a.set_stream_handler(SINK, handler)
    source = torch.arange(8 * MiB // 4, dtype=torch.float32)
    async with b.open_stream(a.peer_id, SINK) as stream:
        await stream.send_tensor(source, chunk_size=MiB)
        updates.clear()
        for i in range(300):
            await stream.send_message(Hello(i % 10, str(i)), i)
            await trio.lowlevel.checkpoint()  # one message per read, as a slow sender's would be
        await stream.close_write()
        await stream.receive_message(HELLO)
    assert messages == list(range(300))
    assert len(owners) == 8
    # Most chunks were taken whole from Yamux (a bytearray subclass), not copied
    # into the pool's buffers (plain bytearrays).
    assert sum(name != "bytearray" for name in owners) >= 6, owners
    assert len(updates) <= 4, len(updates)  # py-libp2p alone sends about one per read
