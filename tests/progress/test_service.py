"""The progress service: on in-memory nodes in virtual time (every timing
bound is about the protocol, not the machine), and on real nodes over
loopback for the real stack."""

from __future__ import annotations

import dataclasses
from contextlib import AsyncExitStack

import msgpack
import pytest
import trio

from p2pdl import NodeConfig
from p2pdl.errors import ConfigError, LocalProtocolError, StreamClosedError
from p2pdl.progress import PROGRESS_PROTOCOL, ProgressConfig, TrackerStatistics, sign_report
from p2pdl.progress._messages import DigestEntry, Push, Reports
from p2pdl.testing import (
    MemoryNetwork,
    open_memory_nodes,
    open_memory_swarm,
    open_nodes,
    task_names,
    wait_for_dht,
    wait_until,
)
from p2pdl.wire import FrameKind
from p2pdl.wire._frames import frame_header

pytestmark = pytest.mark.timeout(90)

RUN = "test-run"


def with_progress(**fields) -> NodeConfig:
    return dataclasses.replace(NodeConfig(), progress=ProgressConfig(**fields))


def memory_nodes(count: int, config: NodeConfig | None = None):
    """``count`` in-memory nodes, 5 ms apart (one way)."""
    return open_memory_nodes(count, config, network=MemoryNetwork(latency=0.005))


async def wait_in_sync(trackers, timeout: float = 60) -> None:
    """Until every tracker knows every other and has pushed to each once."""
    n = len(trackers)
    await wait_until(lambda: all(t.global_progress().num_peers == n
                                 and len(t.gossip.synced()) == n - 1
                                 for t in trackers), timeout, step=0.05)


async def test_sixteen_peers_agree_on_the_count_within_one_publish_interval(autojump_clock):
    config = ProgressConfig()
    async with memory_nodes(16) as nodes:
        await wait_for_dht(nodes)
        async with AsyncExitStack() as stack:
            trackers = [await stack.enter_async_context(n.progress.track(RUN, 10**5))
                        for n in nodes]
            await wait_in_sync(trackers)
            # Changes beyond the drift tolerance (the larger of 0.01 * 10**5 / 16
            # = 62 samples and 3 of the peer's typical batches) are published at
            # once.  (In virtual time: simulations/bench_progress.py measures the
            # latency of real nodes spread over processes.)
            for round_ in range(1, 4):
                counts = [10 ** (round_ + 1) * (i + 1) for i in range(16)]
                for tracker, count in zip(trackers, counts, strict=True):
                    tracker.report(count, samples_per_second=0.0)
                await wait_until(
                    lambda c=sum(counts): all(t.global_progress().samples_accumulated == c
                                              for t in trackers), config.heartbeat_interval)
            # Changes within the tolerance wait for the next heartbeat at most.
            counts = [c + 10 for c in counts]
            for tracker, count in zip(trackers, counts, strict=True):
                tracker.report(count, samples_per_second=0.0)
            await wait_until(lambda c=sum(counts): all(t.global_progress().samples_accumulated
                                                       == c for t in trackers),
                             config.heartbeat_interval + 1)
            for tracker in trackers:
                stats = tracker.statistics()
                assert set(TrackerStatistics.counter_names()) <= set(stats)
                assert stats["dropped_bad_signature"] == stats["dropped_absurd"] == 0
                assert stats["peers"] == 15


async def test_all_sixteen_ready_soon_after_the_target_is_reached(autojump_clock):
    async with memory_nodes(16) as nodes:
        await wait_for_dht(nodes)
        async with AsyncExitStack() as stack:
            trackers = [await stack.enter_async_context(n.progress.track(RUN, 16 * 1000))
                        for n in nodes]
            await wait_in_sync(trackers)
            # Everyone at 990 samples, at 1 sample/s: the ETA lies 10 s ahead, so
            # only the reports of the last samples can make the peers ready.
            for tracker in trackers:
                tracker.report(990, samples_per_second=1.0)
            await trio.sleep(0.2)
            assert not any(t.ready_to_step for t in trackers)
            ready_at: dict[int, float] = {}

            async def wait_ready(i: int) -> None:
                await trackers[i].wait_ready(timeout=10)
                ready_at[i] = trio.current_time()

            async with trio.open_nursery() as nursery:
                for i in range(16):
                    nursery.start_soon(wait_ready, i)
                await trio.sleep(0.05)
                filled = trio.current_time()
                for tracker in trackers:  # the last samples of the global batch
                    tracker.report(1000)
            delays = sorted(t - filled for t in ready_at.values())
            assert len(delays) == 16
            # Published at once (the endgame), not at the next heartbeat (5 s):
            # in virtual time, so the bound is about the protocol, not the CPU
            # (bench_progress.py measures the latency of real nodes).
            print("ready delays", [round(d, 3) for d in delays])
            assert delays[-1] < 3.0, delays
            for tracker in trackers:
                assert tracker.global_progress().samples_accumulated == 16000
                tracker.update_epoch()
            await wait_until(lambda: all(t.global_progress().epoch == 1 and
                                         not t.ready_to_step for t in trackers), 10)


async def test_a_newer_epoch_makes_peers_ready_and_clients_do_not_set_the_epoch(autojump_clock):
    async with memory_nodes(3) as nodes:
        await wait_for_dht(nodes)
        async with nodes[0].progress.track(RUN, 10**6) as a, \
                nodes[1].progress.track(RUN, 10**6) as b, \
                nodes[2].progress.track(RUN, 10**6, client_mode=True) as client:
            await wait_until(lambda: a.global_progress().num_peers == 3, 10)
            client.update_epoch(5)
            await wait_until(lambda: a.global_progress().num_clients == 1, 5)
            await trio.sleep(0.2)
            assert a.global_progress().epoch == 0 and not a.ready_to_step
            b.update_epoch(1)
            await wait_until(lambda: a.ready_to_step and a.global_progress().epoch == 1, 5)
            assert b.global_progress().epoch == 1 and not b.ready_to_step


async def test_a_killed_peer_leaves_the_view_at_once_not_after_report_ttl(autojump_clock):
    """Its report would vote and count for report_ttl (15 s): a push to it that fails
    with no connection left takes it out of the view."""
    async with open_memory_swarm(MemoryNetwork(latency=0.005)) as swarm:
        nodes = await swarm.add_nodes(3)
        await wait_for_dht(nodes)
        async with AsyncExitStack() as stack:
            a, b = [await stack.enter_async_context(n.progress.track(RUN, 10**6))
                    for n in nodes[:2]]
            doomed = await stack.enter_async_context(nodes[2].progress.track(RUN, 10**6))
            doomed.update_epoch(3)
            await wait_until(lambda: a.global_progress().num_peers == 3
                             and b.global_progress().num_peers == 3, 10)
            swarm.kill(nodes[2])
            a.report(10, samples_per_second=0.0)   # the next publish pushes to everyone
            b.report(10, samples_per_second=0.0)
            took = await wait_until(lambda: a.global_progress().num_peers == 2
                                    and b.global_progress().num_peers == 2, 10)
            assert took < 2.0   # not report_ttl
            # it is no ghost either: the other's view, gossiped, does not bring it back
            await trio.sleep(6.0)
            assert a.global_progress().num_peers == 2 and b.global_progress().num_peers == 2


async def test_auxiliary_peers_count_as_members_but_bring_no_samples():
    async with open_nodes(2) as nodes:
        await wait_for_dht(nodes)
        async with nodes[0].progress.track(RUN, 100) as worker, \
                nodes[1].progress.track(RUN, 100, auxiliary=True) as aux:
            worker.report(40, samples_per_second=0.0)
            await wait_until(lambda: aux.global_progress().samples_accumulated == 40, 10)
            assert aux.global_progress().num_auxiliary == 1
            await wait_until(lambda: worker.global_progress().num_peers == 2, 10)
            assert worker.global_progress().num_auxiliary == 1
            with pytest.raises(LocalProtocolError, match="auxiliary"):
                aux.report(5)


async def test_a_late_joiner_learns_the_run_from_the_dht_snapshot(autojump_clock):
    async with memory_nodes(6) as nodes:
        await wait_for_dht(nodes)
        async with AsyncExitStack() as stack:
            early = [await stack.enter_async_context(n.progress.track(RUN, 10**6))
                     for n in nodes[:5]]
            for i, tracker in enumerate(early):
                tracker.report(10 * (i + 1), samples_per_second=0.0)
            await wait_until(lambda: all(t.global_progress().samples_accumulated == 150
                                         for t in early), 10)
            late = await stack.enter_async_context(nodes[5].progress.track(RUN, 10**6))
            took = await wait_until(lambda: late.global_progress().samples_accumulated == 150, 10)
            assert took < 3
            assert late.statistics()["snapshot_fetches"] >= 1
            # ... and the others learn about it (a change beyond the drift
            # tolerance of 0.01 * 10**6 / 6 samples is published at once).
            late.report(100_000, samples_per_second=0.0)
            await wait_until(lambda: all(t.global_progress().samples_accumulated == 100_150
                                         for t in early), 4)


async def test_partitioned_gossip_falls_back_to_the_dht_snapshot(autojump_clock):
    config = with_progress(snapshot_interval=0.5, snapshot_ttl=30.0, partition_timeout=1.0,
                           heartbeat_interval=5.0)
    async with memory_nodes(4, config) as nodes:
        await wait_for_dht(nodes)
        async with AsyncExitStack() as stack:
            trackers = [await stack.enter_async_context(n.progress.track(RUN, 10**6))
                        for n in nodes]
            await wait_until(lambda: all(t.global_progress().num_peers == 4 for t in trackers),
                             10)
            cut_off = trackers[3]
            original = cut_off.on_push

            def deaf(sender, request):  # pushes reach it but their reports are lost
                return original(sender, dataclasses.replace(request, reports=()))
            cut_off.on_push = deaf
            cut_off._pending.clear()
            for i, tracker in enumerate(trackers[:3]):
                tracker.report(100 * (i + 1), samples_per_second=0.0)
            took = await wait_until(lambda: cut_off.global_progress().samples_accumulated
                                    == 600, 10)
            assert took >= 0.5  # not by gossip
            assert cut_off.statistics()["snapshot_fetches"] >= 2


async def test_forged_absurd_and_foreign_reports_are_dropped_and_counted(autojump_clock):
    async with memory_nodes(3) as nodes:
        await wait_for_dht(nodes)
        victim, honest, attacker = nodes
        async with victim.progress.track(RUN, 10**6) as tracker, \
                honest.progress.track(RUN, 10**6) as other:
            other.report(10, samples_per_second=0.0)
            await wait_until(lambda: tracker.global_progress().samples_accumulated == 10, 10)
            key = attacker.host.libp2p.get_private_key()
            now = victim.dht.now()
            good = sign_report(key, attacker.peer_id, RUN, 0, 5, 1.0, now, False)
            # Signed by the attacker but claiming to be the honest peer.
            forged = dataclasses.replace(good, peer_id=honest.peer_id.to_bytes(),
                                         samples_accumulated=10**6)
            tampered = dataclasses.replace(good, samples_accumulated=10**6)
            absurd = [sign_report(key, attacker.peer_id, RUN, 0, -5, 1.0, now, False),
                      sign_report(key, attacker.peer_id, RUN, 0, 5, 1e9, now, False),
                      sign_report(key, attacker.peer_id, RUN, 0, 5, 1.0, now + 3600, False)]
            foreign = sign_report(key, attacker.peer_id, "another-run", 0, 5, 1.0, now, False)
            reply = await attacker.call(victim.peer_id, PROGRESS_PROTOCOL,
                                        Push(RUN, (forged, tampered, *absurd, foreign)))
            assert reply == Reports()
            stats = tracker.statistics()
            assert stats["dropped_bad_signature"] == 2
            assert stats["dropped_absurd"] == 3
            assert stats["dropped_wrong_run"] == 1
            # Reports for a run the node does not track are dropped and counted too.
            await attacker.call(victim.peer_id, PROGRESS_PROTOCOL, Push("unknown", (good,)))
            assert victim.progress.statistics()["reports_unknown_run"] == 1
            assert tracker.global_progress().samples_accumulated == 10
            # A genuine report of the attacker's own is taken, and the reply
            # carries what it lacks.
            reply = await attacker.call(victim.peer_id, PROGRESS_PROTOCOL,
                                        Push(RUN, (good,), want_reply=True,
                                             digest=(DigestEntry(honest.peer_id.to_bytes(),
                                                                 0.0),)))
            assert {r.peer_id for r in reply.reports} == {victim.peer_id.to_bytes(),
                                                          honest.peer_id.to_bytes()}
            await wait_until(lambda: tracker.global_progress().samples_accumulated == 15, 5)


async def test_malformed_pushes_reset_the_stream_and_the_node_keeps_serving():
    async with open_nodes(3) as nodes:
        await wait_for_dht(nodes)
        victim, honest, attacker = nodes
        async with victim.progress.track(RUN, 10**6) as tracker, \
                honest.progress.track(RUN, 10**6) as other:
            bad_bodies = [
                {"run_id": RUN, "reports": "not a list"},
                {"run_id": RUN, "reports": [{"run_id": RUN, "peer_id": b"x", "epoch": "zero"}]},
                {"run_id": RUN, "reports": [], "digest": [{"peer_id": b"x"}] * 2000},
                {"run_id": "r" * 500, "reports": []},
            ]
            for body in bad_bodies:
                payload = msgpack.packb(["progress.push", 1, body], use_bin_type=True)
                async with attacker.open_stream(victim.peer_id, PROGRESS_PROTOCOL.protocol_id) \
                        as stream:
                    await stream._send_frame(frame_header(FrameKind.MESSAGE, len(payload))
                                             + payload)
                    with pytest.raises(StreamClosedError):
                        await stream.receive_message(PROGRESS_PROTOCOL.responses)
            other.report(77, samples_per_second=0.0)
            await wait_until(lambda: tracker.global_progress().samples_accumulated == 77, 10)


async def test_tracker_lifecycle_and_bad_input(autojump_clock):
    async with memory_nodes(2) as nodes:
        node = nodes[0]
        with pytest.raises(ConfigError, match="run_id"):
            async with node.progress.track("", 10):
                pass
        with pytest.raises(ConfigError, match="target_batch_size"):
            async with node.progress.track(RUN, 0):
                pass
        async with node.progress.track(RUN, 10) as tracker:
            with pytest.raises(ConfigError, match="already tracks"):
                async with node.progress.track(RUN, 10):
                    pass
            for bad in (-1, 1.5, True):
                with pytest.raises(LocalProtocolError):
                    tracker.report(bad)
            tracker.report(5, 2)
            with pytest.raises(LocalProtocolError, match="behind"):
                tracker.report(5, 1)
            assert node.statistics()["progress"]["runs"] == [RUN]
        assert node.progress.statistics()["runs"] == []
        assert not any("_publisher" in name or "_snapshots" in name for name in task_names())
