"""The sync face of a node (``Node``) and its asyncio face (``node.aio``).

``Node(...)`` runs a :class:`~p2pdl._node.TrioNode` in one background thread;
every operation crosses into it through one :class:`~p2pdl._portal.Portal`:

* sync: methods block (with a timeout) or return a
  :class:`concurrent.futures.Future`;
* asyncio: ``node.aio`` -- the same operations as coroutines that await the
  trio thread without blocking the asyncio loop.

The faces of each service (``node.dht``, ``node.progress``, ...) are in
``_faces``; this module composes them.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import signal
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any

import trio
from libp2p.crypto.keys import KeyPair
from libp2p.peer.id import ID

from ._config import NodeConfig
from ._faces import (
    AsyncioAllReduce,
    AsyncioDHT,
    AsyncioMatchmaking,
    AsyncioMembership,
    AsyncioProgress,
    AsyncioStateSync,
    SyncAllReduce,
    SyncDHT,
    SyncMatchmaking,
    SyncMembership,
    SyncProgress,
    SyncStateSync,
)
from ._node import SERVICES, NodeStatistics, ServiceEntry, TrioNode, open_node
from ._portal import Portal
from .errors import CallTimeoutError, ConfigError, NodeClosedError
from .membership import RunPolicy
from .net import PeerIDLike
from .service import AdmissionGate, Reachability
from .wire import Message, RpcHandler, RpcProtocol

__all__ = ["Node", "AsyncioNode"]

logger = logging.getLogger(__name__)


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

    ``runs``: the run policies the node guards (``p2pdl.CertificateRun(...)``;
    docs/security.md); ``node.membership`` shows and changes them.
    ``services``: the protocol services it runs (default ``SERVICES``); each
    one's sync face, if it declares one, is ``node.<name>``.

    ``node.portal`` runs your own trio code on the node's thread
    (``node.portal.submit(async_fn)``); ``node.trio_node`` is the
    :class:`~p2pdl.TrioNode` there, for such code.

    Signals: Ctrl-C raises KeyboardInterrupt in your code as usual (leaving a
    ``with Node()`` block shuts the node down).  With ``handle_sigterm`` (the
    default) SIGTERM raises ``SystemExit(143)`` in the main thread while a node
    runs, so the program unwinds and the node closes cleanly instead of dying.
    """

    dht: SyncDHT
    membership: SyncMembership
    progress: SyncProgress
    matchmaking: SyncMatchmaking
    allreduce: SyncAllReduce
    statesync: SyncStateSync

    def __init__(self, config: NodeConfig | None = None, *, start_timeout: float = 60.0,
                 key_pair: KeyPair | None = None, handle_sigterm: bool = True,
                 admission: AdmissionGate | None = None, runs: Iterable[RunPolicy] = (),
                 services: Sequence[ServiceEntry] = SERVICES, **host_fields: Any) -> None:
        self._config = NodeConfig.build(config, **host_fields)
        self._services = tuple(services)
        for entry in self._services[len(SERVICES):]:   # faces must not hide the nodes' own
            if hasattr(Node, entry.name) or hasattr(AsyncioNode, entry.name):
                raise ConfigError(f"a service may not be called {entry.name!r}: the node "
                                  f"has an attribute of that name")
        self._sigterm = handle_sigterm and _sigterm_exits.acquire()
        self._key_pair = key_pair
        self._admission = admission
        self._runs = tuple(runs)
        self._node: TrioNode | None = None
        self._portal: Portal | None = None
        self._stop: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
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
        node, portal = self._node, self._portal
        assert node is not None and portal is not None
        self.aio = AsyncioNode(self, portal, node)
        for entry in node.services:   # each service's face, as declared
            face = entry.sync_face_of(portal, node, self._config)
            if face is not None:
                setattr(self, entry.name, face)

    def _thread_main(self) -> None:
        try:
            trio.run(self._trio_main)
        except BaseException as exc:  # reported to the constructor, or logged
            if not self._started.is_set():
                self._startup_error = exc
            else:
                logger.error("the node's trio loop failed: %r", exc)
        finally:
            if self._portal is not None:
                self._portal.close()
            self._started.set()

    async def _trio_main(self) -> None:
        self._stop = trio.Event()
        async with open_node(self._config, key_pair=self._key_pair,
                             admission=self._admission, runs=self._runs,
                             services=self._services) as node:
            self._node = node
            self._token = trio.lowlevel.current_trio_token()
            self._portal = Portal(self._token, node.nursery, self._thread)
            self._started.set()
            await self._stop.wait()

    # -- the operations ----------------------------------------------------------

    @property
    def portal(self) -> Portal:
        """The bridge to the node's trio thread (see :class:`~p2pdl._portal.Portal`)."""
        if self._closed or self._portal is None:
            raise NodeClosedError("the node is shut down")
        return self._portal

    @property
    def trio_node(self) -> TrioNode:
        """The trio node on the node's thread: use it only from code run there
        (``node.portal.submit``), never from this thread."""
        if self._closed or self._node is None:
            raise NodeClosedError("the node is shut down")
        return self._node

    @property
    def peer_id(self) -> ID:
        return self.trio_node.peer_id

    @property
    def addrs(self) -> list[str]:
        """Full multiaddrs other peers can dial (read on the node's thread)."""
        return self.portal.run_sync(lambda: self.trio_node.addrs)

    @property
    def config(self) -> NodeConfig:
        return self._config

    def connected_peers(self) -> list[ID]:
        return self.portal.run_sync(self.trio_node.connected_peers)

    @property
    def reachability(self) -> Reachability:
        return self.portal.run_sync(lambda: self.trio_node.reachability)

    @property
    def client_mode(self) -> bool:
        return self.portal.run_sync(lambda: self.trio_node.client_mode)

    def paths(self) -> dict[ID, str]:
        return self.portal.run_sync(self.trio_node.paths)

    def statistics(self) -> NodeStatistics:
        return self.portal.run_sync(self.trio_node.statistics)

    def flagged(self, run_id: str | None = None) -> dict[str, dict[str, int]]:
        """Peers this node caught lying about themselves (base58 id -> count by
        kind), in ``run_id`` or in every run: ``node.flags.flagged`` of the trio node."""
        return self.portal.run_sync(lambda: self.trio_node.flags.flagged(run_id))

    def banned(self, run_id: str | None = None) -> dict[str, dict[str, object]]:
        """Peers this node bans (base58 id -> run, until, reason), in ``run_id``
        or in every run: ``node.flags.banned`` of the trio node."""
        return self.portal.run_sync(lambda: self.trio_node.flags.banned(run_id, time.time()))

    def connect(self, address: str, *, timeout: float | None = None,
                return_future: bool = False) -> Any:
        node = self.trio_node
        return self.portal.run(lambda: node.connect(address, timeout), _outer(timeout),
                               return_future=return_future)

    def wait_for_peers(self, count: int, *, timeout: float = 30.0,
                       return_future: bool = False) -> Any:
        node = self.trio_node
        return self.portal.run(lambda: node.wait_for_peers(count, timeout), timeout + 5,
                               return_future=return_future)

    def call(self, peer: PeerIDLike, protocol: RpcProtocol, request: Message, *,
             timeout: float | None = None, return_future: bool = False) -> Any:
        node = self.trio_node
        return self.portal.run(lambda: node.call(peer, protocol, request, timeout),
                               _outer(timeout), return_future=return_future)

    def ping(self, peer: PeerIDLike, *, timeout: float | None = None,
             return_future: bool = False) -> Any:
        node = self.trio_node
        return self.portal.run(lambda: node.ping(peer, timeout), _outer(timeout),
                               return_future=return_future)

    def serve(self, protocol: RpcProtocol, handler: RpcHandler) -> None:
        """Register an RPC handler (an ``async def`` run on the node's trio thread)."""
        self.portal.run_sync(self.trio_node.serve, protocol, handler)

    # -- lifetime -------------------------------------------------------------

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the node and its thread (at most ``timeout`` s).  Idempotent."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        if self._portal is not None:
            self._portal.close()
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

    Each awaits the trio thread through the portal, so the asyncio loop keeps
    running; cancelling the awaiting task cancels the operation.
    """

    dht: AsyncioDHT
    membership: AsyncioMembership
    progress: AsyncioProgress
    matchmaking: AsyncioMatchmaking
    allreduce: AsyncioAllReduce
    statesync: AsyncioStateSync

    def __init__(self, node: Node, portal: Portal, trio_node: TrioNode) -> None:
        self._node = node
        self._portal = portal
        self._trio = trio_node
        for entry in trio_node.services:   # each service's face, as declared
            face = entry.aio_face_of(portal, trio_node, node.config)
            if face is not None:
                setattr(self, entry.name, face)

    async def connect(self, address: str, *, timeout: float | None = None) -> ID:
        return await self._portal.aio(lambda: self._trio.connect(address, timeout))

    async def wait_for_peers(self, count: int, *, timeout: float = 30.0) -> list[ID]:
        return await self._portal.aio(lambda: self._trio.wait_for_peers(count, timeout))

    async def call(self, peer: PeerIDLike, protocol: RpcProtocol, request: Message, *,
                   timeout: float | None = None) -> Message:
        return await self._portal.aio(lambda: self._trio.call(peer, protocol, request, timeout))

    async def ping(self, peer: PeerIDLike, *, timeout: float | None = None) -> float:
        return await self._portal.aio(lambda: self._trio.ping(peer, timeout))

    async def connected_peers(self) -> list[ID]:
        return await asyncio.to_thread(self._portal.run_sync, self._trio.connected_peers)

    async def flagged(self, run_id: str | None = None) -> dict[str, dict[str, int]]:
        """:meth:`Node.flagged`, awaited."""
        return await asyncio.to_thread(self._portal.run_sync,
                                       lambda: self._trio.flags.flagged(run_id))

    async def banned(self, run_id: str | None = None) -> dict[str, dict[str, object]]:
        """:meth:`Node.banned`, awaited."""
        return await asyncio.to_thread(self._portal.run_sync,
                                       lambda: self._trio.flags.banned(run_id, time.time()))

    async def shutdown(self) -> None:
        await asyncio.to_thread(self._node.shutdown)


def _outer(timeout: float | None) -> float | None:
    # The trio side enforces ``timeout``; the waiting thread allows a margin.
    return None if timeout is None else timeout + 5.0
