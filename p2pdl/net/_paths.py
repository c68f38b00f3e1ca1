"""Connections and paths: which peers the host is connected to, and how.

A peer is reached ``direct``, ``hole-punched`` (a direct connection that a
DCUtR exchange opened through NATs) or ``relayed`` (a circuit through a
relay).  A direct connection is ``hole-punched`` only when it opened while a
DCUtR exchange with that peer ran (``punch_started``/``punch_ended``, told by
:class:`~p2pdl.net._dcutr.LabelledDCUtR`) or the exchange confirmed it
(``punch_succeeded``); a plain dial to a public peer that was first reached
through a relay stays ``direct``.
:class:`Paths` keeps that bookkeeping from py-libp2p's connection
notifications and wakes whoever waits for a connection to open or close.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import multiaddr
import trio
from libp2p.abc import INetConn, INetStream, INetwork, INotifee
from libp2p.connection_types import ConnectionType
from libp2p.peer.id import ID

from ._relay import is_circuit

__all__ = ["Paths", "connection_kind"]

logger = logging.getLogger(__name__)


def connection_kind(conn: INetConn) -> str:
    """``relayed`` for a circuit connection, else ``direct``."""
    try:
        if conn.get_connection_type() == ConnectionType.RELAYED:
            return "relayed"
        addrs = conn.get_transport_addresses()
    except Exception:  # a connection being torn down; assume the common case
        return "direct"
    return "relayed" if any(is_circuit(a) for a in addrs or ()) else "direct"


class _ConnectionWatcher(INotifee):
    """Wakes waiters whenever a connection opens or closes, and reports both."""

    def __init__(self, on_connected: Callable[[INetConn], None],
                 on_disconnected: Callable[[INetConn], None]) -> None:
        self.changed = trio.Event()
        self._on_connected = on_connected
        self._on_disconnected = on_disconnected

    def _wake(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    async def connected(self, network: INetwork, conn: INetConn) -> None:
        self._on_connected(conn)
        self._wake()

    async def disconnected(self, network: INetwork, conn: INetConn) -> None:
        self._on_disconnected(conn)
        self._wake()

    async def opened_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def closed_stream(self, network: INetwork, stream: INetStream) -> None:
        pass

    async def listen(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass

    async def listen_close(self, network: INetwork, multiaddr: multiaddr.Multiaddr) -> None:
        pass


class Paths:
    """The host's connections: who is connected, by which path, since when.

    ``on_connection_lost(peer)`` is called for every connection that closes
    (the reservations learn that a relay went away).
    """

    def __init__(self, network: INetwork, on_connection_lost: Callable[[ID], None]) -> None:
        self._network = network
        self._on_connection_lost = on_connection_lost
        # Peers with a DCUtR exchange running now (a count: the initiator and
        # responder sides may overlap), and peers whose direct connection
        # came from such an exchange.
        self._punching: dict[ID, int] = {}
        self._hole_punched: set[ID] = set()
        self._watcher = _ConnectionWatcher(self._on_connected, self._on_disconnected)
        network.register_notifee(self._watcher)

    def _connections(self, peer: ID) -> list[INetConn]:
        return list(self._network.connections.get(peer, []))

    def is_connected(self, peer: ID) -> bool:
        return bool(self._network.connections.get(peer))

    def connected_peers(self) -> list[ID]:
        return [p for p, conns in self._network.connections.items() if conns]

    async def wait_changed(self, timeout: float) -> bool:
        """Return when a connection opens or closes (True), or after ``timeout`` seconds (False)."""
        with trio.move_on_after(timeout):
            await self._watcher.changed.wait()
            return True
        return False

    def path(self, peer: ID) -> str | None:
        """How we reach ``peer`` now: ``direct``, ``hole-punched``, ``relayed`` or None."""
        kinds = {connection_kind(c) for c in self._connections(peer)}
        if "direct" in kinds:
            return "hole-punched" if peer in self._hole_punched else "direct"
        if "relayed" in kinds:
            return "relayed"
        return None

    def paths(self) -> dict[ID, str]:
        """:meth:`path` of every connected peer."""
        return {p: path for p in self.connected_peers() if (path := self.path(p)) is not None}

    def observed_ip(self, peer: ID) -> str | None:
        """The IP address ``peer``'s direct connection comes from, as we see it."""
        for conn in self._connections(peer):
            if connection_kind(conn) != "direct":
                continue
            try:
                remote = conn.muxed_conn.get_remote_address()
            except Exception:  # a connection being torn down
                continue
            if remote:
                return str(remote[0])
        return None

    def punch_started(self, peer: ID) -> None:
        """A DCUtR exchange with ``peer`` began: a direct connection now is a punch."""
        self._punching[peer] = self._punching.get(peer, 0) + 1

    def punch_ended(self, peer: ID) -> None:
        """A DCUtR exchange with ``peer`` ended (whatever its outcome)."""
        left = self._punching.get(peer, 0) - 1
        if left > 0:
            self._punching[peer] = left
        else:
            self._punching.pop(peer, None)

    def punch_succeeded(self, peer: ID) -> None:
        """The exchange verified a direct connection to ``peer``."""
        if any(connection_kind(c) == "direct" for c in self._connections(peer)):
            self._mark_punched(peer)

    def _mark_punched(self, peer: ID) -> None:
        if peer not in self._hole_punched:
            self._hole_punched.add(peer)
            logger.info("hole punch to %s succeeded: direct connection", peer)

    def _on_connected(self, conn: INetConn) -> None:
        peer = conn.muxed_conn.peer_id
        kind = connection_kind(conn)
        logger.debug("connected to %s (%s)", peer, kind)
        if kind == "direct" and peer in self._punching:
            self._mark_punched(peer)

    def _on_disconnected(self, conn: INetConn) -> None:
        peer = conn.muxed_conn.peer_id
        remaining = [c for c in self._connections(peer) if c is not conn]
        if not any(connection_kind(c) == "direct" for c in remaining):
            self._hole_punched.discard(peer)
        self._on_connection_lost(peer)
