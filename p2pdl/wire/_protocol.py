"""Protocol definitions of request/response protocols: sans-IO (imports no trio).

A protocol is its id and the message types of each direction; the ``_messages``
module of every protocol package defines one with :meth:`RpcProtocol.define`.
The trio side that serves and calls them is ``_rpc``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable

from libp2p.peer.id import ID

from ._messages import ErrorReply, Message, MessageSet

__all__ = ["RpcProtocol", "RequestContext", "RpcHandler", "ERROR_CODES"]

#: Error codes of :class:`ErrorReply` defined by the wire (protocols/wire.md).
ERROR_CODES = {
    "bad_request": "the request was well-formed but its content is invalid",
    "unavailable": "the peer cannot serve this request now",
    "timeout": "the handler did not finish within its time limit",
    "internal": "the handler failed unexpectedly",
    "not_admitted": "the node's admission gate refused this peer this request",
}


@dataclasses.dataclass(frozen=True)
class RpcProtocol:
    """A request/response protocol: its id and the message types of each direction."""

    protocol_id: str
    requests: MessageSet
    responses: MessageSet

    @classmethod
    def define(cls, protocol_id: str, requests: Iterable[type[Message]],
               responses: Iterable[type[Message]]) -> RpcProtocol:
        if not protocol_id.startswith("/"):
            raise ValueError(f"protocol id {protocol_id!r} must start with '/'")
        return cls(protocol_id, MessageSet(*requests), MessageSet(*responses, ErrorReply))


@dataclasses.dataclass(frozen=True)
class RequestContext:
    """What a handler knows about the request besides the message itself."""

    peer_id: ID
    protocol_id: str
    request_id: int


#: What answers one request: ``await handler(ctx, request) -> response``.
RpcHandler = Callable[[RequestContext, Message], Awaitable[Message]]
