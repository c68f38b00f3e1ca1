"""An in-memory network: hosts that a p2pdl node runs on, without sockets.

A :class:`MemoryNetwork` connects memory hosts (:class:`MemoryHost`).  A
memory host offers what a node and its services use of
:class:`p2pdl.net.Host` (peer id, addresses, connections, streams, stream
handlers, dial-back probes) with the same errors, over memory streams
(:class:`~p2pdl.testing.MemoryStream`); there is no relay, no hole punching
and no py-libp2p host.

Each host gets an address of its own, ``/ip4/127.1.x.y/tcp/1``: a loopback
address no socket ever uses, that only the memory network resolves (the
layers above parse, compare and gossip addresses as they would real ones).

What a test can do to the network:

* :meth:`MemoryNetwork.kill` -- the host dies: its connections are reset, it
  refuses dials, and everything running in its ``open_memory_host`` block is
  cancelled (as when a process is killed);
* :meth:`MemoryNetwork.disconnect` -- a connection is reset (both ends may
  dial again);
* :meth:`MemoryNetwork.partition` / :meth:`MemoryNetwork.heal` -- peers in
  different groups cannot reach each other: bytes on their connections wait,
  dials between them get no answer (until their timeout), until healed;
* ``reachable=False`` hosts are behind NAT: they dial out, but dials to them
  and dial-back probes get no answer, so their NAT service finds them private.

Time is trio's: under ``trio.testing.MockClock(autojump_threshold=0)``
timeouts pass at once.
"""

from __future__ import annotations

import collections
import dataclasses
import ipaddress
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import multiaddr
import trio
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair, PrivateKey, PublicKey
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo

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
from ..net import (
    LIBP2P_PING_PROTOCOL_ID,
    Backoff,
    HostConfig,
    HostStatistics,
    InboundStatistics,
    PeerIDLike,
    parse_multiaddr,
    parse_peer_addr,
    parse_peer_id,
)
from ..service import Statistics
from ._memory_stream import DEFAULT_WINDOW, Link, MemoryStream, memory_stream_pair

__all__ = ["MemoryNetwork", "MemoryHost", "MemoryNetworkStatistics", "open_memory_host"]

logger = logging.getLogger(__name__)

StreamHandler = Callable[[Any], Awaitable[None]]

#: The port of every memory address (no socket listens there: the network resolves it).
MEMORY_PORT = 1
#: The first memory address, 127.1.0.1; host n gets the n-th after it.
_FIRST_IP = int(ipaddress.IPv4Address("127.1.0.0"))
#: Peers whose addresses a memory host remembers (least recently used dropped).
MAX_KNOWN_PEERS = 10_000


def _peer_of(peer: Any) -> ID:
    """A peer id from an ID, its base58 text, or anything with a ``peer_id`` (node, host)."""
    if isinstance(peer, (ID, str)):
        return parse_peer_id(peer)
    peer_id = getattr(peer, "peer_id", None)
    if isinstance(peer_id, ID):
        return peer_id
    raise TypeError(f"{peer!r} is not a peer (an ID, its text, a node or a host)")


@dataclasses.dataclass(frozen=True)
class MemoryNetworkStatistics(Statistics):
    """What :meth:`MemoryNetwork.statistics` says: hosts, connections, open streams, bytes."""

    hosts: int
    alive: int
    connections: int
    streams: int
    bytes_sent: int


class _Connection:
    """A connection between two hosts: its streams, which it resets when it goes."""

    def __init__(self, network: MemoryNetwork, a: MemoryHost, b: MemoryHost) -> None:
        self.network = network
        self.hosts = (a, b)
        self.streams: set[MemoryStream] = set()
        self.closed = False
        self.link = Link(lambda: network.reachable(a.peer_id, b.peer_id))

    def other(self, host: MemoryHost) -> MemoryHost:
        return self.hosts[1] if host is self.hosts[0] else self.hosts[0]

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        for stream in list(self.streams):
            stream._pair.reset(reason)
        self.streams.clear()
        self.network._drop(self)
        for host in self.hosts:
            host._connections_changed()


class MemoryNetwork:
    """Hosts that reach each other in memory; what a test does to their network.

    Args:
        latency: one-way delay of every write, stream opening and dial (trio
            seconds).  Default 0.
        window: bytes a stream buffers towards its reader before writes wait.
            Default 256 KiB (yamux's window).
    """

    def __init__(self, *, latency: float = 0.0, window: int = DEFAULT_WINDOW) -> None:
        if latency < 0:
            raise ConfigError("MemoryNetwork latency must be >= 0")
        if window < 1:
            raise ConfigError("MemoryNetwork window must be at least 1 byte")
        self.latency = latency
        self.window = window
        self._hosts: dict[ID, MemoryHost] = {}
        self._by_address: dict[tuple[str, int], MemoryHost] = {}
        self._connections: dict[frozenset[ID], _Connection] = {}
        self._groups: dict[ID, int] | None = None  # the partition, if any
        self._healed = trio.lowlevel.ParkingLot()
        self._count = 0
        self._bytes_closed = 0

    # -- what a test does -------------------------------------------------------

    def kill(self, peer: Any) -> None:
        """The host of ``peer`` dies: connections reset, dials refused, its block cancelled."""
        host = self._hosts.get(_peer_of(peer))
        if host is not None:
            host._die("the peer was killed")

    def disconnect(self, a: Any, b: Any) -> bool:
        """Reset the connection between ``a`` and ``b`` (True if there was one)."""
        connection = self._connections.get(frozenset((_peer_of(a), _peer_of(b))))
        if connection is None:
            return False
        connection.close("the connection was reset")
        return True

    def partition(self, *groups: Iterable[Any]) -> None:
        """Split the network: peers in different groups cannot reach each other.

        Peers named in no group form one more group together.  Bytes on
        connections across groups wait (reads and writes stall, as over a
        link that drops packets); dials across get no answer.  Replaces any
        earlier partition.
        """
        assignment: dict[ID, int] = {}
        for index, group in enumerate(groups):
            for peer in group:
                assignment[_peer_of(peer)] = index
        self._groups = assignment
        self._wake_all()

    def heal(self) -> None:
        """End the partition: stalled bytes flow, dials are answered again."""
        self._groups = None
        self._wake_all()

    def reachable(self, a: Any, b: Any) -> bool:
        """Whether no partition separates ``a`` and ``b``."""
        if self._groups is None:
            return True
        return self._groups.get(_peer_of(a), -1) == self._groups.get(_peer_of(b), -1)

    # -- what a test reads ------------------------------------------------------

    def hosts(self) -> list[MemoryHost]:
        """Every host that joined and has not left (killed ones included)."""
        return list(self._hosts.values())

    def host(self, peer: Any) -> MemoryHost | None:
        return self._hosts.get(_peer_of(peer))

    def open_streams(self) -> list[MemoryStream]:
        """Streams not yet reset or closed by both ends."""
        return [s for c in self._connections.values() for s in c.streams if not s.done]

    def statistics(self) -> MemoryNetworkStatistics:
        streams = [s for c in self._connections.values() for s in c.streams]
        return MemoryNetworkStatistics(
            len(self._hosts), sum(h.alive for h in self._hosts.values()),
            len(self._connections), sum(not s.done for s in streams),
            self._bytes_closed + sum(s.bytes_written for s in streams))

    # -- for the hosts --------------------------------------------------------------

    def _join(self, host: MemoryHost) -> tuple[str, int]:
        self._count += 1
        address = (str(ipaddress.IPv4Address(_FIRST_IP + self._count)), MEMORY_PORT)
        self._hosts[host.peer_id] = host
        self._by_address[address] = host
        return address

    def _leave(self, host: MemoryHost) -> None:
        self._hosts.pop(host.peer_id, None)
        self._by_address.pop(host.address, None)

    def _at(self, address: multiaddr.Multiaddr) -> MemoryHost | None:
        names = [p.name for p in address.protocols()]
        if names[:2] != ["ip4", "tcp"]:
            return None
        try:
            key = (address.value_for_protocol("ip4"), int(address.value_for_protocol("tcp")))
        except Exception:  # not a memory address
            return None
        return self._by_address.get(key)

    def _connection(self, a: ID, b: ID) -> _Connection | None:
        return self._connections.get(frozenset((a, b)))

    def _connect(self, a: MemoryHost, b: MemoryHost) -> _Connection:
        key = frozenset((a.peer_id, b.peer_id))
        connection = self._connections.get(key)
        if connection is None:
            connection = self._connections[key] = _Connection(self, a, b)
            a._connections_changed()
            b._connections_changed()
        return connection

    def _drop(self, connection: _Connection) -> None:
        key = frozenset(h.peer_id for h in connection.hosts)
        if self._connections.get(key) is connection:
            del self._connections[key]

    def _stream_done(self, connection: _Connection, stream: MemoryStream) -> None:
        if stream in connection.streams:
            connection.streams.discard(stream)
            self._bytes_closed += stream.bytes_written

    def _wake_all(self) -> None:
        for connection in self._connections.values():
            for stream in connection.streams:
                stream.wake()
        self._healed.unpark_all()


class _Identity:
    """Stands in for the py-libp2p host in the one thing the layers read of it: the key."""

    def __init__(self, key_pair: KeyPair, peer_id: ID) -> None:
        self._key_pair = key_pair
        self._peer_id = peer_id

    def get_private_key(self) -> PrivateKey:
        return self._key_pair.private_key

    def get_public_key(self) -> PublicKey:
        return self._key_pair.public_key

    def get_id(self) -> ID:
        return self._peer_id


class MemoryHost:
    """A host of a :class:`MemoryNetwork`.  Obtain one from :func:`open_memory_host`.

    Has the methods of :class:`p2pdl.net.Host` that a node and its services
    call, with the same arguments, results and errors; connections are
    direct (no relays, no hole punching).
    """

    def __init__(self, network: MemoryNetwork, key_pair: KeyPair, config: HostConfig,
                 reachable: bool, nursery: trio.Nursery) -> None:
        self.network = network
        self._key_pair = key_pair
        self._peer_id = ID.from_pubkey(key_pair.public_key)
        self._identity = _Identity(key_pair, self._peer_id)
        self._config = config
        self.reachable = reachable
        self._nursery = nursery
        self._handlers: dict[str, StreamHandler] = {}
        self._inbound: collections.Counter[ID] = collections.Counter()
        self._known_addrs: collections.OrderedDict[ID, tuple[str, ...]] = (
            collections.OrderedDict())
        self._changed = trio.Event()
        self._alive = True
        self._wants_relays = config.use_relays
        self._relay_candidates: list[PeerInfo] = []
        self.address = network._join(self)

    # -- identity and addresses -----------------------------------------------------

    @property
    def libp2p(self) -> _Identity:
        """The host's key (``get_private_key()``), as the layers read it of py-libp2p's host."""
        return self._identity

    @property
    def peer_id(self) -> ID:
        return self._peer_id

    @property
    def config(self) -> HostConfig:
        return self._config

    @property
    def alive(self) -> bool:
        """False once killed or closed."""
        return self._alive

    @property
    def ip(self) -> str:
        return self.address[0]

    def listen_addrs(self) -> list[multiaddr.Multiaddr]:
        return [multiaddr.Multiaddr(f"/ip4/{self.address[0]}/tcp/{self.address[1]}")]

    def addrs(self) -> list[str]:
        """Full addresses (``.../p2p/<id>``) other memory hosts reach this one at."""
        return [f"{a}/p2p/{self.peer_id}" for a in self.listen_addrs()]

    def direct_addrs(self) -> list[str]:
        return self.addrs()

    def circuit_addrs(self) -> list[multiaddr.Multiaddr]:
        return []

    @property
    def addrs_version(self) -> int:
        """Memory hosts' addresses never change."""
        return 0

    # -- connections ------------------------------------------------------------------

    def path(self, peer: PeerIDLike) -> str | None:
        """``direct`` while connected to ``peer``, else None."""
        return "direct" if self.is_connected(parse_peer_id(peer)) else None

    def paths(self) -> dict[ID, str]:
        return dict.fromkeys(self.connected_peers(), "direct")

    def is_connected(self, peer: ID) -> bool:
        return self._alive and self.network._connection(self.peer_id, peer) is not None

    def connected_peers(self) -> list[ID]:
        if not self._alive:
            return []
        return [c.other(self).peer_id for c in self.network._connections.values()
                if self in c.hosts]

    def _connections_changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_connections_changed(self, timeout: float) -> bool:
        """Return when a connection opens or closes (True), or after ``timeout`` seconds (False)."""
        with trio.move_on_after(timeout):
            await self._changed.wait()
            return True
        return False

    async def connect(self, address: str | multiaddr.Multiaddr | PeerInfo,
                      timeout: float | None = None) -> ID:
        """Connect to a peer by its full address; reuse the connection if there is one."""
        info = parse_peer_addr(address)
        if info.peer_id == self.peer_id:
            raise ConfigError(f"{address} is this node's own address")
        await self._dial(info.peer_id, [str(a) for a in info.addrs], timeout)
        return info.peer_id

    async def ensure_connected(self, peer: PeerIDLike, timeout: float | None = None) -> ID:
        """Make sure a connection exists, dialling the peer's known addresses if needed."""
        peer_id = parse_peer_id(peer)
        if not self.is_connected(peer_id):
            addrs = self._known_addrs.get(peer_id)
            if not addrs:
                raise PeerUnreachableError(f"no known address for peer {peer_id}; "
                                           f"connect to it by its full address first")
            await self._dial(peer_id, list(addrs), timeout)
        return peer_id

    async def _dial(self, peer_id: ID, addrs: list[str], timeout: float | None) -> None:
        if self.is_connected(peer_id):
            await trio.lowlevel.checkpoint()
            return
        self._check_alive()
        timeout = self._config.dial_timeout if timeout is None else timeout
        self._remember(peer_id, addrs)
        errors: list[str] = []
        with trio.move_on_after(timeout) as scope:
            for text in addrs:
                error = await self._dial_one(peer_id, text)
                if error is None:
                    return
                errors.append(f"{text}: {error}")
        if self.is_connected(peer_id):
            return
        if scope.cancelled_caught:
            errors.append(f"no connection within {timeout:.1f} s")
        raise PeerUnreachableError(f"cannot connect to {peer_id}: " + "; ".join(errors))

    async def _dial_one(self, peer_id: ID, text: str) -> str | None:
        """Dial one address; None once connected, else why not.  Waits while unanswered."""
        try:
            target = self.network._at(parse_multiaddr(text.split("/p2p/")[0]))
        except P2PDLError:
            return "not an address"
        if target is None or not target.alive:
            return "connection refused"
        if target.peer_id != peer_id:
            return f"the host there is {target.peer_id}, not {peer_id}"
        # A round trip for the handshake; no answer across a partition or into a NAT.
        await trio.sleep(2 * self.network.latency)
        while not (target.reachable and self.network.reachable(self.peer_id, peer_id)):
            await self.network._healed.park()
        self._check_alive()
        if not target.alive:
            return "connection refused"
        self.network._connect(self, target)
        return None

    def _check_alive(self) -> None:
        if not self._alive:
            raise PeerUnreachableError("this host is closed")

    def known_addrs(self, peer: PeerIDLike) -> list[str]:
        """Addresses ``peer`` can be dialled at, as far as this host knows (maybe none)."""
        return list(self._known_addrs.get(parse_peer_id(peer), ()))

    def add_addrs(self, peer: PeerIDLike, addrs: Iterable[str]) -> int:
        """Remember where ``peer`` can be dialled; returns how many addresses were kept."""
        peer_id = parse_peer_id(peer)
        kept = []
        for addr in addrs:
            text = str(addr).split(f"/p2p/{peer_id}")[0]
            try:
                parse_multiaddr(text)
            except P2PDLError:
                continue
            kept.append(text)
        if kept and peer_id != self.peer_id:
            self._remember(peer_id, kept)
        return len(kept)

    def _remember(self, peer_id: ID, addrs: list[str]) -> None:
        self._known_addrs[peer_id] = tuple(addrs)
        self._known_addrs.move_to_end(peer_id)
        while len(self._known_addrs) > MAX_KNOWN_PEERS:
            self._known_addrs.popitem(last=False)

    # -- streams ------------------------------------------------------------------------

    async def new_stream(self, peer: PeerIDLike, protocol_id: str,
                         timeout: float | None = None) -> MemoryStream:
        """Open a stream speaking ``protocol_id`` on the (reused) connection to ``peer``.

        Raises :class:`ProtocolNotSupportedError` when the peer serves no such
        protocol, :class:`PeerUnreachableError` when it cannot be reached,
        :class:`StreamClosedError` when the connection is lost meanwhile and
        :class:`CallTimeoutError` after ``timeout`` (default ``stream_open_timeout``).
        """
        timeout = self._config.stream_open_timeout if timeout is None else timeout
        peer_id = await self.ensure_connected(peer, timeout=self._config.dial_timeout)
        with trio.move_on_after(timeout):
            connection = self.network._connection(self.peer_id, peer_id)
            if connection is not None:
                # Protocol negotiation: a round trip (none across a partition).
                await trio.sleep(2 * self.network.latency)
                while not connection.closed and not connection.link.up:
                    await self.network._healed.park()
            if connection is None or connection.closed:
                raise StreamClosedError(f"cannot open {protocol_id} to {peer_id}: "
                                        f"the connection was lost")
            remote = connection.other(self)
            handler = remote._handlers.get(protocol_id)
            if handler is None or not remote.alive:
                raise ProtocolNotSupportedError(f"peer {peer_id} does not support {protocol_id}")
            return self._open(connection, remote, protocol_id, handler)
        raise CallTimeoutError(f"opening {protocol_id} to {peer_id} took over {timeout:.1f} s")

    def _open(self, connection: _Connection, remote: MemoryHost, protocol_id: str,
              handler: StreamHandler) -> MemoryStream:
        network = self.network

        def finished() -> None:
            network._stream_done(connection, mine)
            network._stream_done(connection, theirs)

        mine, theirs = memory_stream_pair(
            protocol_id, (self.peer_id, remote.peer_id),
            addresses=(self.address, remote.address), window=network.window,
            latency=network.latency, link=connection.link, on_done=finished)
        connection.streams.update((mine, theirs))
        try:
            remote._nursery.start_soon(remote._run_handler, protocol_id, handler, theirs,
                                       name=f"memory stream handler {protocol_id}")
        except RuntimeError:  # the remote's nursery is closing
            mine._pair.reset("the peer is shutting down")
            raise StreamClosedError(f"cannot open {protocol_id} to {remote.peer_id}: "
                                    f"the peer is shutting down") from None
        return mine

    def set_stream_handler(self, protocol_id: str, handler: StreamHandler) -> None:
        """Serve ``protocol_id``: ``handler(stream)`` runs once per incoming stream.

        As on :class:`p2pdl.net.Host`: at most ``max_inbound_streams_per_peer``
        handler streams per peer (more are reset); a
        :class:`RemoteProtocolError` or :class:`StreamClosedError` escaping
        the handler is logged, not raised; any other error is logged and the
        stream reset.
        """
        self._handlers[protocol_id] = handler

    async def _run_handler(self, protocol_id: str, handler: StreamHandler,
                           stream: MemoryStream) -> None:
        peer = stream.muxed_conn.peer_id
        if self._inbound[peer] >= self._config.max_inbound_streams_per_peer:
            logger.warning("peer %s has %d streams open to us; resetting a new %s stream",
                           peer, self._inbound[peer], protocol_id)
            await stream.reset()
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
            await stream.reset()
        finally:
            self._inbound[peer] -= 1
            if self._inbound[peer] <= 0:
                del self._inbound[peer]

    async def _answer_ping(self, stream: MemoryStream) -> None:
        """``/ipfs/ping/1.0.0``, which every libp2p host serves: echo 32-byte pings."""
        try:
            for _ in range(1024):  # bounded: a ping stream is short-lived
                data = b""
                while len(data) < 32:
                    data += await stream.read(32 - len(data))
                await stream.write(data)
        except Exception:  # EOF or reset: the pinger is done
            pass
        finally:
            await stream.reset()

    # -- reachability support -------------------------------------------------------

    def observed_ip(self, peer: PeerIDLike) -> str | None:
        """The IP address ``peer``'s connection comes from, as this host sees it."""
        connection = self.network._connection(self.peer_id, parse_peer_id(peer))
        return None if connection is None else connection.other(self).ip

    async def probe(self, address: str | multiaddr.Multiaddr, peer: PeerIDLike,
                    timeout: float) -> None:
        """Dial ``address`` afresh and check it is ``peer`` (never reuses a connection).

        Raises :class:`PeerUnreachableError` when nobody is there, someone
        else is, or no answer comes within ``timeout`` (a partition, a NAT).
        """
        peer_id = parse_peer_id(peer)
        target = parse_multiaddr(str(address).split("/p2p/")[0], "probed address")
        names = [p.name for p in target.protocols()]
        if names not in (["ip4", "tcp"], ["ip6", "tcp"]):
            raise PeerUnreachableError(f"{address} is not a direct TCP address")
        with trio.move_on_after(timeout):
            host = self.network._at(target)
            if host is None or not host.alive:
                raise PeerUnreachableError(f"{address}: connection refused")
            await trio.sleep(2 * self.network.latency)
            while not (host.reachable and self.network.reachable(self.peer_id, host.peer_id)):
                await self.network._healed.park()
            if host.peer_id != peer_id:
                raise PeerUnreachableError(f"{address}: the host there is {host.peer_id}, "
                                           f"not {peer_id}")
            return
        raise PeerUnreachableError(f"{address}: no answer within {timeout:.1f} s")

    # -- relays (none in memory) ------------------------------------------------------

    def add_relay_candidates(self, addresses: list[PeerInfo]) -> None:
        """Recorded (``relay_candidates``), but memory hosts hold no reservations."""
        known = {info.peer_id for info in self._relay_candidates}
        self._relay_candidates += [info for info in addresses
                                   if info.peer_id not in known and info.peer_id != self.peer_id]

    def relay_candidates(self) -> list[PeerInfo]:
        return list(self._relay_candidates)

    def set_wants_relays(self, wanted: bool) -> None:
        """Recorded (``wants_relays``), but memory hosts hold no reservations."""
        self._wants_relays = wanted and self._config.use_relays

    @property
    def wants_relays(self) -> bool:
        return self._wants_relays

    def relay_reservations(self) -> list[ID]:
        return []

    def statistics(self) -> HostStatistics:
        """As :meth:`p2pdl.net.Host.statistics`; a memory host counts no inbound
        streams and holds no input budget (``MemoryNetwork.statistics`` counts streams)."""
        return HostStatistics(len(self.connected_peers()), InboundStatistics(0, 0, 0, {}, {}),
                              0, 0, 0)

    # -- initial peers and the end ------------------------------------------------

    async def serve_initial_peers(
            self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Connect to every initial peer and reconnect whenever a connection drops."""
        infos = [parse_peer_addr(a, "initial peer") for a in self._config.initial_peers]
        async with trio.open_nursery() as nursery:
            for info in infos:
                if info.peer_id != self.peer_id:
                    self._remember(info.peer_id, [str(a) for a in info.addrs])
                    nursery.start_soon(self._keep_connected, info)
            task_status.started()

    async def _keep_connected(self, info: PeerInfo) -> None:
        backoff = Backoff(self._config.initial_peer_backoff)
        retries = self._config.initial_peer_retries
        while True:  # until the host's block ends, or the peer is given up
            if self.is_connected(info.peer_id):
                backoff.reset()
                await self.wait_connections_changed(self._config.reconnect_check_interval)
                continue
            try:
                await self._dial(info.peer_id, [str(a) for a in info.addrs], None)
                continue
            except PeerUnreachableError as exc:
                delay = backoff.next_delay()
                if retries is not None and backoff.failures >= retries:
                    logger.warning("giving up on initial peer %s after %d attempts: %s",
                                   info.peer_id, backoff.failures, exc)
                    return
            await trio.sleep(delay)

    def _die(self, reason: str) -> None:
        if not self._alive:
            return
        self._alive = False
        for connection in list(self.network._connections.values()):
            if self in connection.hosts:
                connection.close(reason)
        self._connections_changed()
        self._nursery.cancel_scope.cancel()

    def kill(self) -> None:
        """Die at once: connections reset, dials refused, the host's block cancelled."""
        self._die("the peer was killed")


@asynccontextmanager
async def open_memory_host(network: MemoryNetwork, config: HostConfig | None = None,
                           key_pair: KeyPair | None = None, *,
                           reachable: bool = True) -> AsyncIterator[MemoryHost]:
    """Run a host of ``network`` for the duration of the block.

    ``config`` supplies the timeouts, ``initial_peers`` (dialled and kept
    connected while the block runs) and ``max_inbound_streams_per_peer``;
    its listen, announce, identity and relay settings do not apply.
    ``reachable=False``: the host is behind NAT (see the module docstring).
    Incoming streams are handled in the block's nursery.  When the block
    ends the host's connections are reset and it leaves the network; when
    the host is killed the block is cancelled and ends quietly.
    """
    config = config or HostConfig()
    key_pair = key_pair or create_new_key_pair()
    async with open_service_nursery() as nursery:
        host = MemoryHost(network, key_pair, config, reachable, nursery)
        host.set_stream_handler(LIBP2P_PING_PROTOCOL_ID, host._answer_ping)
        try:
            if config.initial_peers:
                await nursery.start(host.serve_initial_peers)
            yield host
        finally:
            host._die("the peer closed its host")
            network._leave(host)
