"""A monitor never changes the run: two trainers end with the same parameters
with and without one following them, and no round ever took its values."""

from __future__ import annotations

import concurrent.futures
import functools
import time

import pytest
import torch

import p2pdl
from p2pdl import Optimizer
from p2pdl.monitor import CreditStore, Dashboard, follow_run

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
RUN = "no-effect"
EPOCHS = 6


def train(watched: bool) -> tuple[list[torch.Tensor], list[list[object]], int]:
    """Two trainers to EPOCHS whose every batch has the same gradient, of
    few bits (a linear loss of quarter-integer inputs): however many batches
    a round's sum holds, their mean is that gradient exactly; the run's rule
    (CenteredClip by default) averages identical rows to exactly that row;
    so the parameters after EPOCHS steps are the same bits in every run, and
    differ only if something else entered a round (timing changes nothing).
    With ``watched`` a monitor follows the run.  Returns the parameters, the
    trainers' rounds and the epochs the monitor saw complete."""
    torch.manual_seed(0)
    models = [torch.nn.Linear(3, 1) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    x = torch.randint(-4, 5, (32, 3), generator=torch.Generator().manual_seed(1)) / 4
    nodes = [p2pdl.Node(listen=LOOPBACK)]
    dashboard = None
    try:
        nodes += [p2pdl.Node(listen=LOOPBACK, initial_peers=nodes[0].addrs[:1])
                  for _ in range(2 if watched else 1)]
        for node in nodes[1:]:
            node.wait_for_peers(1)
        if watched:
            monitor = nodes[2]
            dashboard = Dashboard(RUN, CreditStore(":memory:"))
            follow = functools.partial(follow_run, monitor.trio_node, RUN, dashboard.store,
                                       target_batch_size=64, interval=0.2,
                                       on_glance=dashboard.observe)
            monitor.portal.run(lambda: monitor.trio_node.nursery.start(follow), 30)
        opts = [Optimizer(node=n, run_id=RUN, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                          target_batch_size=64, batch_size_per_step=32, matchmaking_time=5.0)
                for n, m in zip(nodes[:2], models, strict=True)]

        def loop(i: int) -> None:
            deadline = time.monotonic() + 120
            while opts[i].local_epoch < EPOCHS:
                assert time.monotonic() < deadline
                models[i](x).mean().backward()
                opts[i].step()
                opts[i].zero_grad()

        try:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                for future in [pool.submit(loop, i) for i in range(2)]:
                    future.result(timeout=150)
            rounds = [list(o.round_history()) for o in opts]
            ids = {str(n.peer_id) for n in nodes[:2]}
        finally:
            for opt in opts:
                opt.close()
        seen = len(dashboard.history.epochs) if dashboard is not None else 0
        for history in rounds:
            for info in history:
                assert set(info.contributors) <= ids, info
        return [p.detach().clone() for p in models[0].parameters()], rounds, seen
    finally:
        for node in nodes:
            node.shutdown()


@pytest.mark.timeout(300)
def test_a_monitor_never_changes_the_trainers_parameters():
    alone, _, _ = train(watched=False)
    watched, rounds, seen = train(watched=True)
    assert all(torch.equal(a, b) for a, b in zip(alone, watched, strict=True)), (alone, watched)
    assert seen >= 2                     # it did follow the run's epochs
    averaged = [info for history in rounds for info in history if info.outcome == "averaged"]
    assert averaged and all(info.group_size == 2 for info in averaged)
