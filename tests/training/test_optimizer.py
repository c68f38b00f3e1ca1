"""p2pdl.Optimizer: peers that train the example together end with the same parameters."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import torch
from libp2p.peer.id import ID

import p2pdl
from p2pdl.errors import ConfigError, NodeClosedError
from p2pdl.training import (
    DeDLOCStrategy,
    ExampleConfig,
    ExampleTask,
    Optimizer,
    OptimizerConfig,
    PendingRound,
)

from .fake_node import FakeNode, group
from .fake_node import averaged as fake_averaged
from .fake_node import progress as fake_progress
from .fake_node import report as fake_report

pytestmark = pytest.mark.timeout(180)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
#: A small version of the example so that a step costs milliseconds.
SMALL = ExampleConfig(context_length=32, d_model=32, n_layers=1, n_heads=2, batch_size=8)


@pytest.fixture(scope="module")
def task() -> ExampleTask:
    torch.set_num_threads(1)
    return ExampleTask(SMALL)


@contextlib.contextmanager
def swarm(count: int) -> Iterator[list[p2pdl.Node]]:
    nodes: list[p2pdl.Node] = []
    try:
        nodes.append(p2pdl.Node(listen=LOOPBACK))
        for _ in range(count - 1):
            nodes.append(p2pdl.Node(listen=LOOPBACK, initial_peers=nodes[0].addrs[:1]))
        for node in nodes[1:]:
            node.wait_for_peers(1)
        yield nodes
    finally:
        for node in nodes:
            node.shutdown()


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def train(opt: Optimizer, model: torch.nn.Module, batches: Iterator[torch.Tensor], *,
          epochs: int, seconds: float = 90.0,
          stop: Callable[[], bool] = lambda: False) -> list[float]:
    """Train until ``opt`` reaches ``epochs``; the losses of the steps that stepped."""
    losses = []
    deadline = time.monotonic() + seconds
    while opt.local_epoch < epochs and not stop():
        assert time.monotonic() < deadline, f"epoch {opt.local_epoch} of {epochs} in time"
        loss = model.loss(next(batches))
        loss.backward()
        if opt.step():
            losses.append(loss.item())
        opt.zero_grad()
    return losses


def in_threads(*calls: Callable[[], object]) -> list[object]:
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result(timeout=150) for f in futures]


def make_opt(node: p2pdl.Node, model: torch.nn.Module, run_id: str, target: int = 64,
             **options: object) -> Optimizer:
    return Optimizer(node=node, run_id=run_id,
                     optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                     target_batch_size=target, batch_size_per_step=SMALL.batch_size,
                     matchmaking_time=8.0, **options)


def test_three_peers_end_with_identical_parameters(task):
    models = [task.build_model() for _ in range(3)]
    start_loss = task.validation_loss(models[0])
    with swarm(3) as nodes:
        opts = [make_opt(n, m, "three") for n, m in zip(nodes, models, strict=True)]
        try:
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=6)
                         for i in range(3)))
            stats = [o.statistics() for o in opts]
        finally:
            for o in opts:
                o.close()
    assert all(torch.equal(flat(models[0]), flat(m)) for m in models[1:])
    # under load a peer may miss a round and download the state instead
    assert all(s["epoch"] >= 6 for s in stats) and sum(s["averaged"] for s in stats) >= 12, stats
    assert all(s["failed"] == 0 for s in stats), stats
    assert opts[0].last_round is not None and opts[0].last_round.group_size == 3
    assert task.validation_loss(models[0]) < start_loss - 0.3
    with pytest.raises(NodeClosedError):
        opts[0].step()


def test_delayed_updates_keep_peers_identical(task):
    models = [task.build_model() for _ in range(2)]
    with swarm(2) as nodes:
        opts = [make_opt(n, m, "delayed", delay_updates=True)
                for n, m in zip(nodes, models, strict=True)]
        try:
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=5)
                         for i in range(2)))
            # apply the last round everywhere before comparing
            for o in opts:
                o.close()
        finally:
            for o in opts:
                o.close()
    assert torch.equal(flat(models[0]), flat(models[1]))
    assert opts[0].statistics()["averaged"] >= 4


def test_diloco_converges_on_the_example(task):
    models = [task.build_model() for _ in range(2)]
    start_loss = task.validation_loss(models[0])
    with swarm(2) as nodes:
        opts = [make_opt(n, m, "diloco", target=160, mode="diloco") for n, m in
                zip(nodes, models, strict=True)]
        try:
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=4)
                         for i in range(2)))
        finally:
            for o in opts:
                o.close()
    assert torch.equal(flat(models[0]), flat(models[1]))
    assert opts[0].statistics()["averaged"] >= 3
    assert task.validation_loss(models[0]) < start_loss - 0.3
    # The shared state leaves out the inner optimizer's moments (each peer's own,
    # from its own batches), so peers that shared every outer step agree on it.
    keepers = [o.state_keeper for o in opts]
    assert keepers[0].epoch == keepers[1].epoch
    assert keepers[0].digest() == keepers[1].digest()
    assert keepers[0].full_state()["optimizer"] is None
    inner = [k.full_state(own=True)["optimizer"]["state"] for k in keepers]
    assert not torch.equal(inner[0][0]["exp_avg"], inner[1][0]["exp_avg"])
    assert opts[0].state_dict()["optimizer"]["state"]   # the user's state_dict keeps it


def test_delayed_diloco_overlaps_rounds_with_inner_steps_converges_and_stays_identical(task):
    """``delay_updates`` in DiLoCo mode: every outer round runs while the next
    inner steps compute; the anchors stay bit-identical, and once the last
    round is applied (``close``) so do the parameters."""
    models = [task.build_model() for _ in range(2)]
    start_loss = task.validation_loss(models[0])
    with swarm(2) as nodes:
        opts = [make_opt(n, m, "diloco-delayed", target=160, mode="diloco",
                         delay_updates=True) for n, m in zip(nodes, models, strict=True)]
        try:
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=5)
                         for i in range(2)))
            for o in opts:
                o.close()   # applies the last round
            stats = [o.statistics() for o in opts]
        finally:
            for o in opts:
                o.close()
    assert all(torch.equal(a, b) for a, b in zip(opts[0].strategy.anchor,
                                                 opts[1].strategy.anchor, strict=True))
    assert torch.equal(flat(models[0]), flat(models[1]))
    assert all(s["averaged"] >= 4 and s["failed"] == 0 for s in stats), stats
    assert task.validation_loss(models[0]) < start_loss - 0.3


def test_diloco_in_fragments_with_delayed_outer_steps_converges_and_keeps_anchors_identical(
        task):
    """``fragments=2`` with ``delay_updates``: each epoch's round carries half
    of the model, while the inner steps go on; the anchors stay bit-identical."""
    models = [task.build_model() for _ in range(2)]
    start_loss = task.validation_loss(models[0])
    with swarm(2) as nodes:
        opts = [make_opt(n, m, "diloco-fragments", target=96, mode="diloco",
                         delay_updates=True, fragments=2)
                for n, m in zip(nodes, models, strict=True)]
        try:
            sizes = [sum(opts[0].strategy._params[i].numel() for i in part)
                     for part in opts[0].strategy.fragments]
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=6)
                         for i in range(2)))
            for o in opts:
                o.close()
            stats = [o.statistics() for o in opts]
        finally:
            for o in opts:
                o.close()
    assert len(sizes) == 2 and max(sizes) < 0.75 * sum(sizes), sizes
    assert all(torch.equal(a, b) for a, b in zip(opts[0].strategy.anchor,
                                                 opts[1].strategy.anchor, strict=True))
    assert all(s["averaged"] >= 5 and s["failed"] == 0 for s in stats), stats
    assert task.validation_loss(models[0]) < start_loss - 0.3


@pytest.mark.parametrize("codec", ["uint4", "topk", "qtopk"])
def test_diloco_with_a_lossy_codec_and_error_feedback_converges_and_stays_identical(
        task, codec):
    """Outer deltas in 4 bits (about 8x fewer bytes than float32), or their
    largest 1/32 (topk), with error feedback on by default: the peers stay
    bit-identical and the loss falls."""
    models = [task.build_model() for _ in range(2)]
    start_loss = task.validation_loss(models[0])
    lossy = p2pdl.averaging.AllReduceConfig(codecs=p2pdl.averaging.CodecPolicy(large=codec,
                                                                     threshold=1024))
    with swarm(2) as nodes:
        opts = [make_opt(n, m, f"diloco-{codec}", target=160, mode="diloco", allreduce=lossy)
                for n, m in zip(nodes, models, strict=True)]
        try:
            assert all(o.rounds.feedback is not None for o in opts)
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=4)
                         for i in range(2)))
            residuals = [o.rounds.feedback.residual for o in opts]
        finally:
            for o in opts:
                o.close()
    assert torch.equal(flat(models[0]), flat(models[1]))
    assert opts[0].statistics()["averaged"] >= 3
    # (a peer's own part travels not at all: the other peer's rounding is there)
    assert all(r is not None for r in residuals)
    assert any(bool(e.any()) for r in residuals for e in r)
    assert task.validation_loss(models[0]) < start_loss - 0.3


def test_a_late_joiner_downloads_the_state_and_then_matches(task):
    models = [task.build_model() for _ in range(3)]
    with swarm(3) as nodes:
        opts = [make_opt(nodes[i], models[i], "late") for i in range(2)]
        try:
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=3)
                         for i in range(2)))
            late = make_opt(nodes[2], models[2], "late")
            opts.append(late)
            with torch.no_grad():   # a different start: only the download can fix it
                for p in models[2].parameters():
                    p.add_(1.0)
            target = 7
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=target)
                         for i in range(3)))
            assert late.statistics()["state_syncs"] >= 1
            assert late.local_epoch >= target
        finally:
            for o in opts:
                o.close()
    assert torch.equal(flat(models[0]), flat(models[2]))
    assert torch.equal(flat(models[0]), flat(models[1]))


def test_peers_that_drifted_apart_after_a_failed_round_agree_again(task):
    """After a failed round each peer compares its state's digest with the others'."""
    models = [task.build_model() for _ in range(2)]
    with swarm(2) as nodes:
        opts = [make_opt(n, m, "drift") for n, m in zip(nodes, models, strict=True)]
        try:
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=2)
                         for i in range(2)))
            with torch.no_grad():   # as if peer 1 had stepped alone in a failed round
                for p in models[1].parameters():
                    p.add_(0.01)
            opts[1].state_keeper.share(force=True)
            for opt in opts:
                opt.state_keeper.mark_suspect()
            in_threads(*(lambda i=i: train(opts[i], models[i], task.batches(i), epochs=4)
                         for i in range(2)))
            stats = [o.statistics() for o in opts]
        finally:
            for o in opts:
                o.close()
    assert torch.equal(flat(models[0]), flat(models[1])), stats
    assert sum(s["repairs"] for s in stats) == 1, stats
    assert sum(s["consistency_checks"] for s in stats) >= 1, stats


def test_checkpoint_and_resume_round_trip(task, tmp_path):
    model = task.build_model()
    scheduler_factory = lambda opt: torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)  # noqa: E731
    with swarm(1) as (node,):
        opt = make_opt(node, model, "ckpt", target=16, checkpoint_dir=tmp_path,
                       checkpoint_every=2, scheduler=scheduler_factory, discovery_time=0)
        try:
            train(opt, model, task.batches(0), epochs=4)
            assert opt.statistics()["alone"] == 4 and opt.statistics()["checkpoints"] == 2
            lr = opt.optimizer.param_groups[0]["lr"]
            saved = flat(model).clone()
            state = opt.optimizer.state_dict()
        finally:
            opt.close()
        assert sorted(p.name for p in tmp_path.glob("*.pt")) == [
            "checkpoint-0000000002.pt", "checkpoint-0000000004.pt"]
        fresh = task.build_model()
        resumed = make_opt(node, fresh, "ckpt", target=16, checkpoint_dir=tmp_path,
                           scheduler=scheduler_factory, discovery_time=0)
        try:
            assert resumed.local_epoch == 4
            assert torch.equal(flat(fresh), saved)
            assert resumed.optimizer.param_groups[0]["lr"] == lr == 3e-3 * 0.25
            step = resumed.optimizer.state_dict()["state"][0]["step"]
            assert torch.equal(step, state["state"][0]["step"])
            assert resumed.state_dict()["epoch"] == 4
            train(resumed, fresh, task.batches(0), epochs=5)
        finally:
            resumed.close()


def test_a_plain_torch_model_learns_a_linear_map():
    torch.manual_seed(0)
    truth = torch.tensor([[2.0, -3.0, 0.5]])
    models = [torch.nn.Linear(3, 1) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    with swarm(2) as nodes:
        opts = [Optimizer(node=n, run_id="linear", optimizer=torch.optim.SGD(m.parameters(),
                                                                              lr=0.1),
                          target_batch_size=128, batch_size_per_step=32, matchmaking_time=8.0)
                for n, m in zip(nodes, models, strict=True)]

        def loop(i: int) -> None:
            generator = torch.Generator().manual_seed(i)
            deadline = time.monotonic() + 90
            while opts[i].local_epoch < 40:
                assert time.monotonic() < deadline
                x = torch.randn(32, 3, generator=generator)
                loss = torch.nn.functional.mse_loss(models[i](x), x @ truth.T + 1.0)
                loss.backward()
                opts[i].step()
                opts[i].zero_grad()
        try:
            in_threads(lambda: loop(0), lambda: loop(1))
        finally:
            for o in opts:
                o.close()
    assert torch.equal(models[0].weight, models[1].weight), [o.statistics() for o in opts]
    assert torch.allclose(models[0].weight, truth, atol=0.05)
    assert torch.allclose(models[0].bias, torch.tensor([1.0]), atol=0.05)


KILLED_PEER = textwrap.dedent("""
    import sys, torch, p2pdl
    from p2pdl.training import ExampleConfig, ExampleTask, Optimizer
    torch.set_num_threads(1)
    task = ExampleTask(ExampleConfig(context_length=32, d_model=32, n_layers=1, n_heads=2,
                                     batch_size=8))
    model = task.build_model()
    node = p2pdl.Node(listen=["/ip4/127.0.0.1/tcp/0"], initial_peers=[sys.argv[1]])
    opt = Optimizer(node=node, run_id="kill", optimizer=torch.optim.AdamW(model.parameters(),
                    lr=3e-3), target_batch_size=64, batch_size_per_step=8, matchmaking_time=8.0)
    batches = task.batches(2)
    while True:
        model.loss(next(batches)).backward()
        if opt.step():
            print("epoch", opt.local_epoch, flush=True)
        opt.zero_grad()
""")


@pytest.mark.slow
def test_the_others_continue_when_a_peer_is_killed(task):
    models = [task.build_model() for _ in range(2)]
    with swarm(2) as nodes:
        child = subprocess.Popen([sys.executable, "-c", KILLED_PEER, nodes[0].addrs[0]],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                 env={**os.environ, "PYTHONUNBUFFERED": "1"})
        opts = [make_opt(n, m, "kill") for n, m in zip(nodes, models, strict=True)]
        try:
            killed_at: list[int] = []

            def killer() -> None:
                assert child.stdout is not None
                for line in child.stdout:
                    if line.startswith("epoch") and int(line.split()[1]) >= 2:
                        break
                child.send_signal(signal.SIGKILL)
                child.wait(10)
                killed_at.append(opts[0].local_epoch)

            def trainer(i: int) -> None:
                train(opts[i], models[i], task.batches(i), epochs=60, seconds=120,
                      stop=lambda: bool(killed_at) and opts[i].local_epoch >= killed_at[0] + 4)

            in_threads(killer, lambda: trainer(0), lambda: trainer(1))
            rounds = [o.last_round for o in opts]
        finally:
            child.kill()
            child.wait(10)
            for o in opts:
                o.close()
    assert all(r is not None and r.outcome == "averaged" and r.group_size == 2 for r in rounds)
    assert torch.equal(flat(models[0]), flat(models[1]))


def test_bad_arguments_are_config_errors(task):
    model = task.build_model()
    with pytest.raises(ConfigError, match="mode"):
        OptimizerConfig(mode="sgd")
    with pytest.raises(ConfigError, match="fragments applies to mode='diloco'"):
        OptimizerConfig(fragments=2)
    with pytest.raises(ConfigError, match="fragments"):
        OptimizerConfig(mode="diloco", fragments=0)
    with pytest.raises(ConfigError, match="node"):
        Optimizer(node=object(), run_id="x", optimizer=torch.optim.SGD(model.parameters(), 0.1),
                  target_batch_size=8)
    with swarm(1) as (node,):
        with pytest.raises(ConfigError, match="unknown Optimizer option"):
            make_opt(node, model, "bad", target=8, learning_rate=1)
        with pytest.raises(ConfigError, match="target_batch_size"):
            make_opt(node, model, "bad", target=0)
        with pytest.raises(ConfigError, match="torch.optim.Optimizer"):
            Optimizer(node=node, run_id="bad", optimizer=object(), target_batch_size=8)
        with make_opt(node, model, "bad", target=8) as opt:
            with pytest.raises(ConfigError, match="batch_size"):
                opt.step(batch_size=-1)


def test_diloco_outer_step_is_nesterov_momentum_on_the_mean_delta(task):
    """The outer update, by hand: m = mu m + d; x = anchor - lr (d + mu m)."""
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    with swarm(1) as (node,):
        with Optimizer(node=node, run_id="outer", optimizer=torch.optim.SGD(model.parameters(),
                                                                            lr=0.5),
                       target_batch_size=1, batch_size_per_step=1, mode="diloco",
                       outer_lr=0.7, outer_momentum=0.9, discovery_time=0) as opt:
            anchor = torch.tensor([[1.0, 2.0]])
            momentum = torch.zeros(1, 2)
            for _ in range(3):
                model.weight.grad = torch.tensor([[1.0, -1.0]])
                assert opt.step()      # alone: the inner step, then the outer step at once
                delta = anchor - (anchor - 0.5 * torch.tensor([[1.0, -1.0]]))
                momentum = 0.9 * momentum + delta
                anchor = anchor - 0.7 * (delta + 0.9 * momentum)
                assert torch.allclose(model.weight, anchor)
                opt.zero_grad()


def test_a_delayed_result_applied_in_a_step_keeps_that_steps_gradients():
    """The background round's result replaces p.grad: the batch's own gradients
    must be in the accumulator first."""
    model = torch.nn.Linear(4, 1, bias=False)
    with swarm(1) as (node,):
        with Optimizer(node=node, run_id="dpu", optimizer=torch.optim.SGD(model.parameters(),
                                                                          lr=0.1),
                       target_batch_size=1000, delay_updates=True) as opt:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(SimpleNamespace(completed=True, tensors=[torch.full((1, 4), 2.0)],
                                            group=group(2), excluded=()))
            grouped = threading.Event()
            grouped.set()
            opt.rounds.pending = PendingRound(done, 0, [torch.zeros(1, 4)], 5, time.monotonic(),
                                              grouped)
            assert isinstance(opt.strategy, DeDLOCStrategy)
            before = model.weight.detach().clone()
            model.weight.grad = torch.ones(1, 4)
            assert opt.step(batch_size=1)          # the round's average was applied
            assert torch.allclose(model.weight, before - 0.1 * 2.0)
            assert torch.equal(opt.strategy.accumulators[0], torch.ones(1, 4))
            assert opt.samples_accumulated == 1 and opt.last_round.outcome == "averaged"


def test_an_auxiliary_peer_helps_and_follows_the_trainers_epoch(task):
    models = [task.build_model() for _ in range(3)]
    with swarm(3) as nodes:
        # epochs of a few seconds: an auxiliary peer learns of readiness from the
        # trainers' reports and estimates, a moment after they do
        opts = [make_opt(nodes[i], models[i], "aux", target=320) for i in range(2)]
        helper = make_opt(nodes[2], models[2], "aux", target=320, auxiliary=True,
                          ready_timeout=5.0)
        done = []

        def assist() -> None:
            deadline = time.monotonic() + 120
            while not done and time.monotonic() < deadline:
                helper.step()

        def trainer(i: int) -> None:
            # epochs enough for the helper to hear of the run and join: its first
            # view of the trainers' progress may come after their first epochs
            train(opts[i], models[i], task.batches(i), epochs=8)

        try:
            with concurrent.futures.ThreadPoolExecutor(3) as pool:
                aux = pool.submit(assist)
                in_threads(lambda: trainer(0), lambda: trainer(1))
                done.append(True)
                aux.result(timeout=60)
            stats = [o.statistics() for o in opts]
            aux_stats = helper.statistics()
        finally:
            for o in [*opts, helper]:
                o.close()
    assert torch.equal(flat(models[0]), flat(models[1]))
    assert all(s["averaged"] >= 3 for s in stats), stats
    assert aux_stats["averaged"] >= 2, aux_stats
    assert helper.local_epoch <= opts[0].local_epoch   # it never runs ahead
    assert opts[0].last_round is not None and opts[0].last_round.group_size == 3
    with pytest.raises(ConfigError):
        OptimizerConfig(auxiliary="yes")


# -- the facade on a fake node (no network) -----------------------------------------------


def offline(node: FakeNode, **options: object) -> tuple[Optimizer, torch.nn.Linear]:
    model = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 2.0]]))
    opt = Optimizer(node=node, run_id="offline", optimizer=torch.optim.SGD(model.parameters(),
                                                                           lr=0.5),
                    target_batch_size=8, batch_size_per_step=4, **options)
    return opt, model


def failed_round() -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_exception(p2pdl.MatchmakingFailedError("no group"))
    return future


@pytest.mark.parametrize("on_failure", ["local", "skip"])
def test_a_failed_round_applies_on_failure_and_holds_the_next_round_for_the_check(on_failure):
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=True)]
    node.allreduce.futures.append(failed_round())
    opt, model = offline(node, on_failure=on_failure)
    model.weight.grad = torch.tensor([[1.0, -1.0]])
    assert opt.step() is (on_failure == "local")
    expected = [[0.5, 2.5]] if on_failure == "local" else [[1.0, 2.0]]
    assert torch.allclose(model.weight, torch.tensor(expected))
    assert opt.local_epoch == 1 and opt.last_round.outcome == "failed"   # advances either way
    assert opt.state_keeper.suspect and node.tracker.epochs[-1] == 1
    model.weight.grad = torch.tensor([[1.0, -1.0]])
    assert not opt.step()   # the check found no offers: no round until it is done
    assert len(node.allreduce.calls) == 1 and opt.state_keeper.suspect
    opt.close()


def test_a_failed_round_after_which_the_swarm_moved_on_takes_its_state_not_a_local_step():
    """The others formed the epoch's group without this peer and stepped: no local step
    (it would drift apart); it catches up instead (here: no state sync, so it adopts)."""
    node = FakeNode()
    # before the batch, after reporting it, and after the failed round: the others at 1
    node.tracker.view = [fake_progress(0, ready=True), fake_progress(0, ready=True),
                         fake_progress(1)]
    node.allreduce.futures.append(failed_round())
    opt, model = offline(node, state_sync=False)
    model.weight.grad = torch.tensor([[1.0, -1.0]])
    assert opt.step() is False
    assert torch.equal(model.weight, torch.tensor([[1.0, 2.0]]))   # no local step
    assert opt.local_epoch == 1 and opt.samples_accumulated == 0
    assert opt.last_round.outcome == "failed" and not opt.state_keeper.suspect
    assert node.tracker.epochs[-1] == 1
    opt.close()


def done_round(members: int) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(SimpleNamespace(completed=True, tensors=None, parts=[],
                                      group=group(members), excluded=()))
    return future


@pytest.mark.parametrize("seen, group_size, expected", [
    ((b"a", b"b"), 3, 0),     # everyone seen at the epoch was in the group
    ((b"a", b"b", b"c"), 3, 4),   # c averaged elsewhere: compare once its offer is in
], ids=["whole", "split"])
def test_a_group_that_left_out_peers_seen_at_the_epoch_makes_the_peer_compare_states(
        seen, group_size, expected):
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=True)]
    node.tracker.reports = [fake_report(p, 0) for p in seen]
    opt, model = offline(node)
    future = done_round(group_size)
    model.weight.grad = torch.tensor([[1.0, -1.0]])

    def averaged_in_place(*args, **kwargs):
        result = future.result()
        result.tensors = kwargs.get("tensors") or args[2]
        return future

    node.allreduce.start_round = lambda run_id, epoch, tensors, **kw: averaged_in_place(
        run_id, epoch, tensors)
    assert opt.step()
    keeper = opt.state_keeper
    assert keeper.suspect is bool(expected) and keeper._expected == expected
    if expected:
        # offers from two of the four: it waits for the others (SPLIT_CHECKS tries) ...
        digest = keeper.digest()
        node.statesync.offered = {p: (1, digest) for p in (ID(b"a"), ID(b"b"))}
        node.tracker.reports = [fake_report(p, 1) for p in seen]
        assert not keeper.check_consistency(node.tracker)
        assert keeper.suspect and keeper.statistics()["consistency_checks"] == 0
        # ... and compares once every one is in
        node.statesync.offered[ID(b"c")] = (1, digest)
        assert not keeper.check_consistency(node.tracker)   # they agree with it
        assert not keeper.suspect and keeper.statistics()["consistency_checks"] == 1
    opt.close()


def step_one_complete_round(node, future):
    """An optimizer on ``node`` whose one step averages in ``future``'s round (the
    values come back as sent): the opt, after that step."""
    node.tracker.view = [fake_progress(0, ready=True)]
    opt, model = offline(node)

    def averaged_in_place(run_id, epoch, tensors, **kw):
        future.result().tensors = tensors
        return future

    node.allreduce.start_round = averaged_in_place
    model.weight.grad = torch.tensor([[1.0, -1.0]])
    assert opt.step() and opt.last_round.outcome == "averaged"
    return opt


@pytest.mark.parametrize("gone", [False, True])
def test_a_member_gone_after_a_complete_round_makes_the_peer_compare_states(gone):
    """It may have died while sending its part's results: some members got them, others
    did not.  This one got every part; it checks anyway."""
    node = FakeNode()
    future = done_round(3)
    members = [m.peer_id for m in future.result().group.members]
    node.connected_peers = lambda: members[1:] if gone else members
    opt = step_one_complete_round(node, future)
    assert opt.state_keeper.suspect is gone
    opt.close()


def test_the_report_of_the_next_epoch_names_the_round_s_contributors():
    """The report that announces the next epoch says how the round ended and whose
    values this peer's part took (a monitor credits those it names); the excluded
    member is not named."""
    node = FakeNode()
    future = done_round(3)
    future.result().excluded = (2,)
    opt = step_one_complete_round(node, future)
    members = [m.peer_id.to_base58() for m in future.result().group.members]
    assert node.tracker.epochs[-1] == 1
    assert node.tracker.rounds[-1] == (0, "averaged", 3, tuple(members[:2]))
    opt.close()


@pytest.mark.parametrize("disputed", [(), (1,)])
def test_a_part_another_member_lacks_makes_the_peer_compare_states(disputed):
    """After the round a member said it lacks part 1, whose reducer is alive
    (the all-reduce's post-round exchange): this peer got it, so the two hold
    different states; it checks before its next round."""
    node = FakeNode()
    future = done_round(3)
    future.result().disputed = disputed
    opt = step_one_complete_round(node, future)
    assert opt.state_keeper.suspect is bool(disputed)
    opt.close()


def test_statistics_name_every_counter():
    opt, _ = offline(FakeNode())
    assert list(opt.statistics()) == [
        "epoch", "local_steps", "samples_accumulated", "stale_batches", "rounds", "averaged",
        "partial", "alone",
        "failed", "state_syncs", "state_sync_failures", "checkpoints", "shared",
        "consistency_checks", "repairs", "unconfirmed_syncs", "merges"]
    opt.close()


def test_a_delayed_round_is_announced_once_its_group_formed_and_applied_a_step_late():
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=True)]
    opt, model = offline(node, delay_updates=True)
    model.weight.grad = torch.tensor([[1.0, 1.0]])
    assert not opt.step()   # the round runs in the background
    assert opt.local_epoch == 1 and opt.samples_accumulated == 0 and opt.rounds.matching()
    model.weight.grad = torch.tensor([[1.0, 1.0]])
    assert not opt.step()
    assert node.tracker.reported == [(4, 0)]   # epoch 1 not announced while matching
    call = node.allreduce.calls[0]
    assert call["epoch"] == 0 and call["weight"] == 4.0
    call["on_group"](object())
    opt.rounds.pending.future.set_result(SimpleNamespace(
        completed=True, tensors=[torch.tensor([[2.0, 2.0]])],
        group=group(2), excluded=()))
    node.tracker.view = [fake_progress(1)]
    model.weight.grad = torch.tensor([[1.0, 1.0]])
    assert opt.step()
    assert torch.allclose(model.weight, torch.tensor([[0.0, 1.0]]))
    assert opt.last_round.outcome == "averaged" and node.tracker.reported[-1] == (8, 1)
    opt.close()


def test_a_delayed_diloco_round_runs_while_inner_steps_go_on_and_its_outer_step_keeps_them():
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=True)]
    opt, model = offline(node, delay_updates=True, mode="diloco", outer_lr=1.0,
                         outer_momentum=0.0)
    model.weight.grad = torch.tensor([[1.0, 1.0]])
    assert not opt.step()   # inner step to [0.5, 1.5]; the round runs in the background
    assert opt.local_epoch == 1 and opt.rounds.matching()
    assert torch.allclose(model.weight, torch.tensor([[0.5, 1.5]]))   # not back to the anchor
    call = node.allreduce.calls[0]
    assert torch.allclose(call["tensors"][0], torch.tensor([[0.5, 0.5]]))
    model.weight.grad = torch.tensor([[1.0, 1.0]])
    assert not opt.step()   # another inner step meanwhile: [0.0, 1.0]
    call["on_group"](object())
    opt.rounds.pending.future.set_result(SimpleNamespace(
        completed=True, tensors=[torch.tensor([[0.25, 0.75]])],
        group=group(2), excluded=()))
    node.tracker.view = [fake_progress(1)]
    model.weight.grad = torch.tensor([[1.0, 1.0]])
    assert opt.step()   # inner step to [-0.5, 0.5], then the outer step
    anchor = torch.tensor([[0.75, 1.25]])
    assert torch.allclose(opt.strategy.anchor[0], anchor)
    # the two inner steps since the delta was taken, carried over to the anchor
    assert torch.allclose(model.weight, anchor - 1.0)
    shared = opt.state_keeper.full_state()["params"][0]
    assert torch.equal(shared, opt.strategy.anchor[0])
    opt.close()


def test_a_peer_behind_without_state_sync_adopts_the_epoch():
    node = FakeNode()
    node.tracker.view = [fake_progress(5)]
    opt, model = offline(node, state_sync=False)
    model.weight.grad = torch.tensor([[1.0, 1.0]])
    assert not opt.step()
    assert opt.local_epoch == 5 and opt.samples_accumulated == 4 and node.tracker.epochs == [5]
    opt.close()


def test_close_stops_sharing_and_tracking():
    node = FakeNode()
    opt, _ = offline(node)
    opt.close()
    opt.close()
    assert node.statesync.unshared == ["offline"] and node.tracker.closed
    with pytest.raises(NodeClosedError):
        opt.step()


def test_the_weight_a_round_sends_is_the_count_just_reported_and_published():
    node = FakeNode()
    published: list[tuple[tuple[int, int | None], int]] = []
    node.tracker.publish_now = lambda: published.append(   # type: ignore[attr-defined]
        (node.tracker.reported[-1], len(node.allreduce.calls)))
    node.tracker.view = [fake_progress(0, ready=False), fake_progress(0, ready=False),
                         fake_progress(0, ready=True)]
    opt, model = offline(node)
    for batch in (3, 5):   # batch sizes passed to step() add up to the weight
        model.weight.grad = torch.tensor([[1.0, 1.0]])
        opt.step(batch_size=batch)
    (call,) = node.allreduce.calls
    assert call["weight"] == 8.0 and call["epoch"] == 0
    assert published == [((8, 0), 0)]   # the report of 8 samples, before the round
    opt.close()


def test_clip_sent_norm_bounds_what_a_round_sends():
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=True)] * 3
    opt, model = offline(node, clip_sent_norm=1.0)
    model.weight.grad = torch.tensor([[30.0, 40.0]])   # norm 50
    opt.step(batch_size=2)
    (call,) = node.allreduce.calls
    (sent,) = call["tensors"]
    assert torch.allclose(sent, torch.tensor([[0.6, 0.8]]), atol=1e-6)
    opt.close()
    with pytest.raises(ConfigError):
        OptimizerConfig(clip_sent_norm=0.0)


def test_sent_momentum_is_refused_where_it_has_no_meaning():
    for bad in (1.0, -0.1, "0.5"):
        with pytest.raises(ConfigError):
            OptimizerConfig(sent_momentum=bad)
    with pytest.raises(ConfigError):
        OptimizerConfig(sent_momentum=0.9, mode="diloco")


def test_a_batch_computed_before_a_state_download_is_dropped():
    """Catching up replaced the parameters this batch's gradients were computed on: the
    batch is not averaged (it would pull the swarm's state back), only counted."""
    source_opt, source_model = offline(FakeNode())
    with torch.no_grad():
        source_model.weight.copy_(torch.tensor([[5.0, 6.0]]))
    source_opt.state_keeper.epoch = 3
    payload = source_opt.state_keeper.serialized()
    source_opt.close()
    node = FakeNode()
    node.tracker.view = [fake_progress(3)]
    node.tracker.reports = [fake_report(b"donor-a", 3)]
    node.statesync.payloads.append((3, payload))
    opt, model = offline(node)
    model.weight.grad = torch.tensor([[1.0, -1.0]])   # computed on the old parameters
    assert opt.step() is False
    assert opt.local_epoch == 3 and torch.equal(model.weight, torch.tensor([[5.0, 6.0]]))
    assert opt.samples_accumulated == 0 and node.tracker.reported == []
    assert opt.statistics()["stale_batches"] == 1 and opt.statistics()["state_syncs"] == 1
    model.weight.grad = torch.tensor([[1.0, -1.0]])   # the next batch counts
    opt.step()
    assert opt.samples_accumulated == 4 and opt.statistics()["stale_batches"] == 1
    opt.close()


def test_it_is_a_torch_optimizer_sharing_the_wrapped_ones_groups_and_state():
    """Training code that wants a torch.optim.Optimizer takes it: LR schedulers
    set the wrapped optimizer's lr, step hooks run, a closure is evaluated,
    and new parameter groups are refused."""
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=False)]   # no round: batches are counted
    opt, model = offline(node)
    inner = opt.optimizer
    assert isinstance(opt, torch.optim.Optimizer)
    assert opt.param_groups is inner.param_groups and opt.state is inner.state
    assert opt.defaults is inner.defaults and "p2pdl.Optimizer(" in repr(opt)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    assert inner.param_groups[0]["initial_lr"] == 0.5
    calls: list[str] = []
    pre = opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    post = opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))

    def closure() -> torch.Tensor:
        assert torch.is_grad_enabled()
        calls.append("closure")
        opt.zero_grad()
        loss = model(torch.tensor([[1.0, 1.0]])).sum()
        loss.backward()
        return loss

    with torch.no_grad():   # the closure gets its gradients all the same
        assert not opt.step(closure)
    assert calls == ["pre", "closure", "post"]
    assert torch.equal(model.weight.grad, torch.tensor([[1.0, 1.0]]))
    assert opt.samples_accumulated == 4
    scheduler.step()   # after a step: no warning, and the wrapped optimizer's lr
    assert inner.param_groups[0]["lr"] == 0.25
    pre.remove()
    post.remove()
    # GradScaler takes it: the gradients are unscaled before the batch is counted.
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    opt.zero_grad()
    scaler.scale(model(torch.tensor([[1.0, 1.0]])).sum()).backward()
    assert torch.equal(model.weight.grad, torch.tensor([[4.0, 4.0]]))
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight.grad, torch.tensor([[1.0, 1.0]]))
    assert opt.samples_accumulated == 8
    # The state-dict hooks run around state_dict and load_state_dict.
    seen: list[str] = []
    opt.register_state_dict_pre_hook(lambda o: seen.append("save-pre"))
    opt.register_state_dict_post_hook(lambda o, sd: {**sd, "mine": 1})
    opt.register_load_state_dict_pre_hook(
        lambda o, sd: seen.append("load-pre:" + str(sd.pop("mine"))) or sd)
    opt.register_load_state_dict_post_hook(lambda o: seen.append("load-post"))
    saved = opt.state_dict()
    assert saved["mine"] == 1
    opt.load_state_dict(saved)
    assert seen == ["save-pre", "load-pre:1", "load-post"] and "mine" in saved
    with pytest.raises(ConfigError, match="closure must be callable"):
        opt.step(4)   # a batch size is passed by name
    with pytest.raises(ConfigError, match="cannot take new parameters"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(1))]})
    opt.close()


def test_a_models_buffers_are_averaged_at_each_global_step_and_joiners_get_them():
    """With ``model=``, BatchNorm's running statistics (and its integer batch
    count) are averaged with the round: the peers end with identical buffers,
    though each saw other data; the state a joiner downloads carries them."""
    torch.manual_seed(0)

    def bn_model() -> torch.nn.Module:
        torch.manual_seed(1)
        return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4),
                                   torch.nn.Linear(4, 1))

    models = [bn_model() for _ in range(2)]
    with swarm(3) as nodes:   # the third joins later
        opts = [Optimizer(node=n, run_id="buffers", optimizer=torch.optim.SGD(m.parameters(),
                                                                               lr=0.05),
                          target_batch_size=64, batch_size_per_step=16, matchmaking_time=8.0,
                          model=m)
                for n, m in zip(nodes[:2], models, strict=True)]

        def loop(i: int) -> None:
            generator = torch.Generator().manual_seed(i)
            deadline = time.monotonic() + 90
            while opts[i].local_epoch < 4:
                assert time.monotonic() < deadline
                x = torch.randn(16, 3, generator=generator) * (1 + 4 * i) + 3 * i
                loss = models[i](x).pow(2).mean()
                loss.backward()
                opts[i].step()
                opts[i].zero_grad()
        try:
            in_threads(lambda: loop(0), lambda: loop(1))
            stats = [o.statistics() for o in opts]
            bn = [m[1] for m in models]
            assert stats[0]["averaged"] >= 1, stats
            assert torch.equal(bn[0].running_mean, bn[1].running_mean), \
                (stats, [o.round_history() for o in opts])
            assert torch.equal(bn[0].running_var, bn[1].running_var)
            assert torch.equal(bn[0].num_batches_tracked, bn[1].num_batches_tracked)
            assert torch.equal(flat(models[0]), flat(models[1]))
            # a joiner with fresh buffers downloads the swarm's
            joiner_model = bn_model()
            joiner = Optimizer(node=nodes[2], run_id="buffers",
                               optimizer=torch.optim.SGD(joiner_model.parameters(), lr=0.05),
                               target_batch_size=64, batch_size_per_step=16,
                               model=joiner_model)
            try:
                deadline = time.monotonic() + 40   # once it has heard the donors' progress
                while not joiner.sync_state(min_epoch=opts[1].local_epoch, timeout=5):
                    assert time.monotonic() < deadline, joiner.statistics()
                    time.sleep(0.5)
                assert torch.equal(joiner_model[1].running_mean, bn[1].running_mean)
                assert torch.equal(joiner_model[1].num_batches_tracked,
                                   bn[1].num_batches_tracked)
            finally:
                joiner.close()
            # a state without the buffers does not fit a model with them, and back
            state = opts[0].state_dict()
            assert len(state["buffers"]) == 3
            # only persistent buffers train (a mask derived from the configuration does not)
            from p2pdl.training._optimizer import persistent_buffers
            masked = bn_model()
            masked.register_buffer("mask", torch.ones(3), persistent=False)
            assert [b.shape for b in persistent_buffers(masked)] == \
                [torch.Size([4]), torch.Size([4]), torch.Size([])]
            plain = Optimizer(node=nodes[0], run_id="buffers-plain",
                              optimizer=torch.optim.SGD(bn_model().parameters(), lr=0.05),
                              target_batch_size=64, batch_size_per_step=16)
            try:
                with pytest.raises(ConfigError, match="buffers"):
                    plain.load_state_dict(state)
            finally:
                plain.close()
        finally:
            for o in opts:
                o.close()


@pytest.mark.parametrize("complete", [True, False])
def test_buffers_take_a_rounds_averages_only_when_it_completed(complete):
    """A complete round sets the buffers to its averages (an integer one
    rounded); a partial one zeroes what did not complete, which is no
    buffer value: each peer keeps its own buffers then."""
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=True)]
    model = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    model.register_buffer("stat", torch.tensor([1.0, 3.0]))
    model.register_buffer("count", torch.tensor(4))
    back = [torch.tensor([[0.5, 0.5]]), torch.tensor([2.0, 0.0]), torch.tensor(6.6)]
    parts = [SimpleNamespace(completed=True, start=0, end=3),
             SimpleNamespace(completed=complete, start=3, end=5)]
    done: concurrent.futures.Future = concurrent.futures.Future()
    done.set_result(SimpleNamespace(completed=complete, tensors=back, parts=parts,
                                    group=group(2), excluded=()))
    node.allreduce.futures.append(done)
    opt = Optimizer(node=node, run_id="offline", target_batch_size=4, batch_size_per_step=4,
                    optimizer=torch.optim.SGD(model.parameters(), lr=1.0), model=model)
    model.weight.grad = torch.ones(1, 2)
    assert opt.step()
    (call,) = node.allreduce.calls
    assert [t.tolist() for t in call["tensors"][1:]] == [[1.0, 3.0], 4.0]   # values, float32
    if complete:
        assert model.stat.tolist() == [2.0, 0.0] and model.count.item() == 7
    else:
        assert model.stat.tolist() == [1.0, 3.0] and model.count.item() == 4
    assert torch.allclose(model.weight, torch.tensor([[-0.5, -0.5]]))   # the update either way
    opt.close()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_precision_peers_stay_identical_and_an_overflowed_batch_counts_nothing(
        task, dtype):
    """autocast (bf16 and fp16 on the CPU) with a GradScaler: the scaler
    unscales the gradients before ``step`` counts them; a batch whose
    gradients overflowed is skipped by the scaler, so the peer contributes
    nothing of it, and both peers still step together and end identical."""
    models = [task.build_model() for _ in range(2)]
    steps = [0, 0]
    scalers = [torch.amp.GradScaler("cpu", init_scale=2.0**12) for _ in range(2)]

    def run(i: int, opt: Optimizer) -> None:
        batches = task.batches(i)
        deadline = time.monotonic() + 90
        while opt.local_epoch < 4:
            assert time.monotonic() < deadline, f"epoch {opt.local_epoch} of 4 in time"
            with torch.autocast("cpu", dtype=dtype):
                loss = models[i].loss(next(batches))
            if i == 0 and steps[0] == 1:
                loss = loss * float("inf")   # this batch's gradients overflow
            scalers[i].scale(loss).backward()
            scalers[i].step(opt)
            scalers[i].update()
            opt.zero_grad()
            steps[i] += 1

    with swarm(2) as nodes:
        opts = [make_opt(n, m, f"amp-{dtype}", target=32)
                for n, m in zip(nodes, models, strict=True)]
        try:
            in_threads(*(lambda i=i: run(i, opts[i]) for i in range(2)))
            stats = [o.statistics() for o in opts]
        finally:
            for o in opts:
                o.close()
    assert stats[0]["local_steps"] == steps[0] - 1   # the overflowed batch was never counted
    assert stats[1]["local_steps"] == steps[1]
    assert scalers[0].get_scale() < 2.0**12 <= scalers[1].get_scale()   # peer 0 overflowed
    assert all(torch.isfinite(p).all() for m in models for p in m.parameters())
    assert all(s["averaged"] >= 1 for s in stats), stats
    if all(s["averaged"] == s["rounds"] == s["epoch"] for s in stats):
        assert torch.equal(flat(models[0]), flat(models[1])), stats


def _slow_round(node: FakeNode, delay: float) -> None:
    """The next round ends ``delay`` seconds after it starts, averaging two members."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    node.allreduce.futures.append(future)

    def finish() -> None:
        time.sleep(delay)
        future.set_result(fake_averaged([torch.tensor([[0.5, 0.5]])], members=2))

    threading.Thread(target=finish, daemon=True).start()


@pytest.mark.parametrize("library", ["asyncio", "trio"])
def test_astep_steps_from_an_event_loop_without_blocking_it(library):
    """``await opt.astep()`` from asyncio and trio: the round runs in a worker
    thread while the loop's other tasks go on."""
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=True)]
    opt, model = offline(node)
    ticks = []

    def backward() -> None:
        model.zero_grad()
        model(torch.tensor([[1.0, 1.0]])).sum().backward()

    async def asyncio_main() -> bool:
        import asyncio

        async def ticker() -> None:
            while True:
                ticks.append(time.monotonic())
                await asyncio.sleep(0.02)

        task = asyncio.create_task(ticker())
        backward()
        _slow_round(node, 0.4)
        stepped = await opt.astep(batch_size=4)
        task.cancel()
        return stepped

    async def trio_main() -> bool:
        import trio

        result = []
        async with trio.open_nursery() as nursery:
            async def ticker() -> None:
                while True:
                    ticks.append(time.monotonic())
                    await trio.sleep(0.02)

            nursery.start_soon(ticker)
            backward()
            _slow_round(node, 0.4)
            result.append(await opt.astep(batch_size=4))
            nursery.cancel_scope.cancel()
        return result[0]

    try:
        if library == "asyncio":
            import asyncio

            stepped = asyncio.run(asyncio_main())
        else:
            import trio

            stepped = trio.run(trio_main)
    finally:
        opt.close()
    assert stepped and opt.local_epoch == 1 and opt.last_round.outcome == "averaged"
    assert torch.allclose(model.weight, torch.tensor([[0.75, 1.75]]))  # lr 0.5 x [0.5, 0.5]
    assert len(ticks) >= 10   # the loop ran its other task while the round took 0.4 s


def test_a_scheduler_built_from_the_optimizer_steps_once_per_global_epoch():
    """``scheduler=lambda opt: ...`` gets the p2pdl optimizer; p2pdl steps the
    scheduler at each global step, however many local steps the epoch took,
    and its state travels with the optimizer's."""
    node = FakeNode()
    built = []

    def factory(opt: Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
        built.append(opt)
        return torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)

    opt, model = offline(node, scheduler=factory)
    assert built == [opt] and opt.scheduler.optimizer is opt
    for epoch, local_steps in enumerate((1, 3, 2)):
        # local steps with no round due, then one with the round ready
        node.tracker.view = [fake_progress(epoch, ready=False)] * (2 * local_steps - 2) + \
            [fake_progress(epoch, ready=True)] * 2
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(fake_averaged([torch.tensor([[0.5, 0.5]])], members=2))
        node.allreduce.futures.append(future)
        for _ in range(local_steps):
            model.zero_grad()
            model(torch.tensor([[1.0, 1.0]])).sum().backward()
            opt.step()
        assert opt.local_epoch == epoch + 1
        assert opt.optimizer.param_groups[0]["lr"] == 0.5 * 0.5 ** (epoch + 1)
    assert opt.state_dict()["scheduler"]["last_epoch"] == 3
    opt.close()
