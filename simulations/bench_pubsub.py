"""Which transport for progress gossip?  FloodSub, GossipSub (default, tuned), p2pdl push.

    python simulations/bench_pubsub.py [--peers 16] [--rates 0.5,2,10] [--duration 15]
                                       [--warmup 3] [--payload 300] [--quick] [--no-skip]
                                       [--systems floodsub,gossipsub_default,...]

Every system runs ``--peers`` peers in ONE process on loopback (TCP, Noise,
Yamux), one child process per system, one system after the other (so the
systems never share the 2 cores, and each starts from a clean process: the
byte counters and the monkeypatches below stay in it).  All peers of a system
thus share one core (one GIL): the latencies are those of 16 peers on one
core, and ``process_cpu_fraction`` near 1 means the rate is past what one
core carries; ``cpu_ms_per_message`` (the process's CPU over the window per
message published) is the cost that a deployment spreads over the peers.

Per rate R (messages per second per peer; the rates run one after the other
on the same swarm, each once the process has gone idle) each peer publishes
on a fixed schedule with a random phase; messages sent in the ``--warmup``
seconds are not counted, those sent in the next ``--duration`` seconds are;
then up to ``--drain`` seconds for the last deliveries.  Once a rate's
delivery has collapsed (``--collapse``) the higher rates are skipped (null,
with a note) unless ``--no-skip``.  All peers share one clock, so a
delivery's latency is its receive ``time.time()`` minus its send
``time.time()``.  ``staleness_*`` samples, every 0.1 s, how long each peer
has lacked each other peer's newest message (0 when it has it): for progress
the newest report is what counts, so a message superseded by a delivered
newer one stops counting.

* ``floodsub`` -- py-libp2p's ``FloodSub`` under ``Pubsub`` (signed messages,
  py-libp2p's defaults), hosts in a full mesh, one topic.
* ``gossipsub_default`` -- ``GossipSub`` with go-libp2p's mesh defaults (D=6,
  Dlo=5, Dhi=12, heartbeat 1 s) and py-libp2p's defaults for everything else
  (spam protection 10 msg/s per topic per forwarding peer, adaptive gossip,
  eclipse protection, IDONTWANT on /meshsub/1.2.0).
* ``gossipsub_tuned`` -- ``GossipSub`` with a mesh of every peer (D=Dlo=Dhi=N-1),
  a 0.2 s heartbeat, spam protection, adaptive gossip and eclipse protection
  off, /meshsub/1.1.0 only (no IDONTWANT: it only pays for large messages).
* ``p2pdl_push`` -- p2pdl nodes (``open_nodes`` + ``wait_for_dht``) running the
  real progress service: every peer tracks one run, and each message is a
  ``tracker.report(0, epoch=k)`` with a new epoch, which the publish policy
  publishes at once (signed report pushed to every member over
  ``/p2pdl/progress/1.0.0``).  Deliveries are seen by wrapping each tracker's
  ``_absorb`` in this process (the library is not changed).  A report that is
  superseded before it was pushed (the service coalesces: a slow member gets
  the newest report, never a queue) counts as not delivered.

Bytes: for p2pdl, ``p2pdl.wire.traffic()`` (p2pdl frames on the progress
protocol, requests, replies and anti-entropy included); for pubsub, the
varint-framed RPCs the ``Pubsub`` writes (``Pubsub.write_msg`` wrapped: data,
control and subscription RPCs, the signed peer record py-libp2p attaches to
each RPC included).  Neither counts Yamux, Noise or TCP overhead, and the
DHT traffic of p2pdl nodes is given apart.  ``bytes_sent_per_peer_min`` is
per peer per minute of the measured window.  Prints one JSON object.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import random
import statistics
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulations import _harness as harness  # noqa: E402
from simulations._harness import CpuMeter, CpuSample, RunFailed  # noqa: E402

SYSTEMS = ("floodsub", "gossipsub_default", "gossipsub_tuned", "p2pdl_push")
TOPIC = "p2pdl-bench-progress"
HEADER = struct.Struct("<IId")  # sender index, sequence number, send time

GOSSIPSUB_DEFAULT = {"degree": 6, "degree_low": 5, "degree_high": 12, "heartbeat_interval": 1.0,
                     "protocols": "/meshsub/1.2.0,/meshsub/1.1.0,/meshsub/1.0.0",
                     "spam_protection_enabled": True, "max_messages_per_topic_per_second": 10.0,
                     "adaptive_gossip_enabled": True, "eclipse_protection_enabled": True,
                     "source": "mesh degrees and heartbeat: go-libp2p defaults; "
                               "the rest: py-libp2p 0.8.1 GossipSub() defaults"}


def gossipsub_tuned(peers: int) -> dict[str, Any]:
    return {"degree": peers - 1, "degree_low": peers - 1, "degree_high": peers - 1,
            "heartbeat_interval": 0.2, "heartbeat_initial_delay": 0.1,
            "protocols": "/meshsub/1.1.0", "spam_protection_enabled": False,
            "adaptive_gossip_enabled": False, "eclipse_protection_enabled": False,
            "source": "mesh = every peer (flooding with gossip repair), short heartbeat, "
                      "spam/adaptive/eclipse protection off, no IDONTWANT"}


# -- measurement, shared by every system -----------------------------------------


class Recorder:
    """Send times of the messages and first deliveries of each at each receiver."""

    def __init__(self, peers: int) -> None:
        self.peers = peers
        self.sent: dict[tuple[int, int], float] = {}
        self.last_sent: dict[int, int] = {}                  # sender -> newest seq sent
        self.newest: dict[tuple[int, int], int] = {}         # (receiver, sender) -> newest seq
        self.first_seq: dict[int, int] = {}
        self.measured: set[tuple[int, int]] = set()
        self.delivered: dict[tuple[int, int], set[int]] = collections.defaultdict(set)
        self.latencies: list[float] = []
        self.staleness: list[float] = []
        self.pending = 0  # measured (message, receiver) pairs not yet delivered

    def send(self, sender: int, seq: int, measured: bool) -> float:
        now = time.time()
        self.sent[(sender, seq)] = now
        self.last_sent[sender] = seq
        self.first_seq.setdefault(sender, seq)
        if measured:
            self.measured.add((sender, seq))
            self.pending += self.peers - 1
        return now

    def deliver(self, receiver: int, sender: int, seq: int, sent_at: float | None = None) -> None:
        key = (sender, seq)
        if receiver == sender or key not in self.sent:
            return
        seen = self.delivered[key]
        if receiver in seen:
            return
        seen.add(receiver)
        pair = (receiver, sender)
        self.newest[pair] = max(seq, self.newest.get(pair, seq))
        if key in self.measured:
            self.pending -= 1
            start = self.sent[key] if sent_at is None else sent_at
            self.latencies.append(time.time() - start)

    def sample_staleness(self) -> None:
        """For every (receiver, sender): how long the receiver has lacked the sender's news.

        0 when it holds the newest message sent; else the age of the oldest
        message newer than the newest it holds (a message it never gets, but
        that a newer delivered one supersedes, stops counting then: for
        progress the newest report is what matters).
        """
        now = time.time()
        for sender, last in self.last_sent.items():
            for receiver in range(self.peers):
                if receiver == sender:
                    continue
                have = self.newest.get((receiver, sender), self.first_seq[sender] - 1)
                self.staleness.append(0.0 if have >= last
                                      else now - self.sent[(sender, have + 1)])


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _ms(value: float | None) -> float | None:
    return None if value is None else round(1000 * value, 2)


async def drive(peers: int, rate: float, warmup: float, duration: float, drain: float,
                first_seq: int, publish: Callable[[int, int, bool], Awaitable[None]],
                recorder: Recorder, counters: Callable[[], dict[str, float]]) -> dict[str, Any]:
    """Every peer publishes ``rate`` msg/s; returns the measured window's numbers.

    ``publish(sender, seq, measured)`` sends one message (it records its send
    time with the recorder); ``counters()`` returns cumulative counters, read at
    the start and the end of the measured window.
    """
    period = 1.0 / rate
    start = trio.current_time() + 0.2
    measure_from = start + warmup
    stop = measure_from + duration
    window: dict[str, tuple[dict[str, float], CpuSample]] = {}
    lag: list[float] = []
    rng = random.Random(int(rate * 1000) + peers)

    async def publisher(sender: int) -> None:
        seq = first_seq
        at = start + rng.random() * period
        while at < stop:
            await trio.sleep_until(at)
            lag.append(trio.current_time() - at)
            await publish(sender, seq, at >= measure_from)
            seq += 1
            at += period

    meter = CpuMeter()  # this process: every peer of the system

    def read() -> tuple[dict[str, float], CpuSample]:
        return counters(), meter.sample()

    async def window_task() -> None:
        await trio.sleep_until(measure_from)
        window["start"] = read()
        while trio.current_time() < stop:
            recorder.sample_staleness()
            await trio.sleep(0.1)
        window["stop"] = read()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(window_task)
        for sender in range(peers):
            nursery.start_soon(publisher, sender)
    deadline = trio.current_time() + drain
    while recorder.pending > 0 and trio.current_time() < deadline:
        await trio.sleep(0.05)
    messages = len(recorder.measured)
    expected = messages * (peers - 1)
    (counters0, cpu0), (counters1, cpu1) = window["start"], window["stop"]
    delta = {k: counters1[k] - counters0[k] for k in counters0}
    usage = cpu1.usage_since(cpu0)
    lat = recorder.latencies
    result: dict[str, Any] = {
        "rate_per_peer": rate, "swarm_rate": rate * peers, "messages": messages,
        "latency_p50_ms": _ms(statistics.median(lat) if lat else None),
        "latency_p99_ms": _ms(_quantile(lat, 0.99)),
        "latency_max_ms": _ms(max(lat) if lat else None),
        "delivered_fraction": round((expected - recorder.pending) / expected, 4)
        if expected else None,
        "staleness_p50_ms": _ms(_quantile(recorder.staleness, 0.5)),
        "staleness_p99_ms": _ms(_quantile(recorder.staleness, 0.99)),
        "bytes_sent_per_peer_min": round(delta.pop("bytes") / peers / (duration / 60)),
    }
    publishes = delta.pop("publishes", messages)
    sent = delta.pop("messages")
    result["messages_sent_per_publish"] = round(sent / publishes, 2) if publishes else None
    result["publishes"] = publishes
    result.update({
        # CPU of the whole process (every peer, one GIL) over the window: 1.0 = one core busy
        "process_cpu_fraction": round(usage.core_fraction, 2),
        "cpu_ms_per_message": round(1000 * usage.total_cpu_s / messages, 2)
        if messages else None,
        "publish_lag_p99_ms": _ms(_quantile(lag, 0.99)),
    })
    for key, value in delta.items():
        result[key] = round(value, 2) if isinstance(value, float) else value
    return result


# -- py-libp2p pubsub ------------------------------------------------------------


class PubsubCounters:
    def __init__(self) -> None:
        self.bytes = 0
        self.rpcs = 0
        self.data_rpcs = 0
        self.control_rpcs = 0
        self.queue_drops = 0


class _LogCounter(logging.Handler):
    """Counts py-libp2p's warnings that mean a message was dropped."""

    PATTERNS = {"Rate limit exceeded": "spam_drops",
                "fail to deliver message to subscription": "subscription_drops"}

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.counts: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        for pattern, name in self.PATTERNS.items():
            if isinstance(record.msg, str) and record.msg.startswith(pattern):
                self.counts[name] += 1


def _install_pubsub_counters() -> tuple[PubsubCounters, _LogCounter]:
    from libp2p.pubsub import rpc_queue
    from libp2p.pubsub.pubsub import Pubsub

    stats = PubsubCounters()
    write_msg = Pubsub.write_msg
    push = rpc_queue.RpcQueue.push

    async def counting_write(self: Any, stream: Any, rpc_msg: Any) -> bool:
        size = rpc_msg.ByteSize()
        stats.bytes += size + len(_uvarint(size))
        stats.rpcs += 1
        if len(rpc_msg.publish):
            stats.data_rpcs += 1
        if rpc_msg.HasField("control"):
            stats.control_rpcs += 1
        return await write_msg(self, stream, rpc_msg)

    def counting_push(self: Any, rpc: Any, priority: bool = False) -> bool:
        ok = push(self, rpc, priority)
        if not ok:
            stats.queue_drops += 1
        return ok

    Pubsub.write_msg = counting_write  # type: ignore[method-assign]
    rpc_queue.RpcQueue.push = counting_push  # type: ignore[method-assign]
    counter = _LogCounter()
    for name in ("libp2p.pubsub", "libp2p.pubsub.gossipsub", "libp2p.pubsub.pubsub"):
        logger = logging.getLogger(name)
        logger.addHandler(counter)
        logger.setLevel(logging.WARNING)
        logger.propagate = False  # counted here, not printed (hundreds per second)
    return stats, counter


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _make_router(system: str, peers: int) -> tuple[Any, dict[str, Any] | None]:
    from libp2p.custom_types import TProtocol
    from libp2p.pubsub.floodsub import PROTOCOL_ID as FLOODSUB_ID
    from libp2p.pubsub.floodsub import FloodSub
    from libp2p.pubsub.gossipsub import GossipSub

    if system == "floodsub":
        return FloodSub([FLOODSUB_ID]), None
    params = dict(GOSSIPSUB_DEFAULT if system == "gossipsub_default" else gossipsub_tuned(peers))
    kwargs = {k: v for k, v in params.items() if k not in ("protocols", "source")}
    protocols = [TProtocol(p) for p in params["protocols"].split(",")]
    return GossipSub(protocols, **kwargs), params


async def run_pubsub(system: str, args: argparse.Namespace) -> dict[str, Any]:
    from libp2p.pubsub.pubsub import Pubsub
    from libp2p.tools.anyio_service import background_trio_service

    from p2pdl.net import HostConfig, open_host
    from p2pdl.testing import LOOPBACK

    stats, log_counter = _install_pubsub_counters()
    n = args.peers
    out: dict[str, Any] = {}
    recorder = Recorder(n)
    async with AsyncExitStack() as stack:
        config = HostConfig(listen=LOOPBACK, use_relays=False, hole_punching=False)
        hosts = [await stack.enter_async_context(open_host(config)) for _ in range(n)]
        routers, pubsubs = [], []
        for host in hosts:
            router, params = _make_router(system, n)
            pubsub = Pubsub(host.libp2p, router)
            await stack.enter_async_context(background_trio_service(pubsub))
            if system != "floodsub":
                await stack.enter_async_context(background_trio_service(router))
            routers.append(router)
            pubsubs.append(pubsub)
            out["params"] = params
        subscriptions = []
        for pubsub in pubsubs:
            with trio.fail_after(10):
                await pubsub.wait_until_ready()
            subscriptions.append(await pubsub.subscribe(TOPIC))
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for i, host in enumerate(hosts):
                    for other in hosts[i + 1:]:
                        nursery.start_soon(host.connect, other.addrs()[0])
        ready_s = await _wait(lambda: all(len(p.peer_topics.get(TOPIC, ())) == n - 1
                                          for p in pubsubs), 30)
        if system != "floodsub":
            low = routers[0].degree_low
            await _wait(lambda: all(len(r.mesh.get(TOPIC, ())) >= low for r in routers), 15)
            out["mesh_sizes"] = sorted(len(r.mesh.get(TOPIC, ())) for r in routers)
        out["setup_ready_s"] = round(ready_s, 2)
        padding = b"\0" * max(0, args.payload - HEADER.size)

        async def receive(index: int, subscription: Any) -> None:
            async for message in subscription:
                sender, seq, sent_at = HEADER.unpack_from(message.data)
                recorder.deliver(index, sender, seq, sent_at)

        async def publish(sender: int, seq: int, measured: bool) -> None:
            sent_at = recorder.send(sender, seq, measured)
            await pubsubs[sender].publish(TOPIC, HEADER.pack(sender, seq, sent_at) + padding)

        def counters() -> dict[str, float]:
            return {"bytes": stats.bytes, "messages": stats.data_rpcs, "rpcs": stats.rpcs,
                    "control_rpcs": stats.control_rpcs, "queue_drops": stats.queue_drops,
                    **{k: log_counter.counts[k] for k in _LogCounter.PATTERNS.values()}}

        async with trio.open_nursery() as nursery:
            for i, subscription in enumerate(subscriptions):
                nursery.start_soon(receive, i, subscription)
            def finish(result: dict[str, Any]) -> None:
                result["rpcs_sent_per_publish"] = round(result.pop("rpcs") / result["messages"], 2)

            await run_rates(args, out, 0, publish, recorder, counters, finish)
            nursery.cancel_scope.cancel()
        harness.emit("result", result=out)
        # Connections first: a Pubsub stopped while its streams still deliver raises
        # from py-libp2p's stream handlers ("Nursery is closed to new arrivals").
        await _close_all(host.libp2p for host in hosts)
    return out


async def _close_all(libp2p_hosts: Any) -> None:
    conns = [c for h in libp2p_hosts for cs in h.get_network().connections.values() for c in cs]

    async def close(conn: Any) -> None:
        with contextlib.suppress(Exception):
            await conn.close()

    with trio.move_on_after(10):
        async with trio.open_nursery() as nursery:
            for conn in conns:
                nursery.start_soon(close, conn)


async def run_rates(args: argparse.Namespace, out: dict[str, Any], first_seq: int,
                    publish: Callable[[int, int, bool], Awaitable[None]], recorder: Recorder,
                    counters: Callable[[], dict[str, float]],
                    finish: Callable[[dict[str, Any]], None]) -> None:
    """Each rate in turn on the same swarm, after the process has gone idle.

    A rate after one whose delivery collapsed (below ``--collapse``) is skipped
    unless ``--no-skip``: the backlog only grows, and it would cost a minute.
    """
    seq = first_seq
    collapsed: str | None = None
    for i, rate in enumerate(args.rates):
        if collapsed and not args.no_skip:
            out[_rate_key(rate)] = None
            out.setdefault("note", f"skipped the higher rates: {collapsed}")
            continue
        settled = await settle(args.settle if i == 0 else args.settle_between)
        result = await drive(args.peers, rate, args.warmup, args.duration, args.drain, seq,
                             publish, recorder, counters)
        finish(result)
        result["settled_before_s"] = round(settled, 2)
        out[_rate_key(rate)] = result
        if (result["delivered_fraction"] or 0) < args.collapse:
            collapsed = (f"delivery collapsed at {rate:g} msg/s per peer (delivered "
                         f"{result['delivered_fraction']}, latency p50 "
                         f"{result['latency_p50_ms']} ms)")
        seq += int(rate * (args.warmup + args.duration)) + 10
        recorder.__init__(args.peers)  # type: ignore[misc]  # fresh; the closures hold it


async def _wait(predicate: Callable[[], bool], timeout: float) -> float:
    start = trio.current_time()
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.05)
    return trio.current_time() - start


async def settle(timeout: float, busy: float = 0.25) -> float:
    """Wait until the process uses under ``busy`` of a core (setup traffic over); seconds waited."""
    start = trio.current_time()
    meter = CpuMeter()
    while trio.current_time() - start < timeout:
        before = meter.sample()
        await trio.sleep(0.5)
        if meter.sample().usage_since(before).core_fraction < busy:
            break
    return trio.current_time() - start


def _rate_key(rate: float) -> str:
    return f"rate_{rate:g}"


# -- p2pdl push (the progress service) --------------------------------------------


async def run_p2pdl(args: argparse.Namespace) -> dict[str, Any]:
    from p2pdl.dht import DHT_PROTOCOL_ID
    from p2pdl.progress import PROGRESS_PROTOCOL_ID
    from p2pdl.testing import open_nodes, wait_for_dht
    from p2pdl.wire import traffic

    n = args.peers
    out: dict[str, Any] = {}
    recorder = Recorder(n)
    run_id = "bench-pubsub"
    started = trio.current_time()
    async with open_nodes(n, timeout=60) as nodes:
        await wait_for_dht(nodes, timeout=60)
        index = {node.peer_id.to_bytes(): i for i, node in enumerate(nodes)}
        async with AsyncExitStack() as stack:
            trackers = [await stack.enter_async_context(node.progress.track(run_id, 1 << 40))
                        for node in nodes]
            for i, tracker in enumerate(trackers):
                absorb = tracker._absorb

                def hooked(report: Any, sender: Any, now: float, _absorb: Any = absorb,
                           _i: int = i) -> Any:
                    verdict = _absorb(report, sender, now)
                    if verdict is not None:
                        recorder.deliver(_i, index.get(report.peer_id, -1), report.epoch)
                    return verdict

                tracker._absorb = hooked  # type: ignore[method-assign]
            ready_s = await _wait(lambda: all(t.statistics()["members"] == n - 1
                                              for t in trackers), 60)
            out["setup_ready_s"] = round(trio.current_time() - started, 2)
            out["members_ready_s"] = round(ready_s, 2)

            async def publish(sender: int, seq: int, measured: bool) -> None:
                recorder.send(sender, seq, measured)
                trackers[sender].report(0, seq)
                await trio.lowlevel.checkpoint()

            def sent(protocol: str) -> int:
                return traffic().get(protocol, (0, 0))[0]

            def counters() -> dict[str, float]:
                total = collections.Counter[str]()
                for tracker in trackers:
                    total.update({k: v for k, v in tracker.statistics().items()
                                  if isinstance(v, int)})
                return {"bytes": sent(PROGRESS_PROTOCOL_ID), "messages": total["pushes_sent"]
                        + total["pushes_failed"], "publishes": total["reports_published"],
                        "pushes_failed": total["pushes_failed"],
                        "dht_bytes_sent": sent(DHT_PROTOCOL_ID),
                        "syncs": total["syncs"]}

            def finish(result: dict[str, Any]) -> None:
                result["dht_bytes_sent_per_peer_min"] = round(
                    result.pop("dht_bytes_sent") / n / (args.duration / 60))

            await run_rates(args, out, 1, publish, recorder, counters, finish)
            harness.emit("result", result=out)
    return out


# -- driver ------------------------------------------------------------------------


def child_main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR)
    runner = run_p2pdl(args) if args.child == "p2pdl_push" else run_pubsub(args.child, args)

    async def bounded() -> None:
        with trio.fail_after(args.child_timeout):
            await runner

    with harness.reporting():  # a failure is sent as fatal; the exit status says it too
        trio.run(bounded)


def run_child(system: str, args: argparse.Namespace) -> dict[str, Any]:
    budget = 90 + args.settle + len(args.rates) * (args.warmup + args.duration + args.drain
                                                   + args.settle_between + 5)
    command = [sys.executable, str(Path(__file__).resolve()), "--child", system,
               "--peers", str(args.peers), "--rates", ",".join(f"{r:g}" for r in args.rates),
               "--duration", str(args.duration), "--warmup", str(args.warmup),
               "--drain", str(args.drain), "--settle", str(args.settle),
               "--settle-between", str(args.settle_between), "--payload", str(args.payload),
               "--collapse", str(args.collapse), *(["--no-skip"] if args.no_skip else []),
               "--child-timeout", str(budget)]
    started = time.time()
    limit = budget + 30
    with harness.Supervisor(name=f"bench_pubsub {system}", timeout=limit,
                            exit_grace=1.0) as child:
        child.start(command)
        try:
            result = child.wait_all("result")[0]["result"]
        except RunFailed as exc:
            result = {_rate_key(r): None for r in args.rates}
            result["note"] = f"no result: {exc}"[:600]
        else:
            try:
                code = child.wait_exit()[0]
                failed = child.find(0, "fatal")
                why = None if code == 0 else failed["error"] if failed \
                    else f"exit status {code}"
            except RunFailed:
                why = f"killed after {limit:.0f} s"
            if why:
                result["note"] = f"measured; the teardown then failed: {why}"
    result["process_s"] = round(time.time() - started, 1)
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", type=int, default=16)
    parser.add_argument("--rates", default="0.5,2,10", help="messages per second per peer")
    parser.add_argument("--duration", type=float, default=15.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--drain", type=float, default=4.0,
                        help="most seconds to wait for the last deliveries")
    parser.add_argument("--settle", type=float, default=30.0,
                        help="most seconds to wait, after setup, for the process to go idle")
    parser.add_argument("--settle-between", type=float, default=10.0,
                        help="most seconds to wait between two rates for the backlog to clear")
    parser.add_argument("--collapse", type=float, default=0.25,
                        help="a delivered fraction below this skips the higher rates")
    parser.add_argument("--no-skip", action="store_true", help="run every rate regardless")
    parser.add_argument("--payload", type=int, default=300, help="pubsub message bytes")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--quick", action="store_true",
                        help="3 s windows after 1.5 s of warm-up (for tests)")
    parser.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--child-timeout", type=float, default=300.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.rates = [float(r) for r in args.rates.split(",")]
    if args.quick and not args.child:
        args.duration, args.warmup, args.drain = 3.0, 1.5, 2.0
    args.systems = [s for s in args.systems.split(",") if s]
    unknown = [s for s in args.systems if s not in SYSTEMS]
    if unknown or args.peers < 2 or min(args.rates) <= 0 or args.payload < HEADER.size:
        parser.error(f"bad arguments (systems must be among {', '.join(SYSTEMS)}; "
                     f"peers >= 2, rates > 0, payload >= {HEADER.size})")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        child_main(args)
        return
    out: dict[str, Any] = {
        "peers": args.peers, "rates_per_peer": args.rates, "duration_s": args.duration,
        "warmup_s": args.warmup, "payload_bytes": args.payload, "quick": args.quick,
        "cpus": os.cpu_count(),
        "method": "each system in its own child process, one after the other, all its peers "
                  "in that process on loopback (tcp+noise+yamux); the rates run one after "
                  "the other on the same swarm",
        "bytes_note": "p2pdl: p2pdl frame bytes sent on /p2pdl/progress/1.0.0 "
                      "(p2pdl.wire.traffic(): pushes, replies, anti-entropy, credit frames); "
                      "pubsub: varint-framed RPC bytes passed to Pubsub.write_msg (data, "
                      "control, subscriptions, the signed peer record in every RPC); neither "
                      "counts yamux/noise/tcp; per peer per minute of the measured window",
        "messages_note": "network messages carrying a published message, per publish: "
                         "pubsub data RPCs written; p2pdl push requests (each also gets a "
                         "small reply, not counted here)",
    }
    for system in args.systems:
        out[system] = run_child(system, args)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
