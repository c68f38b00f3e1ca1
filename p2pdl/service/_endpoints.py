"""What a service serves, and how the node serves it behind its admission gate.

A service lists its endpoints; :func:`install_endpoint` puts each on the host
so that every inbound request or stream passes the gate first:

* :class:`RpcEndpoint` -- a request/response protocol.  The gate is asked for
  every request, with the run the request names (``run_id_of``); a refused
  request is answered with the error reply ``not_admitted`` and the handler
  never sees it.
* :class:`StreamEndpoint` -- a streaming protocol.  ``open`` reads what the
  stream is for (the service's own opening message and checks); the gate is
  asked with the run that names; a refused stream gets the service's own
  refusal (``refuse``) with the code ``not_admitted``, and ``handler`` runs
  only for admitted streams.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..errors import RequestError
from ..wire import (
    FramedStream,
    Message,
    RequestContext,
    RpcHandler,
    RpcProtocol,
    WireConfig,
    open_framed_stream,
    serve_rpc_stream,
)
from ._admission import Gatekeeper, Refusal

if TYPE_CHECKING:
    from libp2p.abc import INetStream

    from ..net import Host

__all__ = ["RpcEndpoint", "StreamEndpoint", "Opened", "Endpoint", "install_endpoint",
           "no_run", "run_of_request", "gated_handler"]


def no_run(request: Message) -> None:
    """``run_id_of`` of protocols that serve the whole network, not one run."""
    return None


def run_of_request(request: Message) -> str | None:
    """``run_id_of`` of run-scoped protocols whose requests carry a ``run_id`` field."""
    run_id = getattr(request, "run_id", None)
    return run_id if isinstance(run_id, str) else None


@dataclasses.dataclass(frozen=True)
class RpcEndpoint:
    """A request/response protocol a service answers.

    Attributes:
        protocol: the protocol (id and message types).
        handler: ``await handler(ctx, request) -> response``.
        run_id_of: the run a request belongs to, for the gate (:func:`no_run`
            for protocols of the whole network).
        serve_stream: the service's own loop over one incoming stream, given
            the gated handler (default: the wire's, ``serve_rpc_stream``); for
            a service that watches its streams (state sync counts the replies
            each one still has to write).
    """

    protocol: RpcProtocol
    handler: RpcHandler
    run_id_of: Callable[[Message], str | None] = no_run
    serve_stream: Callable[[FramedStream, RpcHandler], Awaitable[None]] | None = None

    @property
    def protocol_id(self) -> str:
        return self.protocol.protocol_id


@dataclasses.dataclass(frozen=True)
class Opened:
    """What ``StreamEndpoint.open`` learnt: the stream's run (None: no run) and the
    service's own state for ``handler``."""

    run_id: str | None
    state: Any = None


@dataclasses.dataclass(frozen=True)
class StreamEndpoint:
    """A streaming protocol a service serves.

    Attributes:
        protocol_id: the protocol id.
        open: ``await open(stream) -> Opened | None``: reads the opening of the
            stream and says which run it is for; None when the service has
            already answered (refused, or the peer broke the protocol).
        handler: ``await handler(stream, opened.state)``, for admitted streams.
        refuse: ``await refuse(stream, refusal)``: the protocol's own refusal.
    """

    protocol_id: str
    open: Callable[[FramedStream], Awaitable[Opened | None]]
    handler: Callable[[FramedStream, Any], Awaitable[None]]
    refuse: Callable[[FramedStream, Refusal], Awaitable[None]]


Endpoint = RpcEndpoint | StreamEndpoint


def gated_handler(endpoint: RpcEndpoint, gate: Gatekeeper) -> RpcHandler:
    """``endpoint.handler`` behind the gate: a refused request is answered
    ``not_admitted`` and never reaches the handler."""
    handler, run_id_of = endpoint.handler, endpoint.run_id_of

    async def gated(ctx: RequestContext, request: Message) -> Message:
        refusal = gate.check(ctx.peer_id, ctx.protocol_id, run_id_of(request))
        if refusal is not None:
            raise RequestError(refusal.code, refusal.reason)
        return await handler(ctx, request)

    return gated


def install_endpoint(host: Host, wire: WireConfig, gate: Gatekeeper, endpoint: Endpoint) -> None:
    """Serve ``endpoint`` on ``host``, every request and stream behind ``gate``."""
    if isinstance(endpoint, RpcEndpoint):
        handler = gated_handler(endpoint, gate)
        protocol = endpoint.protocol
        serve_stream = endpoint.serve_stream

        async def handle_rpc(net_stream: INetStream) -> None:
            async with open_framed_stream(net_stream, wire) as stream:
                if serve_stream is None:
                    await serve_rpc_stream(stream, protocol, handler, wire)
                else:
                    await serve_stream(stream, handler)

        host.set_stream_handler(endpoint.protocol_id, handle_rpc)
        return

    async def handle_stream(net_stream: INetStream) -> None:
        async with open_framed_stream(net_stream, wire) as stream:
            opened = await endpoint.open(stream)
            if opened is None:
                return
            refusal = gate.check(stream.peer_id, endpoint.protocol_id, opened.run_id)
            if refusal is not None:
                await endpoint.refuse(stream, refusal)
                return
            await endpoint.handler(stream, opened.state)

    host.set_stream_handler(endpoint.protocol_id, handle_stream)
