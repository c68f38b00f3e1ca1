"""py-libp2p 0.8.1's bulk data path, made cheaper per byte.

Moving a tensor through py-libp2p costs Python work per Yamux frame, per
Noise message and per socket call, not per byte: measured on the 2-core
machine this project develops on, about 13 CPU-seconds per GiB, which made
a 10M-value all-reduce among 4 processes CPU-bound.  Four patches, all
local to one connection and within the Yamux and Noise specs:

* **Buffered socket reads.**  py-libp2p reads a Noise message as a 2-byte
  length, then the body, each a ``receive_some`` of exactly that size -- at
  least two system calls and two trips through trio per 64 KiB.  Reads now
  take up to ``READ_AHEAD`` bytes from the socket and serve the exact sizes
  asked for from that buffer (at most ``READ_AHEAD`` bytes per connection).
* **One socket write per Noise write.**  A Yamux frame larger than a Noise
  message (65519 bytes of plaintext) was encrypted and written message by
  message; now every message of the frame is encrypted and the lot goes out
  in one write.  The bytes on the wire are the same.
* **Larger Yamux data frames.**  Yamux frames carried at most 64 KiB of data;
  now up to ``YAMUX_FRAME_SIZE`` (256 KiB), still never more than the
  receiver's window allows, as the Yamux spec requires.  A larger frame
  holds the connection longer (256 KiB is 42 ms at 50 Mbit/s) before a small
  message of another stream can go; 256 KiB kept most of the gain of 1 MiB.

* **A larger receive window.**  py-libp2p starts every Yamux stream at the
  protocol's 256 KiB window and grows it only when window updates follow
  each other within 4 RTTs, which on a quiet link they rarely do; a sender
  then waits for an update every 256 KiB, and on a capped link that update
  queues behind the data flowing the other way.  Streams now aim at
  ``YAMUX_WINDOW`` (4 MiB, go-yamux's limit is 16 MiB): a stream that is
  read grants it with its first window update; one that is never read
  stays at 256 KiB, so unread streams hold no more memory than before.

Measured with ``simulations/bench_allreduce.py`` (10M float32 values, 4
processes on 2 cores): about half the CPU per round (docs/allreduce.md).
Installed once, when the host module is imported; the version is pinned.
"""

from __future__ import annotations

import trio
from libp2p.io.trio import TrioTCPStream
from libp2p.security.noise import io as noise_io
from libp2p.stream_muxer.yamux import yamux

__all__ = ["install", "READ_AHEAD", "YAMUX_FRAME_SIZE", "YAMUX_WINDOW"]

#: Bytes asked of the socket per read, at most (also the most a connection buffers).
READ_AHEAD = 256 * 1024
#: Most bytes of one Yamux frame (header included); py-libp2p's default is 64 KiB.
YAMUX_FRAME_SIZE = 256 * 1024
#: The receive window a Yamux stream grants once it is read (py-libp2p starts at 256 KiB).
YAMUX_WINDOW = 4 * 1024 * 1024

_original_stream_init = yamux.YamuxStream.__init__


def _stream_init(self: yamux.YamuxStream, *args: object, **kwargs: object) -> None:
    _original_stream_init(self, *args, **kwargs)
    self.target_recv_window = max(self.target_recv_window, YAMUX_WINDOW)

_original_read = TrioTCPStream.read
_original_write_msg = noise_io.BaseNoiseMsgReadWriter.write_msg


async def _buffered_read(self: TrioTCPStream, n: int | None = None) -> bytes:
    """Up to ``n`` bytes, from the read-ahead buffer first (one reader at a time)."""
    state = self.__dict__
    lock = state.get("_p2pdl_read_lock")
    if lock is None:
        lock = state["_p2pdl_read_lock"] = trio.Lock()
    async with lock:
        buffered = state.get("_p2pdl_buffer")
        if buffered:
            if n is None or n >= len(buffered):
                state["_p2pdl_buffer"] = None
                return bytes(buffered)
            state["_p2pdl_buffer"] = buffered[n:]
            return bytes(buffered[:n])
        if n == 0:
            return b""
        data = await _original_read(self, READ_AHEAD if n is None else max(n, READ_AHEAD))
        if n is None or len(data) <= n:
            return data
        state["_p2pdl_buffer"] = memoryview(data)[n:]
        return data[:n]


async def _write_msg_at_once(self: noise_io.BaseNoiseMsgReadWriter, msg: bytes,
                             prefix_encoded: bool = False) -> None:
    """Encrypt ``msg`` as Noise messages (length-prefixed) and write them in one go."""
    if prefix_encoded:  # the handshake's first message: rare, keep the original
        await _original_write_msg(self, msg, prefix_encoded)
        return
    limit = noise_io.MAX_PLAINTEXT_LENGTH
    view = memoryview(msg)
    pieces = []
    for start in range(0, max(len(msg), 1), limit):
        encrypted = self.encrypt(bytes(view[start:start + limit]))
        pieces.append(len(encrypted).to_bytes(noise_io.SIZE_NOISE_MESSAGE_LEN, "big"))
        pieces.append(encrypted)
    await self.read_writer.read_write_closer.write(b"".join(pieces))


def install() -> None:
    """Install the four patches (idempotent)."""
    if TrioTCPStream.read is not _buffered_read:
        TrioTCPStream.read = _buffered_read  # type: ignore[method-assign]
    if noise_io.BaseNoiseMsgReadWriter.write_msg is not _write_msg_at_once:
        noise_io.BaseNoiseMsgReadWriter.write_msg = _write_msg_at_once  # type: ignore[method-assign]
    yamux.MAX_MESSAGE_SIZE = YAMUX_FRAME_SIZE
    if yamux.YamuxStream.__init__ is not _stream_init:
        yamux.YamuxStream.__init__ = _stream_init  # type: ignore[method-assign]
