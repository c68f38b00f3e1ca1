"""In-memory streams that behave like py-libp2p's ``INetStream`` as p2pdl uses it.

A :class:`MemoryStream` is one end of a pair made by :func:`memory_stream_pair`.
What :class:`~p2pdl.wire.FramedStream` and the host read of a libp2p stream
is all there is: ``read(n)``, ``write(data)``, ``close_write()``, ``close()``,
``reset()``, ``get_protocol()``, ``get_remote_address()`` and
``muxed_conn.peer_id``, with py-libp2p's errors:

* ``read`` returns between 1 and ``n`` bytes, in the order they were
  written; once the other end half-closed and everything it sent was read,
  it raises ``StreamEOF``;
* ``write`` waits while the other end's buffer holds ``window`` bytes
  (bounded, as a muxer's window is); after a local ``close_write`` it raises
  ``StreamClosed``;
* after a reset by either end, or the loss of the connection, both ends'
  reads and writes raise ``StreamReset`` and whatever was buffered is gone.

Bytes written become readable ``latency`` seconds later (trio's clock), and
not at all while the :class:`Link` is down (a partition): they wait, as
TCP would retransmit them, until it is up again.  Every state change is
synchronous, so a test can cut a connection from plain code.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import trio
from libp2p.network.stream.exceptions import StreamClosed, StreamEOF, StreamReset

__all__ = ["DEFAULT_WINDOW", "Link", "MemoryStream", "memory_stream_pair"]

#: Bytes a stream buffers towards its reader before writes wait (yamux's default window).
DEFAULT_WINDOW = 256 * 1024


class Link:
    """Whether the two ends of a stream can exchange bytes now (a partition says not).

    ``up`` is asked at every read and write; :meth:`MemoryStream.wake` must be
    called when its answer changes, so that waiting ends re-check it.
    """

    def __init__(self, up: Callable[[], bool] = lambda: True) -> None:
        self._up = up

    @property
    def up(self) -> bool:
        return self._up()


class _Pipe:
    """One direction of a stream: what the writer sent and the reader has not read."""

    def __init__(self, window: int) -> None:
        self.window = window
        self.chunks: collections.deque[tuple[float, bytes]] = collections.deque()
        self.buffered = 0
        self.eof_at: float | None = None  # when the writer's half-close becomes readable
        self.readers = trio.lowlevel.ParkingLot()
        self.writers = trio.lowlevel.ParkingLot()
        self.bytes_written = 0

    def wake(self) -> None:
        self.readers.unpark_all()
        self.writers.unpark_all()

    def clear(self) -> None:
        self.chunks.clear()
        self.buffered = 0
        self.wake()


class _Pair:
    """What both ends of a stream share: the two pipes, the reset flag, the link."""

    def __init__(self, window: int, latency: float, link: Link) -> None:
        self.pipes = (_Pipe(window), _Pipe(window))
        self.latency = latency
        self.link = link
        self.reset_reason: str | None = None
        self.write_closed = [False, False]
        self.on_done: Callable[[], None] | None = None

    @property
    def done(self) -> bool:
        """Reset, or both ends half-closed: nothing more can happen on it."""
        return self.reset_reason is not None or all(self.write_closed)

    def reset(self, reason: str) -> None:
        if self.reset_reason is not None:
            return
        self.reset_reason = reason
        for pipe in self.pipes:
            pipe.clear()
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.done and self.on_done is not None:
            on_done, self.on_done = self.on_done, None
            on_done()

    def wake(self) -> None:
        for pipe in self.pipes:
            pipe.wake()


class _ConnView:
    """What a stream's ``muxed_conn`` says: the peer at the other end."""

    def __init__(self, peer_id: Any, remote_address: tuple[str, int] | None) -> None:
        self.peer_id = peer_id
        self._remote_address = remote_address

    def get_remote_address(self) -> tuple[str, int] | None:
        return self._remote_address


class MemoryStream:
    """One end of an in-memory stream (see the module docstring for its rules)."""

    def __init__(self, pair: _Pair, side: int, protocol_id: str, remote_peer: Any,
                 remote_address: tuple[str, int] | None) -> None:
        self._pair = pair
        self._side = side
        self._incoming = pair.pipes[1 - side]
        self._outgoing = pair.pipes[side]
        self._protocol_id = protocol_id
        self.muxed_conn = _ConnView(remote_peer, remote_address)

    # -- what FramedStream and the host read -------------------------------

    def get_protocol(self) -> str:
        return self._protocol_id

    def set_protocol(self, protocol_id: str) -> None:
        self._protocol_id = protocol_id

    def get_remote_address(self) -> tuple[str, int] | None:
        return self.muxed_conn.get_remote_address()

    async def read(self, n: int | None = None) -> bytes:
        """Up to ``n`` bytes (None or -1: all that is readable), at least one.

        Raises ``StreamEOF`` after the other end's half-close, ``StreamReset``
        after a reset.  Cancel-safe: a cancelled read takes nothing.
        """
        await trio.lowlevel.checkpoint()
        pipe = self._incoming
        while True:  # each round either returns, raises or waits for a change
            if self._pair.reset_reason is not None:
                raise StreamReset(self._pair.reset_reason)
            if not self._pair.link.up:
                await pipe.readers.park()
                continue
            now = trio.current_time()
            if pipe.chunks:
                at, _ = pipe.chunks[0]
                if at <= now:
                    return self._take(n)
                with trio.move_on_at(at):
                    await pipe.readers.park()
                continue
            if pipe.eof_at is not None:
                if pipe.eof_at <= now:
                    raise StreamEOF("the other end closed the stream for writing")
                with trio.move_on_at(pipe.eof_at):
                    await pipe.readers.park()
                continue
            await pipe.readers.park()

    def _take(self, n: int | None) -> bytes:
        pipe = self._incoming
        limit = None if n is None or n < 0 else max(1, n)
        now = trio.current_time()
        out = bytearray()
        while pipe.chunks and pipe.chunks[0][0] <= now and (limit is None or len(out) < limit):
            at, data = pipe.chunks.popleft()
            room = len(data) if limit is None else limit - len(out)
            out += data[:room]
            if room < len(data):
                pipe.chunks.appendleft((at, data[room:]))
        pipe.buffered -= len(out)
        pipe.writers.unpark_all()
        return bytes(out)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Send ``data``, waiting while the other end's buffer is full.

        Raises ``StreamClosed`` after a local half-close and ``StreamReset``
        after a reset.  A write cancelled while it waits may have sent a
        prefix of ``data`` (as a muxer's may).
        """
        await trio.lowlevel.checkpoint()
        pipe = self._outgoing
        view = memoryview(bytes(data))
        while True:  # bounded by len(data): every round sends some bytes or waits
            if self._pair.reset_reason is not None:
                raise StreamReset(self._pair.reset_reason)
            if self._pair.write_closed[self._side]:
                raise StreamClosed("the stream is closed for writing")
            if not view:
                return
            room = pipe.window - pipe.buffered
            if room <= 0:
                await pipe.writers.park()
                continue
            piece, view = bytes(view[:room]), view[room:]
            pipe.chunks.append((trio.current_time() + self._pair.latency, piece))
            pipe.buffered += len(piece)
            pipe.bytes_written += len(piece)
            pipe.readers.unpark_all()

    async def close_write(self) -> None:
        """Half-close: the other end reads EOF after what was sent.  Idempotent.

        Done even by a cancelled task (then the cancellation is raised).
        """
        self._close_write()
        await trio.lowlevel.checkpoint()

    def _close_write(self) -> None:
        if self._pair.write_closed[self._side] or self._pair.reset_reason is not None:
            return
        self._pair.write_closed[self._side] = True
        self._outgoing.eof_at = trio.current_time() + self._pair.latency
        self._outgoing.readers.unpark_all()
        self._pair._maybe_done()

    async def close(self) -> None:
        """As py-libp2p's over yamux: a half-close (reading what is buffered still works)."""
        await self.close_write()

    async def reset(self) -> None:
        """Abort both directions at once.  Never raises, but a cancelled task's
        cancellation (after the reset is done)."""
        self._pair.reset("the stream was reset")
        await trio.lowlevel.checkpoint()

    # -- for the memory host and tests -------------------------------------

    @property
    def is_reset(self) -> bool:
        return self._pair.reset_reason is not None

    @property
    def done(self) -> bool:
        """Reset, or half-closed by both ends."""
        return self._pair.done

    @property
    def buffered(self) -> int:
        """Bytes sent by this end that the other has not read yet."""
        return self._outgoing.buffered

    @property
    def bytes_written(self) -> int:
        return self._outgoing.bytes_written

    def wake(self) -> None:
        """Make waiting reads and writes look again (the link changed)."""
        self._pair.wake()


def memory_stream_pair(protocol_id: str, peers: tuple[Any, Any], *,
                       addresses: tuple[tuple[str, int] | None, tuple[str, int] | None] = (
                           None, None),
                       window: int = DEFAULT_WINDOW, latency: float = 0.0,
                       link: Link | None = None,
                       on_done: Callable[[], None] | None = None
                       ) -> tuple[MemoryStream, MemoryStream]:
    """Two connected ends of a ``protocol_id`` stream between ``peers[0]`` and ``peers[1]``.

    The first end is ``peers[0]``'s: its ``muxed_conn.peer_id`` is
    ``peers[1]``.  ``addresses`` are the peers' ``(ip, port)`` as the other
    sees them; ``on_done`` runs once, when the stream is reset or half-closed
    by both ends.
    """
    if window < 1:
        raise ValueError("window must be at least 1 byte")
    if latency < 0:
        raise ValueError("latency must be >= 0")
    pair = _Pair(window, latency, link or Link())
    pair.on_done = on_done
    return (MemoryStream(pair, 0, protocol_id, peers[1], addresses[1]),
            MemoryStream(pair, 1, protocol_id, peers[0], addresses[0]))
