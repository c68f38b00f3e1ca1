"""Several p2pdl nodes in one process, driven by JSON lines: for DHT scenarios.

    python -m p2pdl.testing.swarm_agent --nodes 8 [--initial-peers ADDR ...]

Node 0 joins the initial peers; the other nodes join node 0 (and the
initial peers).  Prints ``{"ready": {"nodes": [{"peer_id", "addrs"}, ...]}}``
once every node runs, then answers one JSON line per command (the protocol
of :func:`p2pdl.testing.open_agent`).  Commands (``{"op": ..., ...}``;
``node`` is an index into this process's nodes):

* ``status`` -- every node's peer id, reachability and DHT statistics.
* ``wait_dht`` ``contacts`` -- wait until every node is a DHT server with at
  least that many routing-table contacts.
* ``store`` ``node`` ``key`` ``value`` ``ttl`` [``subkey``] -- ``subkey``
  ``"@own"`` means the node's own signed subkey.  Returns ``ok`` and ``ms``.
* ``get`` ``node`` ``key`` [``latest``] -- returns ``found``, ``value``
  (subkey -> [value, expiration] for dictionaries), ``expiration``, ``ms``,
  and ``local`` (whether the node held the key itself before the get).
* ``batch`` ``ops`` -- a list of store/get commands run one after another;
  returns their results (latencies measured in the process, without the
  command channel's overhead).  ``parallel`` ``ops`` -- the same, all at once.
* ``local`` ``node`` ``key`` -- the subkeys (or ``null`` for a plain value)
  the node itself holds for ``key``.
* ``table`` ``node`` -- the peer ids in the node's routing table.
* ``progress`` ``args`` -- simulated trainers on every node, reporting progress
  by gossip or by DHT polling (:func:`p2pdl.testing.simulate_progress`); returns
  their step and ready logs and the bytes sent.
* ``quit``.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import trio

from .. import NodeConfig, TrioNode, open_node
from .._concurrency import open_service_nursery
from ..dht import DHTConfig
from ._agent import Agent, open_agent, serve_commands
from ._progress_sim import simulate_progress
from ._swarm import LOOPBACK, wait_for_dht

MODULE = "p2pdl.testing.swarm_agent"


def _plain(value: Any) -> Any:
    """A DHT value as JSON (Message objects as their fields)."""
    if hasattr(value, "to_wire"):
        return {k: _plain(v) for k, v in value.to_wire().items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    return value


async def _store(node: TrioNode, command: dict[str, Any]) -> dict[str, Any]:
    subkey = command.get("subkey")
    if subkey == "@own":
        subkey = node.dht.own_subkey()
    start = time.perf_counter()
    ok = await node.dht.store(command["key"], command["value"],
                              node.dht.now() + float(command.get("ttl", 60)), subkey)
    return {"ok": ok, "ms": (time.perf_counter() - start) * 1000}


async def _get(node: TrioNode, command: dict[str, Any]) -> dict[str, Any]:
    local = bool(node.dht.local_store.get(command["key"], node.dht.now()))
    start = time.perf_counter()
    found = await node.dht.get(command["key"], latest=bool(command.get("latest", False)))
    ms = (time.perf_counter() - start) * 1000
    if found is None:
        return {"found": False, "ms": ms, "local": local}
    value = found.value
    if isinstance(value, dict) and all(hasattr(v, "expiration") for v in value.values()):
        value = {k: [_plain(v.value), v.expiration] for k, v in value.items()}
    return {"found": True, "value": _plain(value), "expiration": found.expiration, "ms": ms,
            "local": local}


def _status(nodes: list[TrioNode]) -> list[dict[str, Any]]:
    return [{"peer_id": str(n.peer_id), "addrs": n.addrs, "reachability": n.reachability.value,
             "dht": n.dht.statistics().as_dict()} for n in nodes]


async def _execute(nodes: list[TrioNode], command: dict[str, Any]) -> Any:
    op = command.get("op")
    with trio.fail_after(float(command.get("timeout", 60))):
        if op == "status":
            return _status(nodes)
        if op == "wait_dht":
            await wait_for_dht(nodes, int(command.get("contacts", 1)),
                               float(command.get("timeout", 60)))
            return _status(nodes)
        if op == "batch":
            return [await _one(nodes, c) for c in command["ops"]]
        if op == "parallel":
            results: list[Any] = [None] * len(command["ops"])

            async def run(i: int, one: dict[str, Any]) -> None:
                results[i] = await _one(nodes, one)

            async with trio.open_nursery() as nursery:
                for i, one in enumerate(command["ops"]):
                    nursery.start_soon(run, i, one)
            return results
        if op == "progress":
            return await simulate_progress(nodes, **command["args"])
        if op in ("store", "get"):
            return await _one(nodes, command)
        node = nodes[int(command["node"])]
        if op == "local":
            items = node.dht.local_store.get(command["key"], node.dht.now())
            return [i.subkey for i in items] if items else []
        if op == "table":
            return [str(c.peer) for c in node.dht.routing_table.contacts()]
    raise ValueError(f"unknown command {op!r}")


async def _one(nodes: list[TrioNode], command: dict[str, Any]) -> dict[str, Any]:
    node = nodes[int(command["node"])]
    if command["op"] == "store":
        return await _store(node, command)
    if command["op"] == "get":
        return await _get(node, command)
    raise ValueError(f"unknown batch command {command['op']!r}")


async def _main(count: int, config: NodeConfig) -> None:
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(open_node(config))
        nodes = [first]
        rest = NodeConfig.build(config, initial_peers=[*config.host.initial_peers,
                                                       first.addrs[0]])
        for _ in range(count - 1):
            nodes.append(await stack.enter_async_context(open_node(rest)))
        ready = {"nodes": [{"peer_id": str(n.peer_id), "addrs": n.addrs} for n in nodes]}
        await serve_commands(lambda command: _execute(nodes, command), ready)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m p2pdl.testing.swarm_agent")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--initial-peers", nargs="+", default=[])
    parser.add_argument("--dht-mode", choices=["auto", "server", "client"], default="auto")
    args = parser.parse_args(argv)
    config = NodeConfig.build(listen=LOOPBACK, initial_peers=args.initial_peers)
    config = dataclasses.replace(config, dht=DHTConfig(mode=args.dht_mode))
    try:
        trio.run(_main, args.nodes, config)
    except KeyboardInterrupt:
        pass


@asynccontextmanager
async def open_swarm_agents(processes: int, nodes: int, args: Sequence[str] = (), *,
                            timeout: float = 120.0) -> AsyncIterator[list[Agent]]:
    """Run ``processes`` swarm agents of ``nodes`` nodes each, all joined through
    node 0 of the first; the block starts once every process runs.

    ``args`` go to every agent (``--dht-mode``...).  Agents are told to quit
    at the end, then terminated, then killed (see :func:`open_agent`).
    """
    async with AsyncExitStack() as stack:
        first = await stack.enter_async_context(open_agent(
            ["--nodes", str(nodes), *args], module=MODULE, timeout=timeout))
        bootstrap = first.ready["nodes"][0]["addrs"][0]
        agents: list[Agent | None] = [first] + [None] * (processes - 1)
        done = trio.Event()

        async def hold(i: int, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
            async with open_agent(["--nodes", str(nodes), "--initial-peers", bootstrap, *args],
                                  module=MODULE, timeout=timeout) as agent:
                agents[i] = agent
                task_status.started()
                await done.wait()

        nursery = await stack.enter_async_context(open_service_nursery())
        stack.callback(done.set)
        async with trio.open_nursery() as starting:  # start the others at once
            for i in range(1, processes):
                starting.start_soon(nursery.start, hold, i)
        yield [a for a in agents if a is not None]
