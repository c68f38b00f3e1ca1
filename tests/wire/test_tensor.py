"""Tensor frames: chunking, headers, zero-copy views."""

from __future__ import annotations

import pytest
import torch

from p2pdl.errors import LocalProtocolError, RemoteProtocolError
from p2pdl.wire import FrameDecoder, TensorHeader
from p2pdl.wire._tensor import (
    decode_tensor_frame,
    encode_tensor_frame,
    iter_tensor_chunks,
    tensor_bytes,
)
from p2pdl.wire.config import MAX_FRAME_PAYLOAD


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64,
                                   torch.uint8, torch.bool])
def test_chunks_reassemble_exactly(dtype):
    source = (torch.arange(1000) % 7).to(dtype).reshape(10, 100)
    name, shape, raw = tensor_bytes(source)
    out = torch.empty(source.numel(), dtype=dtype)
    decoder = FrameDecoder(max_message_size=1 << 20, max_tensor_frame_size=MAX_FRAME_PAYLOAD)
    chunks = 0
    for header, data in iter_tensor_chunks(5, name, shape, raw, chunk_bytes=300):
        (frame,) = decoder.feed(encode_tensor_frame(header, len(data)) + bytes(data))
        chunk = decode_tensor_frame(frame.payload)
        out[chunk.header.offset:chunk.header.offset + chunk.header.count] = chunk.to_tensor()
        chunks += 1
    assert chunks > 1
    assert torch.equal(out.reshape(shape), source)


def test_empty_tensor_is_one_empty_chunk():
    name, shape, raw = tensor_bytes(torch.empty(0, 3))
    ((header, data),) = list(iter_tensor_chunks(0, name, shape, raw, 1 << 20))
    assert header.count == 0 and len(data) == 0 and header.shape == (0, 3)


def test_non_contiguous_tensor_is_sent_in_logical_order():
    t = torch.arange(12.0).reshape(3, 4).t()
    _, shape, raw = tensor_bytes(t)
    assert torch.equal(torch.frombuffer(bytearray(raw), dtype=torch.float32).reshape(shape), t)


@pytest.mark.parametrize("fields, reason", [
    (dict(dtype="complex64"), "dtype"),
    (dict(offset=10, count=3), "exceeds"),
    (dict(shape=(2**30, 2**30)), "too large"),
])
def test_bad_headers(fields, reason):
    base = dict(part=0, dtype="float32", shape=(12,), offset=0, count=12)
    with pytest.raises(ValueError, match=reason):
        TensorHeader(**{**base, **fields})


def test_data_length_must_match_count_for_codec_none():
    header = TensorHeader(0, "float32", (4,), 0, 4)
    prefix = encode_tensor_frame(header, 15)
    payload = bytearray((prefix + bytes(15))[5:])
    with pytest.raises(RemoteProtocolError, match="carries 15 bytes"):
        decode_tensor_frame(payload)


def test_header_running_past_frame():
    with pytest.raises(RemoteProtocolError):
        decode_tensor_frame(bytearray(b"\x00\xff" + b"x" * 10))


def test_unsupported_tensor_is_local_error():
    with pytest.raises(LocalProtocolError):
        tensor_bytes(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(LocalProtocolError):
        tensor_bytes([1, 2, 3])  # type: ignore[arg-type]
