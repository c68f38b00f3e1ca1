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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Literal

import trio
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from ._concurrency import open_service_nursery
from ._config import NodeConfig
from ._faces import (
    AsyncioAllReduce,
    AsyncioDHT,
    AsyncioFace,
    AsyncioMatchmaking,
    AsyncioMembership,
    AsyncioProgress,
    AsyncioStateSync,
    SyncAllReduce,
    SyncDHT,
    SyncFace,
    SyncMatchmaking,
    SyncMembership,
    SyncProgress,
    SyncStateSync,
)
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

__all__ = ["NodeConfig", "TrioNode", "open_node", "NodeStatistics", "SERVICES", "ServiceEntry",
           "DERIVED", "statistics_record"]

if TYPE_CHECKING:
    from ._portal import Portal

logger = logging.getLogger(__name__)

ServiceBuilder = Callable[[ServiceContext, NodeConfig, dict[str, Any]], Service]

FaceBuilder = Callable[["Portal", "TrioNode", NodeConfig], Any]


@dataclasses.dataclass(frozen=True)
class ServiceEntry:
    """One protocol service of the node, declared once (docs/architecture.md,
    "How to add a protocol").

    ``name``: the service's package (``p2pdl.<...>.<name>``) and everything
    the node names after it: ``node.<name>`` on every face, the
    ``NodeStatistics`` field, the ``NodeConfig`` field of its settings.
    ``service``: its class.  ``build``: how to build it from the context,
    the node's config and the services built before it (by name).
    ``sync_face`` and ``aio_face``: how ``p2pdl.Node`` and ``node.aio``
    show it (from the portal, the trio node and the config); DERIVED (the
    default): :class:`~p2pdl._faces.SyncFace` and
    :class:`~p2pdl._faces.AsyncioFace`, every public method of the service;
    None: they do not show it.  ``about``: one line for people.
    """

    name: str
    service: type
    build: ServiceBuilder
    sync_face: FaceBuilder | Literal["derived"] | None = "derived"
    aio_face: FaceBuilder | Literal["derived"] | None = "derived"
    about: str = ""

    def sync_face_of(self, portal: Portal, node: TrioNode, config: NodeConfig) -> Any:
        """The service's face on a sync node (None: it has none)."""
        if self.sync_face == DERIVED:
            return SyncFace(portal, getattr(node, self.name))
        return None if self.sync_face is None else self.sync_face(portal, node, config)

    def aio_face_of(self, portal: Portal, node: TrioNode, config: NodeConfig) -> Any:
        """The service's face on ``node.aio`` (None: it has none)."""
        if self.aio_face == DERIVED:
            return AsyncioFace(portal, getattr(node, self.name))
        return None if self.aio_face is None else self.aio_face(portal, node, config)


#: :class:`ServiceEntry`'s faces derived from the service's class.
DERIVED: Literal["derived"] = "derived"


#: The node's protocol services, in the order they are built and started.
SERVICES: tuple[ServiceEntry, ...] = (
    ServiceEntry("nat", NatService, lambda ctx, cfg, s: NatService(ctx, cfg.nat), None, None,
                 about="reachability by dial-back and client mode (docs/nat.md)"),
    ServiceEntry("dht", DHTService,
                 lambda ctx, cfg, s: DHTService(ctx, cfg.dht, reachability=s["nat"],
                                                schemas=cfg.dht_schemas),
                 lambda portal, node, cfg: SyncDHT(portal, node.dht, cfg.dht),
                 lambda portal, node, cfg: AsyncioDHT(portal, node.dht),
                 about="the DHT: store, get, announce, find_peers (docs/dht.md)"),
    ServiceEntry("membership", MembershipService,
                 lambda ctx, cfg, s: MembershipService(
                     ctx, cfg.membership, dht=s["dht"],
                     averaging_protocols=(MATCHMAKING_PROTOCOL_ID, ALLREDUCE_PROTOCOL_ID)),
                 lambda portal, node, cfg: SyncMembership(portal, node.membership,
                                                          cfg.dht.operation_timeout),
                 lambda portal, node, cfg: AsyncioMembership(portal, node.membership),
                 about="who may touch which run: runs, members, add_run, "
                       "publish_revocations (docs/security.md)"),
    ServiceEntry("progress", ProgressService,
                 lambda ctx, cfg, s: ProgressService(ctx, cfg.progress, dht=s["dht"],
                                                     reachability=s["nat"]),
                 lambda portal, node, cfg: SyncProgress(portal, node.progress),
                 lambda portal, node, cfg: AsyncioProgress(portal, node.progress),
                 about="training progress: track(run_id, target) (docs/progress.md)"),
    ServiceEntry("matchmaking", MatchmakingService,
                 lambda ctx, cfg, s: MatchmakingService(ctx, cfg.matchmaking, dht=s["dht"],
                                                        reachability=s["nat"]),
                 lambda portal, node, cfg: SyncMatchmaking(portal, node.matchmaking),
                 lambda portal, node, cfg: AsyncioMatchmaking(portal, node.matchmaking),
                 about="averaging groups: form_group(run_id, epoch) (docs/matchmaking.md)"),
    ServiceEntry("allreduce", AllReduceService,
                 lambda ctx, cfg, s: AllReduceService(
                     ctx, cfg.allreduce, weight_evidence=s["progress"].weight_evidence,
                     own_report=s["progress"].signed_report, dht=s["dht"]),
                 lambda portal, node, cfg: SyncAllReduce(portal, node.allreduce,
                                                         node.matchmaking),
                 lambda portal, node, cfg: AsyncioAllReduce(portal, node.allreduce,
                                                            node.matchmaking),
                 about="butterfly all-reduce: all_reduce(group, tensors, weight=samples) "
                       "(docs/allreduce.md)"),
    ServiceEntry("statesync", StateSyncService,
                 lambda ctx, cfg, s: StateSyncService(ctx, cfg.statesync),
                 lambda portal, node, cfg: SyncStateSync(portal, node.statesync),
                 lambda portal, node, cfg: AsyncioStateSync(portal, node.statesync),
                 about="training state for joiners: share(run_id, epoch, payload), "
                       "fetch(run_id, donors) (docs/statesync.md)"),
)


def _checked_services(entries: Sequence[ServiceEntry]) -> tuple[ServiceEntry, ...]:
    """``entries``, if a node can run them: every entry of :data:`SERVICES`
    (the node itself relies on them) first, in order, and names that are
    distinct and no other attribute of the node; else a ConfigError."""
    entries = tuple(entries)
    names = [entry.name for entry in entries]
    if entries[:len(SERVICES)] != SERVICES:
        raise ConfigError("services must begin with every entry of SERVICES, in order "
                          "(the node relies on them); add yours after them")
    own = _RESERVED | {name for name, _ in _NODE_FIELDS} | set(dir(TrioNode))
    taken = [name for name in names[len(SERVICES):] if name in own or not name.isidentifier()]
    if len(set(names)) != len(names) or taken:
        raise ConfigError(f"service names must be distinct identifiers, none a name the "
                          f"node uses itself: {sorted(set(taken)) or names}")
    return entries


def statistics_record(entries: Sequence[ServiceEntry]) -> type[Statistics]:
    """The record ``node.statistics()`` returns for a node of these services:
    the node's own fields, then one per service, named as it is."""
    fields: list[Any] = [(name, kind) for name, kind in _NODE_FIELDS]
    fields += [(entry.name, Statistics) for entry in entries]
    record = dataclasses.make_dataclass("NodeStatistics", fields, bases=(Statistics,),
                                        frozen=True)
    record.__module__ = __name__
    record.__doc__ = ("What ``node.statistics()`` says: the node, its connections, and "
                      "each service's record (a field per service, named as it is).")
    return record


#: Names a service may not take (the statistics record's own fields besides).
_RESERVED = {"services", "aio"}
_NODE_FIELDS: tuple[tuple[str, Any], ...] = (
    ("peer_id", str), ("connected_peers", int), ("rpc_channels", int),
    ("reachability", str), ("client_mode", bool), ("relay_reservations", int),
    ("paths", dict), ("host", HostStatistics), ("admission", AdmissionStatistics))
#: What ``node.statistics()`` says for the node's :data:`SERVICES`.
NodeStatistics = statistics_record(SERVICES)


class TrioNode:
    """A running node, for trio code.  Obtain one from :func:`open_node`.

    Each service of :data:`SERVICES` (or of the ``services`` given to
    :func:`open_node`) is ``node.<name>``; those of :data:`SERVICES` are
    typed below."""

    nat: NatService
    dht: DHTService
    membership: MembershipService
    progress: ProgressService
    matchmaking: MatchmakingService
    allreduce: AllReduceService
    statesync: StateSyncService

    def __init__(self, host: Host, config: NodeConfig, nursery: trio.Nursery,
                 admission: AdmissionGate | None = None, clock: Callable[[], float] = time.time,
                 runs: Iterable[RunPolicy] = (),
                 services: Sequence[ServiceEntry] = SERVICES) -> None:
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
        self._entries = _checked_services(services)
        self._statistics = NodeStatistics if self._entries == SERVICES \
            else statistics_record(self._entries)
        self._services: dict[str, Any] = {}
        for entry in self._entries:
            service = entry.build(context, config, self._services)
            self._services[entry.name] = service
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

    def __getattr__(self, name: str) -> Any:
        # Only for names not found otherwise: the services, by name.
        services = self.__dict__.get("_services")
        if services is not None and name in services:
            return services[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def services(self) -> tuple[ServiceEntry, ...]:
        """The node's services, as declared (:class:`ServiceEntry`)."""
        return self._entries

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

    def statistics(self) -> Any:
        """:data:`NodeStatistics` (for a node of other services, the same
        record with their fields: :func:`statistics_record`)."""
        paths = list(self.paths().values())
        services = {name: service.statistics() for name, service in self._services.items()}
        return self._statistics(str(self.peer_id), len(self.connected_peers()),
                              self._rpc.open_channels(), self.reachability.value,
                              self.client_mode, len(self._host.relay_reservations()),
                              {k: paths.count(k) for k in ("direct", "hole-punched", "relayed")},
                              self._host.statistics(), self._gate.statistics(), **services)
    # (the record's class has one field per service: ``statistics_record``)

    def _close(self) -> None:
        self._rpc.close()


@asynccontextmanager
async def open_node(config: NodeConfig | None = None, *, key_pair: KeyPair | None = None,
                    admission: AdmissionGate | None = None, host: Host | None = None,
                    clock: Callable[[], float] = time.time, runs: Iterable[RunPolicy] = (),
                    services: Sequence[ServiceEntry] = SERVICES,
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
    ``services``: the protocol services the node runs (default
    :data:`SERVICES`; a protocol of your own is one more
    :class:`ServiceEntry`).
    """
    config = NodeConfig.build(config, **host_fields)
    if host is not None and key_pair is not None:
        raise ConfigError("open_node takes a key_pair or an open host, not both")
    opened = nullcontext(host) if host is not None else open_host(config.host,
                                                                            key_pair)
    async with opened as host, open_service_nursery() as nursery:
        node = TrioNode(host, config, nursery, admission, clock, runs, services)
        try:
            await node._start()
            yield node
        finally:
            node._close()
            nursery.cancel_scope.cancel()
