"""The node: one lifetime that owns the host and every service.

Three faces over the same node:

* trio: ``async with open_node(...) as node`` -- :class:`TrioNode`;
* sync: ``Node(...)`` -- trio runs in one background thread; methods block
  (with a timeout) or return a :class:`concurrent.futures.Future`;
* asyncio: ``node.aio`` -- the same operations as coroutines that await the
  trio thread without blocking the asyncio loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import dataclasses
import logging
import secrets
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio
from libp2p.abc import INetStream
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from ._concurrency import open_service_nursery
from ._faces import (
    AsyncioAveraging,
    AsyncioMatchmaking,
    AsyncioProgress,
    AsyncioStateSync,
    SyncAveraging,
    SyncMatchmaking,
    SyncProgress,
    SyncStateSync,
)
from .averaging import (
    ALLREDUCE_PROTOCOL_ID,
    MATCHMAKING_PROTOCOL,
    AllReduceConfig,
    AllReduceService,
    MatchmakingConfig,
    MatchmakingService,
)
from .dht import DHT_PROTOCOL, DHTConfig, DHTService, GroupPeer, Schema, ValueWithExpiration
from .errors import CallTimeoutError, ConfigError, LocalProtocolError, NodeClosedError, P2PDLError
from .nat import DIALBACK, NatService, Reachability, ReachabilityConfig
from .net import Host, HostConfig, open_host
from .net._addrs import PeerIDLike
from .progress import PROGRESS_PROTOCOL, ProgressConfig, ProgressService
from .statesync import STATESYNC_PROTOCOL_ID, StateSyncConfig, StateSyncService
from .wire import (
    PING,
    FramedStream,
    Message,
    PingRequest,
    RpcClient,
    RpcProtocol,
    WireConfig,
    open_framed_stream,
)
from .wire._ping import answer_ping
from .wire._rpc import RpcHandler, handler_for

__all__ = ["NodeConfig", "TrioNode", "open_node", "Node"]

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class NodeConfig:
    """Everything a node needs: each layer's settings.

    ``dht_schemas`` are the rules for DHT key prefixes this node validates
    (besides the built-in ones); every node of a collaboration should have
    the same.
    """

    host: HostConfig = HostConfig()
    wire: WireConfig = WireConfig()
    nat: ReachabilityConfig = ReachabilityConfig()
    dht: DHTConfig = DHTConfig()
    dht_schemas: tuple[Schema, ...] = ()
    progress: ProgressConfig = ProgressConfig()
    matchmaking: MatchmakingConfig = MatchmakingConfig()
    allreduce: AllReduceConfig = AllReduceConfig()
    state_sync: StateSyncConfig = StateSyncConfig()

    @classmethod
    def build(cls, config: NodeConfig | None = None, **host_fields: Any) -> NodeConfig:
        """``config`` with the given :class:`HostConfig` fields replaced.

        Accepts ``listen``, ``announce``, ``initial_peers``, ``identity_path``
        and the other HostConfig fields; lists are fine.
        """
        config = config or cls()
        if not host_fields:
            return config
        known = {f.name for f in dataclasses.fields(HostConfig)}
        unknown = sorted(set(host_fields) - known)
        if unknown:
            raise ConfigError(f"unknown node option(s): {', '.join(unknown)} "
                              f"(known: {', '.join(sorted(known))})")
        for name in ("listen", "announce", "initial_peers"):
            if isinstance(host_fields.get(name), str):
                host_fields[name] = (host_fields[name],)
        if host_fields.get("identity_path") is not None:
            host_fields["identity_path"] = str(host_fields["identity_path"])
        return dataclasses.replace(config, host=dataclasses.replace(config.host, **host_fields))


class TrioNode:
    """A running node, for trio code.  Obtain one from :func:`open_node`."""

    def __init__(self, host: Host, config: NodeConfig, nursery: trio.Nursery) -> None:
        self._host = host
        self._config = config
        self._nursery = nursery
        self._rpc = RpcClient(host, nursery, config.wire)
        self._protocols: set[str] = set()
        self.serve(PING, answer_ping)  # type: ignore[arg-type]
        self._nat = NatService(host, self._rpc.call, config.nat)
        self.serve(DIALBACK, self._nat.handle)  # type: ignore[arg-type]
        nursery.start_soon(self._nat.serve)
        self._dht = DHTService(host, self._rpc.call, config.dht, self._nat,
                               schemas=config.dht_schemas)
        self.serve(DHT_PROTOCOL, self._dht.handle)
        nursery.start_soon(self._dht.serve)
        self._progress = ProgressService(host, self._rpc.call, self._dht, self._nat,
                                         config.progress)
        self.serve(PROGRESS_PROTOCOL, self._progress.handle)
        self._matchmaking = MatchmakingService(host, self._rpc.call, self._dht, self._nat,
                                               config.matchmaking,
                                               max_hold=config.wire.handler_timeout - 1.0)
        self.serve(MATCHMAKING_PROTOCOL, self._matchmaking.handle)
        self._averaging = AllReduceService(host, config.wire, config.allreduce)
        self.set_stream_handler(ALLREDUCE_PROTOCOL_ID, self._averaging.handle)
        self._state_sync = StateSyncService(host, self._rpc.call, config.wire, config.state_sync)
        # Served through its own stream loop (the RPC protocol's), so that it
        # sees which chunk replies are still waiting to be written: max_concurrent_uploads.
        self.set_stream_handler(STATESYNC_PROTOCOL_ID, self._state_sync.serve_stream)

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
    def dht(self) -> DHTService:
        """The DHT: ``store``, ``get``, ``announce``, ``find_peers`` (docs/dht.md)."""
        return self._dht

    @property
    def progress(self) -> ProgressService:
        """Training progress: ``async with node.progress.track(run_id, target) as tracker``
        (docs/progress.md)."""
        return self._progress

    @property
    def matchmaking(self) -> MatchmakingService:
        """Averaging groups: ``group = await node.matchmaking.form_group(run_id, epoch)``
        (docs/matchmaking.md)."""
        return self._matchmaking

    @property
    def averaging(self) -> AllReduceService:
        """Butterfly all-reduce: ``result = await node.averaging.all_reduce(group, tensors,
        weight=samples)`` (docs/allreduce.md)."""
        return self._averaging

    @property
    def state_sync(self) -> StateSyncService:
        """Training state for joiners: ``share(run_id, epoch, payload)``,
        ``download = await node.state_sync.fetch(run_id, donors)`` (docs/statesync.md)."""
        return self._state_sync

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
        return self._nat.reachability

    @property
    def client_mode(self) -> bool:
        """True for a node others cannot dial: it dials out and accepts nothing.

        The averaging layers give client-mode peers no part to reduce.
        """
        return self._nat.client_mode

    def paths(self) -> dict[ID, str]:
        """How each connected peer is reached: ``direct``, ``hole-punched`` or ``relayed``."""
        return self._host.paths()

    async def wait_reachability_changed(self) -> None:
        await self._nat.wait_changed()

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
        reply.  Each request is bounded by ``wire.handler_timeout``.
        """
        self._claim(protocol.protocol_id)
        self._host.set_stream_handler(protocol.protocol_id,
                                      handler_for(protocol, handler, self._config.wire))

    def set_stream_handler(self, protocol_id: str,
                           handler: Callable[[FramedStream], Awaitable[None]]) -> None:
        """Serve a streaming protocol: ``handler(stream)`` runs once per incoming stream."""
        self._claim(protocol_id)
        wire = self._config.wire

        async def handle(net_stream: INetStream) -> None:
            async with open_framed_stream(net_stream, wire) as stream:
                await handler(stream)

        self._host.set_stream_handler(protocol_id, handle)

    def _claim(self, protocol_id: str) -> None:
        if protocol_id in self._protocols:
            raise ConfigError(f"{protocol_id} is already served by this node")
        self._protocols.add(protocol_id)

    async def call(self, peer: PeerIDLike, protocol: RpcProtocol, request: Message,
                   timeout: float | None = None) -> Message:
        """Send ``request`` to ``peer`` and return its response (see :class:`RpcClient`)."""
        return await self._rpc.call(peer, protocol, request, timeout)

    @asynccontextmanager
    async def open_stream(self, peer: PeerIDLike, protocol_id: str) -> AsyncIterator[FramedStream]:
        """Open a framed stream to ``peer`` (on the existing connection if any)."""
        net_stream = await self._host.new_stream(peer, protocol_id)
        async with open_framed_stream(net_stream, self._config.wire) as stream:
            yield stream

    async def ping(self, peer: PeerIDLike, timeout: float | None = None) -> float:
        """Round-trip time to ``peer`` over its ping stream, in seconds."""
        nonce = secrets.randbits(63)
        start = trio.current_time()
        response = await self.call(peer, PING, PingRequest(nonce), timeout)
        if response.nonce != nonce:  # type: ignore[attr-defined]
            raise P2PDLError(f"{peer} answered ping with a wrong nonce")
        return trio.current_time() - start

    def statistics(self) -> dict[str, Any]:
        paths = list(self.paths().values())
        return {"peer_id": str(self.peer_id), "connected_peers": len(self.connected_peers()),
                "rpc_channels": self._rpc.open_channels(),
                "reachability": self.reachability.value, "client_mode": self.client_mode,
                "relay_reservations": len(self._host.relay_reservations()),
                "paths": {k: paths.count(k) for k in ("direct", "hole-punched", "relayed")},
                "dht": self._dht.statistics(), "progress": self._progress.statistics(),
                "matchmaking": self._matchmaking.statistics(),
                "averaging": self._averaging.statistics(),
                "state_sync": self._state_sync.statistics()}

    def _close(self) -> None:
        self._rpc.close()


@asynccontextmanager
async def open_node(config: NodeConfig | None = None, *, key_pair: KeyPair | None = None,
                    **host_fields: Any) -> AsyncIterator[TrioNode]:
    """Run a node for the duration of the block (trio).

    ``host_fields`` override fields of ``config.host``, e.g.
    ``open_node(listen=["/ip4/127.0.0.1/tcp/0"], initial_peers=[addr])``.
    Every task the node starts runs in its nursery and ends with the block.
    """
    config = NodeConfig.build(config, **host_fields)
    async with open_host(config.host, key_pair) as host, open_service_nursery() as nursery:
        node = TrioNode(host, config, nursery)
        try:
            yield node
        finally:
            node._close()
            nursery.cancel_scope.cancel()


class _SigtermExits:
    """While sync nodes run, SIGTERM raises SystemExit in the main thread.

    A plain Python program dies on SIGTERM without unwinding, so its node would
    vanish without closing its connections.  With this handler, ``with
    Node(...)`` blocks and ``finally`` clauses run and the process exits with
    status 143.  It is installed only from the main thread, only when SIGTERM
    has its default action, and removed when the last node shuts down.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._installed = False

    def acquire(self) -> bool:
        with self._lock:
            if self._users == 0:
                if (threading.current_thread() is not threading.main_thread()
                        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
                    return False
                signal.signal(signal.SIGTERM, _exit_on_sigterm)
                self._installed = True
            elif not self._installed:
                return False
            self._users += 1
            return True

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._installed:
                self._installed = False
                if signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:
                    try:
                        signal.signal(signal.SIGTERM, signal.SIG_DFL)
                    except ValueError:  # not in the main thread (shutdown at exit)
                        pass


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


_sigterm_exits = _SigtermExits()


class Node:
    """A node for synchronous code: trio runs in one background thread.

    ``Node(initial_peers=[...])`` starts it and returns once it listens.
    Every method blocks until done (at most ``timeout`` seconds) or, with
    ``return_future=True``, returns a :class:`concurrent.futures.Future` at
    once.  ``node.aio`` has the same operations as asyncio coroutines.  Use it
    as a context manager or call :meth:`shutdown`; an interpreter exit shuts
    it down too.

    Signals: Ctrl-C raises KeyboardInterrupt in your code as usual (leaving a
    ``with Node()`` block shuts the node down).  With ``handle_sigterm`` (the
    default) SIGTERM raises ``SystemExit(143)`` in the main thread while a node
    runs, so the program unwinds and the node closes cleanly instead of dying.
    """

    def __init__(self, config: NodeConfig | None = None, *, start_timeout: float = 60.0,
                 key_pair: KeyPair | None = None, handle_sigterm: bool = True,
                 **host_fields: Any) -> None:
        self._config = NodeConfig.build(config, **host_fields)
        self._sigterm = handle_sigterm and _sigterm_exits.acquire()
        self._key_pair = key_pair
        self._node: TrioNode | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._started = threading.Event()
        self._startup_error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._thread_main, name="p2pdl-node", daemon=True)
        self._thread.start()
        if not self._started.wait(start_timeout):
            self.shutdown()
            raise CallTimeoutError(f"the node did not start within {start_timeout:.0f} s")
        if self._startup_error is not None:
            self._thread.join(5)
            self._closed = True
            self._release_sigterm()
            raise self._startup_error
        atexit.register(self.shutdown)
        self.aio = AsyncioNode(self)
        self.dht = SyncDHT(self)
        self.progress = SyncProgress(self)
        self.matchmaking = SyncMatchmaking(self)
        self.averaging = SyncAveraging(self)
        self.state_sync = SyncStateSync(self)

    def _thread_main(self) -> None:
        try:
            trio.run(self._trio_main)
        except BaseException as exc:  # reported to the constructor, or logged
            if not self._started.is_set():
                self._startup_error = exc
            else:
                logger.error("the node's trio loop failed: %r", exc)
        finally:
            self._started.set()

    async def _trio_main(self) -> None:
        self._stop = trio.Event()
        async with open_node(self._config, key_pair=self._key_pair) as node:
            self._node = node
            self._token = trio.lowlevel.current_trio_token()
            self._started.set()
            await self._stop.wait()

    # -- running operations on the trio thread ---------------------------------

    def _submit(self, fn: Callable[[TrioNode], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Run ``fn(node)`` in the node's nursery; cancelling the future cancels it."""
        if self._closed or self._node is None or self._token is None:
            raise NodeClosedError("the node is shut down")
        if threading.current_thread() is self._thread:
            raise LocalProtocolError("a blocking Node method was called on the node's own trio "
                                     "thread (from a handler?); await the TrioNode methods there")
        node = self._node
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        scope = trio.CancelScope()

        # The future stays "pending" while the operation runs, so that
        # ``future.cancel()`` (and asyncio's cancellation of ``wrap_future``)
        # always succeeds; the done-callback below then cancels the trio side.
        async def runner() -> None:
            with scope:
                if future.cancelled():
                    return
                try:
                    result = await fn(node)
                except BaseException as exc:
                    _settle(future, exception=exc if isinstance(exc, Exception)
                            else NodeClosedError("the operation was cancelled"))
                    if not isinstance(exc, Exception):
                        raise
                else:
                    _settle(future, result=result)
            if scope.cancelled_caught:
                _settle(future, exception=NodeClosedError("the operation was cancelled"))

        def cancel_in_trio(f: concurrent.futures.Future[T]) -> None:
            if f.cancelled():
                try:
                    trio.from_thread.run_sync(scope.cancel, trio_token=self._token)
                except (trio.RunFinishedError, RuntimeError):
                    pass

        future.add_done_callback(cancel_in_trio)
        try:
            trio.from_thread.run_sync(node.nursery.start_soon, runner, trio_token=self._token)
        except (trio.RunFinishedError, RuntimeError):  # finished, or nursery closing
            raise NodeClosedError("the node is shut down") from None
        return future

    def _run(self, fn: Callable[[TrioNode], Awaitable[T]], timeout: float | None,
             return_future: bool) -> Any:
        future = self._submit(fn)
        if return_future:
            return future
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise CallTimeoutError(f"operation did not finish within {timeout} s") from None

    # -- the operations ----------------------------------------------------------

    @property
    def peer_id(self) -> ID:
        return self._live().peer_id

    @property
    def addrs(self) -> list[str]:
        """Full multiaddrs other peers can dial (read on the node's thread)."""
        return self._run(_async(lambda n: n.addrs), 10.0, False)

    @property
    def config(self) -> NodeConfig:
        return self._config

    def _live(self) -> TrioNode:
        if self._closed or self._node is None:
            raise NodeClosedError("the node is shut down")
        return self._node

    def connected_peers(self) -> list[ID]:
        return self._run(_async(lambda n: n.connected_peers()), 10.0, False)

    @property
    def reachability(self) -> Reachability:
        return self._run(_async(lambda n: n.reachability), 10.0, False)

    @property
    def client_mode(self) -> bool:
        return self._run(_async(lambda n: n.client_mode), 10.0, False)

    def paths(self) -> dict[ID, str]:
        return self._run(_async(lambda n: n.paths()), 10.0, False)

    def statistics(self) -> dict[str, Any]:
        return self._run(_async(lambda n: n.statistics()), 10.0, False)

    def connect(self, address: str, *, timeout: float | None = None,
                return_future: bool = False) -> Any:
        return self._run(lambda n: n.connect(address, timeout), _outer(timeout), return_future)

    def wait_for_peers(self, count: int, *, timeout: float = 30.0,
                       return_future: bool = False) -> Any:
        return self._run(lambda n: n.wait_for_peers(count, timeout), timeout + 5, return_future)

    def call(self, peer: PeerIDLike, protocol: RpcProtocol, request: Message, *,
             timeout: float | None = None, return_future: bool = False) -> Any:
        return self._run(lambda n: n.call(peer, protocol, request, timeout),
                         _outer(timeout), return_future)

    def ping(self, peer: PeerIDLike, *, timeout: float | None = None,
             return_future: bool = False) -> Any:
        return self._run(lambda n: n.ping(peer, timeout), _outer(timeout), return_future)

    def serve(self, protocol: RpcProtocol, handler: RpcHandler) -> None:
        """Register an RPC handler (an ``async def`` run on the node's trio thread)."""
        node = self._live()
        trio.from_thread.run_sync(node.serve, protocol, handler, trio_token=self._token)

    # -- lifetime -------------------------------------------------------------

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the node and its thread (at most ``timeout`` s).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        if self._stop is not None and self._token is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("the node's thread did not stop within %.0f s", timeout)
        self._release_sigterm()

    def _release_sigterm(self) -> None:
        if self._sigterm:
            self._sigterm = False
            _sigterm_exits.release()

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.shutdown()


class AsyncioNode:
    """The node's operations as asyncio coroutines (``node.aio``).

    Each awaits the trio thread through a future, so the asyncio loop keeps
    running; cancelling the awaiting task cancels the operation.
    """

    def __init__(self, node: Node) -> None:
        self._node = node
        self.dht = AsyncioDHT(self)
        self.progress = AsyncioProgress(self)
        self.matchmaking = AsyncioMatchmaking(self)
        self.averaging = AsyncioAveraging(self)
        self.state_sync = AsyncioStateSync(self)

    async def _await(self, fn: Callable[[TrioNode], Awaitable[T]]) -> T:
        return await asyncio.wrap_future(self._node._submit(fn))

    async def connect(self, address: str, *, timeout: float | None = None) -> ID:
        return await self._await(lambda n: n.connect(address, timeout))

    async def wait_for_peers(self, count: int, *, timeout: float = 30.0) -> list[ID]:
        return await self._await(lambda n: n.wait_for_peers(count, timeout))

    async def call(self, peer: PeerIDLike, protocol: RpcProtocol, request: Message, *,
                   timeout: float | None = None) -> Message:
        return await self._await(lambda n: n.call(peer, protocol, request, timeout))

    async def ping(self, peer: PeerIDLike, *, timeout: float | None = None) -> float:
        return await self._await(lambda n: n.ping(peer, timeout))

    async def connected_peers(self) -> list[ID]:
        return await self._await(_async(lambda n: n.connected_peers()))

    async def shutdown(self) -> None:
        await asyncio.to_thread(self._node.shutdown)


def _dht_op(fn: Callable[[DHTService], Awaitable[T]],
            timeout: float | None) -> Callable[[TrioNode], Awaitable[T]]:
    """``fn(node.dht)``, bounded by ``timeout`` on the trio side (CallTimeoutError)."""
    async def run(node: TrioNode) -> T:
        if timeout is None:
            return await fn(node.dht)
        with trio.move_on_after(timeout):
            return await fn(node.dht)
        raise CallTimeoutError(f"the DHT operation did not finish within {timeout} s")
    return run


class SyncDHT:
    """``node.dht`` of a sync :class:`Node`: the DHT operations, blocking.

    Each method waits at most ``timeout`` seconds (default: the DHT's
    ``operation_timeout``) or, with ``return_future=True``, returns a
    :class:`concurrent.futures.Future` at once.  See :class:`DHTService`.
    """

    def __init__(self, node: Node) -> None:
        self._node = node

    def _do(self, fn: Callable[[DHTService], Awaitable[T]], timeout: float | None,
            return_future: bool) -> Any:
        limit = self._node.config.dht.operation_timeout if timeout is None else timeout
        return self._node._run(_dht_op(fn, timeout), limit + 5.0, return_future)

    def store(self, key: str, value: Any, expiration_time: float, subkey: str | None = None, *,
              timeout: float | None = None, return_future: bool = False) -> Any:
        return self._do(lambda d: d.store(key, value, expiration_time, subkey), timeout,
                        return_future)

    def get(self, key: str, latest: bool = False, *, timeout: float | None = None,
            return_future: bool = False) -> Any:
        return self._do(lambda d: d.get(key, latest), timeout, return_future)

    def announce(self, group: str, expiration_time: float, *, timeout: float | None = None,
                 return_future: bool = False) -> Any:
        return self._do(lambda d: d.announce(group, expiration_time), timeout, return_future)

    def find_peers(self, group: str, *, timeout: float | None = None,
                   return_future: bool = False) -> Any:
        return self._do(lambda d: d.find_peers(group), timeout, return_future)

    def own_subkey(self, name: str = "") -> str:
        return self._node._live().dht.own_subkey(name)

    def now(self) -> float:
        return self._node._live().dht.now()

    def register_schema(self, schema: Schema) -> None:
        self._do(_async(lambda d: d.register_schema(schema)), 10.0, False)

    def statistics(self) -> dict[str, Any]:
        return self._do(_async(lambda d: d.statistics()), 10.0, False)


class AsyncioDHT:
    """``node.aio.dht``: the DHT operations as asyncio coroutines."""

    def __init__(self, aio: AsyncioNode) -> None:
        self._aio = aio

    async def _do(self, fn: Callable[[DHTService], Awaitable[T]], timeout: float | None) -> T:
        return await self._aio._await(_dht_op(fn, timeout))

    async def store(self, key: str, value: Any, expiration_time: float,
                    subkey: str | None = None, *, timeout: float | None = None) -> bool:
        return await self._do(lambda d: d.store(key, value, expiration_time, subkey), timeout)

    async def get(self, key: str, latest: bool = False, *,
                  timeout: float | None = None) -> ValueWithExpiration[Any] | None:
        return await self._do(lambda d: d.get(key, latest), timeout)

    async def announce(self, group: str, expiration_time: float, *,
                       timeout: float | None = None) -> bool:
        return await self._do(lambda d: d.announce(group, expiration_time), timeout)

    async def find_peers(self, group: str, *, timeout: float | None = None) -> list[GroupPeer]:
        return await self._do(lambda d: d.find_peers(group), timeout)

    def own_subkey(self, name: str = "") -> str:
        """This node's own signed subkey (no waiting: it is derived from the peer id)."""
        return self._aio._node.dht.own_subkey(name)

    def now(self) -> float:
        """The DHT's clock (wall-clock seconds)."""
        return self._aio._node.dht.now()

    async def register_schema(self, schema: Schema) -> None:
        await self._do(_async(lambda d: d.register_schema(schema)), 10.0)

    async def statistics(self) -> dict[str, Any]:
        return await self._do(_async(lambda d: d.statistics()), 10.0)


def _settle(future: concurrent.futures.Future[Any], *, result: Any = None,
            exception: BaseException | None = None) -> None:
    """Complete ``future`` unless it was cancelled (possibly from another thread)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass


def _async(fn: Callable[[TrioNode], T]) -> Callable[[TrioNode], Awaitable[T]]:
    async def run(node: TrioNode) -> T:
        return fn(node)
    return run


def _outer(timeout: float | None) -> float | None:
    # The trio side enforces ``timeout``; the waiting thread allows a margin.
    return None if timeout is None else timeout + 5.0


__all__ += ["AsyncioNode", "SyncDHT", "AsyncioDHT"]
