"""The ping protocol: a minimal RPC every node serves (protocols/ping.md)."""

from __future__ import annotations

from typing import Annotated

from ._messages import MaxLen, Message, Range
from ._protocol import RequestContext, RpcProtocol

PING_PROTOCOL_ID = "/p2pdl/ping/1.0.0"
MAX_PING_PAYLOAD = 1024


class PingRequest(Message, tag="ping"):
    nonce: Annotated[int, Range(0, 2**64 - 1)]
    payload: Annotated[bytes, MaxLen(MAX_PING_PAYLOAD)] = b""


class PingResponse(Message, tag="pong"):
    nonce: Annotated[int, Range(0, 2**64 - 1)]
    payload: Annotated[bytes, MaxLen(MAX_PING_PAYLOAD)] = b""


PING = RpcProtocol.define(PING_PROTOCOL_ID, [PingRequest], [PingResponse])


async def answer_ping(ctx: RequestContext, request: PingRequest) -> PingResponse:  # type: ignore[override]
    return PingResponse(request.nonce, request.payload)
