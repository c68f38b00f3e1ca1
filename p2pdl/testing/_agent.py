"""A p2pdl node driven by JSON lines on stdin: for scenarios across processes.

    python -m p2pdl.testing.agent [p2pdl node options...]

It prints ``{"ready": {...}}`` once the node runs, then answers each command
line with one JSON line.  Used by the emulated-internet tests and the NAT
benchmark, where every peer is a process inside its own network namespace.

Commands (``{"op": ..., ...}``):

* ``status`` -- addresses, reachability, client mode, reservations, paths.
* ``connect`` ``addr`` -- connect to a full address; returns the peer id.
* ``ping`` ``peer`` -- round-trip time in seconds.
* ``wait_path`` ``peer`` ``path`` ``timeout`` -- wait until the peer is reached that way.
* ``send`` ``peer`` ``mib`` -- send that many MiB on a framed stream to the
  peer's sink, wait for its acknowledgement; returns seconds and Mbit/s.
* ``quit``.

Each command is bounded by its own timeout; errors come back as
``{"error": "..."}`` and the agent keeps running.  ``P2PDL_AGENT_LOG=DEBUG``
(or ``INFO``) in its environment logs p2pdl's and the relay's loggers at that
level to stderr, each line with the process id.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from .. import NodeConfig, TrioNode, open_node
from ..errors import P2PDLError
from ..nat import NatConfig
from ..wire import Message, MessageSet

SINK = "/p2pdl-test/sink/1.0.0"
MiB = 1 << 20


class SinkDone(Message, tag="test.sink.done"):
    received: int


DONE = MessageSet(SinkDone)


async def _sink(stream: Any) -> None:
    received = 0
    while (item := await stream.receive(MessageSet())) is not None:
        received += len(item.data)
    await stream.send_message(SinkDone(received))


async def _send(node: TrioNode, peer: str, mib: int) -> dict[str, Any]:
    import torch

    data = torch.zeros(mib * MiB // 4)
    start = time.perf_counter()
    async with node.open_stream(peer, SINK) as stream:
        await stream.send_tensor(data)
        await stream.close_write()
        _, done = await stream.receive_message(DONE)
    seconds = time.perf_counter() - start
    assert isinstance(done, SinkDone) and done.received == mib * MiB
    return {"seconds": seconds, "mbit_s": mib * MiB * 8 / 1e6 / seconds,
            "path": node.host.path(peer)}


def _status(node: TrioNode) -> dict[str, Any]:
    return {"peer_id": str(node.peer_id), "addrs": node.addrs,
            "reachability": node.reachability.value, "client_mode": node.client_mode,
            "reservations": [str(p) for p in node.host.relay_reservations()],
            "paths": {str(p): kind for p, kind in node.paths().items()},
            "connected": [str(p) for p in node.connected_peers()]}


async def _execute(node: TrioNode, command: dict[str, Any]) -> Any:
    op = command.get("op")
    timeout = float(command.get("timeout", 60))
    with trio.fail_after(timeout):
        if op == "status":
            return _status(node)
        if op == "connect":
            return str(await node.connect(command["addr"], timeout=timeout))
        if op == "ping":
            return await node.ping(command["peer"], timeout=timeout)
        if op == "wait_path":
            while node.host.path(command["peer"]) != command["path"]:
                await node.host.wait_connections_changed(0.2)
            return command["path"]
        if op == "send":
            return await _send(node, command["peer"], int(command["mib"]))
    raise ValueError(f"unknown command {op!r}")


async def serve_commands(execute: Callable[[dict[str, Any]], Awaitable[Any]],
                         ready: dict[str, Any]) -> None:
    """Print ``{"ready": ...}``, then answer each JSON command line on stdin.

    ``execute(command)`` returns the result; a P2PDLError, a timeout, or a
    bad command comes back as ``{"error": ...}`` and the loop goes on.  Ends
    at ``{"op": "quit"}`` or when stdin closes.
    """
    stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
    print(json.dumps({"ready": ready}), flush=True)
    buffer = b""
    async with stdin:
        while True:
            chunk = await stdin.receive_some(65536)
            if not chunk:
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if not line.strip():
                    continue
                command = json.loads(line)
                if command.get("op") == "quit":
                    return
                try:
                    reply: dict[str, Any] = {"result": await execute(command)}
                except (P2PDLError, trio.TooSlowError, ValueError, KeyError,
                        IndexError) as exc:
                    reply = {"error": f"{type(exc).__name__}: {exc}"}
                print(json.dumps(reply), flush=True)


async def _main(config: NodeConfig) -> None:
    async with open_node(config) as node:
        node.set_stream_handler(SINK, _sink)
        await serve_commands(lambda command: _execute(node, command), _status(node))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m p2pdl.testing.agent")
    parser.add_argument("--listen", nargs="+", default=["/ip4/0.0.0.0/tcp/0"])
    parser.add_argument("--announce", nargs="+", default=[])
    parser.add_argument("--initial-peers", nargs="+", default=[])
    parser.add_argument("--relay", action="store_true")
    parser.add_argument("--no-hole-punching", action="store_true")
    parser.add_argument("--no-reachability", action="store_true")
    parser.add_argument("--relay-reservations", type=int, default=2)
    args = parser.parse_args(argv)
    config = NodeConfig.build(listen=args.listen, announce=args.announce,
                              initial_peers=args.initial_peers, relay_service=args.relay,
                              hole_punching=not args.no_hole_punching,
                              relay_reservations=args.relay_reservations)
    if args.no_reachability:
        import dataclasses
        config = dataclasses.replace(config, nat=NatConfig(enabled=False))
    if os.environ.get("P2PDL_AGENT_LOG"):
        import logging
        logging.getLogger("p2pdl").setLevel(os.environ["P2PDL_AGENT_LOG"])
        logging.getLogger("libp2p.relay").setLevel(os.environ["P2PDL_AGENT_LOG"])
        logging.basicConfig(level="INFO", stream=sys.stderr,
                            format=f"%(relativeCreated)d {os.getpid()} %(name)s %(message)s")
    try:
        trio.run(_main, config)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()


class AgentError(P2PDLError):
    """An agent answered a command with an error, or stopped answering."""


class Agent:
    """The trio side of an agent process (see :func:`open_agent`)."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = b""
        self.ready: dict[str, Any] = {}

    @property
    def peer_id(self) -> str:
        return str(self.ready["peer_id"])

    @property
    def addrs(self) -> list[str]:
        return list(self.ready["addrs"])

    def address_on(self, ip: str) -> str:
        """The agent's full address on the interface with this IP."""
        return next(a for a in self.addrs if a.startswith(f"/ip4/{ip}/"))

    async def wait_for_circuit(self, timeout: float = 30.0) -> str:
        """The agent's first ``/p2p-circuit`` address, once it holds a reservation."""
        with trio.fail_after(timeout):
            while True:
                status = await self.command("status")
                found = [a for a in status["addrs"] if "/p2p-circuit" in a]
                if found:
                    return found[0]
                await trio.sleep(0.2)

    async def _line(self, timeout: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        with trio.move_on_after(timeout):
            while b"\n" not in self._buffer:
                chunk = await self.process.stdout.receive_some(65536)
                if not chunk:
                    raise AgentError(f"agent exited (status {self.process.returncode})")
                self._buffer += chunk
            line, self._buffer = self._buffer.split(b"\n", 1)
            return json.loads(line)
        raise AgentError(f"agent gave no answer within {timeout:.0f} s")

    async def command(self, op: str, *, timeout: float = 60.0, **fields: Any) -> Any:
        assert self.process.stdin is not None
        payload = json.dumps({"op": op, "timeout": timeout, **fields}) + "\n"
        await self.process.stdin.send_all(payload.encode())
        reply = await self._line(timeout + 10)
        if "error" in reply:
            raise AgentError(f"{op}: {reply['error']}")
        return reply["result"]


@asynccontextmanager
async def open_agent(args: list[str], *, open_process: Any = None, timeout: float = 60.0,
                     module: str = "p2pdl.testing.agent") -> AsyncIterator[Agent]:
    """Run an agent (``python -m p2pdl.testing.agent ARGS``) for the block.

    ``module`` runs another agent speaking the same JSON lines
    (``p2pdl.testing.swarm_agent``: several nodes in one process).

    ``open_process`` runs it elsewhere, e.g. ``host.open_process`` of a
    :mod:`p2pdl.netlab` host; by default a local child process.  The agent is
    told to quit at the end, then terminated, then killed (bounded waits).
    """
    import subprocess

    spawn = open_process or trio.lowlevel.open_process
    process = await spawn([sys.executable, "-m", module, *args],
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    agent = Agent(process)
    try:
        first = await agent._line(timeout)
        if "ready" not in first:
            raise AgentError(f"agent did not start: {first}")
        agent.ready = first["ready"]
        yield agent
    finally:
        with trio.CancelScope(shield=True):
            try:
                assert process.stdin is not None
                with trio.move_on_after(2):
                    await process.stdin.send_all(b'{"op": "quit"}\n')
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass
            with trio.move_on_after(5):
                await process.wait()
            if process.returncode is None:
                process.terminate()
                with trio.move_on_after(5):
                    await process.wait()
            if process.returncode is None:
                process.kill()
                await process.wait()
