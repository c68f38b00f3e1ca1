"""The node's three faces: trio, sync (background thread) and asyncio."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import subprocess
import sys
import threading
import time

import pytest
import trio

import p2pdl
from p2pdl import Node, open_node
from p2pdl.errors import CallTimeoutError, ConfigError, NodeClosedError, RemoteError
from p2pdl.testing import LOOPBACK, open_nodes, task_names
from p2pdl.wire import RpcProtocol

from .wire.test_rpc import WORK, Result, Work


async def slow_work(ctx, req: Work) -> Result:
    await trio.sleep(req.delay)
    if req.mode == "reject":
        raise p2pdl.RequestError("bad_request", "no")
    return Result(req.value * 2)


# -- trio ----------------------------------------------------------------------------

async def test_open_node_leaves_no_task_behind():
    before = task_names()
    async with open_nodes(3) as nodes:
        nodes[0].serve(WORK, slow_work)
        for n in nodes[1:]:
            assert await n.call(nodes[0].peer_id, WORK, Work(2)) == Result(4)
        assert len(task_names()) > len(before) + 10
    assert task_names() == before


async def test_user_errors_inside_the_node_block_propagate_unwrapped():
    with pytest.raises(KeyError):
        async with open_node(listen=LOOPBACK):
            raise KeyError("mine")


async def test_serving_a_protocol_twice_is_refused(two_nodes):
    a, _ = two_nodes
    a.serve(WORK, slow_work)
    with pytest.raises(ConfigError, match="already served"):
        a.serve(WORK, slow_work)


async def test_wait_for_peers_times_out():
    async with open_node(listen=LOOPBACK) as node:
        with pytest.raises(CallTimeoutError):
            await node.wait_for_peers(1, timeout=0.2)


# -- sync -------------------------------------------------------------------------------

def p2pdl_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("p2pdl")]


def test_sync_node_calls_futures_and_clean_shutdown():
    threads_before = set(threading.enumerate())
    with Node(listen=LOOPBACK) as server, Node(listen=LOOPBACK) as client:
        server.serve(WORK, slow_work)
        assert client.connect(server.addrs[0]) == server.peer_id
        assert client.call(server.peer_id, WORK, Work(4)) == Result(8)
        assert client.ping(server.peer_id) < 5
        future = client.call(server.peer_id, WORK, Work(5, delay=0.2), return_future=True)
        assert isinstance(future, concurrent.futures.Future)
        assert future.result(10) == Result(10)
        with pytest.raises(RemoteError, match="bad_request"):
            client.call(server.peer_id, WORK, Work(1, mode="reject"))
        with pytest.raises(CallTimeoutError):
            client.call(server.peer_id, WORK, Work(1, delay=5), timeout=0.2)
        assert client.connected_peers() == [server.peer_id]
        assert len(p2pdl_threads()) == 2
    assert p2pdl_threads() == []
    deadline = time.monotonic() + 15  # trio's idle worker threads retire by themselves
    while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert set(threading.enumerate()) - threads_before == set()
    with pytest.raises(NodeClosedError):
        client.ping(server.peer_id)
    client.shutdown()  # idempotent


def test_cancelling_a_future_cancels_the_operation():
    with Node(listen=LOOPBACK) as server, Node(listen=LOOPBACK) as client:
        calls = []

        async def handler(ctx, req):
            calls.append(req)
            await trio.sleep(req.delay)
            return Result(1)

        server.serve(WORK, handler)
        client.connect(server.addrs[0])
        def running_operations() -> int:
            names = client.portal.run_sync(task_names)
            return sum(".runner" in name for name in names)  # run_sync starts no task

        future = client.wait_for_peers(5, timeout=30, return_future=True)
        time.sleep(0.2)
        assert running_operations() == 1
        assert future.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            future.result(1)
        time.sleep(0.2)
        assert running_operations() == 0  # the trio side was cancelled too


def test_sync_node_reports_bad_input_clearly():
    with pytest.raises(ConfigError, match="unknown node option"):
        Node(listn=LOOPBACK)
    with pytest.raises(ConfigError, match="not a multiaddr"):
        Node(listen=LOOPBACK, initial_peers=["localhost:4001"])
    assert p2pdl_threads() == []


# -- asyncio ---------------------------------------------------------------------------

def test_asyncio_loop_keeps_running_while_awaiting_the_node():
    async def main() -> tuple[int, Result, float]:
        server = await asyncio.to_thread(Node, listen=LOOPBACK)
        client = await asyncio.to_thread(Node, listen=LOOPBACK)
        try:
            server.serve(WORK, slow_work)
            await client.aio.connect(server.addrs[0])
            ticks = 0

            async def ticker() -> None:
                nonlocal ticks
                while True:
                    await asyncio.sleep(0.01)
                    ticks += 1

            task = asyncio.create_task(ticker())
            start = time.monotonic()
            result = await client.aio.call(server.peer_id, WORK, Work(3, delay=1.0))
            elapsed = time.monotonic() - start
            task.cancel()
            rtt = await client.aio.ping(server.peer_id)
            assert rtt < 5
            # cancelling the awaiting asyncio task cancels the trio operation
            waiter = asyncio.create_task(client.aio.wait_for_peers(9, timeout=30))
            await asyncio.sleep(0.1)
            waiter.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiter
            return ticks, result, elapsed
        finally:
            await client.aio.shutdown()
            await server.aio.shutdown()

    ticks, result, elapsed = asyncio.run(main())
    assert result == Result(6)
    assert elapsed >= 1.0
    assert ticks >= 0.5 * elapsed / 0.01  # the loop was never blocked for long
    assert p2pdl_threads() == []


def test_public_names():
    for name in ("Node", "open_node", "NodeConfig", "TrioNode", "AsyncioNode", "RpcProtocol",
                 "Message", "RemoteProtocolError", "LocalProtocolError", "__version__"):
        assert hasattr(p2pdl, name), name
    assert isinstance(WORK, RpcProtocol)


SCRIPT = """
import sys, time, p2pdl
with p2pdl.Node(listen=["/ip4/127.0.0.1/tcp/0"]) as node:
    try:
        print(node.addrs[0], flush=True)  # inside the try: a signal may come at once
        time.sleep(60)
    finally:
        print("unwound", flush=True)
"""


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, -signal.SIGINT)])
def test_sync_node_program_stops_within_5s_on_signals(signum, code):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith("/ip4/127.0.0.1/")
        start = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=5)
        assert time.monotonic() - start < 5
    finally:
        proc.kill()
    assert "unwound" in out
    assert proc.returncode == code
    if signum == signal.SIGTERM:
        assert "Traceback" not in err and "Error" not in err, err
    else:  # the program's own KeyboardInterrupt, as in any Python program; nothing from p2pdl
        assert err.strip().endswith("KeyboardInterrupt") and "p2pdl" not in err


async def test_normal_operation_and_shutdown_log_no_warnings(caplog):
    """Failed dials are reported as exceptions, not also as log noise; shutdown is quiet."""
    with caplog.at_level(logging.WARNING):
        async with open_nodes(1) as (b,):
            async with open_nodes(2) as (a, c):
                await b.connect(a.addrs[0])
                assert await b.ping(a.peer_id) < 5 and await c.ping(a.peer_id) < 5
                gone = a.addrs[0]
            with trio.fail_after(5):  # b notices the closed connection
                while b.connected_peers():
                    await b.host.wait_connections_changed(1.0)
            with pytest.raises(p2pdl.PeerUnreachableError):
                await b.connect(gone, timeout=5)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_blocking_call_from_a_handler_is_a_clear_error():
    with Node(listen=LOOPBACK) as server, Node(listen=LOOPBACK) as client:
        async def handler(ctx, req):
            server.ping(ctx.peer_id)  # wrong: blocks the node's own thread
            return Result(0)

        server.serve(WORK, handler)
        client.connect(server.addrs[0])
        with pytest.raises(RemoteError, match="internal"):
            client.call(server.peer_id, WORK, Work(1))
