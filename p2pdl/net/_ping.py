"""The standard libp2p ping (``/ipfs/ping/1.0.0``), as a client.

Every libp2p implementation serves it (py-libp2p serves it for this host), so
it is how a p2pdl node measures the round trip to a peer that does not speak
p2pdl's own ping: 32 random bytes out, the same 32 bytes back.
"""

from __future__ import annotations

import secrets

import trio
from libp2p.network.stream.exceptions import StreamEOF, StreamError

from ..errors import P2PDLError, RemoteProtocolError, StreamClosedError
from ._addrs import PeerIDLike

__all__ = ["LIBP2P_PING_PROTOCOL_ID", "PING_SIZE", "ping_libp2p"]

LIBP2P_PING_PROTOCOL_ID = "/ipfs/ping/1.0.0"
#: Bytes of one standard ping (the spec's fixed size).
PING_SIZE = 32


async def ping_libp2p(host: object, peer: PeerIDLike) -> float:
    """Round-trip time to ``peer`` over ``/ipfs/ping/1.0.0``, in seconds.

    ``host`` is the node's :class:`~p2pdl.net.Host`.  Bounded by the caller
    (``trio.move_on_after``); raises :class:`ProtocolNotSupportedError` when the
    peer speaks neither ping, :class:`RemoteProtocolError` for a wrong answer.
    """
    stream = await host.new_stream(peer, LIBP2P_PING_PROTOCOL_ID)  # type: ignore[attr-defined]
    try:
        payload = secrets.token_bytes(PING_SIZE)
        start = trio.current_time()
        await stream.write(payload)
        answer = b""
        while len(answer) < PING_SIZE:  # bounded: each read returns at least one byte
            try:
                data = await stream.read(PING_SIZE - len(answer))
            except StreamEOF:
                data = b""
            if not data:
                raise StreamClosedError(f"{peer} closed the ping stream")
            answer += data
        elapsed = trio.current_time() - start
        if answer != payload:
            raise RemoteProtocolError(f"{peer} answered the standard ping with other bytes")
        return elapsed
    except StreamError as exc:
        raise StreamClosedError(f"ping stream with {peer} failed: {exc}") from None
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(2):
            try:
                await stream.close()
            except (StreamError, P2PDLError, OSError):
                pass  # the stream is gone: nothing to close
