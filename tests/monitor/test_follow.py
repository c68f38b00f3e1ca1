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

            # Epoch 0: each one's part of the round took the other's values; epoch 1:
            # b's part took a's, a's round was one alone; epoch 2 completes unvouched.
            rounds = {0: ((b.peer_id,), (a.peer_id,)), 1: ((), (a.peer_id,)), 2: ((), ())}
            for epoch, (sa, sb) in enumerate([(30, 90), (50, 500), (20, 20)]):
                ta.report(sa, epoch)
                tb.report(sb, epoch)
                await wait_until(lambda e=epoch, x=sa, y=sb: seen(e, {"a": x, "b": y}), 30)
                took_a, took_b = rounds[epoch]
                ta.report(0, epoch + 1, last_round=(epoch, "averaged" if took_a else "alone",
                                                    2, took_a))
                tb.report(0, epoch + 1, last_round=(epoch, "averaged", 2, took_b))
            await wait_until(lambda: monitor.progress.tracker(RUN).local_epoch == 3, 30)
            await trio.sleep(2)
            credited = {(names[c.peer_id], c.epoch): c.samples for c in store.credits(RUN)}
            # an epoch counts once the run is two past it (epoch 2 waits); b's samples
            # at epoch 1 were in no part but its own (a's round was one alone)
            assert credited == {("a", 0): 30, ("b", 0): 90, ("a", 1): 50}
            assert [(s.samples, s.name) for s in store.leaderboard(RUN)] == [(90, None),
                                                                             (80, "alice")]
            assert monitor.progress.tracker(RUN).local_epoch == 3
            # the trainers count two trainers: the monitor is an auxiliary peer
            view = ta.global_progress()
            assert view.num_peers - view.num_auxiliary == 2
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
            for epoch in range(3):
                ta.report(40, epoch)
                tb.report(60, epoch)
                to.report(100, epoch)
                await wait_until(lambda e=epoch: glances and sorted(
                    (r.epoch, r.samples_accumulated) for r in glances[-1].peers)
                    == [(e, 40), (e, 60)], 30)    # the outsider is not in the view
                # the members even say that their parts took the outsider's values
                ta.report(0, epoch + 1, last_round=(epoch, "averaged", 3,
                                                    (b.peer_id, outsider.peer_id)))
                tb.report(0, epoch + 1, last_round=(epoch, "averaged", 3,
                                                    (a.peer_id, outsider.peer_id)))
                to.report(0, epoch + 1, last_round=(epoch, "averaged", 3,
                                                    (a.peer_id, b.peer_id)))
            await wait_until(lambda: len(store.credits(CLOSED)) == 4, 30)
            assert {c.peer_id for c in store.credits(CLOSED)} \
                == {a.peer_id.to_base58(), b.peer_id.to_base58()}
            assert ta.global_progress().num_peers == 2    # the monitor's reports count nothing
            nursery.cancel_scope.cancel()
