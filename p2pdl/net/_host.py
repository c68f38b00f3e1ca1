"""The p2pdl host: py-libp2p with TCP, Noise and Yamux only.

This module absorbs py-libp2p's sharp edges once for every layer above it
(see ../shared/notes/py-libp2p-0.8.1.md in the project's notes):

* Plaintext, SECIO and TLS are not offered or accepted: Noise only.  Yamux
  only (no Mplex).  TCP only.
* One connection per peer, reused by every stream.  py-libp2p waits 250 ms
  ("happy eyeballs") after each dial unless the per-peer connection quota is
  filled, so the quota is 1: a connect takes milliseconds, not 250 ms.
* py-libp2p retries dials itself and then blocks a peer for 60 s after a
  failure; the host retries on its own schedule instead (``connect``), so
  both are switched off for the dials it makes.
* py-libp2p's auto-connector (dial known peers until 150 connections) is off:
  the layers above choose their peers.
* A Yamux frame write cut short by cancellation breaks the connection's
  Noise session; frame writes are made whole (``_yamux``).
* Bulk data costs py-libp2p Python work per frame and per socket call:
  socket reads are buffered, a Noise write is one socket write, and Yamux
  frames carry up to 256 KiB (``_fastpath``): half the CPU per byte.
* Errors are mapped to p2pdl's: :class:`PeerUnreachableError`,
  :class:`ProtocolNotSupportedError`, :class:`StreamClosedError`.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AsyncExitStack, asynccontextmanager

import multiaddr
import trio
from libp2p import new_host
from libp2p.abc import IHost, INetConn, INetStream, INetwork, INotifee
from libp2p.connection_types import ConnectionType
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.host.exceptions import StreamFailure
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.config import RelayConfig as LibRelayConfig
from libp2p.relay.circuit_v2.config import RelayRole as LibRelayRole
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL_ID
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits as LibRelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.tools.anyio_service import background_trio_service
from libp2p.transport.tcp.tcp import TCP
from multiaddr.utils import get_network_addrs

from .._concurrency import open_service_nursery
from ..errors import (
    CallTimeoutError,
    ConfigError,
    P2PDLError,
    PeerUnreachableError,
    ProtocolNotSupportedError,
    RemoteProtocolError,
    StreamClosedError,
)
from ._addrs import PeerIDLike, parse_multiaddr, parse_peer_addr, parse_peer_id
from ._backoff import Backoff
from ._fastpath import install as _install_fast_path
from ._identity import load_or_create_identity
from ._relay import ReservationBook, circuit_addr, is_circuit
from ._yamux import install as _install_whole_yamux_writes
from .config import HostConfig, RelayLimits

__all__ = ["Host", "open_host", "SECURITY_PROTOCOLS", "MUXER_PROTOCOLS"]

logger = logging.getLogger(__name__)

# py-libp2p logs with propagate=False and no handler; let records reach the
# application's logging configuration like every other library's.
logging.getLogger("libp2p").propagate = True


class _DemoteReportedFailures(logging.Filter):
    """Turn py-libp2p's ERROR records for failures p2pdl reports itself into DEBUG.

    A refused dial, a refused handshake, an unsupported protocol or a
    refused relay circuit already reaches the caller as PeerUnreachableError
    or ProtocolNotSupportedError, and a relay stream closing normally is no
    error at all;
    py-libp2p also logs each at ERROR, which would flood an application's log
    with duplicates (every retry of an initial peer, every plaintext probe).
    """

    PREFIXES = ("Failed to open TCP stream", "failed to upgrade security",
                "Failed to open stream to peer", "fail to upgrade mux",
                "Error reading from hop stream", "Failed to open stream to relay",
                "Failed to fetch stored addresses", "MultiselectClient handshake",
                "Relay connection failed", "Error handling stop stream", "[ADDCONN_FAIL]")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and isinstance(record.msg, str) \
                and record.msg.startswith(self.PREFIXES):
            if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
                return False
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


for _name in ("libp2p.transport.tcp.tcp", "libp2p.network.swarm", "libp2p.host.basic_host",
              "libp2p.relay.circuit_v2.protocol", "libp2p.relay.circuit_v2.transport",
              "libp2p.protocol_muxer.multiselect_client"):
    logging.getLogger(_name).addFilter(_DemoteReportedFailures())

_install_whole_yamux_writes()
_install_fast_path()

#: The only security and muxer protocols a p2pdl host speaks.
SECURITY_PROTOCOLS = (str(NOISE_PROTOCOL_ID),)
MUXER_PROTOCOLS = (str(YAMUX_PROTOCOL_ID),)

#: Peers whose dialled addresses the host remembers (least recently used dropped).
MAX_KNOWN_PEERS = 10_000
#: Relays tried, at most, to reach a peer whose own addresses failed.
MAX_RELAY_ROUTES = 4
#: The reservation service looks at its relays at least this often (s).
RESERVATION_POLL = 5.0

StreamHandler = Callable[[INetStream], Awaitable[None]]


def _build_libp2p_host(key_pair: KeyPair, config: HostConfig) -> IHost:
    listen = [parse_multiaddr(a, "listen address") for a in config.listen]
    for addr in listen:
        names = [p.name for p in addr.protocols()]
        if names[:1] not in (["ip4"], ["ip6"]) or names[1:] != ["tcp"]:
            raise ConfigError(f"listen address {addr} must be /ip4/<ip>/tcp/<port> or "
                              f"/ip6/<ip>/tcp/<port>")
    announce = [parse_multiaddr(a, "announce address") for a in config.announce]
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    connection_config = ConnectionConfig(
        max_connections_per_peer=1,
        dial_timeout=config.dial_timeout,
        outbound_upgrade_timeout=config.dial_timeout,
        inbound_upgrade_timeout=config.dial_timeout,
        outbound_stream_protocol_negotiation_timeout=config.stream_open_timeout,
        inbound_stream_protocol_negotiation_timeout=config.stream_open_timeout,
    )
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt={YAMUX_PROTOCOL_ID: Yamux},
        listen_addrs=listen,
        announce_addrs=announce or None,
        connection_config=connection_config,
        negotiate_timeout=max(1, int(config.stream_open_timeout)),
    )
    swarm = host.get_network()
    # Retries are ours (Host.connect), on a schedule the caller controls.
    swarm.retry_config = RetryConfig(max_retries=0)  # type: ignore[attr-defined]
    # Whom to connect to is decided above (initial peers, the DHT): switch off
    # the auto-connector, which dials every known peer up to 150 connections.
    swarm.auto_connector.maybe_connect = _no_auto_connect  # type: ignore[attr-defined]
    return host


async def _no_auto_connect() -> None:
    return None


class _ConnectionWatcher(INotifee):
    """Wakes waiters whenever a connection opens or closes, and records paths."""

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


class Host:
    """A running libp2p host.  Obtain one from :func:`open_host`."""

    def __init__(self, libp2p_host: IHost, config: HostConfig) -> None:
        self._host = libp2p_host
        self._config = config
        self._watcher = _ConnectionWatcher(self._on_connected, self._on_disconnected)
        libp2p_host.get_network().register_notifee(self._watcher)
        # NAT traversal: filled in by open_host once the services run.
        self._circuit: CircuitV2Protocol | None = None
        self._circuit_transport: CircuitV2Transport | None = None
        self._relays = ReservationBook(config.relay_reservations, config.reservation_retry)
        self._relay_wakeup = trio.Event()
        self._wants_relays = config.use_relays
        self._addrs_version = 0
        # Peers whose first connection of the current session was relayed: a
        # direct connection to them later is a hole punch.
        self._relayed_first: set[ID] = set()
        self._hole_punched: set[ID] = set()
        self._inbound: collections.Counter[ID] = collections.Counter()
        # Addresses we dialled, kept beyond py-libp2p's 2-minute peerstore TTL
        # so that a dropped connection can be re-dialled later (bounded, LRU).
        self._known_addrs: collections.OrderedDict[ID, tuple[multiaddr.Multiaddr, ...]] = (
            collections.OrderedDict())

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
        out = []
        for relay in self._relays.active(trio.current_time()):
            for relay_addr in relay.addrs:
                if not is_circuit(relay_addr):
                    out.append(circuit_addr(relay_addr, relay.peer_id, self.peer_id))
        return out

    @property
    def addrs_version(self) -> int:
        """Increases whenever :meth:`addrs` may have changed (reservations come and go)."""
        return self._addrs_version

    # -- paths ----------------------------------------------------------------

    def path(self, peer: PeerIDLike) -> str | None:
        """How we reach ``peer`` now: ``direct``, ``hole-punched``, ``relayed`` or None."""
        peer_id = parse_peer_id(peer)
        kinds = {_connection_kind(c) for c in
                 self._host.get_network().connections.get(peer_id, [])}
        if "direct" in kinds:
            return "hole-punched" if peer_id in self._hole_punched else "direct"
        if "relayed" in kinds:
            return "relayed"
        return None

    def paths(self) -> dict[ID, str]:
        """:meth:`path` of every connected peer."""
        return {p: path for p in self.connected_peers() if (path := self.path(p)) is not None}

    def _on_connected(self, conn: INetConn) -> None:
        peer = conn.muxed_conn.peer_id
        others = [c for c in self._host.get_network().connections.get(peer, []) if c is not conn]
        kind = _connection_kind(conn)
        if kind == "relayed" and not any(_connection_kind(c) == "direct" for c in others):
            self._relayed_first.add(peer)
        elif kind == "direct" and peer in self._relayed_first:
            self._hole_punched.add(peer)
            logger.info("hole punch to %s succeeded: direct connection", peer)

    def _on_disconnected(self, conn: INetConn) -> None:
        peer = conn.muxed_conn.peer_id
        remaining = [c for c in self._host.get_network().connections.get(peer, [])
                     if c is not conn]
        if not remaining:
            self._relayed_first.discard(peer)
            self._hole_punched.discard(peer)
        if self._relays.on_lost(peer):
            logger.info("lost the connection to relay %s; its reservation is gone", peer)
            self._addrs_changed()

    def _addrs_changed(self) -> None:
        self._addrs_version += 1
        self._relay_wakeup.set()

    def is_connected(self, peer: ID) -> bool:
        return bool(self._host.get_network().connections.get(peer))

    def connected_peers(self) -> list[ID]:
        return [p for p, conns in self._host.get_network().connections.items() if conns]

    async def wait_connections_changed(self, timeout: float) -> bool:
        """Return when a connection opens or closes (True), or after ``timeout`` seconds (False)."""
        with trio.move_on_after(timeout):
            await self._watcher.changed.wait()
            return True
        return False

    async def connect(self, address: str | multiaddr.Multiaddr | PeerInfo,
                      timeout: float | None = None) -> ID:
        """Connect to a peer by its full address; reuse the connection if there is one.

        Raises :class:`PeerUnreachableError` if the peer cannot be reached within
        ``timeout`` (default ``dial_timeout``), and :class:`ConfigError` for an
        address that is not a full peer address.
        """
        info = parse_peer_addr(address)
        if info.peer_id == self.peer_id:
            raise ConfigError(f"{address} is this node's own address")
        await self._dial(info, timeout)
        return info.peer_id

    async def ensure_connected(self, peer: PeerIDLike, timeout: float | None = None) -> ID:
        """Make sure a connection exists, dialling the peer's known addresses if needed."""
        peer_id = parse_peer_id(peer)
        if not self.is_connected(peer_id):
            addrs = self._known_addrs.get(peer_id)
            if not addrs:
                try:
                    addrs = self._host.get_peerstore().addrs(peer_id)
                except Exception:  # py-libp2p raises for unknown or expired peers
                    addrs = []
            if not addrs and not self._relay_routes(peer_id, []):
                raise PeerUnreachableError(f"no known address for peer {peer_id}; "
                                           f"connect to it by its full address first")
            await self._dial(PeerInfo(peer_id, list(addrs)), timeout)
        return peer_id

    async def _dial(self, info: PeerInfo, timeout: float | None) -> None:
        """Connect by the direct addresses, then by relay circuits.

        Circuits come from the address list itself, then from the relays we
        are connected to (a peer behind NAT that moved to another relay is
        found through it).  All of it is bounded by ``timeout``.
        """
        if self.is_connected(info.peer_id):
            return
        timeout = self._config.dial_timeout if timeout is None else timeout
        self._remember(info)
        direct = [a for a in info.addrs if not is_circuit(a)]
        circuits = [_with_target(a, info.peer_id) for a in info.addrs if is_circuit(a)]
        errors: list[str] = []
        with trio.move_on_after(timeout) as scope:
            if direct:
                # Our own schedule decides retries: lift py-libp2p's 60 s block.
                self._host.get_network().unblock_peer(info.peer_id)  # type: ignore[attr-defined]
                try:
                    await self._host.connect(PeerInfo(info.peer_id, direct))
                    return
                except Exception as exc:
                    errors.append(f"{', '.join(str(a) for a in direct)}: {_reason(exc)}")
            for addr in [*circuits, *self._relay_routes(info.peer_id, circuits)]:
                if self.is_connected(info.peer_id):
                    return
                try:
                    await self._dial_circuit(addr)
                    return
                except Exception as exc:
                    errors.append(f"{addr}: {_reason(exc)}")
        if self.is_connected(info.peer_id):
            return
        if scope.cancelled_caught:
            errors.append(f"no connection within {timeout:.1f} s")
        raise PeerUnreachableError(f"cannot connect to {info.peer_id}: " + "; ".join(errors))

    async def _dial_circuit(self, addr: multiaddr.Multiaddr) -> None:
        if self._circuit_transport is None:
            raise PeerUnreachableError("relayed addresses need a running host")
        await self._circuit_transport.dial(addr)

    def _relay_routes(self, peer: ID,
                      tried: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
        """Circuits to ``peer`` through connected relays not in ``tried`` (bounded)."""
        tried_text = {str(a) for a in tried}
        routes = []
        for relay in self._relays.candidates():
            if relay.peer_id == peer or not self.is_connected(relay.peer_id) \
                    or not self._serves_relay(relay.peer_id):
                continue
            for relay_addr in relay.addrs:
                addr = circuit_addr(relay_addr, relay.peer_id, peer)
                if str(addr) not in tried_text and not is_circuit(relay_addr):
                    routes.append(addr)
                    break
        return routes[:MAX_RELAY_ROUTES]

    def known_addrs(self, peer: PeerIDLike) -> list[str]:
        """Addresses ``peer`` can be dialled at, as far as this host knows (maybe none)."""
        peer_id = parse_peer_id(peer)
        addrs = self._known_addrs.get(peer_id)
        if not addrs:
            try:
                addrs = tuple(self._host.get_peerstore().addrs(peer_id))
            except Exception:  # py-libp2p raises for unknown or expired peers
                addrs = ()
        return [str(a) for a in addrs]

    def add_addrs(self, peer: PeerIDLike, addrs: Iterable[str]) -> int:
        """Remember where ``peer`` can be dialled (addresses learnt from the DHT, say).

        Unparsable addresses are skipped; returns how many were kept.  The
        addresses replace those known before and are tried by :meth:`new_stream`.
        """
        peer_id = parse_peer_id(peer)
        parsed = []
        for addr in addrs:
            text = str(addr)
            if not is_circuit(text):  # a direct address: the transport part only
                text = text.split(f"/p2p/{peer_id}")[0]
            try:
                parsed.append(parse_multiaddr(text))
            except P2PDLError:
                continue
        if parsed and peer_id != self.peer_id:
            self._remember(PeerInfo(peer_id, parsed))
        return len(parsed)

    def _remember(self, info: PeerInfo) -> None:
        self._known_addrs[info.peer_id] = tuple(info.addrs)
        self._known_addrs.move_to_end(info.peer_id)
        while len(self._known_addrs) > MAX_KNOWN_PEERS:
            self._known_addrs.popitem(last=False)

    async def new_stream(self, peer: PeerIDLike, protocol_id: str,
                         timeout: float | None = None) -> INetStream:
        """Open a stream speaking ``protocol_id`` on the (reused) connection to ``peer``."""
        timeout = self._config.stream_open_timeout if timeout is None else timeout
        peer_id = await self.ensure_connected(peer, timeout=self._config.dial_timeout)
        with trio.move_on_after(timeout) as scope:
            try:
                return await self._host.new_stream(peer_id, [protocol_id])  # type: ignore[list-item]
            except StreamFailure as exc:
                reason = _reason(exc)
                if "not supported" in reason.lower() or "na" == reason.strip():
                    raise ProtocolNotSupportedError(
                        f"peer {peer_id} does not support {protocol_id}") from None
                raise StreamClosedError(f"cannot open {protocol_id} to {peer_id}: "
                                        f"{reason}") from None
            except Exception as exc:
                raise StreamClosedError(f"cannot open {protocol_id} to {peer_id}: "
                                        f"{_reason(exc)}") from None
        assert scope.cancelled_caught
        raise CallTimeoutError(f"opening {protocol_id} to {peer_id} took over {timeout:.1f} s")

    def set_stream_handler(self, protocol_id: str, handler: StreamHandler) -> None:
        """Serve ``protocol_id``: ``handler`` runs once per incoming stream.

        A peer may have at most ``max_inbound_streams_per_peer`` handler streams
        at once; more are reset.  A :class:`RemoteProtocolError` or
        :class:`StreamClosedError` escaping the handler is logged, not raised:
        the node keeps serving everyone else.
        """
        limit = self._config.max_inbound_streams_per_peer

        async def run_handler(stream: INetStream) -> None:
            peer = stream.muxed_conn.peer_id
            if self._inbound[peer] >= limit:
                logger.warning("peer %s has %d streams open to us; resetting a new %s stream",
                               peer, limit, protocol_id)
                await reset_stream(stream)
                return
            self._inbound[peer] += 1
            try:
                await handler(stream)
            except RemoteProtocolError as exc:
                logger.info("%s from %s: protocol error, stream reset: %s", protocol_id, peer, exc)
            except StreamClosedError as exc:
                logger.debug("%s from %s: %s", protocol_id, peer, exc)
            except Exception:
                logger.exception("handler of %s failed on a stream from %s", protocol_id, peer)
                await reset_stream(stream)
            finally:
                self._inbound[peer] -= 1
                if self._inbound[peer] <= 0:
                    del self._inbound[peer]

        self._host.set_stream_handler(protocol_id, run_handler)  # type: ignore[arg-type]

    # -- reachability support ---------------------------------------------------

    def observed_ip(self, peer: PeerIDLike) -> str | None:
        """The IP address ``peer``'s direct connection comes from, as we see it."""
        for conn in self._host.get_network().connections.get(parse_peer_id(peer), []):
            if _connection_kind(conn) != "direct":
                continue
            try:
                remote = conn.muxed_conn.get_remote_address()
            except Exception:  # a connection being torn down
                continue
            if remote:
                return str(remote[0])
        return None

    async def probe(self, address: str | multiaddr.Multiaddr, peer: PeerIDLike,
                    timeout: float) -> None:
        """Dial ``address`` on a fresh TCP connection and check it is ``peer``.

        Never reuses a connection: the point is to learn whether the address
        itself is reachable.  Succeeds when a Noise handshake proves the
        identity of ``peer``; raises :class:`PeerUnreachableError` otherwise.
        """
        peer_id = parse_peer_id(peer)
        target = parse_multiaddr(str(address).split("/p2p/")[0], "probed address")
        names = [p.name for p in target.protocols()]
        if names not in (["ip4", "tcp"], ["ip6", "tcp"]):
            raise PeerUnreachableError(f"{address} is not a direct TCP address")
        upgrader = self._host.get_network().upgrader  # type: ignore[attr-defined]
        with trio.move_on_after(timeout) as scope:
            raw = None
            try:
                raw = await TCP().dial(target)
                secured = await upgrader.upgrade_security(raw, True, peer_id)
                with trio.move_on_after(1):
                    await secured.close()
                return
            except Exception as exc:
                raise PeerUnreachableError(f"{address}: {_reason(exc)}") from None
            finally:
                if raw is not None:
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        try:
                            await raw.close()
                        except Exception:  # already closed by the handshake's failure
                            pass
        assert scope.cancelled_caught
        raise PeerUnreachableError(f"{address}: no answer within {timeout:.1f} s")

    # -- relays ---------------------------------------------------------------

    def add_relay_candidates(self, addresses: list[PeerInfo]) -> None:
        """Relays to reserve on when the node is not publicly reachable."""
        for info in addresses:
            if info.peer_id != self.peer_id:
                self._relays.add_candidate(info)
        self._relay_wakeup.set()

    def set_wants_relays(self, wanted: bool) -> None:
        """Hold relay reservations (not known to be public) or not (public)."""
        wanted = wanted and self._config.use_relays
        if wanted != self._wants_relays:
            self._wants_relays = wanted
            self._relay_wakeup.set()

    def _serves_relay(self, peer: ID) -> bool:
        """Whether ``peer`` is known to serve circuit relay (identify, or a reservation)."""
        if self._relays.is_relay(peer) is not None:
            return bool(self._relays.is_relay(peer))
        try:
            protocols = self._host.get_peerstore().get_protocols(peer)
        except Exception:  # unknown to the peerstore
            return False
        return str(HOP_PROTOCOL_ID) in protocols

    def relay_reservations(self) -> list[ID]:
        return [r.peer_id for r in self._relays.active(trio.current_time())]

    async def serve_reservations(self) -> None:
        """Keep reservations on relays while wanted; refresh them; replace lost ones."""
        while True:
            now = trio.current_time()
            action = self._relays.next_action(now, self._wants_relays)
            if action.kind == "reserve":
                assert action.relay is not None
                await self._reserve(action.relay)
                continue
            self._relay_wakeup = trio.Event()
            with trio.move_on_after(min(action.delay, RESERVATION_POLL)):
                await self._relay_wakeup.wait()

    async def _reserve(self, relay: PeerInfo) -> None:
        assert self._circuit_transport is not None
        now = trio.current_time()
        try:
            with trio.fail_after(self._config.dial_timeout + self._config.stream_open_timeout):
                stream = await self.new_stream(relay.peer_id, str(HOP_PROTOCOL_ID))
                try:
                    ok = await self._circuit_transport._make_reservation(stream, relay.peer_id)
                finally:
                    with trio.move_on_after(2):
                        await stream.close()
        except ProtocolNotSupportedError:
            self._relays.on_failed(relay.peer_id, now, not_a_relay=True)
            logger.info("%s does not serve circuit relay", relay.peer_id)
            return
        except (P2PDLError, trio.TooSlowError) as exc:
            delay = self._relays.on_failed(relay.peer_id, now)
            logger.info("reservation on relay %s failed (%s); retry in %.0f s",
                        relay.peer_id, exc, delay)
            return
        if not ok:
            delay = self._relays.on_failed(relay.peer_id, now)
            logger.info("relay %s refused a reservation; retry in %.0f s", relay.peer_id, delay)
            return
        expires = self._circuit_transport._reservations.get(relay.peer_id, 0)
        ttl = max(1.0, expires - time.time())
        fresh = relay.peer_id not in self.relay_reservations()
        self._relays.on_reserved(relay.peer_id, trio.current_time(), ttl)
        if fresh:
            logger.info("reserved a slot on relay %s for %.0f s", relay.peer_id, ttl)
            self._addrs_changed()

    async def serve_initial_peers(
            self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect to every initial peer and reconnect whenever a connection drops."""
        infos = [parse_peer_addr(a, "initial peer") for a in self._config.initial_peers]
        async with trio.open_nursery() as nursery:
            for info in infos:
                if info.peer_id != self.peer_id:
                    nursery.start_soon(self._keep_connected, info)
            task_status.started()

    async def _keep_connected(self, info: PeerInfo) -> None:
        backoff = Backoff(self._config.initial_peer_backoff)
        retries = self._config.initial_peer_retries
        while True:
            if self.is_connected(info.peer_id):
                backoff.reset()
                await self.wait_connections_changed(self._config.reconnect_check_interval)
                continue
            try:
                await self._dial(info, None)
                logger.info("connected to initial peer %s", info.peer_id)
                continue
            except PeerUnreachableError as exc:
                delay = backoff.next_delay()
                if retries is not None and backoff.failures >= retries:
                    logger.warning("giving up on initial peer %s after %d attempts: %s",
                                   info.peer_id, backoff.failures, exc)
                    return
                logger.info("initial peer %s unreachable (attempt %d), retrying in %.1f s: %s",
                            info.peer_id, backoff.failures, delay, exc)
            await trio.sleep(delay)


async def reset_stream(stream: INetStream, timeout: float = 2.0) -> None:
    """Reset a libp2p stream, shielded from cancellation and bounded by ``timeout``.

    Shielded so that a reset asked for is a reset sent, even by a task being
    cancelled.
    """
    with trio.CancelScope(shield=True), trio.move_on_after(timeout):
        try:
            await stream.reset()
        except Exception:  # the stream or connection may already be gone
            logger.debug("resetting a stream failed", exc_info=True)


def _with_target(addr: multiaddr.Multiaddr, peer: ID) -> multiaddr.Multiaddr:
    """A circuit address ending in ``/p2p/<peer>``, as the relay transport needs it."""
    text = str(addr)
    return addr if text.endswith(f"/p2p/{peer}") else multiaddr.Multiaddr(f"{text}/p2p/{peer}")


def _connection_kind(conn: INetConn) -> str:
    """``relayed`` for a circuit connection, else ``direct``."""
    try:
        if conn.get_connection_type() == ConnectionType.RELAYED:
            return "relayed"
        addrs = conn.get_transport_addresses()
    except Exception:  # a connection being torn down; assume the common case
        return "direct"
    return "relayed" if any(is_circuit(a) for a in addrs or ()) else "direct"


def _libp2p_relay_limits(limits: RelayLimits) -> LibRelayLimits:
    return LibRelayLimits(duration=limits.max_circuit_duration, data=limits.max_circuit_bytes,
                          max_circuit_conns=limits.max_circuits_per_peer,
                          max_reservations=limits.max_reservations,
                          reservation_ttl=limits.reservation_ttl)


async def _close_listeners(libp2p_host: IHost) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        for listener in list(libp2p_host.get_network().listeners.values()):  # type: ignore[attr-defined]
            try:
                await listener.close()
            except Exception:  # closing is best effort; the socket may be gone
                logger.debug("closing a listener failed", exc_info=True)


async def _close_connections(libp2p_host: IHost) -> None:
    """Close every connection while py-libp2p's tasks still run.

    ``host.run()`` leaves connections open when it ends: a host stopped in a
    process that goes on would keep its sockets, its peers would see it
    connected, and their requests would hang until they time out.
    """
    async def close(conn: INetConn) -> None:
        try:
            await conn.close()
        except Exception:  # closing is best effort; the peer may be gone
            logger.debug("closing a connection failed", exc_info=True)

    connections = [c for conns in libp2p_host.get_network().connections.values() for c in conns]
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            for conn in connections:
                nursery.start_soon(close, conn)


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


def _reason(exc: BaseException) -> str:
    """The innermost useful message of a py-libp2p exception chain.

    Follows causes, and the first error inside py-libp2p's MultiError or an
    exception group, down to the root (a refused connection, a failed
    handshake...).
    """
    messages = []
    current: BaseException | None = exc
    for _ in range(12):  # bounded: chains are short, but never trust a cycle
        if current is None:
            break
        inner = getattr(current, "errors", None) or getattr(current, "exceptions", None)
        if not inner:
            messages.append(str(current).strip() or type(current).__name__)
        if inner:
            current = inner[0]
        else:
            current = current.__cause__ or current.__context__
    return messages[-1] if messages else "unknown error"


@asynccontextmanager
async def open_host(config: HostConfig | None = None,
                    key_pair: KeyPair | None = None) -> AsyncIterator[Host]:
    """Run a host for the duration of the block.

    The identity comes from ``key_pair``, else from ``config.identity_path``
    (created there on first use), else it is new.  Initial peers are dialled in
    the background, with retries, while the block runs.
    """
    config = config or HostConfig()
    if key_pair is None:
        key_pair = (load_or_create_identity(config.identity_path) if config.identity_path
                    else create_new_key_pair())
    initial = [parse_peer_addr(a, "initial peer") for a in config.initial_peers]
    libp2p_host = _build_libp2p_host(key_pair, config)
    listen = [parse_multiaddr(a) for a in config.listen]
    host = Host(libp2p_host, config)
    for info in initial:  # reachable by peer id at once, before the first dial ends
        host._remember(info)
    # Errors are raised after py-libp2p's nurseries have closed, so that the
    # caller sees them as they are, not wrapped in an ExceptionGroup.
    error: BaseException | None = None
    async with AsyncExitStack() as stack:
        # py-libp2p serves its TCP listeners from a system task that outlives
        # host.run(), and leaves connections open; close them ourselves so
        # that nothing is left running.
        stack.push_async_callback(_close_listeners, libp2p_host)
        try:
            await stack.enter_async_context(libp2p_host.run(listen))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {', '.join(config.listen)}: "
                              f"{exc.strerror or exc}") from None
        stack.push_async_callback(_close_connections, libp2p_host)
        # py-libp2p logs a failed listen (port in use...) and carries on.
        if len(libp2p_host.get_transport_addrs()) < len(listen):
            error = ConfigError(f"cannot listen on {', '.join(config.listen)}: the address is "
                                f"in use or not available on this machine")
        else:
            limits = _libp2p_relay_limits(config.relay_limits)
            circuit = CircuitV2Protocol(libp2p_host, limits=limits,
                                        allow_hop=config.relay_service)
            await stack.enter_async_context(background_trio_service(circuit))
            roles = LibRelayRole.STOP | LibRelayRole.CLIENT
            if config.relay_service:
                roles |= LibRelayRole.HOP
            host._circuit = circuit
            host._circuit_transport = CircuitV2Transport(
                libp2p_host, circuit, LibRelayConfig(roles=roles, limits=limits))
            if config.hole_punching:
                dcutr = DCUtRProtocol(libp2p_host, dial_timeout=int(config.dial_timeout))
                await stack.enter_async_context(background_trio_service(dcutr))
            host.add_relay_candidates(initial)
            try:
                async with open_service_nursery() as nursery:
                    if config.use_relays:
                        nursery.start_soon(host.serve_reservations)
                    if config.initial_peers:
                        await nursery.start(host.serve_initial_peers)
                    try:
                        yield host
                    finally:
                        nursery.cancel_scope.cancel()
            except trio.Cancelled:
                raise
            except BaseException as exc:
                error = exc
    if error is not None:
        raise error
