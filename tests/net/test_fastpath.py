"""The patches of py-libp2p's bulk path (p2pdl/net/_fastpath.py) keep the bytes exact."""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing
from libp2p.io.trio import TrioTCPStream
from libp2p.security.noise import io as noise_io
from libp2p.stream_muxer.yamux import yamux

import p2pdl  # noqa: F401 - installs the patches
from p2pdl.net import _fastpath

pytestmark = pytest.mark.timeout(60)


def test_the_patches_are_installed():
    assert TrioTCPStream.read is _fastpath._buffered_read
    assert noise_io.BaseNoiseMsgReadWriter.write_msg is _fastpath._write_msg_at_once
    assert yamux.MAX_MESSAGE_SIZE == _fastpath.YAMUX_FRAME_SIZE


@pytest.mark.parametrize("seed", range(3))
async def test_buffered_reads_return_the_stream_in_order_whatever_the_sizes(seed):
    rng = random.Random(seed)
    payload = rng.randbytes(3 * _fastpath.READ_AHEAD + 12345)
    left, right = trio.testing.memory_stream_pair()
    reader = TrioTCPStream(right)  # type: ignore[arg-type]
    got = bytearray()

    async def write():
        position = 0
        while position < len(payload):
            size = rng.choice([1, 7, 1000, 70000, 300000])
            await left.send_all(payload[position:position + size])
            position += size
        await left.send_eof()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        while True:
            n = rng.choice([None, 1, 2, 12, 65519, 262144, 1 << 20])
            data = await reader.read(n)
            if not data:
                break
            assert n is None or len(data) <= n
            got += data
    assert bytes(got) == payload


class _Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []

    async def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))


class _Plain(noise_io.BaseNoiseMsgReadWriter):
    """Noise framing with a stand-in cipher (adds a 16-byte tag)."""

    def __init__(self, conn) -> None:  # noqa: ANN001
        self.read_writer = noise_io.NoisePacketReadWriter(conn)

    def encrypt(self, data: bytes) -> bytes:
        return bytes(reversed(data)) + b"T" * 16

    def decrypt(self, data: bytes) -> bytes:
        return bytes(reversed(data[:-16]))


@pytest.mark.parametrize("size", [0, 1, noise_io.MAX_PLAINTEXT_LENGTH,
                                  noise_io.MAX_PLAINTEXT_LENGTH + 1, 256 * 1024 + 12])
async def test_one_write_per_noise_write_sends_the_same_bytes(size):
    message = random.Random(size).randbytes(size)
    patched, original = _Recorder(), _Recorder()
    await _fastpath._write_msg_at_once(_Plain(patched), message)
    await _fastpath._original_write_msg(_Plain(original), message)
    assert len(patched.writes) == 1
    assert patched.writes[0] == b"".join(original.writes)
