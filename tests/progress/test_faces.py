"""Progress, matchmaking and averaging from sync and asyncio code (Node.progress,
node.aio.progress, ...)."""

from __future__ import annotations

import asyncio

import pytest

import p2pdl
from p2pdl.errors import ConfigError, LocalProtocolError, NodeClosedError

pytestmark = pytest.mark.timeout(120)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def wait(predicate, seconds: float = 30.0) -> None:
    import time
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


def test_sync_nodes_track_progress_and_form_a_group():
    with p2pdl.Node(listen=LOOPBACK) as a, \
            p2pdl.Node(listen=LOOPBACK, initial_peers=a.addrs[:1]) as b:
        b.wait_for_peers(1)
        with a.progress.track("sync-run", 100) as ta, b.progress.track("sync-run", 100) as tb:
            ta.report(60, samples_per_second=0.0)
            wait(lambda: tb.global_progress().samples_accumulated == 60)
            assert not tb.ready_to_step
            tb.report(40, samples_per_second=0.0)
            progress = ta.wait_ready(timeout=30)
            assert progress.samples_accumulated == 100 and progress.num_peers == 2
            assert ta.update_epoch() == 1 and ta.local_epoch == 1
            with pytest.raises(LocalProtocolError):
                tb.report(-1)
            assert tb.statistics()["reports_accepted"] >= 1
            assert [p.epoch for p in tb.peers()] in ([0], [1])
        with pytest.raises(NodeClosedError):
            ta.report(1)
        with pytest.raises(ConfigError):
            a.progress.track("", 10)
        assert a.progress.statistics()["runs"] == []
        import concurrent.futures
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            groups = list(pool.map(lambda n: n.matchmaking.form_group(
                "sync-run", 1, matchmaking_time=10), (a, b)))
        assert groups[0] == groups[1] and len(groups[0]) == 2
        # the group from matchmaking averages (its members' addresses came with it)
        import torch
        values = {a: [torch.full((1000,), 1.0)], b: [torch.full((1000,), 4.0)]}
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda n: n.allreduce.all_reduce(
                groups[0], values[n], weight=2.0 if n is a else 1.0, inplace=True), (a, b)))
        assert all(r.completed for r in results)
        # the default rule (CenteredClip) counts a's claim of 2 as the median's 1:
        # two members are averaged as they are, (1 + 4) / 2
        assert torch.allclose(values[a][0], torch.full((1000,), 2.5))
        assert torch.equal(values[a][0], values[b][0])
        assert a.allreduce.statistics()["completed"] == 1


def test_asyncio_faces():
    async def main():
        with p2pdl.Node(listen=LOOPBACK) as a, \
                p2pdl.Node(listen=LOOPBACK, initial_peers=a.addrs[:1]) as b:
            await b.aio.wait_for_peers(1)
            async with a.aio.progress.track("aio-run", 10) as ta, \
                    b.aio.progress.track("aio-run", 10) as tb:
                ta.report(4, samples_per_second=0.0)
                tb.report(6, samples_per_second=0.0)
                progress = await ta.wait_ready(timeout=30)
                assert progress.samples_accumulated == 10
            groups = await asyncio.gather(a.aio.matchmaking.form_group("aio-run", 0),
                                          b.aio.matchmaking.form_group("aio-run", 0))
            assert groups[0] == groups[1] and len(groups[0]) == 2
            import torch
            results = await asyncio.gather(
                a.aio.allreduce.all_reduce(groups[0], [torch.zeros(10)]),
                b.aio.allreduce.all_reduce(groups[0], [torch.ones(10)]))
            assert all(r.completed for r in results)
            assert torch.equal(results[0].tensors[0], torch.full((10,), 0.5))

    asyncio.run(main())
