"""The trio node: one lifetime that owns the host and every service.

``async with open_node(...) as node`` runs a :class:`TrioNode`.  The node builds
its protocol services in one loop (:data:`SERVICES`), each the same way from a
:class:`~p2pdl.service.ServiceContext`, its config and the services it depends
on; installs every endpoint they list behind the node's admission gate; and
starts each service's ``serve`` in its nursery.  The sync face (``Node``) and
the asyncio face (``node.aio``) are in ``_sync_node``.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager, nullcontext
from typing import Any

import trio
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from ._concurrency import open_service_nursery
from ._config import NodeConfig
from .averaging import (
    ALLREDUCE_PROTOCOL_ID,
    MATCHMAKING_PROTOCOL_ID,
    AllReduceService,
    MatchmakingService,
)
from .dht import DHTService
from .errors import (
    CallTimeoutError,
    ConfigError,
    P2PDLError,
    ProtocolNotSupportedError,
    RemoteError,
)
from .membership import MembershipService, RunPolicy
from .nat import NatService
from .net import Host, HostStatistics, PeerIDLike, open_host, ping_libp2p
from .progress import ProgressService
from .service import (
    NOT_ADMITTED,
    AdmissionGate,
    AdmissionStatistics,
    BanningGate,
    BothGates,
    Endpoint,
    FlagBook,
    Gatekeeper,
    OpenAdmission,
    Opened,
    Reachability,
    Refusal,
    RpcEndpoint,
    Service,
    ServiceContext,
    Statistics,
    StreamEndpoint,
    install_endpoint,
)
from .statesync import StateSyncService
from .wire import (
    PING,
    FramedStream,
    Message,
    PingRequest,
    RpcClient,
    RpcHandler,
    RpcProtocol,
    answer_ping,
    open_framed_stream,
)

__all__ = ["NodeConfig", "TrioNode", "open_node", "NodeStatistics", "SERVICES"]

logger = logging.getLogger(__name__)

ServiceBuilder = Callable[[ServiceContext, NodeConfig, dict[str, Any]], Service]

#: The node's protocol services, in the order they are built and started: a
#: name (the node's attribute) and how to build the service from the context,
#: the node's config and the services built before it (docs/architecture.md,
#: "How to add a protocol", says what else a new protocol touches).
SERVICES: tuple[tuple[str, ServiceBuilder], ...] = (
    ("nat", lambda ctx, cfg, s: NatService(ctx, cfg.nat)),
    ("dht", lambda ctx, cfg, s: DHTService(ctx, cfg.dht, reachability=s["nat"],
                                           schemas=cfg.dht_schemas)),
    ("membership", lambda ctx, cfg, s: MembershipService(
        ctx, cfg.membership, dht=s["dht"],
        averaging_protocols=(MATCHMAKING_PROTOCOL_ID, ALLREDUCE_PROTOCOL_ID))),
    ("progress", lambda ctx, cfg, s: ProgressService(ctx, cfg.progress, dht=s["dht"],
                                                     reachability=s["nat"])),
    ("matchmaking", lambda ctx, cfg, s: MatchmakingService(ctx, cfg.matchmaking, dht=s["dht"],
                                                           reachability=s["nat"])),
    ("allreduce", lambda ctx, cfg, s: AllReduceService(
        ctx, cfg.allreduce, weight_evidence=s["progress"].weight_evidence,
        own_report=s["progress"].signed_report, dht=s["dht"])),
    ("statesync", lambda ctx, cfg, s: StateSyncService(ctx, cfg.statesync)),
)


@dataclasses.dataclass(frozen=True)
class NodeStatistics(Statistics):
    """What ``node.statistics()`` says: the node, its connections, and each service's record."""

    peer_id: str
    connected_peers: int
    rpc_channels: int
    reachability: str
    client_mode: bool
    relay_reservations: int
    paths: dict[str, int]
    host: HostStatistics
    admission: AdmissionStatistics
    nat: Statistics
    dht: Statistics
    membership: Statistics
    progress: Statistics
    matchmaking: Statistics
    allreduce: Statistics
    statesync: Statistics


class TrioNode:
    """A running node, for trio code.  Obtain one from :func:`open_node`."""

    def __init__(self, host: Host, config: NodeConfig, nursery: trio.Nursery,
                 admission: AdmissionGate | None = None, clock: Callable[[], float] = time.time,
                 runs: Iterable[RunPolicy] = ()) -> None:
        self._host = host
        self._config = config
        self._nursery = nursery
        self._rpc = RpcClient(host, nursery, config.wire)
        self._gate = Gatekeeper(admission or OpenAdmission())
        self._protocols: set[str] = set()
        # protocol id -> the run a request names (run-scoped requests introduce first)
        self._run_of: dict[str, Callable[[Message], str | None]] = {}
        self.serve(PING, answer_ping)  # type: ignore[arg-type]
        self._flags = FlagBook()
        context = ServiceContext(host, self._introduced_call, config.wire, clock,
                                 members=self._gate, flags=self._flags,
                                 introduce=self._introduce)
        self._services: dict[str, Any] = {}
        for name, build in SERVICES:
            service = build(context, config, self._services)
            self._services[name] = service
            for endpoint in service.endpoints():
                self._install(endpoint)
        membership: MembershipService = self._services["membership"]
        # The node's gate is its membership (the Gatekeeper still counts and logs);
        # a user's own gate is asked first.
        self._gate.gate = BanningGate(membership if admission is None
                                      else BothGates(admission, membership), self._flags, clock)
        self.dht.set_run_guard(membership.has_policy)
        for policy in runs:
            membership.add_run(policy)

    async def _start(self) -> None:
        for service in self._services.values():
            await self._nursery.start(service.serve)

    # -- identity and peers -------------------------------------------------

    @property
    def peer_id(self) -> ID:
        return self._host.peer_id

    @property
    def config(self) -> NodeConfig:
        return self._config

    @property
    def host(self) -> Host:
        """The host layer, for the protocol layers built on this node."""
        return self._host

    @property
    def admission(self) -> AdmissionGate:
        """The gate every inbound request and stream of every protocol passes."""
        return self._gate.gate

    @property
    def flags(self) -> FlagBook:
        """Peers this node caught lying about themselves, by run and kind (local knowledge)."""
        return self._flags

    @property
    def membership(self) -> MembershipService:
        """Who may touch which run: ``runs()``, ``members(run_id)``, ``add_run(policy)``,
        ``publish_revocations(list)`` (docs/security.md)."""
        return self._services["membership"]

    @property
    def nat(self) -> NatService:
        """Reachability by dial-back and client mode (docs/nat.md)."""
        return self._services["nat"]

    @property
    def dht(self) -> DHTService:
        """The DHT: ``store``, ``get``, ``announce``, ``find_peers`` (docs/dht.md)."""
        return self._services["dht"]

    @property
    def progress(self) -> ProgressService:
        """Training progress: ``async with node.progress.track(run_id, target) as tracker``
        (docs/progress.md)."""
        return self._services["progress"]

    @property
    def matchmaking(self) -> MatchmakingService:
        """Averaging groups: ``group = await node.matchmaking.form_group(run_id, epoch)``
        (docs/matchmaking.md)."""
        return self._services["matchmaking"]

    @property
    def allreduce(self) -> AllReduceService:
        """Butterfly all-reduce: ``result = await node.allreduce.all_reduce(group, tensors,
        weight=samples)`` (docs/allreduce.md)."""
        return self._services["allreduce"]

    @property
    def statesync(self) -> StateSyncService:
        """Training state for joiners: ``share(run_id, epoch, payload)``,
        ``download = await node.statesync.fetch(run_id, donors)`` (docs/statesync.md)."""
        return self._services["statesync"]

    @property
    def nursery(self) -> trio.Nursery:
        """The node's nursery: services started here live exactly as long as the node."""
        return self._nursery

    @property
    def addrs(self) -> list[str]:
        """Full multiaddrs (with ``/p2p/<id>``) other peers can dial."""
        return self._host.addrs()

    def connected_peers(self) -> list[ID]:
        return self._host.connected_peers()

    @property
    def reachability(self) -> Reachability:
        """``public``, ``private`` or ``unknown``: can other peers dial this node?"""
        return self.nat.reachability

    @property
    def client_mode(self) -> bool:
        """True for a node others cannot dial: it dials out and accepts nothing.

        The averaging layers give client-mode peers no part to reduce.
        """
        return self.nat.client_mode

    def paths(self) -> dict[ID, str]:
        """How each connected peer is reached: ``direct``, ``hole-punched`` or ``relayed``."""
        return self._host.paths()

    async def wait_reachability_changed(self) -> None:
        await self.nat.wait_changed()

    async def connect(self, address: str, timeout: float | None = None) -> ID:
        """Connect to a peer by its full multiaddr and return its peer id."""
        return await self._host.connect(address, timeout)

    async def wait_for_peers(self, count: int, timeout: float = 30.0) -> list[ID]:
        """Wait until at least ``count`` peers are connected (at most ``timeout`` s)."""
        deadline = trio.current_time() + timeout
        while len(self.connected_peers()) < count and trio.current_time() < deadline:
            await self._host.wait_connections_changed(deadline - trio.current_time())
        if len(self.connected_peers()) >= count:
            return self.connected_peers()
        raise CallTimeoutError(f"{len(self.connected_peers())} of {count} peers connected "
                               f"after {timeout:.1f} s")

    # -- protocols ----------------------------------------------------------

    def serve(self, protocol: RpcProtocol, handler: RpcHandler) -> None:
        """Answer ``protocol`` requests with ``handler(ctx, request) -> response``.

        The handler raises :class:`~p2pdl.errors.RequestError` to send an error
        reply.  Each request is bounded by ``wire.handler_timeout`` and passes
        the node's admission gate first (as a request of no run).
        """
        self._install(RpcEndpoint(protocol, handler))

    def set_stream_handler(self, protocol_id: str,
                           handler: Callable[[FramedStream], Awaitable[None]]) -> None:
        """Serve a streaming protocol: ``handler(stream)`` runs once per incoming stream
        that the node's admission gate admits (as a stream of no run); a refused
        stream is reset."""
        async def opened(stream: FramedStream) -> Opened:
            return Opened(None)   # a stream of no run: nothing to read before the gate

        async def refuse(stream: FramedStream, refusal: Refusal) -> None:
            await stream.reset()

        async def handle(stream: FramedStream, state: Any) -> None:
            await handler(stream)

        self._install(StreamEndpoint(protocol_id, opened, handle, refuse))

    def _install(self, endpoint: Endpoint) -> None:
        self._claim(endpoint.protocol_id)
        if isinstance(endpoint, RpcEndpoint):
            self._run_of[endpoint.protocol_id] = endpoint.run_id_of
        install_endpoint(self._host, self._config.wire, self._gate, endpoint)

    def _claim(self, protocol_id: str) -> None:
        if protocol_id in self._protocols:
            raise ConfigError(f"{protocol_id} is already served by this node")
        self._protocols.add(protocol_id)

    async def call(self, peer: PeerIDLike, protocol: RpcProtocol, request: Message,
                   timeout: float | None = None) -> Message:
        """Send ``request`` to ``peer`` and return its response (see :class:`RpcClient`).

        A request of a certificate run (one this node serves with a run-scoped
        endpoint) is preceded by the membership handshake on that connection,
        within ``timeout``.
        """
        run_of = self._run_of.get(protocol.protocol_id)
        return await self._introduced_call(peer, protocol, request, timeout,
                                           run_id=run_of(request) if run_of else None)

    async def _introduce(self, peer: Any, run_id: str) -> None:
        await self._services["membership"].introduce(peer, run_id)

    async def _introduced_call(self, peer: PeerIDLike, protocol: RpcProtocol, request: Message,
                               timeout: float | None = None, *,
                               run_id: str | None = None) -> Message:
        """The services' ``call``: a request of run ``run_id`` (as the calling
        service says) introduces this node first.

        A peer that refuses it ``not_admitted`` although it was introduced to
        (it may have restarted and forgotten us) is introduced to again, once.
        """
        membership: MembershipService | None = self._services.get("membership")
        if run_id is None or membership is None:
            return await self._rpc.call(peer, protocol, request, timeout)
        deadline = None if timeout is None else trio.current_time() + timeout

        def left() -> float | None:
            return None if deadline is None else max(deadline - trio.current_time(), 1e-3)

        with trio.move_on_at(deadline if deadline is not None else float("inf")):
            await membership.introduce(peer, run_id)
        try:
            return await self._rpc.call(peer, protocol, request, left())
        except RemoteError as exc:
            if exc.code != NOT_ADMITTED or not membership.forget_introduction(peer, run_id):
                raise
        with trio.move_on_at(deadline if deadline is not None else float("inf")):
            await membership.introduce(peer, run_id)
        return await self._rpc.call(peer, protocol, request, left())

    @asynccontextmanager
    async def open_stream(self, peer: PeerIDLike, protocol_id: str) -> AsyncIterator[FramedStream]:
        """Open a framed stream to ``peer`` (on the existing connection if any)."""
        net_stream = await self._host.new_stream(peer, protocol_id)
        async with open_framed_stream(net_stream, self._config.wire) as stream:
            yield stream

    async def ping(self, peer: PeerIDLike, timeout: float | None = None) -> float:
        """Round-trip time to ``peer``, in seconds.

        Over p2pdl's ping protocol; a peer that does not speak it (another
        libp2p implementation) is pinged over the standard ``/ipfs/ping/1.0.0``.
        """
        limit = self._config.wire.call_timeout if timeout is None else timeout
        with trio.move_on_after(limit):
            nonce = secrets.randbits(63)
            start = trio.current_time()
            try:
                response = await self.call(peer, PING, PingRequest(nonce), limit)
            except ProtocolNotSupportedError:
                return await ping_libp2p(self._host, peer)
            if response.nonce != nonce:  # type: ignore[attr-defined]
                raise P2PDLError(f"{peer} answered ping with a wrong nonce")
            return trio.current_time() - start
        raise CallTimeoutError(f"no ping answer from {peer} within {limit:.1f} s")

    def statistics(self) -> NodeStatistics:
        paths = list(self.paths().values())
        services = {name: service.statistics() for name, service in self._services.items()}
        return NodeStatistics(str(self.peer_id), len(self.connected_peers()),
                              self._rpc.open_channels(), self.reachability.value,
                              self.client_mode, len(self._host.relay_reservations()),
                              {k: paths.count(k) for k in ("direct", "hole-punched", "relayed")},
                              self._host.statistics(), self._gate.statistics(), **services)

    def _close(self) -> None:
        self._rpc.close()


@asynccontextmanager
async def open_node(config: NodeConfig | None = None, *, key_pair: KeyPair | None = None,
                    admission: AdmissionGate | None = None, host: Host | None = None,
                    clock: Callable[[], float] = time.time, runs: Iterable[RunPolicy] = (),
                    **host_fields: Any) -> AsyncIterator[TrioNode]:
    """Run a node for the duration of the block (trio).

    ``host_fields`` override fields of ``config.host``, e.g.
    ``open_node(listen=["/ip4/127.0.0.1/tcp/0"], initial_peers=[addr])``.
    ``runs``: the run policies this node guards (:class:`~p2pdl.OpenRun`,
    :class:`~p2pdl.AllowlistRun`, :class:`~p2pdl.CertificateRun`); a run without
    one is open.  The node's gate is its membership (``node.membership``);
    ``admission`` is a gate of your own, asked before it.  Every task
    the node starts runs in its nursery and ends with the block; the block
    starts once every service reported ready.

    ``host``: an already open host to run on instead of opening one (for the
    in-memory swarms of :mod:`p2pdl.testing`); ``config.host`` and
    ``key_pair`` are then not used.  ``clock``: the wall clock the services'
    expirations and report times refer to (default ``time.time``).
    """
    config = NodeConfig.build(config, **host_fields)
    if host is not None and key_pair is not None:
        raise ConfigError("open_node takes a key_pair or an open host, not both")
    opened = nullcontext(host) if host is not None else open_host(config.host,
                                                                            key_pair)
    async with opened as host, open_service_nursery() as nursery:
        node = TrioNode(host, config, nursery, admission, clock, runs)
        try:
            await node._start()
            yield node
        finally:
            node._close()
            nursery.cancel_scope.cancel()
