"""py-libp2p 0.8.1's Yamux writes, made whole under cancellation.

Every Yamux frame -- data, window update, reset, half-close, ping -- goes
through ``Yamux._write_frame``, which encrypts it with Noise and writes it
to the socket.  Noise advances its nonce when it encrypts, and splits a
large frame into several Noise messages; a write cancelled half-way (a
timeout somewhere up the stack, a task torn down while its read was
sending a window update) leaves the peer unable to decrypt anything after
it, and the whole connection -- every stream on it -- dies.

The patch runs each frame write to its end, shielded from cancellation; a
cancellation takes effect right after.  It is bounded: a frame that cannot
be written within ``FRAME_WRITE_TIMEOUT`` (a peer that stopped reading its
socket) closes the connection, which half a frame would have broken anyway.
Installed once, when the host module is imported; the version is pinned.
"""

from __future__ import annotations

import logging

import trio
from libp2p.network.connection.exceptions import RawConnError
from libp2p.stream_muxer.yamux.yamux import Yamux

logger = logging.getLogger(__name__)

#: Longest time one Yamux frame (at most the stream window, 16 MiB) may take to write (s).
FRAME_WRITE_TIMEOUT = 120.0

_original_write_frame = Yamux._write_frame


async def _write_frame_whole(self: Yamux, data: bytes) -> None:
    with trio.CancelScope(shield=True) as scope:
        scope.deadline = trio.current_time() + FRAME_WRITE_TIMEOUT
        await _original_write_frame(self, data)
    if scope.cancelled_caught:
        logger.info("a %d-byte frame to %s was not written within %.0f s; closing the "
                    "connection", len(data), self.peer_id, FRAME_WRITE_TIMEOUT)
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            try:
                await self.secured_conn.close()
            except Exception:  # already broken
                logger.debug("closing the stalled connection failed", exc_info=True)
        raise RawConnError("frame write timed out; connection closed")


def install() -> None:
    """Patch ``Yamux._write_frame`` (idempotent)."""
    if Yamux._write_frame is not _write_frame_whole:
        Yamux._write_frame = _write_frame_whole  # type: ignore[method-assign]
