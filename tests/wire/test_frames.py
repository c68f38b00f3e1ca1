"""Frame decoder (sans-IO): round trips, limits, and fuzzing."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from p2pdl.errors import LocalProtocolError, RemoteProtocolError
from p2pdl.wire import FrameDecoder, FrameKind, MessageSet, TensorHeader, encode_message
from p2pdl.wire._frames import BufferPool, decode_credit, encode_credit, frame_header
from p2pdl.wire._tensor import decode_tensor_frame, encode_tensor_frame
from p2pdl.wire.config import MAX_FRAME_PAYLOAD

from .test_messages import Hello

LIMITS = dict(max_message_size=1 << 20, max_tensor_frame_size=MAX_FRAME_PAYLOAD)


def frame(kind: FrameKind, payload: bytes) -> bytes:
    return frame_header(kind, len(payload)) + payload


def test_round_trip_with_every_split_point():
    stream = (frame(FrameKind.MESSAGE, b"hello") + encode_credit(1234)
              + frame(FrameKind.TENSOR, bytes(range(256)) * 300) + frame(FrameKind.MESSAGE, b""))
    for split in range(0, len(stream), 97):
        decoder = FrameDecoder(**LIMITS)
        frames = decoder.feed(stream[:split]) + decoder.feed(stream[split:])
        assert [f.kind for f in frames] == [FrameKind.MESSAGE, FrameKind.CREDIT,
                                           FrameKind.TENSOR, FrameKind.MESSAGE]
        assert bytes(frames[0].payload) == b"hello"
        assert decode_credit(frames[1].payload) == 1234
        assert bytes(frames[2].payload) == bytes(range(256)) * 300
        assert decoder.buffered == 0
        decoder.check_complete()


def test_a_large_frame_whole_in_an_owned_chunk_is_a_view_not_a_copy():
    big = bytes(range(256)) * 1024  # 256 KiB
    chunk = bytearray(frame(FrameKind.TENSOR, big) + frame(FrameKind.MESSAGE, b"hi")
                      + frame(FrameKind.TENSOR, big)[:1000])
    decoder = FrameDecoder(**LIMITS)
    frames = decoder.feed(chunk, owned=True)
    assert [f.kind for f in frames] == [FrameKind.TENSOR, FrameKind.MESSAGE]
    payload = frames[0].payload
    assert isinstance(payload, memoryview) and not payload.readonly
    assert payload.obj is chunk and bytes(payload) == big  # the chunk's own bytes
    assert isinstance(frames[1].payload, bytearray)  # small frames are copied out
    # The partial third frame holds its small start as a copy, and says what it lacks.
    assert decoder.held == 1000 - 5
    assert decoder.wanted(b"") == len(big) - (1000 - 5)
    # Not owned (bytes, read-only): a copy the frame owns, writable.
    copied = FrameDecoder(**LIMITS).feed(bytes(chunk[:5 + len(big)]))[0].payload
    assert isinstance(copied, bytearray) and bytes(copied) == big


def test_wanted_is_the_whole_next_frame_as_far_as_its_header_shows():
    decoder = FrameDecoder(**LIMITS)
    assert decoder.wanted(b"") == 5
    assert decoder.wanted(b"\x02\x00") == 5
    assert decoder.wanted(frame_header(FrameKind.TENSOR, 70000)) == 70005
    # An announced length over the protocol limit asks no more than the limit.
    assert decoder.wanted(struct.pack(">BI", 2, 2**32 - 1)) == 5 + MAX_FRAME_PAYLOAD
    decoder.feed(frame_header(FrameKind.TENSOR, 70000) + bytes(100))
    assert decoder.wanted(b"") == 69900


def test_byte_by_byte():
    stream = frame(FrameKind.MESSAGE, b"abc") * 3
    decoder = FrameDecoder(**LIMITS)
    frames = [f for i in range(len(stream)) for f in decoder.feed(stream[i:i + 1])]
    assert [bytes(f.payload) for f in frames] == [b"abc"] * 3


def test_oversized_message_rejected_at_its_header():
    decoder = FrameDecoder(max_message_size=1000, max_tensor_frame_size=MAX_FRAME_PAYLOAD)
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        decoder.feed(struct.pack(">BI", FrameKind.MESSAGE, 1001))  # no payload needed


def test_unknown_kind_rejected():
    with pytest.raises(RemoteProtocolError, match="unknown frame kind"):
        FrameDecoder(**LIMITS).feed(b"\x09\x00\x00\x00\x01x")


def test_truncated_frame_detected_at_end_of_stream():
    decoder = FrameDecoder(**LIMITS)
    decoder.feed(frame(FrameKind.MESSAGE, b"abcdef")[:-2])
    with pytest.raises(RemoteProtocolError, match="ended inside a frame"):
        decoder.check_complete()


def test_bad_credit_frames():
    with pytest.raises(RemoteProtocolError):
        FrameDecoder(**LIMITS).feed(frame(FrameKind.CREDIT, b"\x00\x00\x01"))
    decoder = FrameDecoder(**LIMITS)
    (f,) = decoder.feed(frame(FrameKind.CREDIT, b"\x00\x00\x00\x00"))
    with pytest.raises(RemoteProtocolError, match="zero"):
        decode_credit(f.payload)
    with pytest.raises(LocalProtocolError):
        encode_credit(0)


def test_local_frame_over_protocol_limit():
    with pytest.raises(LocalProtocolError):
        frame_header(FrameKind.TENSOR, MAX_FRAME_PAYLOAD + 1)


def test_buffer_pool_never_reuses_a_buffer_still_referenced():
    pool = BufferPool(max_buffers=4)
    first = pool(1 << 20)
    first[:4] = b"keep"
    view = memoryview(first)
    del first
    second = pool(1 << 20)
    assert bytes(view[:4]) == b"keep"
    assert second is not view.obj
    del view
    assert pool(1 << 20) is not None


# -- fuzzing: whatever the bytes, only RemoteProtocolError ----------------------------

MESSAGES = MessageSet(Hello)


def _decode_everything(data: bytes, splits: list[int]) -> None:
    decoder = FrameDecoder(max_message_size=4096, max_tensor_frame_size=65536)
    pos = 0
    for cut in sorted(splits) + [len(data)]:
        for f in decoder.feed(data[pos:cut]):
            if f.kind is FrameKind.MESSAGE:
                MESSAGES.decode(f.payload)
            elif f.kind is FrameKind.TENSOR:
                decode_tensor_frame(f.payload)
            else:
                decode_credit(f.payload)
        pos = max(pos, cut)
    decoder.check_complete()


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=512), st.lists(st.integers(0, 512), max_size=4))
def test_fuzz_random_bytes_raise_only_remote_protocol_error(data, splits):
    try:
        _decode_everything(data, splits)
    except RemoteProtocolError:
        pass


_kinds = st.sampled_from([1, 2, 3, 7])


@st.composite
def framed_garbage(draw):
    """Frames with plausible headers around random or half-valid payloads."""
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(_kinds)
        payload = draw(st.one_of(
            st.binary(max_size=200),
            st.just(encode_message(Hello(1, "x"), 3)),
            st.builds(lambda b: struct.pack(">H", len(b)) + b + b"\0" * 8, st.binary(max_size=64)),
        ))
        length = draw(st.one_of(st.just(len(payload)), st.integers(0, 2**32 - 1)))
        parts.append(struct.pack(">BI", kind, length) + payload)
    return b"".join(parts)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(framed_garbage(), st.lists(st.integers(0, 1000), max_size=3))
def test_fuzz_structured_frames_raise_only_remote_protocol_error(data, splits):
    try:
        _decode_everything(data, splits)
    except RemoteProtocolError:
        pass


def test_valid_tensor_frame_decodes():
    header = TensorHeader(part=3, dtype="float16", shape=(4, 5), offset=8, count=6)
    data = bytes(12)
    prefix = encode_tensor_frame(header, len(data), request_id=9)
    (f,) = FrameDecoder(**LIMITS).feed(prefix + data)
    chunk = decode_tensor_frame(f.payload)
    assert chunk.request_id == 9 and chunk.header == header and bytes(chunk.data) == data


# -- memory: buffers grow with the bytes that arrived ----------------------------------

def _allocated_while(action) -> int:
    import gc
    import tracemalloc
    gc.collect()
    tracemalloc.start()
    try:
        kept = action()
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del kept
    return size


def test_a_large_frame_header_alone_allocates_nothing():
    # A peer announced a 4 MiB TENSOR frame and sent nothing more: the node
    # must not set 4 MiB aside for it (64 such streams per peer cost 260 MiB).
    decoder = FrameDecoder(**LIMITS, alloc=BufferPool(max_buffers=4))
    header = frame_header(FrameKind.TENSOR, 4 << 20)
    assert _allocated_while(lambda: decoder.feed(header)) < 64 * 1024
    assert decoder.buffered == 0


def test_a_partial_frame_holds_about_what_arrived():
    decoder = FrameDecoder(**LIMITS, alloc=BufferPool(max_buffers=4))
    data = frame_header(FrameKind.TENSOR, 4 << 20) + bytes(300 * 1024)
    held = _allocated_while(lambda: (decoder.feed(bytes(data[:5])), decoder.feed(data[5:]),
                                     data))
    assert held < 2 * len(data) + 64 * 1024
    assert decoder.buffered == 300 * 1024 + 0


def test_a_frame_sent_in_tiny_pieces_costs_no_more_than_its_bytes():
    decoder = FrameDecoder(**LIMITS)
    payload = bytes(range(256)) * 1024  # 256 KiB
    data = frame_header(FrameKind.TENSOR, len(payload)) + payload
    frames = decoder.feed(data[:5])

    def feed_bytewise() -> int:
        for i in range(5, len(data) - 1):
            frames.extend(decoder.feed(data[i:i + 1]))
        return decoder.buffered

    assert _allocated_while(feed_bytewise) < 2 * len(payload) + 64 * 1024
    frames += decoder.feed(data[-1:])
    assert [bytes(f.payload) for f in frames] == [payload]
