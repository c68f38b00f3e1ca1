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

One more, for p2pdl's own streams only (:func:`read_owned`, used by
:class:`~p2pdl.wire.FramedStream`):

* **Taking a Yamux stream's buffer.**  py-libp2p returns what a Yamux
  stream buffered as a fresh ``bytes`` copy of its buffer.  ``read_owned``
  takes the buffer itself when it holds data (the stream gets a new, empty
  one), so each received byte is copied once less; the caller owns what it
  gets.  It waits, briefly, for a large frame to be buffered whole (so the
  frame is a view of the buffer, with no copy at all), and returns window
  updates as go-yamux does, once half of the window is used up, rather than
  on nearly every read.  Anything unusual (a closed, reset or failed
  stream, a transport that is not Yamux) goes through py-libp2p's ``read``.

Measured with ``simulations/bench_allreduce.py`` (10M float32 values, 4
processes on 2 cores): about half the CPU per round (docs/allreduce.md).
Installed once, when the host module is imported; the version is pinned.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
from libp2p.io.trio import TrioTCPStream
from libp2p.network.stream.net_stream import NetStream, StreamState
from libp2p.security.noise import io as noise_io
from libp2p.stream_muxer.yamux import yamux

__all__ = ["install", "read_owned", "READ_AHEAD", "YAMUX_FRAME_SIZE", "YAMUX_WINDOW"]

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


_READABLE = (StreamState.OPEN, StreamState.CLOSE_WRITE)


async def read_owned(net_stream: object, n: int,
                     want: Callable[[bytearray], int] | None = None,
                     patience: float = 0.0) -> bytes | bytearray:
    """What ``net_stream`` has buffered, taken rather than copied when it can be.

    Returns a ``bytearray`` the caller owns (nothing else refers to it) or,
    on py-libp2p's path, ``bytes`` of at most ``n`` bytes.  A taken buffer
    may hold more than ``n`` bytes: at most the stream's receive window.
    With ``want``, waits up to ``patience`` seconds, while the sender's
    window allows it, until the buffer holds ``want(buffer)`` bytes (a
    whole frame, so that it arrives in one piece); then takes what is there.
    Waits for data as py-libp2p's Yamux does (on the stream's event).
    Errors and end of stream are py-libp2p's, as from ``net_stream.read``.
    """
    deadline: float | None = None
    while type(net_stream) is NetStream and net_stream._state in _READABLE:
        muxed = net_stream.muxed_stream
        if type(muxed) is not yamux.YamuxStream or muxed.closed or muxed.reset_received:
            break
        conn, stream_id = muxed.conn, muxed.stream_id
        if conn.streams.get(stream_id) is not muxed or conn.event_shutting_down.is_set():
            break
        buffers = conn.stream_buffers
        buffer = buffers.get(stream_id)
        if buffer is None:
            break
        if buffer:
            if want is not None and not muxed.recv_closed:
                missing = want(buffer) - len(buffer)
                if missing > 0 and missing <= muxed.recv_window:  # it can come: wait a little
                    now = trio.current_time()
                    if deadline is None:
                        deadline = now + patience
                    if now < deadline:
                        with trio.move_on_at(deadline):
                            await _wait_data(conn, stream_id)
                        continue
            buffers[stream_id] = bytearray()  # wrapped again where windows are enforced
            if hasattr(buffer, "_excess"):  # keep the window overrun count (net._hardening)
                buffers[stream_id]._excess = buffer._excess  # type: ignore[union-attr]
            # Window updates as go-yamux sends them: once half the window is
            # used up (py-libp2p sends one on nearly every read: one more
            # frame, Noise message and socket write per small message).
            if muxed.target_recv_window - muxed.recv_window >= muxed.target_recv_window // 2:
                await muxed._auto_tune_and_send_window_update(bytes_read=len(buffer))
            return buffer
        if muxed.recv_closed:
            break  # end of stream: py-libp2p says so
        if not await _wait_data(conn, stream_id):
            break
    return await net_stream.read(n)  # type: ignore[attr-defined, no-any-return]


async def _wait_data(conn: yamux.Yamux, stream_id: int) -> bool:
    """Wait for the stream's next data or state change, as py-libp2p's reader does."""
    event = conn.stream_events.get(stream_id)
    if event is None:
        return False
    await event.wait()
    if conn.stream_events.get(stream_id) is event:
        conn.stream_events[stream_id] = trio.Event()
    return True


def install() -> None:
    """Install the four patches (idempotent)."""
    if TrioTCPStream.read is not _buffered_read:
        TrioTCPStream.read = _buffered_read  # type: ignore[method-assign]
    if noise_io.BaseNoiseMsgReadWriter.write_msg is not _write_msg_at_once:
        noise_io.BaseNoiseMsgReadWriter.write_msg = _write_msg_at_once  # type: ignore[method-assign]
    yamux.MAX_MESSAGE_SIZE = YAMUX_FRAME_SIZE
    if yamux.YamuxStream.__init__ is not _stream_init:
        yamux.YamuxStream.__init__ = _stream_init  # type: ignore[method-assign]
