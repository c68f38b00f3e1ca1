"""Parsing of user-supplied peer ids and multiaddrs, with clear errors."""

from __future__ import annotations

import multiaddr
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from ..errors import ConfigError

PeerIDLike = ID | str


def parse_multiaddr(text: str | multiaddr.Multiaddr, what: str = "address") -> multiaddr.Multiaddr:
    if isinstance(text, multiaddr.Multiaddr):
        return text
    if not isinstance(text, str) or not text.startswith("/"):
        raise ConfigError(f"{what} {text!r} is not a multiaddr "
                          f"(expected something like /ip4/203.0.113.7/tcp/31337)")
    try:
        return multiaddr.Multiaddr(text)
    except Exception as exc:
        raise ConfigError(f"{what} {text!r} is not a valid multiaddr: {exc}") from None


def is_unspecified(addr: str | multiaddr.Multiaddr) -> bool:
    """True for a direct address on ``0.0.0.0`` or ``::``: a listen address, never dialable.

    Dialling one reaches this machine itself (a peer-id mismatch that makes
    py-libp2p drop the peer's good addresses too).
    """
    parts = str(addr).split("/")
    return len(parts) > 2 and parts[1] in ("ip4", "ip6") and parts[2] in ("0.0.0.0", "::")


def filter_peerstore(peerstore: object) -> None:
    """Make ``peerstore`` (py-libp2p's) drop unspecified addresses on the way in.

    py-libp2p's identify stores a peer's listen addresses as the peer sends
    them, ``/ip4/0.0.0.0/...`` included; a peer may also send them on purpose.
    """
    add_addrs = peerstore.add_addrs  # type: ignore[attr-defined]

    def filtered_add_addrs(peer_id: ID, addrs: object, ttl: int = 0) -> None:
        kept = [a for a in addrs if not is_unspecified(a)]  # type: ignore[attr-defined]
        if kept:
            add_addrs(peer_id, kept, ttl)

    peerstore.add_addrs = filtered_add_addrs  # type: ignore[attr-defined]


def parse_peer_id(value: PeerIDLike) -> ID:
    if isinstance(value, ID):
        return value
    if isinstance(value, str):
        try:
            return ID.from_base58(value)
        except Exception:
            pass
    raise ConfigError(f"{value!r} is not a peer id (expected a base58 id such as 12D3KooW...)")


def parse_peer_addr(value: str | multiaddr.Multiaddr | PeerInfo,
                    what: str = "peer address") -> PeerInfo:
    """A full peer address ``<transport address>/p2p/<peer id>`` as a PeerInfo."""
    if isinstance(value, PeerInfo):
        return value
    addr = parse_multiaddr(value, what)
    try:
        peer = addr.get_peer_id()
    except Exception:
        peer = None
    if not peer:
        raise ConfigError(f"{what} {str(addr)!r} has no /p2p/<peer id> part; "
                          f"use the full address a node prints at start")
    peer_id = parse_peer_id(peer)
    transport = addr.decapsulate(multiaddr.Multiaddr(f"/p2p/{peer}"))
    if not str(transport) or "tcp" not in {p.name for p in transport.protocols()}:
        raise ConfigError(f"{what} {str(addr)!r} has no TCP transport part")
    return PeerInfo(peer_id, [transport])
