"""Request/response over p2pdl streams.

A caller keeps one long-lived stream per (peer, protocol) and multiplexes
concurrent requests on it by request id; a response echoes its request's id.
This costs one round trip per call instead of a stream opening (multistream
negotiation) per call.  The server handles up to ``max_inflight_requests``
requests of a stream at once; beyond that it stops consuming, and credit flow
control holds the caller back.  A caller closes a stream idle for
``rpc_idle_timeout``; the server closes one idle for twice as long (a peer
that opened streams and asked nothing holds none of them for long).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Awaitable, Callable

import trio
from libp2p.abc import INetStream
from libp2p.peer.id import ID

from .._concurrency import open_service_nursery
from ..errors import (
    CallTimeoutError,
    LocalProtocolError,
    NodeClosedError,
    P2PDLError,
    RemoteError,
    RemoteProtocolError,
    RequestError,
    StreamClosedError,
)
from ..net import Host, PeerIDLike, parse_peer_id
from ._frames import Frame
from ._messages import ErrorReply, Message
from ._protocol import ERROR_CODES, RequestContext, RpcHandler, RpcProtocol
from ._stream import FramedStream, decode_frame, open_framed_stream
from ._tensor import TensorChunk
from .config import WireConfig

__all__ = ["RpcProtocol", "RequestContext", "RpcClient", "serve_rpc_stream", "ERROR_CODES"]

logger = logging.getLogger(__name__)


async def serve_rpc_stream(stream: FramedStream, protocol: RpcProtocol, handler: RpcHandler,
                           config: WireConfig) -> None:
    """Answer requests arriving on ``stream`` until the caller closes its side.

    While fewer than ``max_inflight_requests`` are being handled, a request is
    handed to its handler task straight from the stream's reader; beyond
    that, requests wait in the stream's bounded inbox (and credit holds the
    caller back) until a handler finishes.  Returns, so that the stream is
    closed, once no request was in flight for ``2 * rpc_idle_timeout``.
    """
    limiter = trio.Semaphore(config.max_inflight_requests)
    idle = _IdleWatch(limiter, config.max_inflight_requests, 2 * config.rpc_idle_timeout)
    async with open_service_nursery() as nursery:

        def start(request_id: int, request: Message) -> None:
            ctx = RequestContext(stream.peer_id, protocol.protocol_id, request_id)
            idle.touch()
            nursery.start_soon(_answer, stream, protocol, handler, config, ctx, request, limiter,
                               idle)

        def dispatch(frame: Frame) -> bool:
            try:
                limiter.acquire_nowait()
            except trio.WouldBlock:
                return False
            item = decode_frame(frame, protocol.requests)
            if isinstance(item, TensorChunk):
                limiter.release()
                raise RemoteProtocolError("tensor chunk on an RPC stream")
            start(*item)
            return True

        stream.set_dispatcher(dispatch)
        with trio.CancelScope() as serving:
            nursery.start_soon(idle.cancel_when_idle, serving)
            async for request_id, request in stream.iter_messages(protocol.requests):
                await limiter.acquire()
                start(request_id, request)
            await stream.wait_peer_done()
        if serving.cancelled_caught:
            stream.set_dispatcher(None)
            logger.debug("%s: closing the idle stream of %s", protocol.protocol_id, stream.peer_id)
            return
        idle.stop()
        if isinstance(stream.failure, RemoteProtocolError):
            raise stream.failure


class _IdleWatch:
    """Cancels a serving loop once no request was in flight for ``timeout`` seconds."""

    def __init__(self, limiter: trio.Semaphore, capacity: int, timeout: float) -> None:
        self._limiter = limiter
        self._capacity = capacity
        self._timeout = timeout
        self._last = trio.current_time()
        self._stopped = trio.Event()

    def touch(self) -> None:
        self._last = trio.current_time()

    def stop(self) -> None:
        self._stopped.set()

    async def cancel_when_idle(self, scope: trio.CancelScope) -> None:
        while not self._stopped.is_set():  # bounded: each pass waits ``timeout`` at most
            with trio.move_on_at(self._last + self._timeout):
                await self._stopped.wait()
                return
            busy = self._limiter.value < self._capacity
            if not busy and trio.current_time() - self._last >= self._timeout:
                scope.cancel()
                return
            if busy:
                self.touch()  # a request in flight: idle time starts when it ends


async def _answer(stream: FramedStream, protocol: RpcProtocol, handler: RpcHandler,
                  config: WireConfig, ctx: RequestContext, request: Message,
                  limiter: trio.Semaphore, idle: _IdleWatch) -> None:
    try:
        reply: Message
        with trio.move_on_after(config.handler_timeout) as scope:
            try:
                reply = await handler(ctx, request)
            except RequestError as exc:
                reply = ErrorReply(exc.code, exc.message)
            except RemoteProtocolError as exc:
                # The handler found the request unacceptable at the protocol
                # level: reset the stream; the serving loop reports the error.
                await stream._abort(exc)
                return
            except StreamClosedError:
                return
            except Exception:
                logger.exception("%s handler failed on a request from %s",
                                 protocol.protocol_id, ctx.peer_id)
                reply = ErrorReply("internal", "the handler failed")
        if scope.cancelled_caught:
            reply = ErrorReply("timeout", f"no answer within {config.handler_timeout:.0f} s")
        if not isinstance(reply, Message) or type(reply) not in protocol.responses:
            logger.error("%s handler returned %r, which is not a response type of the protocol",
                         protocol.protocol_id, type(reply).__name__)
            reply = ErrorReply("internal", "the handler returned an invalid response")
        await stream.send_message(reply, ctx.request_id)
    except (StreamClosedError, CallTimeoutError, RemoteProtocolError):
        pass  # the caller went away, or broke the protocol: the serving loop reports it
    finally:
        limiter.release()
        idle.touch()


class _Pending:
    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.result: Message | None = None
        self.error: BaseException | None = None


class _Channel:
    """One long-lived client stream to a (peer, protocol)."""

    def __init__(self, stream: FramedStream) -> None:
        self.stream = stream
        self.pending: dict[int, _Pending] = {}
        self.ids = itertools.count(1)
        self.closing = False
        self.idle_since = trio.current_time()

    async def request(self, message: Message) -> Message:
        request_id = next(self.ids)
        slot = self.pending[request_id] = _Pending()
        try:
            await self.stream.send_message(message, request_id)
            await slot.done.wait()
        finally:
            self.pending.pop(request_id, None)
            if not self.pending:
                self.idle_since = trio.current_time()
        if slot.error is not None:
            raise slot.error
        assert slot.result is not None
        if isinstance(slot.result, ErrorReply):
            raise RemoteError(slot.result.code, slot.result.message)
        return slot.result

    @property
    def usable(self) -> bool:
        """False once the channel is retiring or the server closed its side."""
        return not self.closing and not self.stream._peer_done.is_set()

    def fail_all(self, error: BaseException) -> None:
        for slot in self.pending.values():
            slot.error = error
            slot.done.set()


class RpcClient:
    """Calls RPC protocols on other peers, reusing one stream per (peer, protocol).

    The streams' tasks run in ``nursery`` (the node's).  After :meth:`close`
    no new call starts.
    """

    def __init__(self, host: Host, nursery: trio.Nursery, config: WireConfig) -> None:
        self._host = host
        self._nursery = nursery
        self._config = config
        self._channels: dict[tuple[ID, str], _Channel] = {}
        self._opening: dict[tuple[ID, str], trio.Event] = {}
        self._closed = False

    def open_channels(self) -> int:
        return len(self._channels)

    async def call(self, peer: PeerIDLike, protocol: RpcProtocol, request: Message,
                   timeout: float | None = None) -> Message:
        """Send ``request`` and return the peer's response.

        Raises :class:`CallTimeoutError` after ``timeout`` seconds (default
        ``call_timeout``), :class:`PeerUnreachableError`,
        :class:`ProtocolNotSupportedError`, :class:`RemoteError` (the handler
        answered with an error) or :class:`StreamClosedError`.
        """
        if type(request) not in protocol.requests:
            raise LocalProtocolError(f"{type(request).__name__} is not a request of "
                                     f"{protocol.protocol_id}")
        peer_id = parse_peer_id(peer)
        timeout = self._config.call_timeout if timeout is None else timeout
        with trio.move_on_after(timeout):
            channel = await self._channel(peer_id, protocol)
            return await channel.request(request)
        raise CallTimeoutError(f"{protocol.protocol_id} call to {peer_id} got no answer "
                               f"within {timeout:.1f} s")

    async def _channel(self, peer_id: ID, protocol: RpcProtocol) -> _Channel:
        key = (peer_id, protocol.protocol_id)
        for _ in range(3):  # a channel may die between two looks; bounded
            if self._closed:
                raise NodeClosedError("the node is shut down")
            channel = self._channels.get(key)
            if channel is not None and channel.usable:
                return channel
            opening = self._opening.get(key)
            if opening is not None:
                await opening.wait()
                continue
            opening = self._opening[key] = trio.Event()
            try:
                net_stream = await self._host.new_stream(peer_id, protocol.protocol_id)
                try:
                    channel = await self._nursery.start(self._run_channel, key, protocol,
                                                        net_stream)
                except RuntimeError:  # the node's nursery no longer takes tasks
                    with trio.CancelScope(shield=True), trio.move_on_after(2):
                        await net_stream.reset()
                    raise NodeClosedError("the node is shut down") from None
                self._channels[key] = channel
                return channel
            finally:
                del self._opening[key]
                opening.set()
        raise StreamClosedError(f"could not keep a {protocol.protocol_id} stream to {peer_id}")

    async def _run_channel(self, key: tuple[ID, str], protocol: RpcProtocol,
                           net_stream: INetStream,
                           task_status: trio.TaskStatus[_Channel] = trio.TASK_STATUS_IGNORED
                           ) -> None:
        channel: _Channel | None = None
        error: BaseException = StreamClosedError(f"{key[0]} closed the {key[1]} stream")
        try:
            async with open_framed_stream(net_stream, self._config) as stream:
                channel = _Channel(stream)
                task_status.started(channel)
                try:
                    error = await self._dispatch(channel, protocol) or error
                finally:
                    self._retire(key, channel, error)
        except P2PDLError as exc:
            error = exc
        finally:
            if channel is not None:
                self._retire(key, channel, error)

    def _retire(self, key: tuple[ID, str], channel: _Channel, error: BaseException) -> None:
        """Take the channel out of use at once, failing whatever still waits on it."""
        channel.closing = True
        if self._channels.get(key) is channel:
            del self._channels[key]
        channel.fail_all(error)

    async def _dispatch(self, channel: _Channel, protocol: RpcProtocol) -> BaseException | None:
        """Route responses to their callers until EOF, idleness or an error.

        Responses are matched in the stream's reader task, without a task hop.
        """
        stream = channel.stream

        def deliver(frame: Frame) -> bool:
            item = decode_frame(frame, protocol.responses)
            if isinstance(item, TensorChunk):
                raise RemoteProtocolError("tensor chunk on an RPC stream")
            request_id, response = item
            slot = channel.pending.get(request_id)
            if slot is None:
                logger.debug("response %d from %s matches no pending request (timed out?)",
                             request_id, stream.peer_id)
            else:
                slot.result = response
                slot.done.set()
            return True

        stream.set_dispatcher(deliver)
        idle = self._config.rpc_idle_timeout
        while True:  # bounded: each pass waits ``idle`` at most
            with trio.move_on_at(channel.idle_since + idle if not channel.pending
                                 else trio.current_time() + idle):
                await stream.wait_peer_done()
                return stream.failure
            if not channel.pending and trio.current_time() - channel.idle_since >= idle:
                return None

    def close(self) -> None:
        self._closed = True


def handler_for(protocol: RpcProtocol, handler: RpcHandler,
                config: WireConfig) -> Callable[[INetStream], Awaitable[None]]:
    """A host stream handler that serves ``protocol`` with ``handler``."""

    async def handle(net_stream: INetStream) -> None:
        async with open_framed_stream(net_stream, config) as stream:
            await serve_rpc_stream(stream, protocol, handler, config)

    return handle
