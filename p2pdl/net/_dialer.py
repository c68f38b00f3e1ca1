"""The dialler: connections to peers and streams on them.

One connection per peer, reused by every stream.  :class:`Dialer` connects by
a peer's direct addresses first, then through relay circuits (from the
address list, then through connected relays); remembers the addresses it
dialled beyond py-libp2p's 2-minute peerstore TTL; keeps the initial peers
connected with its own retries and backoff; opens streams; and maps
py-libp2p's failures to :class:`PeerUnreachableError`,
:class:`ProtocolNotSupportedError`, :class:`StreamClosedError` and
:class:`CallTimeoutError`.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Iterable

import multiaddr
import trio
from libp2p.abc import IHost, INetStream
from libp2p.host.exceptions import StreamFailure
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.transport.tcp.tcp import TCP

from ..errors import (
    CallTimeoutError,
    ConfigError,
    P2PDLError,
    PeerUnreachableError,
    ProtocolNotSupportedError,
    StreamClosedError,
)
from ._addrs import PeerIDLike, is_unspecified, parse_multiaddr, parse_peer_addr, parse_peer_id
from ._backoff import Backoff
from ._paths import Paths
from ._relay import circuit_addr, is_circuit
from ._reservations import Reservations
from .config import HostConfig

__all__ = ["Dialer", "MAX_KNOWN_PEERS", "MAX_RELAY_ROUTES", "reason"]

logger = logging.getLogger(__name__)

#: Peers whose dialled addresses the host remembers (least recently used dropped).
MAX_KNOWN_PEERS = 10_000
#: Relays tried, at most, to reach a peer whose own addresses failed.
MAX_RELAY_ROUTES = 4


class Dialer:
    """Connects to peers and opens streams; see the module docstring."""

    def __init__(self, libp2p_host: IHost, config: HostConfig, paths: Paths,
                 relays: Reservations) -> None:
        self._host = libp2p_host
        self._config = config
        self._paths = paths
        self._relays = relays
        self.circuit_transport: CircuitV2Transport | None = None
        # Addresses we dialled, kept beyond py-libp2p's 2-minute peerstore TTL
        # so that a dropped connection can be re-dialled later (bounded, LRU).
        self._known_addrs: collections.OrderedDict[ID, tuple[multiaddr.Multiaddr, ...]] = (
            collections.OrderedDict())

    # -- connections ----------------------------------------------------------

    async def connect(self, address: str | multiaddr.Multiaddr | PeerInfo,
                      timeout: float | None = None) -> ID:
        info = parse_peer_addr(address)
        if info.peer_id == self._host.get_id():
            raise ConfigError(f"{address} is this node's own address")
        await self.dial(info, timeout)
        return info.peer_id

    async def ensure_connected(self, peer: PeerIDLike, timeout: float | None = None) -> ID:
        peer_id = parse_peer_id(peer)
        if not self._paths.is_connected(peer_id):
            addrs = self._known_addrs.get(peer_id)
            if not addrs:
                try:
                    addrs = self._host.get_peerstore().addrs(peer_id)
                except Exception:  # py-libp2p raises for unknown or expired peers
                    addrs = []
            if not addrs and not self._relay_routes(peer_id, []):
                raise PeerUnreachableError(f"no known address for peer {peer_id}; "
                                           f"connect to it by its full address first")
            await self.dial(PeerInfo(peer_id, list(addrs)), timeout)
        return peer_id

    async def dial(self, info: PeerInfo, timeout: float | None) -> None:
        """Connect by the direct addresses, then by relay circuits.

        Circuits come from the address list itself, then from the relays we
        are connected to (a peer behind NAT that moved to another relay is
        found through it).  All of it is bounded by ``timeout``.
        """
        is_connected = self._paths.is_connected
        direct = [a for a in info.addrs if not is_circuit(a) and not is_unspecified(a)]
        # A peer reached only through a relay is dialled again when we are
        # given a direct address for it: the direct connection replaces the
        # circuit (py-libp2p's own connect would return the circuit).
        relayed_only = self._paths.path(info.peer_id) == "relayed"
        if is_connected(info.peer_id) and not (relayed_only and direct):
            return
        timeout = self._config.dial_timeout if timeout is None else timeout
        self.remember(info)
        circuits = [_with_target(a, info.peer_id) for a in info.addrs if is_circuit(a)]
        errors: list[str] = []
        with trio.move_on_after(timeout) as scope:
            if direct:
                # Our own schedule decides retries: lift py-libp2p's 60 s block.
                self._host.get_network().unblock_peer(info.peer_id)  # type: ignore[attr-defined]
                try:
                    if relayed_only:
                        await self._dial_direct(info.peer_id, direct)
                    else:
                        await self._host.connect(PeerInfo(info.peer_id, direct))
                    return
                except Exception as exc:
                    errors.append(f"{', '.join(str(a) for a in direct)}: {reason(exc)}")
                if relayed_only:  # still reached through the relay: connected all the same
                    logger.debug("no direct connection to relayed peer %s: %s",
                                 info.peer_id, "; ".join(errors))
                    return
            for addr in [*circuits, *self._relay_routes(info.peer_id, circuits)]:
                if is_connected(info.peer_id):
                    return
                try:
                    await self._dial_circuit(addr)
                    return
                except Exception as exc:
                    errors.append(f"{addr}: {reason(exc)}")
        if is_connected(info.peer_id):
            return
        if scope.cancelled_caught:
            errors.append(f"no connection within {timeout:.1f} s")
        raise PeerUnreachableError(f"cannot connect to {info.peer_id}: " + "; ".join(errors))

    async def _dial_direct(self, peer: ID, addrs: list[multiaddr.Multiaddr]) -> None:
        """A new direct connection to ``peer`` by the first of ``addrs`` that answers."""
        network = self._host.get_network()
        last: Exception | None = None
        for addr in addrs:
            try:
                await network.dial_addr(addr, peer)  # type: ignore[attr-defined]
                return
            except Exception as exc:
                last = exc
        assert last is not None
        raise last

    async def _dial_circuit(self, addr: multiaddr.Multiaddr) -> None:
        if self.circuit_transport is None:
            raise PeerUnreachableError("relayed addresses need a running host")
        await self.circuit_transport.dial(addr)

    def _relay_routes(self, peer: ID,
                      tried: list[multiaddr.Multiaddr]) -> list[multiaddr.Multiaddr]:
        """Circuits to ``peer`` through connected relays not in ``tried`` (bounded)."""
        tried_text = {str(a) for a in tried}
        routes = []
        for relay in self._relays.candidates():
            if relay.peer_id == peer or not self._paths.is_connected(relay.peer_id) \
                    or not self._relays.serves_relay(relay.peer_id):
                continue
            for relay_addr in relay.addrs:
                addr = circuit_addr(relay_addr, relay.peer_id, peer)
                if str(addr) not in tried_text and not is_circuit(relay_addr):
                    routes.append(addr)
                    break
        return routes[:MAX_RELAY_ROUTES]

    # -- known addresses ------------------------------------------------------

    def known_addrs(self, peer: PeerIDLike) -> list[str]:
        peer_id = parse_peer_id(peer)
        addrs = self._known_addrs.get(peer_id)
        if not addrs:
            try:
                addrs = tuple(self._host.get_peerstore().addrs(peer_id))
            except Exception:  # py-libp2p raises for unknown or expired peers
                addrs = ()
        return [str(a) for a in addrs]

    def add_addrs(self, peer: PeerIDLike, addrs: Iterable[str]) -> int:
        peer_id = parse_peer_id(peer)
        parsed = []
        for addr in addrs:
            text = str(addr)
            if is_unspecified(text):  # a listen address, dialable nowhere
                continue
            if not is_circuit(text):  # a direct address: the transport part only
                text = text.split(f"/p2p/{peer_id}")[0]
            try:
                parsed.append(parse_multiaddr(text))
            except P2PDLError:
                continue
        if parsed and peer_id != self._host.get_id():
            self.remember(PeerInfo(peer_id, parsed))
        return len(parsed)

    def remember(self, info: PeerInfo) -> None:
        self._known_addrs[info.peer_id] = tuple(info.addrs)
        self._known_addrs.move_to_end(info.peer_id)
        while len(self._known_addrs) > MAX_KNOWN_PEERS:
            self._known_addrs.popitem(last=False)

    # -- streams --------------------------------------------------------------

    async def new_stream(self, peer: PeerIDLike, protocol_id: str,
                         timeout: float | None = None) -> INetStream:
        timeout = self._config.stream_open_timeout if timeout is None else timeout
        peer_id = await self.ensure_connected(peer, timeout=self._config.dial_timeout)
        with trio.move_on_after(timeout) as scope:
            try:
                return await self._host.new_stream(peer_id, [protocol_id])  # type: ignore[list-item]
            except StreamFailure as exc:
                why = reason(exc)
                if "not supported" in why.lower() or "na" == why.strip():
                    raise ProtocolNotSupportedError(
                        f"peer {peer_id} does not support {protocol_id}") from None
                raise StreamClosedError(f"cannot open {protocol_id} to {peer_id}: "
                                        f"{why}") from None
            except Exception as exc:
                raise StreamClosedError(f"cannot open {protocol_id} to {peer_id}: "
                                        f"{reason(exc)}") from None
        assert scope.cancelled_caught
        raise CallTimeoutError(f"opening {protocol_id} to {peer_id} took over {timeout:.1f} s")

    # -- reachability support -------------------------------------------------

    async def probe(self, address: str | multiaddr.Multiaddr, peer: PeerIDLike,
                    timeout: float) -> None:
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
                raise PeerUnreachableError(f"{address}: {reason(exc)}") from None
            finally:
                if raw is not None:
                    with trio.CancelScope(shield=True), trio.move_on_after(1):
                        try:
                            await raw.close()
                        except Exception:  # already closed by the handshake's failure
                            pass
        assert scope.cancelled_caught
        raise PeerUnreachableError(f"{address}: no answer within {timeout:.1f} s")

    # -- initial peers --------------------------------------------------------

    async def serve_initial_peers(
            self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        infos = [parse_peer_addr(a, "initial peer") for a in self._config.initial_peers]
        own_id = self._host.get_id()
        async with trio.open_nursery() as nursery:
            for info in infos:
                if info.peer_id != own_id:
                    nursery.start_soon(self._keep_connected, info)
            task_status.started()

    async def _keep_connected(self, info: PeerInfo) -> None:
        backoff = Backoff(self._config.initial_peer_backoff)
        retries = self._config.initial_peer_retries
        while True:
            if self._paths.is_connected(info.peer_id):
                backoff.reset()
                await self._paths.wait_changed(self._config.reconnect_check_interval)
                continue
            try:
                await self.dial(info, None)
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


def _with_target(addr: multiaddr.Multiaddr, peer: ID) -> multiaddr.Multiaddr:
    """A circuit address ending in ``/p2p/<peer>``, as the relay transport needs it."""
    text = str(addr)
    return addr if text.endswith(f"/p2p/{peer}") else multiaddr.Multiaddr(f"{text}/p2p/{peer}")


def reason(exc: BaseException) -> str:
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
