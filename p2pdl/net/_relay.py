"""Circuit relay v2 reservations (sans-IO bookkeeping) and address helpers.

A node that is not known to be publicly reachable holds reservations on a
few relays among its initial peers, so that others can reach it at
``<relay address>/p2p/<relay>/p2p-circuit/p2p/<node>``.  The
:class:`ReservationBook` decides, from what happened and ``now``, which relay
to reserve on next, when to refresh, and how long to wait; the host's trio
service carries the decisions out.
"""

from __future__ import annotations

import dataclasses
import random

import multiaddr
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

from ._backoff import Backoff
from .config import BackoffPolicy

__all__ = ["ReservationBook", "Action", "is_circuit", "circuit_addr", "REFRESH_AT"]

#: A reservation is refreshed once this fraction of its lifetime has passed.
REFRESH_AT = 0.8
#: After a relay refuses the hop protocol it is asked again only after this long (s).
NOT_A_RELAY_RETRY = 600.0


def is_circuit(addr: multiaddr.Multiaddr | str) -> bool:
    return "/p2p-circuit" in str(addr)


def circuit_addr(relay_addr: multiaddr.Multiaddr | str, relay: ID,
                 target: ID) -> multiaddr.Multiaddr:
    """``<relay transport address>/p2p/<relay>/p2p-circuit/p2p/<target>``."""
    base = str(relay_addr).split("/p2p/")[0]
    return multiaddr.Multiaddr(f"{base}/p2p/{relay}/p2p-circuit/p2p/{target}")


@dataclasses.dataclass(frozen=True)
class Action:
    """What the reservation service should do next.

    ``kind`` is ``reserve`` (reserve or refresh on ``relay``) or ``wait``
    (nothing to do for ``delay`` seconds, unless something changes).
    """

    kind: str
    relay: PeerInfo | None = None
    delay: float = 0.0


@dataclasses.dataclass
class _Relay:
    info: PeerInfo
    backoff: Backoff
    not_before: float = 0.0
    expires: float | None = None  # reservation end, on the caller's clock
    refresh_at: float | None = None
    is_relay: bool | None = None  # learnt from a reservation's outcome


class ReservationBook:
    """Reservations held on relays: state and decisions, no I/O.

    Time is the caller's monotonic clock (``trio.current_time()``).
    """

    def __init__(self, target: int, retry: BackoffPolicy,
                 rng: random.Random | None = None) -> None:
        self.target = target
        self._retry = retry
        self._rng = rng or random.Random()
        self._relays: dict[ID, _Relay] = {}

    # -- candidates ---------------------------------------------------------

    def add_candidate(self, info: PeerInfo) -> None:
        if info.peer_id not in self._relays:
            self._relays[info.peer_id] = _Relay(info, Backoff(self._retry, self._rng))

    def candidates(self) -> list[PeerInfo]:
        return [r.info for r in self._relays.values()]

    def is_relay(self, peer: ID) -> bool | None:
        """True if ``peer`` granted a reservation, False if it refused the protocol."""
        r = self._relays.get(peer)
        return None if r is None else r.is_relay

    # -- state --------------------------------------------------------------

    def active(self, now: float) -> list[PeerInfo]:
        """Relays we hold a reservation with now."""
        return [r.info for r in self._relays.values()
                if r.expires is not None and r.expires > now]

    def on_reserved(self, relay: ID, now: float, ttl: float) -> None:
        r = self._relays[relay]
        r.is_relay = True
        r.expires = now + ttl
        r.refresh_at = now + REFRESH_AT * ttl
        r.backoff.reset()
        r.not_before = 0.0

    def on_failed(self, relay: ID, now: float, not_a_relay: bool = False) -> float:
        """Record a failed attempt; returns the delay before this relay is tried again."""
        r = self._relays[relay]
        r.expires = r.refresh_at = None
        if not_a_relay:
            r.is_relay = False
        delay = NOT_A_RELAY_RETRY if not_a_relay else r.backoff.next_delay()
        r.not_before = now + delay
        return delay

    def on_lost(self, relay: ID) -> bool:
        """The connection to ``relay`` dropped: its reservation is gone.  True if one was held."""
        r = self._relays.get(relay)
        if r is None or r.expires is None:
            return False
        r.expires = r.refresh_at = None
        return True

    # -- decisions ----------------------------------------------------------

    def next_action(self, now: float, wanted: bool) -> Action:
        """The next thing to do: refresh a reservation, reserve a new one, or wait."""
        held = [r for r in self._relays.values() if r.expires is not None and r.expires > now]
        for r in self._relays.values():  # forget what expired
            if r.expires is not None and r.expires <= now:
                r.expires = r.refresh_at = None
        due = [r for r in held if r.refresh_at is not None and r.refresh_at <= now]
        if due:
            return Action("reserve", due[0].info)
        if wanted and len(held) < self.target:
            ready = [r for r in self._relays.values() if r.expires is None and r.not_before <= now]
            if ready:
                return Action("reserve", ready[0].info)
        deadlines = [r.refresh_at for r in held if r.refresh_at is not None]
        if wanted and len(held) < self.target:
            deadlines += [r.not_before for r in self._relays.values() if r.expires is None]
        delay = max(0.0, min(deadlines) - now) if deadlines else float("inf")
        return Action("wait", None, delay)
