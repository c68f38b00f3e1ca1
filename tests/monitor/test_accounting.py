"""The accounting of a recorded run matches what the rounds averaged.

Three trainers (real ``p2pdl.Node`` peers on loopback, one thread each) and a
monitor following them: every credit is a sample count that a round of that
peer at that epoch actually took, and every round that averaged at an epoch
the monitor counted is credited, with the samples it claimed.  (Restarts
and the store's once-only rule: test_ledger.py.)
"""

from __future__ import annotations

import concurrent.futures
import functools
import time

import pytest
import torch

import p2pdl
from p2pdl import Optimizer
from p2pdl.monitor import CreditStore, follow_run

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
RUN = "accounting"
EPOCHS = 6
TARGET = 96
BATCH = 16


@pytest.mark.timeout(300)
def test_the_credits_are_the_samples_the_rounds_averaged(tmp_path):
    torch.manual_seed(0)
    models = [torch.nn.Linear(3, 1) for _ in range(3)]
    for model in models[1:]:
        model.load_state_dict(models[0].state_dict())
    x = torch.randn(BATCH, 3, generator=torch.Generator().manual_seed(1))
    store = CreditStore(tmp_path / "credits.sqlite")
    nodes = [p2pdl.Node(listen=LOOPBACK)]
    try:
        nodes += [p2pdl.Node(listen=LOOPBACK, initial_peers=nodes[0].addrs[:1])
                  for _ in range(3)]
        for node in nodes[1:]:
            node.wait_for_peers(1)
        monitor = nodes[3]
        follow = functools.partial(follow_run, monitor.trio_node, RUN, store,
                                   target_batch_size=TARGET, interval=1.0)
        monitor.portal.run(lambda: monitor.trio_node.nursery.start(follow), 30)
        opts = [Optimizer(node=n, run_id=RUN, optimizer=torch.optim.SGD(m.parameters(), lr=0.1),
                          target_batch_size=TARGET, batch_size_per_step=BATCH,
                          matchmaking_time=5.0)
                for n, m in zip(nodes[:3], models, strict=True)]

        def loop(i: int) -> None:
            deadline = time.monotonic() + 150
            while opts[i].local_epoch < EPOCHS:
                assert time.monotonic() < deadline
                models[i](x).pow(2).mean().backward()
                opts[i].step()
                opts[i].zero_grad()

        try:
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                for future in [pool.submit(loop, i) for i in range(3)]:
                    future.result(timeout=200)
            time.sleep(1.0)   # the monitor's last looks
            rounds = {str(n.peer_id): list(o.round_history())
                      for n, o in zip(nodes[:3], opts, strict=True)}
        finally:
            for opt in opts:
                opt.close()
        credits = {(c.peer_id, c.epoch): c.samples for c in store.credits(RUN)}
        assert credits, rounds
        averaged = {(peer, info.epoch): info.samples for peer, history in rounds.items()
                    for info in history if info.outcome in ("averaged", "partial")
                    and len(info.contributors) >= 2}
        counted = {epoch for _, epoch in credits}
        # every credit is what a round of that peer took at that epoch ...
        for key, samples in credits.items():
            assert key in averaged and samples == min(averaged[key], TARGET), (key, rounds)
        # ... and every round that averaged at an epoch the monitor counted is credited
        missing = {key: s for key, s in averaged.items() if key[1] in counted
                   and key not in credits}
        assert not missing, (missing, credits)
        # the epochs counted are those the run stepped two past (the last ones wait)
        assert counted == set(range(min(counted), EPOCHS - 1)), counted
    finally:
        for node in nodes:
            node.shutdown()
