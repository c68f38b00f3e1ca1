"""Stream benchmark: p2pdl framing vs bare py-libp2p vs raw TCP, two processes.

    python simulations/bench_stream.py [--mib 256] [--repeats 3]

Prints one JSON object (see protocols/wire.md and the README).  Every case
moves ``--mib`` MiB from this process to a server process on loopback and
waits for the server's acknowledgement that all bytes arrived; cases are
interleaved and repeated, and the median is reported, so the ratios compare
runs made under the same machine load.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import struct
import sys
import time
from pathlib import Path
from typing import Annotated

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import p2pdl  # noqa: E402
from p2pdl.wire import MaxLen, Message, MessageSet, RpcProtocol, TensorChunk  # noqa: E402
from simulations import _harness as harness  # noqa: E402

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
SINK = "/bench/sink/1.0.0"  # p2pdl framed stream: tensor frames in, a Done message out
RAW_SINK = "/bench/raw-sink/1.0.0"  # bare libp2p stream: bytes in, 8-byte count out
RAW_ECHO = "/bench/raw-echo/1.0.0"  # bare libp2p stream: echoes 64-byte messages
MiB = 1 << 20


class Done(Message, tag="done"):
    received: int
    cpu_s: float


class Echo(Message, tag="echo"):
    data: Annotated[bytes, MaxLen(1024)]


ECHO = RpcProtocol.define("/bench/echo/1.0.0", [Echo], [Echo])
DONE_SET = MessageSet(Done)
SERVER_START_TIMEOUT = 60.0  # seconds for the server process to listen
cpu_seconds = harness.process_cpu_s  # this process's user + system CPU seconds


# -- server process ----------------------------------------------------------------

async def serve() -> None:
    async def echo(ctx, req):
        return Echo(req.data)

    async def sink(stream) -> None:
        cpu0, n = cpu_seconds(), 0
        while True:
            item = await stream.receive(MessageSet())
            if item is None:
                break
            assert isinstance(item, TensorChunk)
            n += len(item.data)
        await stream.send_message(Done(n, cpu_seconds() - cpu0))

    async def raw_sink(net_stream) -> None:
        from libp2p.network.stream.exceptions import StreamEOF
        cpu0, n = cpu_seconds(), 0
        while True:
            try:
                data = await net_stream.read(MiB)
            except StreamEOF:
                break
            if not data:
                break
            n += len(data)
        await net_stream.write(struct.pack(">Qd", n, cpu_seconds() - cpu0))
        await net_stream.close()

    async def raw_echo(net_stream) -> None:
        from libp2p.network.stream.exceptions import StreamEOF
        try:
            while True:
                data = b""
                while len(data) < 64:
                    data += await net_stream.read(64 - len(data))
                await net_stream.write(data)
        except StreamEOF:
            pass

    async def tcp_sink(sock_stream) -> None:
        cpu0, n = cpu_seconds(), 0
        async with sock_stream:
            while True:
                data = await sock_stream.receive_some(MiB)
                if not data:
                    break
                n += len(data)
            await sock_stream.send_all(struct.pack(">Qd", n, cpu_seconds() - cpu0))

    async with p2pdl.open_node(listen=LOOPBACK) as node, trio.open_nursery() as nursery:
        node.serve(ECHO, echo)
        node.set_stream_handler(SINK, sink)
        node.host.libp2p.set_stream_handler(RAW_SINK, raw_sink)
        node.host.libp2p.set_stream_handler(RAW_ECHO, raw_echo)
        listeners = await nursery.start(
            functools.partial(trio.serve_tcp, tcp_sink, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        harness.emit("listening", addr=node.addrs[0], tcp_port=port)
        # Serve until the parent says stop or is gone (the end of stdin).
        await trio.to_thread.run_sync(harness.wait_command, "stop", abandon_on_cancel=True)
        nursery.cancel_scope.cancel()


# -- client ------------------------------------------------------------------------

async def run_p2pdl(node, peer, total: int, streams: int) -> tuple[float, float]:
    import torch

    per_stream = total // streams
    tensor = torch.empty(per_stream // 4, dtype=torch.float32).uniform_()
    server_cpu = []

    async def one() -> None:
        async with node.open_stream(peer, SINK) as stream:
            await stream.send_tensor(tensor)
            await stream.close_write()
            _, done = await stream.receive_message(DONE_SET)
            assert done.received == per_stream, done
            server_cpu.append(done.cpu_s)

    cpu0, t0 = cpu_seconds(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(streams):
            nursery.start_soon(one)
    elapsed = time.perf_counter() - t0
    return total / MiB / elapsed, (cpu_seconds() - cpu0 + sum(server_cpu)) / (total / 2**30)


async def run_libp2p(node, peer, total: int) -> float:
    from libp2p.network.stream.exceptions import StreamEOF

    stream = await node.host.libp2p.new_stream(peer, [RAW_SINK])
    chunk = memoryview(bytes(MiB))
    t0 = time.perf_counter()
    for _ in range(total // MiB):
        await stream.write(chunk)
    await stream.close_write()
    reply = b""
    while len(reply) < 16:
        try:
            reply += await stream.read(16 - len(reply))
        except StreamEOF:
            break
    elapsed = time.perf_counter() - t0
    received, _ = struct.unpack(">Qd", reply)
    assert received == total, received
    return total / MiB / elapsed


async def run_tcp(port: int, total: int) -> float:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    chunk = bytes(MiB)
    t0 = time.perf_counter()
    async with stream:
        for _ in range(total // MiB):
            await stream.send_all(chunk)
        await stream.send_eof()
        reply = b""
        while len(reply) < 16:
            data = await stream.receive_some(16)
            if not data:
                break
            reply += data
    elapsed = time.perf_counter() - t0
    assert struct.unpack(">Qd", reply)[0] == total
    return total / MiB / elapsed


async def run_rtt(node, peer, calls: int) -> tuple[float, float]:
    payload = Echo(b"x" * 64)
    for _ in range(50):  # warm up the stream
        await node.call(peer, ECHO, payload)
    samples = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await node.call(peer, ECHO, payload)
        samples.append((time.perf_counter() - t0) * 1000)
    samples.sort()
    return samples[len(samples) // 2], samples[int(len(samples) * 0.99) - 1]


async def run_libp2p_rtt(node, peer, calls: int) -> float:
    """Median round trip of 64 bytes echoed on a bare py-libp2p stream (reference)."""
    stream = await node.host.libp2p.new_stream(peer, [RAW_ECHO])
    payload = b"x" * 64
    samples = []
    for i in range(calls + 50):
        t0 = time.perf_counter()
        await stream.write(payload)
        data = b""
        while len(data) < 64:
            data += await stream.read(64 - len(data))
        if i >= 50:
            samples.append((time.perf_counter() - t0) * 1000)
    await stream.close()
    samples.sort()
    return samples[len(samples) // 2]


async def client(args: argparse.Namespace, info: dict) -> dict:
    """Every case against the server listening at ``info`` (its ``listening`` event)."""
    total = args.mib * MiB
    results: dict[str, list[float]] = {k: [] for k in
                                       ("p2pdl", "p2pdl8", "libp2p", "tcp", "cpu")}
    async with p2pdl.open_node(listen=LOOPBACK) as node:
        peer = await node.connect(info["addr"])
        for _ in range(args.repeats):
            mib_s, cpu = await run_p2pdl(node, peer, total, 1)
            results["p2pdl"].append(mib_s)
            results["cpu"].append(cpu)
            results["libp2p"].append(await run_libp2p(node, peer, total))
            results["p2pdl8"].append((await run_p2pdl(node, peer, total, 8))[0])
            results["tcp"].append(await run_tcp(info["tcp_port"], total))
        rtt_p50, rtt_p99 = await run_rtt(node, peer, args.calls)
        libp2p_rtt = await run_libp2p_rtt(node, peer, args.calls)
    med = {k: statistics.median(v) for k, v in results.items()}
    return {
        "mib_per_case": args.mib,
        "repeats": args.repeats,
        "p2pdl_mib_s": round(med["p2pdl"], 1),
        "p2pdl_8streams_mib_s": round(med["p2pdl8"], 1),
        "libp2p_mib_s": round(med["libp2p"], 1),
        "raw_tcp_mib_s": round(med["tcp"], 1),
        "ratio_vs_libp2p": round(med["p2pdl"] / med["libp2p"], 3),
        "rtt_p50_ms": round(rtt_p50, 3),
        "rtt_p99_ms": round(rtt_p99, 3),
        "libp2p_rtt_p50_ms": round(libp2p_rtt, 3),
        "cpu_s_per_gib": round(med["cpu"], 2),
        "samples": {k: [round(x, 1) for x in v] for k, v in results.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="MiB per case (default 256)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per case (default 3)")
    parser.add_argument("--calls", type=int, default=2000, help="calls for the RTT (default 2000)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        try:
            trio.run(serve)
        except KeyboardInterrupt:
            pass
        return
    with harness.Supervisor(name="bench_stream server", exit_grace=5.0) as server:
        server.start([sys.executable, str(Path(__file__).resolve()), "--serve"])
        info = server.wait_all("listening", limit=SERVER_START_TIMEOUT)[0]
        report = trio.run(client, args, info)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
