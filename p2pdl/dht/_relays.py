"""The relay directory (sans-IO): relays found through the DHT.

A node that serves circuit relay v2 and is publicly reachable announces
itself in the DHT group :data:`RELAYS_GROUP` (``DHTService.announce``: its
own signed subkey, its addresses); a node that wants relays (not known to
be public) looks the group up and hands the relays it finds to its host as
reservation candidates, beside its initial peers.  :class:`RelayDirectory`
decides when to announce and when to look, and which entries to hand over;
the DHT service carries the decisions out (protocols/dht.md, The relay
directory).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING

from libp2p.peer.peerinfo import PeerInfo

from ..errors import ConfigError
from ..net import parse_multiaddr

if TYPE_CHECKING:
    from ._state import GroupPeer

__all__ = ["RELAYS_GROUP", "MAX_RELAY_CANDIDATES", "MAX_RELAYS_HANDED", "RELAY_RETRY",
           "RelayDirectory"]

#: The DHT group relays announce themselves in (key ``p2pdl/group/p2pdl/relays/1``).
RELAYS_GROUP = "p2pdl/relays/1"
#: Relays handed to the host from one lookup at most.
MAX_RELAY_CANDIDATES = 16
#: Relays handed to the host over the node's life at most (each once).
MAX_RELAYS_HANDED = 256
#: A failed announcement is tried again after this long at most (s).
RELAY_RETRY = 30.0


class RelayDirectory:
    """When to announce this node as a relay and when to look relays up, and
    which found relays are new candidates.  Times are the caller's monotonic
    clock."""

    def __init__(self, ttl: float, lookup_interval: float,
                 rng: random.Random | None = None) -> None:
        self._ttl = ttl
        self._interval = lookup_interval
        self._rng = rng or random.Random()
        self._announce_at = 0.0
        self._lookup_at = 0.0
        self._handed: set[bytes] = set()

    @property
    def handed(self) -> int:
        """Relays handed to the host so far."""
        return len(self._handed)

    def announce_due(self, now: float, serving: bool) -> bool:
        """Whether to announce now: while the node serves relays publicly,
        once half of the last entry's lifetime has passed (at once when it
        starts serving)."""
        if not serving:
            self._announce_at = 0.0
            return False
        return now >= self._announce_at

    def announced(self, now: float, ok: bool) -> None:
        self._announce_at = now + (self._ttl / 2 if ok else min(RELAY_RETRY, self._ttl / 2))

    def lookup_due(self, now: float, wanted: bool) -> bool:
        """Whether to look relays up now: while the host wants more of them,
        every ``lookup_interval`` (at once the first time), until
        MAX_RELAYS_HANDED were handed over."""
        return wanted and now >= self._lookup_at and len(self._handed) < MAX_RELAYS_HANDED

    def looked_up(self, now: float) -> None:
        self._lookup_at = now + self._interval

    def candidates(self, found: Sequence[GroupPeer], own: object) -> list[PeerInfo]:
        """The relays of a lookup to hand to the host: not this node, not in
        client mode, with an address that is not itself relayed, not handed
        over before; at most MAX_RELAY_CANDIDATES of them, drawn at random
        (so that a flood of entries cannot choose which ones a node tries)."""
        fresh = []
        for peer in found:
            key = peer.peer_id.to_bytes()
            if peer.peer_id == own or peer.client_mode or key in self._handed:
                continue
            addrs = []
            for addr in peer.addrs:
                if "/p2p-circuit" in addr:
                    continue
                try:
                    addrs.append(parse_multiaddr(addr))
                except ConfigError:
                    continue
            if addrs:
                fresh.append(PeerInfo(peer.peer_id, addrs))
        self._rng.shuffle(fresh)
        room = min(MAX_RELAY_CANDIDATES, MAX_RELAYS_HANDED - len(self._handed))
        chosen = fresh[:max(0, room)]
        self._handed.update(info.peer_id.to_bytes() for info in chosen)
        return chosen
