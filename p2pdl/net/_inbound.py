"""Inbound streams: every stream a peer opens to the node, bounded and contained.

Every inbound stream -- its multistream-select negotiation, then its
handler, whether one of p2pdl's protocols or one of py-libp2p's own
(identify, identify push, ``/ipfs/ping``, circuit relay hop and stop,
DCUtR) -- runs under :class:`InboundStreams`:

* A peer may have at most ``HostConfig.max_inbound_streams_per_peer``
  inbound streams open at once, negotiating or served; more are reset
  before they are read.
* Nothing a stream raises reaches py-libp2p (where it would end the
  connection's tasks, or the process): the stream is reset, counted per
  protocol (:class:`HostStatistics`), and logged once at INFO per peer and
  protocol, then at DEBUG -- never as a traceback, unless the error is the
  node's own (a bug, not bad input).
* A stream of one of py-libp2p's protocols must get its first answer
  within ``HostConfig.inbound_handshake_timeout``; after its handler
  returns, the peer has ``CLOSE_LINGER`` seconds to close its side, then
  the stream is reset (py-libp2p left such streams, and the bytes a peer
  kept sending on them, open for as long as the connection lived).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from libp2p.abc import IHost, INetStream
from libp2p.network.stream.exceptions import StreamEOF
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.protocol import STOP_PROTOCOL_ID

from ..errors import CallTimeoutError, RemoteProtocolError, StreamClosedError
from .config import HostConfig

__all__ = ["InboundStreams", "StreamHandler", "InboundStatistics", "reset_stream",
           "CLOSE_LINGER", "MULTISTREAM"]

logger = logging.getLogger(__name__)

StreamHandler = Callable[[INetStream], Awaitable[None]]

#: How long the peer has to close its side of a finished py-libp2p stream (s).
CLOSE_LINGER = 2.0
#: Bytes read, at most, from a finished py-libp2p stream while waiting for its end.
DRAIN_LIMIT = 64 * 1024
#: The ``protocol_errors`` key of streams that failed before a protocol was agreed.
MULTISTREAM = "/multistream/1.0.0"
#: Peer and protocol pairs whose first error was logged at INFO (then DEBUG).
MAX_LOGGED_PAIRS = 4096
#: py-libp2p protocols whose stream lives on after the handler returns: a
#: circuit relay stop stream carries the relayed connection.
STREAM_OUTLIVES_HANDLER = frozenset({str(STOP_PROTOCOL_ID)})

#: Errors that say the peer, or its connection, misbehaved or went away.
_REMOTE_ERRORS = (RemoteProtocolError, StreamClosedError, CallTimeoutError)


@dataclasses.dataclass(frozen=True)
class InboundStatistics:
    """What the host refused or reset of its inbound streams, since it started.

    Attributes:
        open_streams: inbound streams open now.
        refused_streams: streams reset at once because their peer had
            ``max_inbound_streams_per_peer`` open.
        failed_negotiations: streams whose multistream-select negotiation
            failed (bad input, an unknown protocol, a reset).
        protocol_errors: streams reset for bad input or a handler's error,
            per protocol id.
        timeouts: streams of py-libp2p's protocols reset for getting no
            answer within ``inbound_handshake_timeout``, per protocol id.
    """

    open_streams: int
    refused_streams: int
    failed_negotiations: int
    protocol_errors: dict[str, int]
    timeouts: dict[str, int]


async def reset_stream(stream: INetStream, timeout: float = 2.0) -> None:
    """Reset a libp2p stream, shielded from cancellation and bounded by ``timeout``.

    Shielded so that a reset asked for is a reset sent, even by a task being
    cancelled.
    """
    with trio.CancelScope(shield=True), trio.move_on_after(timeout):
        try:
            await stream.reset()
        except Exception:  # the stream or connection may already be gone
            logger.debug("resetting a stream failed", exc_info=True)


def is_remote_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or every error of an exception group) is the peer's doing."""
    pending, seen = [exc], 0
    while pending and seen < 64:  # bounded: groups are small, never trust a cycle
        current = pending.pop()
        seen += 1
        inner = getattr(current, "exceptions", None)
        if inner:
            pending.extend(inner)
        elif not isinstance(current, _REMOTE_ERRORS):
            return False
    return not pending


def _first_remote_error(exc: BaseException) -> BaseException:
    current = exc
    for _ in range(16):
        inner = getattr(current, "exceptions", None)
        if not inner:
            return current
        current = inner[0]
    return current


class InboundStreams:
    """Serves every inbound stream of a py-libp2p host (see the module docstring)."""

    def __init__(self, libp2p_host: IHost, config: HostConfig) -> None:
        self._host = libp2p_host
        self._config = config
        self._open: collections.Counter[ID] = collections.Counter()
        self._ours: set[str] = set()
        self._refused = 0
        self._failed_negotiations = 0
        self._errors: collections.Counter[str] = collections.Counter()
        self._timeouts: collections.Counter[str] = collections.Counter()
        self._logged: collections.OrderedDict[tuple[Any, str], None] = collections.OrderedDict()
        network = libp2p_host.get_network()
        # py-libp2p's host negotiates the protocol and runs its handler here.
        self._negotiate_and_serve = network.common_stream_handler  # type: ignore[attr-defined]
        network.set_stream_handler(self._serve)  # type: ignore[attr-defined]

    def statistics(self) -> InboundStatistics:
        return InboundStatistics(sum(self._open.values()), self._refused,
                                 self._failed_negotiations, dict(self._errors),
                                 dict(self._timeouts))

    # -- every stream -------------------------------------------------------------

    async def _serve(self, stream: INetStream) -> None:
        peer = stream.muxed_conn.peer_id
        limit = self._config.max_inbound_streams_per_peer
        if self._open[peer] >= limit:
            self._refused += 1
            self._log(peer, "streams", "peer %s has %d streams open to us; resetting "
                      "new ones", peer, limit)
            await reset_stream(stream)
            return
        self._open[peer] += 1
        try:
            await self._negotiate_and_serve(stream)
            if stream.get_protocol() is None:
                self._failed_negotiations += 1
        except Exception as exc:
            # Only py-libp2p's own handlers get here; ours contain their errors.
            protocol = str(stream.get_protocol() or MULTISTREAM)
            self._errors[protocol] += 1
            self._log(peer, protocol, "%s from %s failed, stream reset: %s", protocol, peer,
                      _describe(exc))
            await reset_stream(stream)
        finally:
            self._open[peer] -= 1
            if self._open[peer] <= 0:
                del self._open[peer]

    def _log(self, peer: Any, what: str, message: str, *args: Any) -> None:
        """Log at INFO the first time for ``(peer, what)``, at DEBUG afterwards."""
        key = (peer, what)
        if key in self._logged:
            logger.debug(message, *args)
            return
        self._logged[key] = None
        if len(self._logged) > MAX_LOGGED_PAIRS:
            self._logged.popitem(last=False)
        logger.info(message + " (further ones from this peer at DEBUG)", *args)

    # -- p2pdl's protocols --------------------------------------------------------

    def set_stream_handler(self, protocol_id: str, handler: StreamHandler) -> None:
        self._ours.add(protocol_id)

        async def run_handler(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id
            try:
                await handler(stream)
            except Exception as exc:
                if not is_remote_failure(exc):
                    self._errors[protocol_id] += 1
                    logger.exception("handler of %s failed on a stream from %s",
                                     protocol_id, peer)
                elif isinstance(_first_remote_error(exc), RemoteProtocolError):
                    self._errors[protocol_id] += 1
                    self._log(peer, protocol_id, "%s from %s: protocol error, stream reset: %s",
                              protocol_id, peer, _describe(exc))
                else:
                    logger.debug("%s from %s: %s", protocol_id, peer, _describe(exc))
                await reset_stream(stream)

        self._host.set_stream_handler(protocol_id, run_handler)  # type: ignore[arg-type]

    # -- py-libp2p's protocols ----------------------------------------------------

    def guard_libp2p_handlers(self) -> None:
        """Put every handler py-libp2p registered (not ours) under a handshake deadline.

        Called once its protocols run (relay and hole punching register theirs
        when they start).  Idempotent.
        """
        mux = self._host.get_mux()
        for protocol, handler in list(mux.handlers.items()):
            if protocol is None or handler is None or str(protocol) in self._ours \
                    or getattr(handler, "_p2pdl_guarded", False):
                continue
            mux.add_handler(protocol, self._guarded(str(protocol), handler))

    def _guarded(self, protocol: str, handler: StreamHandler) -> StreamHandler:
        timeout = self._config.inbound_handshake_timeout
        linger = protocol not in STREAM_OUTLIVES_HANDLER

        async def guarded(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id
            with trio.CancelScope(deadline=trio.current_time() + timeout) as scope:
                write = stream.write

                async def write_lifting_deadline(data: bytes) -> None:
                    scope.deadline = math.inf  # answered: the protocol's own timeouts rule
                    await write(data)

                stream.write = write_lifting_deadline  # type: ignore[method-assign]
                try:
                    await handler(stream)
                finally:
                    del stream.write  # the class's method again
            if scope.cancelled_caught:
                self._timeouts[protocol] += 1
                self._log(peer, protocol, "%s from %s: no answer within %.0f s, stream reset",
                          protocol, peer, timeout)
                await reset_stream(stream)
            elif linger:
                await _finish(stream)

        guarded._p2pdl_guarded = True  # type: ignore[attr-defined]
        return guarded


async def _finish(stream: INetStream) -> None:
    """Give the peer ``CLOSE_LINGER`` seconds to close its side, then reset the stream."""
    received = 0
    with trio.move_on_after(CLOSE_LINGER):
        while received <= DRAIN_LIMIT:
            try:
                data = await stream.read(DRAIN_LIMIT)
            except StreamEOF:
                data = b""
            except Exception:  # reset, or a closed connection: the stream is gone
                return
            if not data:  # the peer closed its side: close ours, if the handler did not
                try:
                    await stream.close()
                except Exception:  # already closed, or the connection is gone
                    pass
                return
            received += len(data)
    await reset_stream(stream)


def _describe(exc: BaseException) -> str:
    inner = _first_remote_error(exc)
    return str(inner) or type(inner).__name__
