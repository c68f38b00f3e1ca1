"""py-libp2p 0.8.1, made to interoperate with the other libp2p implementations.

* **The address of a relayed inbound connection.**  When a peer reached the
  node through a circuit relay, py-libp2p's relay stop handler recorded the
  connection's address as ``/p2p/<this node>/p2p-circuit/p2p/<peer>``: the
  node's own id where the relay's belongs, and no transport part.  Identify
  reports that address to the peer as its observed address, and js-libp2p
  rejects the whole identify reply for it.  The connection's address is now
  ``<relay's transport address>/p2p/<relay>/p2p-circuit``, what the identify
  spec prescribes for a relayed connection; and identify reports a relayed
  observed address only in that form, or none.

Installed once, when the host layer is imported; the version is pinned.
"""

from __future__ import annotations

import logging
from typing import Any

import multiaddr
from libp2p.connection_types import ConnectionType
from libp2p.identity.identify import identify
from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol

from ._relay import is_circuit

__all__ = ["install", "relayed_observed_addr"]

logger = logging.getLogger(__name__)


def _transport_addr(stream: Any) -> multiaddr.Multiaddr | None:
    """The direct transport address of the peer at the other end of ``stream``."""
    try:
        remote = stream.get_remote_address()
    except Exception:  # a stream being torn down
        remote = None
    if remote:
        host, port = str(remote[0]), int(remote[1])
        if host.lower().startswith("::ffff:"):
            host = host[7:]
        proto = "ip6" if ":" in host else "ip4"
        return multiaddr.Multiaddr(f"/{proto}/{host}/tcp/{port}")
    return None


def relayed_observed_addr(addr: multiaddr.Multiaddr | None,
                          own_id: ID) -> multiaddr.Multiaddr | None:
    """``addr`` as a relayed observed address, ``<transport>/p2p/<relay>/p2p-circuit``, or None.

    None when ``addr`` has no transport part or names this node as the relay.
    """
    if addr is None or not is_circuit(addr):
        return addr
    text = str(addr)
    base = text[: text.index("/p2p-circuit")]
    if base.startswith("/p2p/") or "/p2p/" not in base:
        return None
    relay = base.rsplit("/p2p/", 1)[1]
    if relay == str(own_id):
        return None
    try:
        return multiaddr.Multiaddr(base + "/p2p-circuit")
    except Exception:  # not a multiaddr after all
        return None


_original_prefer_circuit_addr = identify._prefer_circuit_addr


def _prefer_circuit_addr(host: Any, peer_id: ID,
                         fallback: multiaddr.Multiaddr | None) -> multiaddr.Multiaddr | None:
    chosen = _original_prefer_circuit_addr(host, peer_id, fallback)
    if chosen is not None and is_circuit(chosen):
        return relayed_observed_addr(chosen, host.get_id())
    return chosen


_original_handle_incoming_connection = CircuitV2Protocol.handle_incoming_connection


async def _handle_incoming_connection(self: CircuitV2Protocol, stream: Any,
                                      remote_peer_id: bytes) -> None:
    await _original_handle_incoming_connection(self, stream, remote_peer_id)
    # ``stream`` is the relay's stop stream: the relay is its peer.
    relay = stream.muxed_conn.peer_id
    transport = _transport_addr(stream)
    if transport is None:
        return
    address = multiaddr.Multiaddr(f"{transport}/p2p/{relay}/p2p-circuit")
    peer = ID(remote_peer_id)
    for conn in list(self.host.get_network().connections.get(peer, [])):
        try:
            addrs = conn.get_transport_addresses() or []
            wrong = any(str(a).startswith("/p2p/") and is_circuit(a) for a in addrs)
            if wrong and conn.get_connection_type() == ConnectionType.RELAYED:
                conn.set_transport_info([address], ConnectionType.RELAYED)
        except Exception:  # a connection being torn down keeps its address
            logger.debug("could not correct the address of a relayed connection", exc_info=True)


def install() -> None:
    """Install the fixes (idempotent)."""
    if identify._prefer_circuit_addr is not _prefer_circuit_addr:
        identify._prefer_circuit_addr = _prefer_circuit_addr
    if CircuitV2Protocol.handle_incoming_connection is not _handle_incoming_connection:
        CircuitV2Protocol.handle_incoming_connection = (  # type: ignore[method-assign]
            _handle_incoming_connection)
