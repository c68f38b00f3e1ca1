"""Messages of the dial-back protocol (protocols/transport.md)."""

from __future__ import annotations

from typing import Annotated, Literal

from ..wire import MaxLen, Message, RpcProtocol

DIALBACK_PROTOCOL_ID = "/p2pdl/dialback/1.0.0"

#: Hard bound on addresses in one request, whatever a node's configuration says.
MAX_DIALBACK_ADDRS = 16
MAX_ADDR_LENGTH = 256


class DialBackRequest(Message, tag="dialback"):
    """Please dial me at each of these addresses, on fresh connections."""

    addrs: Annotated[list[Annotated[str, MaxLen(MAX_ADDR_LENGTH)]], MaxLen(MAX_DIALBACK_ADDRS)]


class DialBackResult(Message, tag="dialback.result"):
    """Outcome for one address: reached (and it was you), not reached, or not tried."""

    addr: Annotated[str, MaxLen(MAX_ADDR_LENGTH)]
    status: Literal["ok", "failed", "refused"]
    detail: Annotated[str, MaxLen(512)] = ""


class DialBackResponse(Message, tag="dialback.results"):
    results: Annotated[list[DialBackResult], MaxLen(MAX_DIALBACK_ADDRS)]


DIALBACK = RpcProtocol.define(DIALBACK_PROTOCOL_ID, [DialBackRequest], [DialBackResponse])
