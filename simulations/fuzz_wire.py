"""Wire fuzzer: strangers attack a real p2pdl node over real connections; it must hold.

    python simulations/fuzz_wire.py [--cases 1000] [--attackers 3] [--seed 1]

Three processes on loopback: a target node (``--relay``: every protocol a
node serves, circuit relay's hop included), a process with two honest nodes
that ping the target and read a DHT record from it all the time, and this
process, whose attacker identities open streams to every protocol the
target exposes -- multistream-select itself (a stream never negotiated),
py-libp2p's identify, identify push, ``/ipfs/ping``, relay hop and stop,
DCUtR, and every p2pdl protocol -- plus raw TCP connections to its listener
(``connection``).  Each protocol gets ``--cases`` cases of every input class:

* ``random`` -- random bytes;
* ``bad_length`` -- length prefixes and frame headers that are wrong
  (unknown kinds, over the limits, over-long varints, lengths that lie);
* ``huge_length`` -- the largest lengths allowed, then part of the payload
  and nothing more;
* ``wrong_shape`` -- well-formed messages of the wrong shape (wrong tags,
  fields, types; valid protobufs of random content; a valid request
  followed by a violation; a TENSOR frame on an RPC stream);
* ``truncation`` -- a message cut short, the stream then closed or left open;
* ``idle`` -- streams opened and left silent, many at once;
* ``flood`` -- many valid requests at once, and stream churn.

Meanwhile every attacker also holds ``--idle-streams`` silent streams open
to the target.  The honest peers' ping and DHT latencies and failures are
measured before, during and after the attack; the target's RSS before, at
its peak (the kernel's high-water mark) and after; its log is scanned for
tracebacks and for records at WARNING or above.  Prints one JSON object;
``ok`` is true when the node is alive, no honest request failed, nothing
was logged as a traceback and RSS ended within ``--rss-slack`` MiB of
where it started.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import logging
import math
import os
import random
import statistics
import struct
import sys
import time
import typing
from pathlib import Path
from typing import Any

import msgpack
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import p2pdl  # noqa: E402
from p2pdl.averaging import MATCHMAKING_PROTOCOL  # noqa: E402
from p2pdl.dht import DHT_PROTOCOL  # noqa: E402
from p2pdl.net import HostConfig, open_host  # noqa: E402
from p2pdl.progress import PROGRESS_PROTOCOL  # noqa: E402
from p2pdl.statesync import STATESYNC_PROTOCOL  # noqa: E402
from p2pdl.wire import PING, MaxLen, Message, PingRequest, Range, encode_message  # noqa: E402
from p2pdl.wire.config import MAX_FRAME_PAYLOAD  # noqa: E402
from simulations import _harness as harness  # noqa: E402

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
CLASSES = ("random", "bad_length", "huge_length", "wrong_shape", "truncation", "idle", "flood")
MiB = 1 << 20
START_TIMEOUT = 60.0
HONEST_PING_EVERY = 0.05  # s between one honest node's pings
HONEST_DHT_EVERY = 0.2  # s between one honest node's DHT reads
HONEST_KEY = "fuzz/honest"

MULTISTREAM = b"/multistream/1.0.0\n"
NEGOTIATED = "negotiated"  # a stream negotiated to its protocol, then attacked
RAW = "raw"  # a Yamux stream never negotiated: the attack is on multistream-select itself
TCP = "tcp"  # a raw TCP connection to the listener: the attack is on the upgrade


@dataclasses.dataclass(frozen=True)
class Target:
    """One protocol the fuzzer attacks, and how its bytes are framed."""

    name: str
    protocol_id: str | None
    framing: str  # p2pdl | protobuf | ping | identify | multistream | connection
    requests: tuple[type[Message], ...] = ()
    tags: tuple[str, ...] = ()  # request tags of protocols whose types are not public

    @property
    def opening(self) -> str:
        return {"multistream": RAW, "connection": TCP}.get(self.framing, NEGOTIATED)


TARGETS = (
    Target("connection", None, "connection"),
    Target("multistream", None, "multistream"),
    Target("identify", "/ipfs/id/1.0.0", "identify"),
    Target("identify_push", "/ipfs/id/push/1.0.0", "protobuf"),
    Target("ipfs_ping", "/ipfs/ping/1.0.0", "ping"),
    Target("relay_hop", "/libp2p/circuit/relay/0.2.0/hop", "protobuf"),
    Target("relay_stop", "/libp2p/circuit/relay/0.2.0/stop", "protobuf"),
    Target("dcutr", "/libp2p/dcutr", "protobuf"),
    Target("ping", PING.protocol_id, "p2pdl", tuple(PING.requests)),
    Target("dht", DHT_PROTOCOL.protocol_id, "p2pdl", tuple(DHT_PROTOCOL.requests)),
    Target("dialback", "/p2pdl/dialback/1.0.0", "p2pdl", tags=("dialback",)),
    Target("progress", PROGRESS_PROTOCOL.protocol_id, "p2pdl", tuple(PROGRESS_PROTOCOL.requests)),
    Target("matchmaking", MATCHMAKING_PROTOCOL.protocol_id, "p2pdl",
           tuple(MATCHMAKING_PROTOCOL.requests)),
    Target("statesync", STATESYNC_PROTOCOL.protocol_id, "p2pdl",
           tuple(STATESYNC_PROTOCOL.requests)),
    Target("allreduce", "/p2pdl/allreduce/1.0.0", "p2pdl", tags=("ar.begin",)),
)


# -- the target and the honest peers (child processes) -----------------------------------

def _log_to_stderr() -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


async def serve_target() -> None:
    """The attacked node: every service, and circuit relay."""
    config = p2pdl.NodeConfig.build(listen=LOOPBACK, relay_service=True)
    async with p2pdl.open_node(config) as node:
        harness.emit("ready", addrs=node.addrs, pid=os.getpid())
        while True:
            command = await trio.to_thread.run_sync(harness.read_command, None,
                                                    abandon_on_cancel=True)
            if command is None or command["command"] == "stop":
                return
            if command["command"] == "gc":  # diagnostics: where the memory is
                harness.emit("gc", **_memory_report())
            if command["command"] == "stats":
                harness.emit("stats", host=_plain(dataclasses.asdict(node.host.statistics())),
                             peers=[str(p) for p in node.connected_peers()])


def _memory_report() -> dict[str, Any]:
    """RSS, glibc's view of the heap, and both again after a cyclic GC and malloc_trim."""
    import ctypes
    import gc

    def mallinfo() -> dict[str, float]:
        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in (
                "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                "uordblks", "fordblks", "keepcost")]
        try:
            libc = ctypes.CDLL("libc.so.6")
            libc.mallinfo2.restype = MallInfo2
            info = libc.mallinfo2()
        except (OSError, AttributeError):
            return {}
        return {"heap_in_use": round(info.uordblks / MiB, 1),
                "heap_free": round(info.fordblks / MiB, 1),
                "mmapped": round(info.hblkhd / MiB, 1)}

    pid = os.getpid()
    out: dict[str, Any] = {"rss": rss_mib(pid)["rss"], "torch_loaded": "torch" in sys.modules,
                           **mallinfo()}
    out["gc_objects"] = gc.collect()
    out["rss_after_gc"] = rss_mib(pid)["rss"]
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        out["rss_after_trim"] = rss_mib(pid)["rss"]
        out.update({f"{k}_after_trim": v for k, v in mallinfo().items()})
    except (OSError, AttributeError):
        pass
    return out


def _plain(value: Any) -> Any:
    """JSON-ready: peer ids and other keys as strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Latencies:
    """Round trips and failures of one kind of honest request, per phase."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self.failures = 0
        self.errors: collections.Counter[str] = collections.Counter()

    def summary(self) -> dict[str, Any]:
        s = sorted(self.samples)
        out: dict[str, Any] = {"requests": len(s) + self.failures, "failures": self.failures}
        if s:
            out.update(median_ms=round(1000 * statistics.median(s), 2),
                       p99_ms=round(1000 * s[min(len(s) - 1, int(0.99 * len(s)))], 2),
                       max_ms=round(1000 * s[-1], 2))
        if self.errors:
            out["errors"] = dict(self.errors.most_common(5))
        return out


async def serve_honest(target_addr: str) -> None:
    """Two honest nodes: ping the target and read a DHT record from it, all the time."""
    phase: dict[str, Latencies] = {"ping": Latencies(), "dht": Latencies()}
    config = p2pdl.NodeConfig.build(listen=LOOPBACK, initial_peers=[target_addr])
    async with p2pdl.open_node(config) as a, p2pdl.open_node(config) as b, \
            trio.open_nursery() as nursery:
        target = await a.connect(target_addr)
        await b.connect(target_addr)
        with trio.fail_after(30):
            while not await a.dht.store(HONEST_KEY, b"honest", time.time() + 3600):
                await trio.sleep(0.5)

        async def timed(kind: str, call: Any) -> None:
            start = trio.current_time()
            try:
                ok = await call()
            except Exception as exc:  # every failure counts; its kind is reported
                phase[kind].failures += 1
                phase[kind].errors[harness.describe(exc)[:120]] += 1
                return
            if ok:
                phase[kind].samples.append(trio.current_time() - start)
            else:
                phase[kind].failures += 1
                phase[kind].errors["wrong answer"] += 1

        async def pinger(node: Any) -> None:
            while True:
                await timed("ping", lambda: _ping_ok(node, target))
                await trio.sleep(HONEST_PING_EVERY)

        async def reader(node: Any) -> None:
            while True:
                await timed("dht", lambda: _dht_ok(node))
                await trio.sleep(HONEST_DHT_EVERY)

        for node in (a, b):
            nursery.start_soon(pinger, node)
            nursery.start_soon(reader, node)
        harness.emit("ready")
        while True:
            command = await trio.to_thread.run_sync(harness.read_command, None,
                                                    abandon_on_cancel=True)
            if command is None or command["command"] == "stop":
                nursery.cancel_scope.cancel()
                return
            if command["command"] == "phase":
                harness.emit("phase", name=command["name"],
                             ping=phase["ping"].summary(), dht=phase["dht"].summary())
                phase = {"ping": Latencies(), "dht": Latencies()}


async def _ping_ok(node: Any, target: Any) -> bool:
    return await node.ping(target, timeout=30) >= 0


async def _dht_ok(node: Any) -> bool:
    with trio.fail_after(30):
        found = await node.dht.get(HONEST_KEY)
    return found is not None and found.value == b"honest"


# -- payloads ----------------------------------------------------------------------------

def uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def delimited(payload: bytes) -> bytes:
    return uvarint(len(payload)) + payload


def frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BI", kind, len(payload)) + payload


def sample_value(hint: Any, rng: random.Random, depth: int = 0) -> Any:
    """A value of the annotated type (its bounds not always kept: a fuzzer's sample)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        base, *extras = args
        value = sample_value(base, rng, depth)
        for extra in extras:
            if isinstance(extra, Range) and isinstance(value, (int, float)) \
                    and extra.lo is not None and rng.random() < 0.8:
                value = type(value)(extra.lo)
            if isinstance(extra, MaxLen) and hasattr(value, "__len__") and rng.random() < 0.8:
                value = value[: extra.n]
        return value
    if origin is typing.Literal:
        return rng.choice(args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return sample_value(rng.choice(args), rng, depth)
    if origin in (list, tuple):
        if depth > 2:
            return []
        item = args[0] if args else int
        return [sample_value(item, rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if origin is dict:
        return {f"k{i}": sample_value(args[1], rng, depth + 1) for i in range(rng.randint(0, 2))}
    if isinstance(hint, type) and issubclass(hint, Message):
        return sample_body(hint, rng, depth + 1)
    return {int: lambda: rng.choice([0, 1, rng.getrandbits(16)]), float: lambda: rng.random(),
            bool: lambda: rng.random() < 0.5, str: lambda: rng.choice(["", "x", "run", "a" * 40]),
            bytes: lambda: rng.randbytes(rng.choice([0, 8, 32])),
            type(None): lambda: None}.get(hint, lambda: None)()


def sample_body(cls: type[Message], rng: random.Random, depth: int = 0) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: sample_value(hints[f.name], rng, depth) for f in dataclasses.fields(cls)}


def garbage_value(rng: random.Random, depth: int = 0) -> Any:
    choices: list[Any] = [None, True, -1, 2**64 - 1, 2**70, 1.5, float("nan"), "", "x" * 300,
                          b"", rng.randbytes(40)]
    if depth < 3:
        choices += [[garbage_value(rng, depth + 1) for _ in range(rng.randint(0, 4))],
                    {rng.choice(["a", "key", "run_id", 1]): garbage_value(rng, depth + 1)}]
    return rng.choice(choices)


def envelope(tag: Any, request_id: Any, body: Any) -> bytes:
    return msgpack.packb([tag, request_id, body], use_bin_type=True, default=repr)


class Payloads:
    """What an attacker sends for one target and input class (seeded)."""

    def __init__(self, target: Target, rng: random.Random, hostile_addr: str) -> None:
        self.t = target
        self.rng = rng
        self.hostile_addr = hostile_addr

    # A request the target may accept (for truncation and floods).
    def valid(self) -> bytes:
        rng, t = self.rng, self.t
        if t.framing == "p2pdl":
            return frame(1, self._request(rng.randint(1, 2**32)))
        if t.framing == "protobuf":
            return delimited(self._protobuf())
        if t.framing == "ping":
            return rng.randbytes(32)
        if t.framing == "multistream":
            return delimited(MULTISTREAM) + delimited(rng.choice(
                [b"/ipfs/ping/1.0.0\n", b"/p2pdl/ping/1.0.0\n", b"ls\n"]))
        if t.framing == "connection":
            return delimited(MULTISTREAM) + delimited(b"/noise\n")
        return b""  # identify: the client sends nothing

    def _request(self, request_id: int) -> bytes:
        rng, t = self.rng, self.t
        if t.name == "ping":
            return encode_message(PingRequest(rng.getrandbits(63), rng.randbytes(8)), request_id)
        if t.requests:
            cls = rng.choice(t.requests)
            return envelope(cls.TAG, request_id, sample_body(cls, rng))
        if t.name == "dialback":  # the node will dial it: a listener answering bad bytes
            return envelope("dialback", request_id, {"addrs": [self.hostile_addr]})
        return envelope(t.tags[0], 0, {"group_id": rng.randbytes(16), "sender": 0, "reducer": 1,
                                       "layout": rng.randbytes(32), "weight": 1.0})

    def _protobuf(self) -> bytes:
        from libp2p.identity.identify.pb.identify_pb2 import Identify
        from libp2p.relay.circuit_v2.pb.circuit_pb2 import HopMessage, StopMessage
        from libp2p.relay.circuit_v2.pb.dcutr_pb2 import HolePunch
        rng, name = self.rng, self.t.name
        if name == "identify_push":
            msg: Any = Identify(protocol_version=rng.choice(["ipfs/0.1.0", "x" * 100]),
                                agent_version="fuzz", public_key=rng.randbytes(36),
                                listen_addrs=[rng.randbytes(rng.randint(0, 30))
                                              for _ in range(rng.randint(0, 8))],
                                observed_addr=rng.randbytes(12),
                                protocols=[f"/p/{i}" for i in range(rng.randint(0, 20))])
        elif name == "relay_hop":
            msg = HopMessage(type=rng.choice([0, 1, 2]))
            if rng.random() < 0.5:
                msg.peer.id = rng.randbytes(rng.choice([0, 8, 38]))
                msg.peer.addrs.extend(rng.randbytes(10) for _ in range(rng.randint(0, 3)))
        elif name == "relay_stop":
            msg = StopMessage(type=rng.choice([0, 1]))
            msg.peer.id = rng.randbytes(rng.choice([0, 38]))
        else:
            msg = HolePunch(type=rng.choice([100, 300]),
                            ObsAddrs=[rng.randbytes(rng.randint(0, 20))
                                      for _ in range(rng.randint(0, 6))])
        data = msg.SerializeToString()
        if rng.random() < 0.2:  # field 1 (the type everywhere) again, with no such value
            data += b"\x08\x07"
        return data

    # The input classes: each returns the parts to write, in order.
    def random(self) -> list[bytes]:
        rng = self.rng
        data = rng.randbytes(rng.choice([1, 3, 16, 200, 4096, 65536]))
        if self.t.framing in ("multistream", "connection") and rng.random() < 0.5:
            data = delimited(MULTISTREAM) + data
        return [data]

    def bad_length(self) -> list[bytes]:
        rng, f = self.rng, self.t.framing
        if f == "p2pdl":
            return [rng.choice([
                struct.pack(">BI", rng.choice([0, 4, 9, 255]), rng.randint(0, 64)) + b"x" * 8,
                struct.pack(">BI", 1, 1 * MiB + 1),
                struct.pack(">BI", 2, MAX_FRAME_PAYLOAD + 1),
                struct.pack(">BI", 3, rng.choice([0, 3, 5, 1000])) + bytes(8),
                frame(3, b"\0\0\0\0"),
                frame(3, b"\xff\xff\xff\xff") * 3,  # credit beyond 4 GiB
                struct.pack(">BI", 1, 100) + self._request(1)[:50],
            ])]
        if f == "ping":
            return [rng.randbytes(rng.randint(1, 31))]
        if f in ("multistream", "connection"):
            return [rng.choice([b"\x80\x80\x80\x01" + MULTISTREAM, b"\x00",
                                uvarint(5) + b"ab\n", uvarint(2000) + b"x" * 64])]
        return [rng.choice([b"\xff" * 11, b"\x00", uvarint(70 * 1024) + b"x" * 32,
                            uvarint(2 * MiB), uvarint(50) + self._protobuf()[:10]])]

    def huge_length(self) -> list[bytes]:
        rng, f = self.rng, self.t.framing
        if f == "p2pdl":
            kind, length = rng.choice([(2, MAX_FRAME_PAYLOAD), (1, MiB), (2, 4 * MiB)])
            sent = rng.choice([0, 1, 64 * 1024, length // 2, length - 1])
            return [struct.pack(">BI", kind, length), bytes(sent)]
        if f == "ping":
            return [rng.randbytes(rng.choice([32 * 1024, 256 * 1024]))]
        if f in ("multistream", "connection"):
            return [uvarint(16383) + b"/" * rng.choice([0, 100, 1000])]
        length = rng.choice([64 * 1024, MiB - 1, 2**31])
        return [uvarint(length), bytes(rng.choice([0, 1000, 60 * 1024]))]

    def wrong_shape(self) -> list[bytes]:
        rng, t = self.rng, self.t
        if t.framing == "p2pdl":
            tags = [c.TAG for c in t.requests] + list(t.tags)
            bad = rng.choice([
                envelope(rng.choice(tags), rng.randint(0, 9), garbage_value(rng)),
                envelope(rng.choice(tags), -5, {}),
                envelope("no.such.tag", 1, {}),
                envelope(rng.choice(tags + ["pong", "dht.nodes"]), 1,
                         {k: garbage_value(rng) for k in ("key", "target", "addrs", "run_id")}),
                msgpack.packb(garbage_value(rng), use_bin_type=True, default=repr),
                b"\xc1" * rng.randint(1, 20),
            ])
            parts = [frame(1, bad)]
            if rng.random() < 0.3:  # a TENSOR frame where messages belong
                parts = [frame(2, struct.pack(">H", 4) + b"\x90\x90\x90\x90" + bytes(64))]
            if rng.random() < 0.5:  # a valid request first: the violation comes later
                parts.insert(0, self.valid())
            return parts
        if t.framing == "protobuf":
            return [delimited(self._protobuf()) for _ in range(rng.randint(1, 3))]
        if t.framing in ("multistream", "connection"):
            return [delimited(MULTISTREAM) + delimited(rng.choice(
                [b"/multistream/2.0.0\n", "/é/ü\n".encode(), b"ls\n", b"/tls/1.0.0\n",
                 b"/plaintext/2.0.0\n", b"/noise\n" + bytes(3)]))
                + rng.randbytes(rng.randint(0, 64))]
        return [rng.randbytes(32 * rng.randint(1, 4))]

    def truncation(self) -> list[bytes]:
        data = self.valid() or self.rng.randbytes(40)
        return [data[: self.rng.randint(1, max(1, len(data) - 1))]]

    def flood(self) -> list[bytes]:
        rng, f = self.rng, self.t.framing
        if f == "p2pdl":
            return [b"".join(frame(1, self._request(i + 1)) for i in range(rng.randint(50, 200)))]
        if f == "ping":
            return [rng.randbytes(32) * rng.randint(10, 100)]
        return [self.valid() * rng.randint(1, 20)]


# -- the attackers -----------------------------------------------------------------------

@dataclasses.dataclass
class Tally:
    cases: collections.Counter[tuple[str, str]] = dataclasses.field(
        default_factory=collections.Counter)
    outcomes: dict[str, collections.Counter[str]] = dataclasses.field(
        default_factory=lambda: collections.defaultdict(collections.Counter))
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    rss_peak: dict[str, float] = dataclasses.field(default_factory=dict)


async def _sample_rss(pid: int, tally: Tally, key: str) -> None:
    """The target's largest RSS while ``key`` (class/protocol) runs, sampled every 50 ms."""
    while True:
        rss = rss_mib(pid).get("rss", 0.0)
        tally.rss_peak[key] = max(tally.rss_peak.get(key, 0.0), rss)
        await trio.sleep(0.05)


class Attacker:
    """One identity: a host connected to the target, and its silent streams."""

    def __init__(self, host: Any, target: Any, addr: str, tcp_port: int, hold: float) -> None:
        self.host = host
        self.target = target
        self.addr = addr
        self.tcp_port = tcp_port
        self.hold = hold
        self.idle: list[Any] = []

    async def connection(self) -> Any:
        if not self.host.is_connected(self.target):
            await self.host.connect(self.addr, timeout=10)
        (conn, *_) = self.host.libp2p.get_network().connections[self.target]
        return conn

    async def open(self, target: Target) -> Any:
        if target.opening == RAW:
            conn = await self.connection()
            return await conn.muxed_conn.open_stream()
        await self.connection()
        return await self.host.libp2p.new_stream(self.target, [target.protocol_id])

    async def run_case(self, target: Target, cls: str, parts: list[bytes], close: bool,
                       tally: Tally) -> None:
        tally.cases[target.name, cls] += 1
        if target.opening == TCP:
            tally.outcomes[target.name][await self._tcp_case(parts, close)] += 1
            return
        try:
            with trio.fail_after(15):
                stream = await self.open(target)
        except Exception:  # refused (a limit), or the connection went away
            tally.outcomes[target.name]["refused"] += 1
            return
        outcome = "held"
        try:
            for part in parts:
                await stream.write(part)
            if close:
                await stream.close()
            outcome = await _await_reaction(stream, self.hold)
        except Exception:  # the node reset it while we wrote
            outcome = "reset"
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await stream.reset()
                except Exception:  # already gone
                    pass
        tally.outcomes[target.name][outcome] += 1

    async def _tcp_case(self, parts: list[bytes], close: bool) -> str:
        try:
            with trio.fail_after(5):
                sock = await trio.open_tcp_stream("127.0.0.1", self.tcp_port)
        except (OSError, trio.TooSlowError):
            return "refused"
        async with sock:
            try:
                for part in parts:
                    await sock.send_all(part)
                if close:
                    await sock.send_eof()
                with trio.move_on_after(self.hold):
                    while await sock.receive_some(65536):
                        pass
                    return "closed"
                return "held"
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                return "reset"

    async def churn(self, target: Target, count: int, tally: Tally) -> None:
        """Open and drop streams as fast as the node answers (part of ``flood``)."""
        for _ in range(count):
            tally.cases[target.name, "flood"] += 1
            try:
                with trio.fail_after(15):
                    stream = await self.open(target)
                await stream.reset()
                tally.outcomes[target.name]["churned"] += 1
            except Exception:  # refused, or reset under us
                tally.outcomes[target.name]["refused"] += 1


async def _await_reaction(stream: Any, hold: float) -> str:
    """How the node treated the stream within ``hold`` seconds."""
    answered = False
    with trio.move_on_after(hold):
        while True:
            try:
                data = await stream.read(65536)
            except Exception as exc:  # reset, or EOF (py-libp2p raises it)
                if "EOF" in type(exc).__name__:
                    return "answered" if answered else "closed"
                return "reset"
            if not data:
                return "answered" if answered else "closed"
            answered = True
    return "answered_then_held" if answered else "held"


async def hostile_listener(task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
    """A TCP listener that answers multistream-select with bytes that are not UTF-8:
    dial-back requests make the target dial it (outbound negotiation under attack)."""
    async def answer(conn: trio.SocketStream) -> None:
        with trio.move_on_after(5):
            try:
                await conn.receive_some(1024)
                await conn.send_all(b"\x02\xff\x0a")
                await conn.receive_some(1024)
            except (trio.BrokenResourceError, OSError):
                pass

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    task_status.started(listeners[0].socket.getsockname()[1])
    await trio.serve_listeners(answer, listeners)


async def attack(args: argparse.Namespace, target_info: dict[str, Any],
                 on_progress: Any) -> tuple[Tally, dict[str, Any]]:
    addr = target_info["addrs"][0]
    tcp_port = int(addr.split("/tcp/")[1].split("/")[0])
    rng = random.Random(args.seed)
    tally = Tally()
    targets = [t for t in TARGETS if not args.protocols or t.name in args.protocols]
    held_idle = {"opened": 0, "closed_by_node": 0}
    async with trio.open_nursery() as outer:
        hostile_port = await outer.start(hostile_listener)
        hostile_addr = f"/ip4/127.0.0.1/tcp/{hostile_port}"
        try:
            # The hosts' own nursery: leaving it waits until every host has closed
            # its connections, so the target sees the attackers go.
            async with trio.open_nursery() as hosts_nursery:
                hosts = [await hosts_nursery.start(_attacker_host)
                         for _ in range(args.attackers)]
                try:
                    await _attack_with(hosts, addr, tcp_port, hostile_addr, targets, rng, args,
                                       tally, held_idle, on_progress)
                finally:
                    for host in hosts:
                        host.close()
        finally:
            outer.cancel_scope.cancel()
    return tally, held_idle


async def _attack_with(hosts: list[Any], addr: str, tcp_port: int, hostile_addr: str,
                       targets: list[Target], rng: random.Random, args: argparse.Namespace,
                       tally: Tally, held_idle: dict[str, Any], on_progress: Any) -> None:
    attackers = []
    for host in hosts:
        target = await host.connect(addr, timeout=10)
        attackers.append(Attacker(host, target, addr, tcp_port, args.hold))
        held_idle.setdefault("attacker_ids", []).append(str(host.peer_id))
    # Silent streams held open for the whole attack.
    for i, attacker in enumerate(attackers):
        for j in range(args.idle_streams):
            t = targets[(i + j) % len(targets)]
            if t.opening == TCP:
                continue
            try:
                attacker.idle.append(await attacker.open(t))
                held_idle["opened"] += 1
            except Exception:  # refused: the limit is doing its work
                pass
    for cls in CLASSES:
        started = trio.current_time()
        for target in targets:
            payloads = Payloads(target, random.Random(rng.getrandbits(64)), hostile_addr)
            async with trio.open_nursery() as sampling:
                sampling.start_soon(_sample_rss, args.target_pid, tally, f"{cls}/{target.name}")
                await _run_class(attackers, target, cls, payloads, args, tally)
                sampling.cancel_scope.cancel()
            on_progress(target.name, cls)
        tally.seconds[cls] = round(trio.current_time() - started, 1)
    for attacker in attackers:
        for stream in attacker.idle:
            if await _await_reaction(stream, 0.1) in ("reset", "closed"):
                held_idle["closed_by_node"] += 1


class _AttackerHost:
    """An attacker's host, kept open until ``close``."""

    def __init__(self) -> None:
        self._done = trio.Event()
        self.host: Any = None

    def close(self) -> None:
        self._done.set()


async def _attacker_host(task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
    holder = _AttackerHost()
    config = HostConfig(listen=LOOPBACK, use_relays=False, hole_punching=False)
    async with open_host(config) as host:
        holder.host = host
        proxy = _HostProxy(host, holder)
        task_status.started(proxy)
        await holder._done.wait()


class _HostProxy:
    """The attacker's :class:`~p2pdl.net.Host`, plus ``close()``."""

    def __init__(self, host: Any, holder: _AttackerHost) -> None:
        self._host, self._holder = host, holder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._host, name)

    def close(self) -> None:
        self._holder.close()


async def _run_class(attackers: list[Attacker], target: Target, cls: str, payloads: Payloads,
                     args: argparse.Namespace, tally: Tally) -> None:
    rng = payloads.rng
    limiter = trio.Semaphore(args.concurrency * len(attackers))
    n = args.cases
    async with trio.open_nursery() as nursery:
        if cls == "idle":
            # Batches of silent streams: as many as a peer may open, and more.
            batch = HostConfig().max_inbound_streams_per_peer
            for start in range(0, n, batch * len(attackers)):
                async with trio.open_nursery() as wave:
                    for i, attacker in enumerate(attackers):
                        count = min(batch, n - start - i * batch)
                        for _ in range(max(0, count)):
                            wave.start_soon(attacker.run_case, target, cls, [], False, tally)
            return
        if cls == "flood" and target.opening != TCP:
            churn, k = n // 2, len(attackers)
            for i, attacker in enumerate(attackers):
                nursery.start_soon(attacker.churn, target, churn // k + (i < churn % k), tally)
            n -= churn
        for i in range(n):
            attacker = attackers[i % len(attackers)]
            parts = getattr(payloads, cls)()
            close = rng.random() < (0.3 if cls == "truncation" else 0.5)
            await limiter.acquire()
            nursery.start_soon(_limited, limiter, attacker.run_case, target, cls, parts, close,
                               tally)


async def _limited(limiter: trio.Semaphore, fn: Any, *args: Any) -> None:
    try:
        await fn(*args)
    finally:
        limiter.release()


# -- measuring -----------------------------------------------------------------------------

def rss_mib(pid: int) -> dict[str, float]:
    """The process's resident set now and its high-water mark (MiB), from /proc."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    key, value = line.split(":", 1)
                    out[key] = int(value.split()[0]) / 1024
    except OSError:
        return {}
    return {"rss": round(out.get("VmRSS", math.nan), 1),
            "hwm": round(out.get("VmHWM", math.nan), 1)}


def scan_log(path: Path) -> dict[str, Any]:
    """Tracebacks and records by level in the target's log; the loud ones by source."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return {}
    levels: collections.Counter[str] = collections.Counter()
    loud: collections.Counter[str] = collections.Counter()
    for line in lines:
        for level in ("CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG"):
            if f" {level} " in line:
                levels[level] += 1
                if level in ("CRITICAL", "ERROR", "WARNING"):
                    loud[line.split(f" {level} ", 1)[1][:90]] += 1
                break
    return {"tracebacks": sum("Traceback (most recent call last)" in line for line in lines),
            "error_lines": levels["ERROR"] + levels["CRITICAL"],
            "warning_lines": levels["WARNING"], "info_lines": levels["INFO"],
            "loud": dict(loud.most_common(10))}


def run(args: argparse.Namespace) -> dict[str, Any]:
    me = [sys.executable, str(Path(__file__).resolve())]
    started = time.monotonic()
    log_dir = Path(args.log_dir) if args.log_dir else None
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
    with harness.Supervisor(name="fuzz_wire", timeout=args.timeout, exit_grace=10.0,
                            log_dir=log_dir) as sup:
        sup.start([*me, "--child", "target"])
        info = sup.wait_all("ready", [0], limit=START_TIMEOUT)[0]
        pid = info["pid"]
        sup.start([*me, "--child", "honest", "--target-addr", info["addrs"][0]])
        sup.wait_all("ready", [1], limit=START_TIMEOUT)
        time.sleep(args.baseline)
        rss_before = rss_mib(pid)["rss"]
        sup.send("phase", [1], name="before")
        phases = {"before": sup.wait_all("phase", [1], limit=30)[1]}
        attack_started = time.monotonic()
        cpu_started = harness.process_cpu_s(pid) or 0.0
        died_during: list[str] = []

        def on_progress(protocol: str, cls: str) -> None:
            if sup.returncode(0) is not None and not died_during:
                died_during.append(f"{protocol}/{cls}")

        args.target_pid = pid
        tally, held_idle = trio.run(attack, args, info, on_progress)
        attack_s = time.monotonic() - attack_started
        target_cpu_s = (harness.process_cpu_s(pid) or 0.0) - cpu_started
        rss_end_of_attack = rss_mib(pid)
        sup.send("phase", [1], name="during")
        phases["during"] = sup.wait_all("phase", [1], limit=60)[1]
        time.sleep(args.settle)
        sup.send("phase", [1], name="after")
        phases["after"] = sup.wait_all("phase", [1], limit=60)[1]
        alive = sup.returncode(0) is None
        host_stats: dict[str, Any] = {}
        rss_after = rss_mib(pid)
        if alive:
            sup.send("stats", [0])
            try:
                reply = sup.wait_all("stats", [0], limit=30)[0]
                host_stats = reply["host"]
                host_stats["attackers_still_connected"] = len(
                    set(reply["peers"]) & set(held_idle.pop("attacker_ids", [])))
            except harness.RunFailed:
                alive = False
        if alive and args.gc_check:
            sup.send("gc", [0])
            gc_report = sup.wait_all("gc", [0], limit=60)[0]
            host_stats["memory_check"] = {k: v for k, v in gc_report.items() if k != "event"}
        log = scan_log(sup.log_dir / "fuzz_wire-rank-0.log")
        sup.send("stop")
        sup.wait_exit(limit=30)
    cases = {t: {c: n for (tt, c), n in sorted(tally.cases.items()) if tt == t}
             for t in sorted({t for t, _ in tally.cases})}
    honest = {kind: {name: phases[name][kind] for name in ("before", "during", "after")}
              for kind in ("ping", "dht")}
    failures = sum(v["failures"] for kind in honest.values() for v in kind.values())
    rss = {"before": rss_before, "peak": rss_after.get("hwm"),
           "end_of_attack": rss_end_of_attack.get("rss"), "after": rss_after.get("rss")}
    rss["after_minus_before"] = round(rss["after"] - rss_before, 1) if alive else None
    ok = (alive and failures == 0 and log.get("tracebacks", 1) == 0
          and rss["after_minus_before"] is not None
          and rss["after_minus_before"] <= args.rss_slack)
    return {
        "ok": ok,
        "node_alive": alive,
        "died_during": died_during[0] if died_during else None,
        "total_cases": sum(tally.cases.values()),
        "cases": cases,
        "outcomes": {t: dict(c) for t, c in sorted(tally.outcomes.items())},
        "idle_streams_held": held_idle,
        "honest": honest,
        "honest_failures": failures,
        "rss_mib": rss,
        "log": log,
        "node_statistics": host_stats,
        "target_cpu_s_during_attack": round(target_cpu_s, 1),
        "rss_peak_mib_by_case": dict(sorted(tally.rss_peak.items(), key=lambda kv: -kv[1])[:10]),
        "seconds": {"attack": round(attack_s, 1), "total": round(time.monotonic() - started, 1),
                    "by_class": tally.seconds},
        "settings": {"cases_per_class": args.cases, "attackers": args.attackers,
                     "concurrency": args.concurrency, "hold_s": args.hold,
                     "idle_streams": args.idle_streams, "seed": args.seed},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=1000,
                        help="cases per protocol and input class (default 1000)")
    parser.add_argument("--attackers", type=int, default=3, help="attacker identities (3)")
    parser.add_argument("--concurrency", type=int, default=40,
                        help="cases in flight per attacker (default 40)")
    parser.add_argument("--hold", type=float, default=0.1,
                        help="seconds a case waits for the node's reaction (default 0.1)")
    parser.add_argument("--idle-streams", type=int, default=16,
                        help="silent streams each attacker holds during the attack (16)")
    parser.add_argument("--protocols", nargs="*", default=[],
                        help=f"only these ({', '.join(t.name for t in TARGETS)})")
    parser.add_argument("--baseline", type=float, default=5.0,
                        help="seconds of honest traffic before the attack (5)")
    parser.add_argument("--settle", type=float, default=10.0,
                        help="seconds of honest traffic after it (10)")
    parser.add_argument("--rss-slack", type=float, default=100.0,
                        help="MiB RSS may end above where it started (100)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gc-check", action="store_true",
                        help="at the end, report the target's heap, then collect and trim it")
    parser.add_argument("--log-dir", help="keep the children's logs here (default: discard)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds for the whole run (3600)")
    parser.add_argument("--child", choices=["target", "honest"], help=argparse.SUPPRESS)
    parser.add_argument("--target-addr", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _log_to_stderr()
        with harness.reporting(child=args.child):
            if args.child == "target":
                trio.run(serve_target)
            else:
                trio.run(serve_honest, args.target_addr)
        return
    print(json.dumps(run(args), indent=2))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
