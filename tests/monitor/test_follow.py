"""A monitor follows a run on in-memory nodes (virtual time) and credits what
the trainers' own reports claimed at each epoch the run completed."""

from __future__ import annotations

import functools

import pytest
import trio
from libp2p.peer.id import ID

from p2pdl.monitor import CreditStore, follow_run
from p2pdl.testing import open_memory_nodes, wait_until

pytestmark = pytest.mark.timeout(60)

RUN = "followed-run"


async def test_a_monitor_credits_each_completed_epoch_and_moves_nobody(autojump_clock):
    async with open_memory_nodes(3) as nodes:
        a, b, monitor = nodes
        store = CreditStore(":memory:")
        glances = []
        async with a.progress.track(RUN, 100, name="alice") as ta, \
                b.progress.track(RUN, 100) as tb, \
                trio.open_nursery() as nursery:
            await nursery.start(functools.partial(
                follow_run, monitor, RUN, store, target_batch_size=100, interval=0.5,
                on_glance=glances.append))
            names = {a.peer_id.to_base58(): "a", b.peer_id.to_base58(): "b"}

            def seen(epoch: int, samples: dict[str, int]) -> bool:
                if not glances:
                    return False
                latest = {names.get(ID(r.peer_id).to_base58()): (r.epoch, r.samples_accumulated)
                          for r in glances[-1].peers}
                return all(latest.get(k) == (epoch, v) for k, v in samples.items())

            for epoch, (sa, sb) in enumerate([(30, 80), (50, 500)]):
                ta.report(sa, epoch)
                tb.report(sb, epoch)
                await wait_until(lambda e=epoch, x=sa, y=sb: seen(e, {"a": x, "b": y}), 30)
                ta.update_epoch(epoch + 1)
                tb.update_epoch(epoch + 1)
            await wait_until(lambda: len(store.credits(RUN)) == 4, 30)
            credited = {(names[c.peer_id], c.epoch): c.samples for c in store.credits(RUN)}
            assert credited == {("a", 0): 30, ("b", 0): 80, ("a", 1): 50, ("b", 1): 100}
            assert [(s.samples, s.name) for s in store.leaderboard(RUN)] == [(180, None),
                                                                             (80, "alice")]
            # the trainers count two trainers: the monitor is an auxiliary peer
            view = ta.global_progress()
            assert view.num_peers - view.num_auxiliary == 2
            assert monitor.progress.tracker(RUN).local_epoch == 2   # it follows the run
            nursery.cancel_scope.cancel()


async def test_in_a_closed_run_a_monitor_role_is_invisible_and_outsiders_earn_nothing(
        autojump_clock):
    from p2pdl.service import Role

    from ..progress.test_evidence import RUN as CLOSED
    from ..progress.test_evidence import gated_nodes

    roles = [Role.TRAINER, Role.TRAINER, Role.MONITOR, None]
    async with gated_nodes(roles) as (nodes, _):
        a, b, monitor, outsider = nodes
        store = CreditStore(":memory:")
        glances = []
        async with a.progress.track(CLOSED, 100) as ta, b.progress.track(CLOSED, 100) as tb, \
                outsider.progress.track(CLOSED, 100) as to, trio.open_nursery() as nursery:
            await nursery.start(functools.partial(
                follow_run, monitor, CLOSED, store, target_batch_size=100, interval=0.5,
                on_glance=glances.append))
            for epoch in range(2):
                ta.report(40, epoch)
                tb.report(60, epoch)
                to.report(100, epoch)
                await wait_until(lambda e=epoch: glances and sorted(
                    (r.epoch, r.samples_accumulated) for r in glances[-1].peers)
                    == [(e, 40), (e, 60)], 30)    # the outsider is not in the view
                ta.update_epoch(epoch + 1)
                tb.update_epoch(epoch + 1)
                to.update_epoch(epoch + 1)
            await wait_until(lambda: len(store.credits(CLOSED)) == 4, 30)
            assert {c.peer_id for c in store.credits(CLOSED)} \
                == {a.peer_id.to_base58(), b.peer_id.to_base58()}
            assert ta.global_progress().num_peers == 2    # the monitor's reports count nothing
            nursery.cancel_scope.cancel()
