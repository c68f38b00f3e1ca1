"""Frame layer of the p2pdl wire: bytes in, frames out.  No I/O here.

A frame is ``kind (1 byte) | payload length (u32, big-endian) | payload``.
Kinds are MESSAGE (a msgpack envelope), TENSOR (a tensor header and raw
bytes) and CREDIT (flow-control credit).  See protocols/wire.md.
"""

from __future__ import annotations

import enum
import struct
import sys
from collections.abc import Callable
from typing import NamedTuple

from ..errors import LocalProtocolError, RemoteProtocolError
from .config import FRAME_HEADER_SIZE, MAX_FRAME_PAYLOAD

_HEADER = struct.Struct(">BI")
_CREDIT = struct.Struct(">I")

class FrameKind(enum.IntEnum):
    MESSAGE = 1
    TENSOR = 2
    CREDIT = 3


class Frame(NamedTuple):
    kind: FrameKind
    #: Writable and the frame's own: a buffer, or a view of a received chunk
    #: that nothing else refers to (a large frame that arrived whole).
    payload: bytearray | memoryview

    @property
    def wire_size(self) -> int:
        """Bytes this frame took on the wire, header included (what credit counts)."""
        return FRAME_HEADER_SIZE + len(self.payload)


def frame_header(kind: FrameKind, payload_length: int) -> bytes:
    if payload_length > MAX_FRAME_PAYLOAD:
        raise LocalProtocolError(
            f"frame payload of {payload_length} bytes exceeds the protocol limit "
            f"of {MAX_FRAME_PAYLOAD} bytes"
        )
    return _HEADER.pack(kind, payload_length)


def encode_credit(increment: int) -> bytes:
    if not 0 < increment < 2**32:
        raise LocalProtocolError(f"credit increment {increment} out of range")
    return _HEADER.pack(FrameKind.CREDIT, _CREDIT.size) + _CREDIT.pack(increment)


def decode_credit(payload: bytes | bytearray) -> int:
    if len(payload) != _CREDIT.size:
        raise RemoteProtocolError(f"CREDIT frame payload must be 4 bytes, got {len(payload)}")
    (increment,) = _CREDIT.unpack(payload)
    if increment == 0:
        raise RemoteProtocolError("CREDIT frame with a zero increment")
    return increment


class BufferPool:
    """Reuses large receive buffers once nothing outside the pool refers to them.

    Allocating (and zeroing, and page-faulting) a fresh megabyte for every
    received chunk costs about as much as the rest of the receive path; a
    buffer is reused only when its reference count shows that the consumer
    dropped every chunk, view and tensor built on it, so reuse is invisible.
    At most ``max_buffers`` buffers are tracked.
    """

    MIN_SIZE = 64 * 1024

    def __init__(self, max_buffers: int) -> None:
        self._max = max_buffers
        self._buffers: list[bytearray] = []

    def __call__(self, length: int) -> bytearray:
        if length >= self.MIN_SIZE:
            for buf in self._buffers:
                # References: the list, the loop variable, getrefcount's argument.
                if len(buf) == length and sys.getrefcount(buf) <= 3:
                    return buf
        buf = bytearray(length)
        if length >= self.MIN_SIZE:
            if len(self._buffers) >= self._max:
                self._buffers.pop(0)
            self._buffers.append(buf)
        return buf


class FrameDecoder:
    """Turns a byte stream into frames, enforcing size limits as early as possible.

    An oversized frame is rejected as soon as its header arrives, before any of
    its payload is buffered.  What a partial frame holds grows with the bytes
    that arrived, never with the length its header announced: a frame of more
    than ``INLINE_PAYLOAD`` bytes is kept as the pieces that arrived (large
    pieces as views of the received chunks, small ones copied together) and
    gets its buffer -- from ``alloc``, a :class:`BufferPool` in a stream --
    only once it is complete.  Each payload byte is copied once into that
    buffer, which the frame then owns (writable, so tensors can be built on
    it without another copy) -- except a large frame that arrives whole in
    a chunk the caller owns (``feed(owned=True)``, a buffer taken from the
    muxer): its payload is a view of that chunk, with no copy at all.
    :attr:`held` is the memory a partial frame takes (a view keeps its
    whole chunk alive), for the node's input budget.
    ``feed`` raises :class:`RemoteProtocolError` on any violation; after that
    the decoder must not be used again.
    """

    #: Frames up to this size get their buffer when their header arrives.
    INLINE_PAYLOAD = 64 * 1024
    #: Pieces of a large frame smaller than this are copied together.
    MIN_PIECE = 64 * 1024

    def __init__(self, *, max_message_size: int, max_tensor_frame_size: int,
                 alloc: Callable[[int], bytearray] = bytearray) -> None:
        self._alloc = alloc
        self._limits = {
            FrameKind.MESSAGE: max_message_size,
            FrameKind.TENSOR: max_tensor_frame_size,
            FrameKind.CREDIT: _CREDIT.size,
        }
        self._header = bytearray()
        self._kind = FrameKind.MESSAGE
        self._length = 0
        self._filled = 0
        self._payload: bytearray | None = None  # a small frame's buffer
        self._pieces: list[memoryview | bytearray] | None = None  # a large frame's bytes
        self._pinned = 0  # bytes of the chunks that views of ``_pieces`` keep alive

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet form a whole frame."""
        return len(self._header) + self._filled

    @property
    def held(self) -> int:
        """Bytes of memory the frame being received takes now."""
        if self._payload is not None:
            return len(self._header) + len(self._payload)
        if self._pieces is not None:
            return len(self._header) + self._pinned + sum(
                len(p) for p in self._pieces if isinstance(p, bytearray))
        return len(self._header)

    def feed(self, data: bytes | bytearray | memoryview, *, owned: bool = False) -> list[Frame]:
        """Frames completed by ``data``.  ``owned``: nothing else will change ``data``
        (a buffer taken from the muxer), so views of it may be kept like views of bytes."""
        frames: list[Frame] = []
        view = memoryview(data).cast("B")
        # Views of an immutable or owned chunk are safe to keep; anything else is copied.
        keep_views = owned or isinstance(data, bytes)
        pos, end = 0, len(view)
        while pos < end:
            if self._payload is None and self._pieces is None:
                take = min(FRAME_HEADER_SIZE - len(self._header), end - pos)
                self._header += view[pos : pos + take]
                pos += take
                if len(self._header) == FRAME_HEADER_SIZE:
                    self._start_frame(frames)
                continue
            take = min(self._length - self._filled, end - pos)
            payload = self._payload
            if payload is not None:
                payload[self._filled : self._filled + take] = view[pos : pos + take]
            elif self._filled == 0 and take == self._length:  # the whole frame at once
                if owned and take >= self.MIN_PIECE:  # ours and writable: no copy
                    payload = view[pos : pos + take]
                else:
                    payload = self._alloc(take)
                    payload[:] = view[pos : pos + take]
            else:
                self._add_piece(view[pos : pos + take], keep_views and 2 * take >= end)
            self._filled += take
            pos += take
            if self._filled == self._length:
                frames.append(Frame(self._kind, payload if payload is not None
                                    else self._assemble()))
                self._payload = self._pieces = None
                self._filled = 0
        return frames

    def _add_piece(self, piece: memoryview, keep_view: bool) -> None:
        pieces = self._pieces
        assert pieces is not None
        if keep_view and len(piece) >= self.MIN_PIECE:
            pieces.append(piece)
            self._pinned += len(piece.obj)  # type: ignore[arg-type]
        elif pieces and isinstance(pieces[-1], bytearray):
            pieces[-1] += piece
        else:
            pieces.append(bytearray(piece))

    def _assemble(self) -> bytearray:
        pieces = self._pieces
        assert pieces is not None
        payload = self._alloc(self._length)
        offset = 0
        for piece in pieces:
            payload[offset : offset + len(piece)] = piece
            offset += len(piece)
        pieces.clear()
        self._pinned = 0
        return payload

    def _start_frame(self, frames: list[Frame]) -> None:
        raw_kind, length = _HEADER.unpack(self._header)
        self._header.clear()
        try:
            kind = FrameKind(raw_kind)
        except ValueError:
            raise RemoteProtocolError(f"unknown frame kind {raw_kind}") from None
        limit = self._limits[kind]
        if length > limit:
            raise RemoteProtocolError(
                f"{kind.name} frame of {length} bytes exceeds the limit of {limit} bytes"
            )
        if kind is FrameKind.CREDIT and length != _CREDIT.size:
            raise RemoteProtocolError(f"CREDIT frame payload must be 4 bytes, got {length}")
        if length == 0:
            frames.append(Frame(kind, bytearray()))
            return
        self._kind, self._length, self._filled = kind, length, 0
        if length <= self.INLINE_PAYLOAD:
            self._payload = self._alloc(length)
        else:
            self._pieces = []

    def discard(self) -> None:
        """Drop whatever a partial frame holds (the stream is over, or broken)."""
        self._header.clear()
        self._payload = self._pieces = None
        self._filled = self._pinned = 0

    def wanted(self, pending: bytes | bytearray) -> int:
        """Bytes of ``pending`` (received, not fed yet) that would complete a frame.

        With a frame in progress, what it still lacks; at a frame boundary,
        the whole next frame as far as ``pending`` shows its header.  The
        reader waits for that much so a large frame arrives in one piece.
        """
        if self._payload is not None or self._pieces is not None:
            return self._length - self._filled
        missing = FRAME_HEADER_SIZE - len(self._header)
        if len(pending) < missing:
            return missing
        header = bytes(self._header) + bytes(pending[:missing])
        _, length = _HEADER.unpack(header)
        return missing + min(length, MAX_FRAME_PAYLOAD)

    def check_complete(self) -> None:
        """Called at end of stream: a partial frame means the peer truncated it."""
        if self.buffered or self._payload is not None or self._pieces is not None:
            raise RemoteProtocolError(
                f"stream ended inside a frame ({self.buffered} bytes of it received)"
            )
