"""Circuit relay v2 reservations held by the host, carried out on trio.

A node that is not known to be publicly reachable keeps reservations on a
few relays (``HostConfig.relay_reservations``) among its candidates, so that
others can reach it through ``/p2p-circuit`` addresses.  What to do next is
decided by the sans-IO :class:`~p2pdl.net._relay.ReservationBook`;
:class:`Reservations` runs the decisions (``serve``) and says which circuit
addresses the host can advertise.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.transport import CircuitV2Transport

from ..errors import P2PDLError, ProtocolNotSupportedError
from ._relay import ReservationBook, circuit_addr, is_circuit
from .config import HostConfig

__all__ = ["Reservations", "RESERVATION_POLL", "HOP_PROTOCOL_ID"]

logger = logging.getLogger(__name__)

#: The reservation service looks at its relays at least this often (s).
RESERVATION_POLL = 5.0

OpenStream = Callable[[ID, str], Awaitable[INetStream]]


class Reservations:
    """The relays we reserve on: candidates, the reservations held, and the service.

    ``open_stream(peer, protocol_id)`` opens a stream (the host's dialler);
    ``circuit_transport`` is set once the host's relay protocol runs.
    """

    def __init__(self, libp2p_host: IHost, config: HostConfig, open_stream: OpenStream) -> None:
        self._host = libp2p_host
        self._config = config
        self._open_stream = open_stream
        self.circuit_transport: CircuitV2Transport | None = None
        self.book = ReservationBook(config.relay_reservations, config.reservation_retry)
        self._wakeup = trio.Event()
        self._wanted = config.use_relays
        self._addrs_version = 0

    @property
    def addrs_version(self) -> int:
        """Increases whenever the circuit addresses may have changed."""
        return self._addrs_version

    def _addrs_changed(self) -> None:
        self._addrs_version += 1
        self._wakeup.set()

    def circuit_addrs(self, own_id: ID) -> list[multiaddr.Multiaddr]:
        """``/p2p-circuit`` addresses through the relays we hold reservations with."""
        out = []
        for relay in self.book.active(trio.current_time()):
            for relay_addr in relay.addrs:
                if not is_circuit(relay_addr):
                    out.append(circuit_addr(relay_addr, relay.peer_id, own_id))
        return out

    def add_candidates(self, addresses: list[PeerInfo]) -> None:
        own_id = self._host.get_id()
        for info in addresses:
            if info.peer_id != own_id:
                self.book.add_candidate(info)
        self._wakeup.set()

    def candidates(self) -> list[PeerInfo]:
        return self.book.candidates()

    @property
    def wanted(self) -> bool:
        return self._wanted

    def set_wanted(self, wanted: bool) -> None:
        wanted = wanted and self._config.use_relays
        if wanted != self._wanted:
            self._wanted = wanted
            self._wakeup.set()

    def serves_relay(self, peer: ID) -> bool:
        """Whether ``peer`` is known to serve circuit relay (identify, or a reservation)."""
        known = self.book.is_relay(peer)
        if known is not None:
            return known
        try:
            protocols = self._host.get_peerstore().get_protocols(peer)
        except Exception:  # unknown to the peerstore
            return False
        return str(HOP_PROTOCOL_ID) in protocols

    def active(self) -> list[ID]:
        return [r.peer_id for r in self.book.active(trio.current_time())]

    def on_connection_lost(self, peer: ID) -> None:
        """A connection to ``peer`` closed: a reservation on it is gone."""
        if self.book.on_lost(peer):
            logger.info("lost the connection to relay %s; its reservation is gone", peer)
            self._addrs_changed()

    async def serve(self) -> None:
        """Keep reservations on relays while wanted; refresh them; replace lost ones."""
        while True:
            now = trio.current_time()
            action = self.book.next_action(now, self._wanted)
            if action.kind == "reserve":
                assert action.relay is not None
                await self._reserve(action.relay)
                continue
            self._wakeup = trio.Event()
            with trio.move_on_after(min(action.delay, RESERVATION_POLL)):
                await self._wakeup.wait()

    async def _reserve(self, relay: PeerInfo) -> None:
        transport = self.circuit_transport
        assert transport is not None
        now = trio.current_time()
        try:
            with trio.fail_after(self._config.dial_timeout + self._config.stream_open_timeout):
                stream = await self._open_stream(relay.peer_id, str(HOP_PROTOCOL_ID))
                try:
                    ok = await transport._make_reservation(stream, relay.peer_id)
                finally:
                    with trio.move_on_after(2):
                        await stream.close()
        except ProtocolNotSupportedError:
            self.book.on_failed(relay.peer_id, now, not_a_relay=True)
            logger.info("%s does not serve circuit relay", relay.peer_id)
            return
        except (P2PDLError, trio.TooSlowError) as exc:
            delay = self.book.on_failed(relay.peer_id, now)
            logger.info("reservation on relay %s failed (%s); retry in %.0f s",
                        relay.peer_id, exc, delay)
            return
        if not ok:
            delay = self.book.on_failed(relay.peer_id, now)
            logger.info("relay %s refused a reservation; retry in %.0f s", relay.peer_id, delay)
            return
        expires = transport._reservations.get(relay.peer_id, 0)
        ttl = max(1.0, expires - time.time())
        fresh = relay.peer_id not in self.active()
        self.book.on_reserved(relay.peer_id, trio.current_time(), ttl)
        if fresh:
            logger.info("reserved a slot on relay %s for %.0f s", relay.peer_id, ttl)
            self._addrs_changed()
