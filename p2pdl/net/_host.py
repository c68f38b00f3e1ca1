"""The :class:`Host` facade: one object the layers above use, composed of small ones.

* :class:`~p2pdl.net._paths.Paths` -- connections and how each peer is reached;
* :class:`~p2pdl.net._dialer.Dialer` -- connecting, known addresses, streams;
* :class:`~p2pdl.net._reservations.Reservations` -- relay reservations;
* :class:`~p2pdl.net._inbound.InboundStreams` -- every incoming stream, bounded and contained;
* :class:`~p2pdl.net._budget.InputBudget` -- the bytes peers sent that the node still holds.

The host's own addresses and its statistics are computed here.  :func:`~p2pdl.net.open_host`
builds and runs one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from multiaddr.utils import get_network_addrs

from ._addrs import PeerIDLike, filter_peerstore, parse_multiaddr, parse_peer_id
from ._budget import InputBudget, register_input_budget
from ._dialer import Dialer
from ._inbound import InboundStatistics, InboundStreams, StreamHandler
from ._paths import Paths
from ._relay import is_circuit
from ._reservations import Reservations
from .config import HostConfig

__all__ = ["Host", "HostStatistics"]


@dataclasses.dataclass(frozen=True)
class HostStatistics:
    """What :meth:`Host.statistics` says.

    Attributes:
        connected_peers: peers with a connection now.
        inbound: the inbound streams refused, failed and reset (per protocol).
        buffered_input: bytes of p2pdl frames peers sent that the node holds now.
        buffered_input_peak: the most it held at once.
        input_budget_refusals: times a stream was reset because its bytes
            would have passed ``input_budget_per_peer`` or ``input_budget_per_node``.
    """

    connected_peers: int
    inbound: InboundStatistics
    buffered_input: int
    buffered_input_peak: int
    input_budget_refusals: int


class Host:
    """A running libp2p host.  Obtain one from :func:`open_host`."""

    def __init__(self, libp2p_host: IHost, config: HostConfig) -> None:
        self._host = libp2p_host
        self._config = config
        filter_peerstore(libp2p_host.get_peerstore())
        self._reservations = Reservations(libp2p_host, config, self.new_stream)
        self._paths = Paths(libp2p_host.get_network(), self._reservations.on_connection_lost)
        self._dialer = Dialer(libp2p_host, config, self._paths, self._reservations)
        self._inbound = InboundStreams(libp2p_host, config)
        self._input_budget = InputBudget(config.input_budget_per_peer,
                                         config.input_budget_per_node)
        register_input_budget(libp2p_host.get_network(), self._input_budget)

    def use_circuit_transport(self, transport: CircuitV2Transport) -> None:
        """Dial and reserve through ``transport`` (set by :func:`open_host` once it runs)."""
        self._dialer.circuit_transport = transport
        self._reservations.circuit_transport = transport

    def statistics(self) -> HostStatistics:
        budget = self._input_budget
        return HostStatistics(len(self.connected_peers()), self._inbound.statistics(),
                              budget.total, budget.peak, budget.refusals)

    # -- identity and addresses -------------------------------------------------

    @property
    def libp2p(self) -> IHost:
        """The underlying py-libp2p host (for layers that need its protocols)."""
        return self._host

    @property
    def peer_id(self) -> ID:
        return self._host.get_id()

    @property
    def config(self) -> HostConfig:
        return self._config

    def listen_addrs(self) -> list[multiaddr.Multiaddr]:
        """Transport addresses we listen on; a wildcard becomes one per interface."""
        out: list[multiaddr.Multiaddr] = []
        for addr in self._host.get_transport_addrs():
            out.extend(_expand_wildcard(addr))
        return out

    def addrs(self) -> list[str]:
        """Full addresses (``.../p2p/<id>``) other peers can use to reach us."""
        suffix = f"/p2p/{self.peer_id}"
        if self._config.announce:
            base = [parse_multiaddr(a) for a in self._config.announce]
        else:
            base = self.listen_addrs()
        seen: dict[str, None] = {}
        for addr in base:
            text = str(addr)
            if "/p2p/" in text:
                text = text.split("/p2p/")[0]
            seen.setdefault(text + suffix)
        for addr in self.circuit_addrs():
            seen.setdefault(str(addr))
        return list(seen)

    def direct_addrs(self) -> list[str]:
        """The addresses of :meth:`addrs` that are not relayed."""
        return [a for a in self.addrs() if not is_circuit(a)]

    def circuit_addrs(self) -> list[multiaddr.Multiaddr]:
        """``/p2p-circuit`` addresses through the relays we hold reservations with."""
        return self._reservations.circuit_addrs(self.peer_id)

    @property
    def addrs_version(self) -> int:
        """Increases whenever :meth:`addrs` may have changed (reservations come and go)."""
        return self._reservations.addrs_version

    # -- connections and paths ----------------------------------------------------

    def path(self, peer: PeerIDLike) -> str | None:
        """How we reach ``peer`` now: ``direct``, ``hole-punched``, ``relayed`` or None."""
        return self._paths.path(parse_peer_id(peer))

    def paths(self) -> dict[ID, str]:
        """:meth:`path` of every connected peer."""
        return self._paths.paths()

    def is_connected(self, peer: ID) -> bool:
        return self._paths.is_connected(peer)

    def connected_peers(self) -> list[ID]:
        return self._paths.connected_peers()

    async def wait_connections_changed(self, timeout: float) -> bool:
        """Return when a connection opens or closes (True), or after ``timeout`` seconds (False)."""
        return await self._paths.wait_changed(timeout)

    def observed_ip(self, peer: PeerIDLike) -> str | None:
        """The IP address ``peer``'s direct connection comes from, as we see it."""
        return self._paths.observed_ip(parse_peer_id(peer))

    # -- dialling -------------------------------------------------------------------

    async def connect(self, address: str | multiaddr.Multiaddr | PeerInfo,
                      timeout: float | None = None) -> ID:
        """Connect to a peer by its full address; reuse the connection if there is one.

        Raises :class:`PeerUnreachableError` if the peer cannot be reached within
        ``timeout`` (default ``dial_timeout``), and :class:`ConfigError` for an
        address that is not a full peer address.
        """
        return await self._dialer.connect(address, timeout)

    async def ensure_connected(self, peer: PeerIDLike, timeout: float | None = None) -> ID:
        """Make sure a connection exists, dialling the peer's known addresses if needed."""
        return await self._dialer.ensure_connected(peer, timeout)

    def known_addrs(self, peer: PeerIDLike) -> list[str]:
        """Addresses ``peer`` can be dialled at, as far as this host knows (maybe none)."""
        return self._dialer.known_addrs(peer)

    def add_addrs(self, peer: PeerIDLike, addrs: Iterable[str]) -> int:
        """Remember where ``peer`` can be dialled (addresses learnt from the DHT, say).

        Unparsable addresses are skipped; returns how many were kept.  The
        addresses replace those known before and are tried by :meth:`new_stream`.
        """
        return self._dialer.add_addrs(peer, addrs)

    async def new_stream(self, peer: PeerIDLike, protocol_id: str,
                         timeout: float | None = None) -> INetStream:
        """Open a stream speaking ``protocol_id`` on the (reused) connection to ``peer``."""
        return await self._dialer.new_stream(peer, protocol_id, timeout)

    async def probe(self, address: str | multiaddr.Multiaddr, peer: PeerIDLike,
                    timeout: float) -> None:
        """Dial ``address`` on a fresh TCP connection and check it is ``peer``.

        Never reuses a connection: the point is to learn whether the address
        itself is reachable.  Succeeds when a Noise handshake proves the
        identity of ``peer``; raises :class:`PeerUnreachableError` otherwise.
        """
        await self._dialer.probe(address, peer, timeout)

    async def serve_initial_peers(
            self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect to every initial peer and reconnect whenever a connection drops."""
        await self._dialer.serve_initial_peers(task_status=task_status)

    # -- serving ----------------------------------------------------------------------

    def set_stream_handler(self, protocol_id: str, handler: StreamHandler) -> None:
        """Serve ``protocol_id``: ``handler`` runs once per incoming stream.

        A peer may have at most ``max_inbound_streams_per_peer`` streams open
        to us at once; more are reset.  Whatever escapes the handler resets
        the stream and is counted (:meth:`statistics`); the bad input of a
        peer (:class:`RemoteProtocolError`) is logged once at INFO, a closed
        stream at DEBUG, and only the handler's own failures with a
        traceback: the node keeps serving everyone else.
        """
        self._inbound.set_stream_handler(protocol_id, handler)

    # -- relays -----------------------------------------------------------------------

    def add_relay_candidates(self, addresses: list[PeerInfo]) -> None:
        """Relays to reserve on when the node is not publicly reachable."""
        self._reservations.add_candidates(addresses)

    def set_wants_relays(self, wanted: bool) -> None:
        """Hold relay reservations (not known to be public) or not (public)."""
        self._reservations.set_wanted(wanted)

    @property
    def wants_relays(self) -> bool:
        """Whether the host holds relay reservations (``set_wants_relays``, and
        ``HostConfig.use_relays``)."""
        return self._reservations.wanted

    def relay_candidates(self) -> list[PeerInfo]:
        """The relays the host may reserve on: its initial peers and those
        added since (``add_relay_candidates``)."""
        return self._reservations.candidates()

    def relay_reservations(self) -> list[ID]:
        return self._reservations.active()

    async def serve_reservations(self) -> None:
        """Keep reservations on relays while wanted; refresh them; replace lost ones."""
        await self._reservations.serve()


def _expand_wildcard(addr: multiaddr.Multiaddr) -> list[multiaddr.Multiaddr]:
    """``/ip4/0.0.0.0/tcp/P`` as the concrete addresses of every interface (loopback too)."""
    names = [p.name for p in addr.protocols()]
    if names != ["ip4", "tcp"] and names != ["ip6", "tcp"]:
        return [addr]
    ip, port = addr.value_for_protocol(names[0]), addr.value_for_protocol("tcp")
    if ip not in ("0.0.0.0", "::"):
        return [addr]
    version = 4 if names[0] == "ip4" else 6
    try:
        ips = list(get_network_addrs(version) or [])
    except Exception:  # interface enumeration is best effort
        ips = []
    loopback = "127.0.0.1" if version == 4 else "::1"
    if loopback not in ips:
        ips.append(loopback)
    return [multiaddr.Multiaddr(f"/{names[0]}/{ip}/tcp/{port}") for ip in ips]
