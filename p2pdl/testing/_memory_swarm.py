"""Real p2pdl nodes on an in-memory network, in virtual time if the test wants it.

:func:`open_memory_nodes` is :func:`~p2pdl.testing.open_nodes` without
sockets: real nodes (:class:`~p2pdl.TrioNode`), each on a memory host
(:class:`~p2pdl.testing.MemoryHost`), with a wall clock that follows trio's
(:func:`trio_clock`).  Under ``trio.testing.MockClock(autojump_threshold=0)``
(pytest-trio's ``autojump_clock`` fixture) every timeout, heartbeat and
expiry then passes as soon as nothing else can run: a test of timeouts takes
milliseconds, and its time bounds are about the protocol, not the machine's
load.

Each node runs in a task of its own in the swarm's nursery, so that
:meth:`MemorySwarm.kill` (or ``network.kill(node)``) ends that node alone,
as killing its process would.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio
from libp2p.peer.id import ID

from .. import NodeConfig, TrioNode, open_node
from .._concurrency import open_service_nursery
from ..errors import CallTimeoutError
from ..service import AdmissionGate
from ._memory import MemoryNetwork, open_memory_host

__all__ = ["MemorySwarm", "open_memory_swarm", "open_memory_nodes", "trio_clock"]


def trio_clock(start: float | None = None) -> Callable[[], float]:
    """A wall clock (seconds since the epoch) that advances with trio's clock.

    It reads ``start`` (default: ``time.time()`` now) at trio's current time,
    and moves on exactly as ``trio.current_time()`` does: in real time under
    trio's default clock, in virtual time under a ``MockClock``.  Call it
    inside the trio run whose clock it follows.
    """
    origin = trio.current_time()
    wall = time.time() if start is None else float(start)
    return lambda: wall + (trio.current_time() - origin)


class MemorySwarm:
    """Nodes on one :class:`MemoryNetwork`.  Obtain one from :func:`open_memory_swarm`.

    ``nodes`` lists the nodes running now, in the order they started (a
    stopped or killed node leaves the list when its task has ended).
    """

    def __init__(self, network: MemoryNetwork, clock: Callable[[], float],
                 nursery: trio.Nursery) -> None:
        self.network = network
        self.clock = clock
        self._nursery = nursery
        self._running: dict[ID, tuple[trio.CancelScope, trio.Event]] = {}
        self.nodes: list[TrioNode] = []

    async def add(self, config: NodeConfig | None = None, *, reachable: bool = True,
                  clock: Callable[[], float] | None = None,
                  admission: AdmissionGate | None = None) -> TrioNode:
        """Start one node; returns it once every service is ready.

        ``config.host.initial_peers`` are dialled (and redialled) as on a real
        host.  ``reachable=False``: the node is behind NAT.  ``clock``: this
        node's wall clock (default the swarm's), to skew one node's time.
        ``admission``: the node's gate (default: it admits everyone).
        """
        node: TrioNode = await self._nursery.start(self._run, config or NodeConfig(), reachable,
                                                   clock or self.clock, admission)
        self.nodes.append(node)
        return node

    async def _run(self, config: NodeConfig, reachable: bool, clock: Callable[[], float],
                   admission: AdmissionGate | None,
                   task_status: trio.TaskStatus[TrioNode] = trio.TASK_STATUS_IGNORED) -> None:
        ended = trio.Event()
        peer_id: ID | None = None
        try:
            with trio.CancelScope() as scope:
                async with open_memory_host(self.network, config.host,
                                            reachable=reachable) as host, \
                        open_node(config, host=host, clock=clock,  # type: ignore[arg-type]
                                  admission=admission) as node:
                    peer_id = node.peer_id
                    self._running[peer_id] = (scope, ended)
                    task_status.started(node)
                    await trio.sleep_forever()
        finally:
            ended.set()
            if peer_id is not None:
                self._running.pop(peer_id, None)
                self.nodes = [n for n in self.nodes if n.peer_id != peer_id]

    async def add_nodes(self, count: int, config: NodeConfig | None = None, *,
                        connect: bool = True, reachable: bool = True,
                        timeout: float = 30.0) -> list[TrioNode]:
        """Start ``count`` nodes; with ``connect``, each has the swarm's first node as its
        initial peer (the first of these when the swarm is empty), and the call
        returns once all are connected to it."""
        config = config or NodeConfig()
        added: list[TrioNode] = []
        for _ in range(count):
            first = self.nodes[0] if self.nodes else None
            own = config
            if connect and first is not None:
                own = NodeConfig.build(config, initial_peers=[*config.host.initial_peers,
                                                              first.addrs[0]])
            added.append(await self.add(own, reachable=reachable))
        if connect and self.nodes:
            first = self.nodes[0]
            with trio.move_on_after(timeout):
                for node in added:
                    if node is not first:
                        await node.wait_for_peers(1, timeout)
                while not all(first.host.is_connected(n.peer_id) for n in added
                              if n is not first):
                    await first.host.wait_connections_changed(timeout)
            missing = [n for n in added if n is not first
                       and not first.host.is_connected(n.peer_id)]
            if missing:
                raise CallTimeoutError(f"{len(missing)} of {len(added)} memory nodes did not "
                                       f"connect within {timeout:.0f} s")
        return added

    def kill(self, node: TrioNode) -> None:
        """Kill ``node``: its host dies (connections reset, dials refused), its task ends."""
        self.network.kill(node.peer_id)

    async def stop(self, node: TrioNode) -> None:
        """Shut ``node`` down as its block ending would (services first, then the
        host), and wait until it has."""
        running = self._running.get(node.peer_id)
        if running is not None:
            scope, ended = running
            scope.cancel()
            await ended.wait()


@asynccontextmanager
async def open_memory_swarm(network: MemoryNetwork | None = None, *,
                            clock: Callable[[], float] | None = None
                            ) -> AsyncIterator[MemorySwarm]:
    """A :class:`MemorySwarm` for the duration of the block; its nodes end with it.

    ``network`` defaults to a new :class:`MemoryNetwork` (no latency);
    ``clock`` to :func:`trio_clock`.
    """
    network = network or MemoryNetwork()
    async with open_service_nursery() as nursery:
        swarm = MemorySwarm(network, clock or trio_clock(), nursery)
        try:
            yield swarm
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def open_memory_nodes(count: int, config: NodeConfig | None = None, *,
                            connect: bool = True, network: MemoryNetwork | None = None,
                            clock: Callable[[], float] | None = None,
                            timeout: float = 30.0) -> AsyncIterator[list[TrioNode]]:
    """Open ``count`` nodes on an in-memory network (:func:`open_nodes` without sockets).

    With ``connect`` every node after the first has the first as its initial
    peer, and the block starts once all are connected to it.  The network
    is ``nodes[0].host.network``; see :func:`open_memory_swarm` to add or
    kill nodes later.
    """
    async with open_memory_swarm(network, clock=clock) as swarm:
        yield await swarm.add_nodes(count, config, connect=connect, timeout=timeout)
