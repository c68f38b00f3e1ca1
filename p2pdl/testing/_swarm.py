"""Real nodes on loopback, in this process or in child processes."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager

import trio

from .. import NodeConfig, TrioNode, open_node
from .._concurrency import open_service_nursery
from ..errors import CallTimeoutError

LOOPBACK = ("/ip4/127.0.0.1/tcp/0",)


def loopback_config(config: NodeConfig | None = None) -> NodeConfig:
    """``config`` listening on a free loopback port (never on other interfaces)."""
    return NodeConfig.build(config, listen=LOOPBACK)


@asynccontextmanager
async def open_nodes(count: int, config: NodeConfig | None = None, *, connect: bool = True,
                     timeout: float = 30.0) -> AsyncIterator[list[TrioNode]]:
    """Open ``count`` nodes on loopback in this trio run.

    With ``connect`` every node after the first has the first as its initial
    peer, and the block starts once all are connected to it.
    """
    config = loopback_config(config)
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(open_node(config))
        nodes = [first]
        rest = NodeConfig.build(config, initial_peers=first.addrs[:1]) if connect else config
        for _ in range(count - 1):
            nodes.append(await stack.enter_async_context(open_node(rest)))
        if connect:
            for node in nodes[1:]:
                await node.wait_for_peers(1, timeout)
            await first.wait_for_peers(count - 1, timeout)
            if len(first.connected_peers()) < count - 1:
                raise CallTimeoutError(f"only {len(first.connected_peers())} of {count - 1} "
                                       f"nodes connected within {timeout:.0f} s")
        yield nodes


@dataclasses.dataclass
class NodeProcess:
    """A ``p2pdl node`` running in a child process."""

    process: trio.Process
    addrs: list[str]
    lines: list[str]

    @property
    def peer_id(self) -> str:
        return self.addrs[0].rsplit("/p2p/", 1)[1]

    def send_signal(self, signum: int) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


async def _read_lines(stream: trio.abc.ReceiveStream, lines: list[str],
                      ready: trio.Event, addrs: list[str]) -> None:
    buf = b""
    async for chunk in stream:
        buf += chunk
        while b"\n" in buf:
            raw, buf = buf.split(b"\n", 1)
            line = raw.decode(errors="replace")
            lines.append(line)
            if line.startswith("/"):
                addrs.append(line)
            elif line.startswith("status:"):
                ready.set()
        del lines[:-1000]  # bounded


@asynccontextmanager
async def open_node_process(args: Sequence[str] = (), *, timeout: float = 30.0,
                            env: dict[str, str] | None = None) -> AsyncIterator[NodeProcess]:
    """Run ``python -m p2pdl node --listen <loopback> ARGS`` until the block ends.

    The block starts once the child printed its addresses; the child is sent
    SIGTERM at the end (SIGKILL if it is still alive 10 s later).
    """
    command = [sys.executable, "-m", "p2pdl", "node", "--listen", *LOOPBACK,
               "--status-interval", "1", *args]
    child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    async with open_service_nursery() as nursery:
        process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE,
                                                   stderr=None, env=child_env)
        try:
            lines: list[str] = []
            addrs: list[str] = []
            ready = trio.Event()
            assert process.stdout is not None
            nursery.start_soon(_read_lines, process.stdout, lines, ready, addrs)
            with trio.move_on_after(timeout):
                await ready.wait()
            if not ready.is_set():
                raise CallTimeoutError(f"p2pdl node did not start within {timeout:.0f} s; "
                                       f"output: {lines[-5:]}")
            yield NodeProcess(process, addrs, lines)
        finally:
            with trio.CancelScope(shield=True):
                if process.returncode is None:
                    process.send_signal(signal.SIGTERM)
                    with trio.move_on_after(10):
                        await process.wait()
                    if process.returncode is None:
                        process.kill()
                        await process.wait()
            nursery.cancel_scope.cancel()


async def wait_for_dht(nodes: Sequence[TrioNode], contacts: int | None = None,
                       timeout: float = 30.0) -> None:
    """Wait until every node that can be a DHT server is one, and every node
    has at least ``contacts`` routing-table contacts (default: every server
    but itself, at most k)."""
    deadline = trio.current_time() + timeout
    while True:
        servers = [n for n in nodes if n.config.dht.mode != "client" and not n.client_mode]
        want = contacts if contacts is not None else \
            min(len(servers) - 1, min(n.config.dht.k for n in nodes))
        if all(n.dht.server_mode for n in servers) and \
                all(len(n.dht.routing_table) >= want for n in nodes):
            return
        if trio.current_time() >= deadline:
            sizes = [len(n.dht.routing_table) for n in nodes]
            raise CallTimeoutError(f"DHT not ready within {timeout:.0f} s: routing tables "
                                   f"{sizes}, want {want} contacts each")
        await trio.sleep(0.05)


async def wait_until(predicate: Callable[[], object], timeout: float, *,
                     step: float = 0.01) -> float:
    """Seconds (trio's clock) until ``predicate()`` holds, looking every ``step`` s.

    Raises :class:`trio.TooSlowError` after ``timeout`` s.  Under a
    ``MockClock`` the looking costs no wall-clock time.
    """
    start = trio.current_time()
    with trio.fail_after(timeout):
        while True:
            if predicate():
                return trio.current_time() - start
            await trio.sleep(step)


def task_names() -> list[str]:
    """Names of every task of this trio run, depth first (to find leftovers)."""
    names: list[str] = []

    def walk(task: trio.lowlevel.Task) -> None:
        names.append(task.name)
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    walk(trio.lowlevel.current_root_task())
    return names


@asynccontextmanager
async def open_node_processes(count: int, args: Sequence[str] = (), *,
                              timeout: float = 60.0) -> AsyncIterator[list[NodeProcess]]:
    """Run ``count`` ``p2pdl node`` processes; all after the first join the first.

    The block starts once every child printed its addresses; all are stopped
    (SIGTERM, then SIGKILL) when it ends.
    """
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(open_node_process(args, timeout=timeout))
        procs = [first]
        for _ in range(count - 1):
            procs.append(await stack.enter_async_context(open_node_process(
                [*args, "--initial-peers", first.addrs[0]], timeout=timeout)))
        yield procs
