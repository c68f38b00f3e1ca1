"""A monitor's copies of the run's state: when, what is written, and a real
round trip (two trainers, a monitor's copy, a trainer started from it alone)."""

from __future__ import annotations

import concurrent.futures
import io
import time

import pytest
import torch

import p2pdl
from p2pdl import Optimizer
from p2pdl.errors import ConfigError
from p2pdl.monitor import BackupConfig, Backups, BackupSchedule
from p2pdl.monitor._backup import write_state
from p2pdl.training import latest_checkpoint, load_checkpoint

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
RUN = "backup-run"


def test_the_schedule_copies_every_n_epochs_and_waits_after_a_failure(tmp_path):
    schedule = BackupSchedule(BackupConfig(tmp_path, every=5, retry=30.0))
    assert schedule.due(0, 0.0) is None                  # nothing completed yet
    assert schedule.due(3, 0.0) == 3                     # the first completed epoch seen
    schedule.saved(3)
    assert schedule.due(7, 1.0) is None and schedule.due(8, 1.0) == 8
    schedule.failed(1.0)
    assert schedule.due(8, 30.0) is None and schedule.due(8, 31.0) == 8
    resumed = BackupSchedule(BackupConfig(tmp_path, every=5), last_epoch=10)   # a restart
    assert resumed.due(12, 0.0) is None and resumed.due(15, 0.0) == 15


@pytest.mark.parametrize("field, value", [("every", 0), ("keep", 0), ("timeout", 0),
                                          ("retry", float("nan")), ("every", True)])
def test_bad_settings_are_config_errors(tmp_path, field, value):
    with pytest.raises(ConfigError, match=field):
        BackupConfig(tmp_path, **{field: value})


def payload(state: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def test_only_a_p2pdl_state_of_the_offered_epoch_is_written(tmp_path):
    config = BackupConfig(tmp_path / "copies", keep=2)
    state = {"format": 1, "epoch": 4, "mode": "dedloc", "params": [torch.ones(3)],
             "optimizer": {"state": {}, "param_groups": []}, "scheduler": None, "diloco": None}
    for bad, epoch in ((b"not a torch file", 4), (payload({"format": 99, "epoch": 4}), 4),
                       (payload(state), 5), (payload([1, 2, 3]), 4)):
        with pytest.raises(ValueError):
            write_state(config, bad, epoch)
    assert latest_checkpoint(config.directory) is None
    for epoch in (4, 5, 6):
        write_state(config, payload({**state, "epoch": epoch}), epoch)
    loaded, epoch = load_checkpoint(config.directory)
    assert epoch == 6 and torch.equal(loaded["params"][0], torch.ones(3))
    assert sorted(p.name for p in config.directory.glob("*.json")) == \
        ["checkpoint-0000000005.json", "checkpoint-0000000006.json"]     # keep=2


def linear_opt(node: p2pdl.Node, model: torch.nn.Module, **options: object) -> Optimizer:
    return Optimizer(node=node, run_id=RUN, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     target_batch_size=64, batch_size_per_step=32, matchmaking_time=5.0,
                     **options)


def train_to(opt: Optimizer, model: torch.nn.Module, epochs: int, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    truth = torch.tensor([[2.0, -3.0, 0.5]])
    deadline = time.monotonic() + 90
    while opt.local_epoch < epochs:
        assert time.monotonic() < deadline, f"epoch {opt.local_epoch} of {epochs} in time"
        x = torch.randn(32, 3, generator=generator)
        torch.nn.functional.mse_loss(model(x), x @ truth.T).backward()
        opt.step()
        opt.zero_grad()


@pytest.mark.timeout(180)
def test_a_copy_taken_by_a_monitor_restarts_the_run_after_every_trainer_left(tmp_path):
    torch.manual_seed(0)
    models = [torch.nn.Linear(3, 1) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    nodes = [p2pdl.Node(listen=LOOPBACK)]
    try:
        nodes += [p2pdl.Node(listen=LOOPBACK, initial_peers=nodes[0].addrs[:1])
                  for _ in range(2)]
        for node in nodes[1:]:
            node.wait_for_peers(1)
        trainers, monitor = nodes[:2], nodes[2]
        opts = [linear_opt(n, m) for n, m in zip(trainers, models, strict=True)]
        try:
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                for future in [pool.submit(train_to, opts[i], models[i], 4, i) for i in range(2)]:
                    future.result(timeout=120)
            assert torch.equal(models[0].weight, models[1].weight)
            assert {o.local_epoch for o in opts} == {4}
            # The monitor copies the state both trainers offer at epoch 4.
            backups = Backups(monitor.trio_node, RUN, BackupConfig(tmp_path / "copies"))
            donors = [n.peer_id for n in trainers]
            saved = monitor.portal.run(lambda: backups.copy(4, donors), 60)
            assert saved == 4
            expected = [p.detach().clone() for p in models[0].parameters()]
        finally:
            for opt in opts:
                opt.close()
    finally:
        for node in nodes:
            node.shutdown()
    # Every trainer and the monitor are gone: a new trainer, alone, starts from the copy.
    model = torch.nn.Linear(3, 1)
    with p2pdl.Node(listen=LOOPBACK) as node:
        opt = linear_opt(node, model, resume_from=str(tmp_path / "copies"), discovery_time=0.0)
        try:
            assert opt.local_epoch == 4
            assert all(torch.equal(p, q) for p, q in zip(model.parameters(), expected,
                                                         strict=True))
            train_to(opt, model, 6, 7)            # and trains on from there
            assert opt.local_epoch == 6
        finally:
            opt.close()
    with p2pdl.Node(listen=LOOPBACK) as node:       # a directory with no copy: one clear error
        with pytest.raises(ConfigError, match="no intact checkpoint"):
            linear_opt(node, torch.nn.Linear(3, 1), resume_from=str(tmp_path / "empty"))


async def test_a_following_monitor_copies_the_state_every_n_completed_epochs(tmp_path):
    import functools

    import trio

    from p2pdl.monitor import CreditStore, follow_run
    from p2pdl.testing import open_memory_nodes, wait_for_dht, wait_until

    base = {"format": 1, "mode": "dedloc", "params": [torch.zeros(4)],
            "optimizer": {"state": {}, "param_groups": []}, "scheduler": None, "diloco": None}
    async with open_memory_nodes(3) as nodes:
        await wait_for_dht(nodes)
        a, b, monitor = nodes
        config = BackupConfig(tmp_path / "copies", every=2)
        backups = Backups(monitor, RUN, config)
        async with a.progress.track(RUN, 100) as ta, b.progress.track(RUN, 100) as tb, \
                trio.open_nursery() as nursery:
            await nursery.start(functools.partial(
                follow_run, monitor, RUN, CreditStore(":memory:"), target_batch_size=100,
                interval=0.05, backups=backups))
            for epoch in range(1, 6):
                state = payload({**base, "epoch": epoch, "params": [torch.full((4,), epoch)]})
                for node, tracker in ((a, ta), (b, tb)):
                    node.statesync.share(RUN, epoch, state)
                    tracker.update_epoch(epoch)
                await wait_until(lambda e=epoch: backups.last_epoch is not None
                                 and backups.last_epoch + config.every > e
                                 and not backups.busy, 30, step=0.05)
            nursery.cancel_scope.cancel()
    assert backups.failures == 0 and backups.saved == 3
    epochs = sorted(int(p.stem.split("-")[1]) for p in config.directory.glob("*.json"))
    assert epochs == [1, 3, 5]                   # the first seen, then every 2
    state, epoch = load_checkpoint(config.directory)
    assert epoch == 5 and torch.equal(state["params"][0], torch.full((4,), 5))
