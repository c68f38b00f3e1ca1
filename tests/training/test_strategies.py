"""p2pdl.training._strategies: DeDLOC and DiLoCo on tensors by hand, no network."""

from __future__ import annotations

import pytest
import torch

from p2pdl.errors import ConfigError
from p2pdl.training import DeDLOCStrategy, DiLoCoStrategy, OptimizerConfig
from p2pdl.training._strategies import check_like, make_strategy, split_fragments

pytestmark = pytest.mark.timeout(30)


def linear(weight: list[float]) -> torch.nn.Linear:
    model = torch.nn.Linear(len(weight), 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([weight]))
    return model


def dedloc(model: torch.nn.Module, lr: float = 0.1, **options: object
           ) -> tuple[DeDLOCStrategy, torch.optim.Optimizer]:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return DeDLOCStrategy(opt, list(model.parameters()), **options), opt


def diloco(model: torch.nn.Module, lr: float = 0.5, **options: object
           ) -> tuple[DiLoCoStrategy, torch.optim.Optimizer]:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    return DiLoCoStrategy(opt, list(model.parameters()), **options), opt


# -- DeDLOC ------------------------------------------------------------------------------


def test_dedloc_accumulates_gradients_weighted_by_samples_and_averages_them():
    model = linear([0.0, 0.0])
    strategy, _ = dedloc(model)
    assert torch.equal(strategy.round_tensors(0)[0], torch.zeros(1, 2))   # before any batch
    model.weight.grad = torch.tensor([[1.0, 2.0]])
    strategy.on_batch(3)
    model.weight.grad = torch.tensor([[5.0, -2.0]])
    strategy.on_batch(1)
    strategy.on_batch(0)   # an empty batch adds nothing
    assert strategy.accumulators is not None
    assert torch.equal(strategy.accumulators[0], torch.tensor([[8.0, 4.0]]))
    (mean,) = strategy.round_tensors(4)
    assert mean.dtype == torch.float32
    assert torch.equal(mean, torch.tensor([[2.0, 1.0]]))
    strategy.reset()
    assert torch.equal(strategy.accumulators[0], torch.zeros(1, 2))
    assert torch.equal(strategy.round_tensors(0)[0], torch.zeros(1, 2))


def test_dedloc_skips_parameters_without_gradients():
    model = linear([1.0, 1.0])
    strategy, _ = dedloc(model)
    model.weight.grad = None
    strategy.on_batch(4)
    assert torch.equal(strategy.round_tensors(4)[0], torch.zeros(1, 2))


def test_dedloc_apply_steps_the_wrapped_optimizer_once_with_the_average():
    model = linear([1.0, 2.0])
    strategy, _ = dedloc(model, lr=0.1)
    model.weight.grad = torch.tensor([[100.0, 100.0]])   # the local gradients are replaced
    strategy.apply([torch.tensor([[1.0, -1.0]])])
    assert torch.allclose(model.weight, torch.tensor([[0.9, 2.1]]))
    assert model.weight.grad is None   # zeroed after the step


def test_dedloc_apply_clips_the_averaged_gradients():
    model = linear([0.0, 0.0])
    strategy, _ = dedloc(model, lr=1.0, clip_grad_norm=1.0)
    strategy.apply([torch.tensor([[3.0, 4.0]])])   # norm 5 -> 1
    assert torch.allclose(model.weight, torch.tensor([[-0.6, -0.8]]), atol=1e-5)


def test_dedloc_sent_momentum_sends_the_peers_momentum_and_keeps_it_out_of_the_state():
    model = linear([0.0, 0.0])
    strategy, _ = dedloc(model, sent_momentum=0.5)
    for grad in ([2.0, 4.0], [1.0, 1.0]):
        model.weight.grad = torch.tensor([grad])
        strategy.on_batch(2)
        sent = strategy.round_tensors(2)
        strategy.apply([s.clone() for s in sent])   # the round's result replaces it
        strategy.reset()
    assert torch.allclose(sent[0], torch.tensor([[2.0, 3.0]]))   # 0.5 * [2, 4] + [1, 1]
    sent[0].zero_()   # the all-reduce writes into what was sent: the momentum is apart
    assert torch.allclose(strategy.momentum[0], torch.tensor([[2.0, 3.0]]))
    assert strategy.extra_state() is None   # each peer's own, never shared


def test_dedloc_apply_none_leaves_the_parameters():
    model = linear([1.0, 2.0])
    strategy, _ = dedloc(model)
    strategy.apply(None)
    assert torch.equal(model.weight, torch.tensor([[1.0, 2.0]]))


@pytest.mark.parametrize("on_failure", ["local", "skip"])
def test_dedloc_on_failure_local_steps_with_own_gradients_skip_drops_them(on_failure):
    model = linear([1.0, 2.0])
    strategy, _ = dedloc(model, lr=0.1, on_failure=on_failure)
    sent = [torch.tensor([[1.0, 1.0]])]
    update = strategy.on_failure(sent)
    strategy.apply(update)
    if on_failure == "local":
        assert update is sent
        assert torch.allclose(model.weight, torch.tensor([[0.9, 1.9]]))
    else:
        assert update is None
        assert torch.equal(model.weight, torch.tensor([[1.0, 2.0]]))


def test_dedloc_adds_nothing_to_the_state():
    strategy, _ = dedloc(linear([1.0]))
    assert strategy.extra_state() is None
    strategy.check_extra_state({"anything": 1})   # ignored, as a DeDLOC state's "diloco" entry
    strategy.load_extra_state(None)


# -- DiLoCo ------------------------------------------------------------------------------


def test_diloco_batches_are_inner_steps_and_the_round_averages_the_delta():
    model = linear([1.0, 2.0])
    strategy, _ = diloco(model, lr=0.5)
    model.weight.grad = torch.tensor([[1.0, -1.0]])
    strategy.on_batch(8)
    assert torch.allclose(model.weight, torch.tensor([[0.5, 2.5]]))
    (delta,) = strategy.round_tensors(8)
    assert delta.dtype == torch.float32
    assert torch.allclose(delta, torch.tensor([[0.5, -0.5]]))   # anchor - params
    strategy.reset()   # nothing to reset: the delta is read from the parameters
    assert torch.allclose(strategy.round_tensors(0)[0], delta)


def test_diloco_inner_steps_clip_each_batch():
    model = linear([0.0, 0.0])
    strategy, _ = diloco(model, lr=1.0, clip_grad_norm=1.0)
    model.weight.grad = torch.tensor([[3.0, 4.0]])
    strategy.on_batch(1)
    assert torch.allclose(model.weight, torch.tensor([[-0.6, -0.8]]), atol=1e-5)


def test_diloco_outer_step_is_nesterov_momentum_by_hand():
    """m = mu m + d; anchor -= lr (d + mu m); the parameters go to the anchor."""
    model = linear([1.0, 2.0])
    strategy, _ = diloco(model, outer_lr=0.7, outer_momentum=0.9)
    anchor = torch.tensor([[1.0, 2.0]])
    momentum = torch.zeros(1, 2)
    for d in ([[0.5, -0.5]], [[0.1, 0.3]], [[-0.2, 0.0]]):
        delta = torch.tensor(d)
        with torch.no_grad():
            model.weight.add_(1.0)   # wherever the inner steps went
        strategy.apply([delta])
        momentum = 0.9 * momentum + delta
        anchor = anchor - 0.7 * (delta + 0.9 * momentum)
        assert torch.allclose(strategy.anchor[0], anchor)
        assert torch.allclose(strategy.momentum[0], momentum)
        assert torch.equal(model.weight.detach(), strategy.anchor[0])


def test_diloco_apply_accepts_a_flat_average():
    model = linear([1.0, 2.0])
    strategy, _ = diloco(model, outer_lr=1.0, outer_momentum=0.0)
    strategy.apply([torch.tensor([0.5, 0.5])])   # as the all-reduce may hand it back
    assert torch.allclose(model.weight, torch.tensor([[0.5, 1.5]]))


@pytest.mark.parametrize("on_failure", ["local", "skip"])
def test_diloco_on_failure_local_steps_with_own_delta_skip_goes_back_to_the_anchor(on_failure):
    model = linear([1.0, 2.0])
    strategy, _ = diloco(model, lr=0.5, outer_lr=1.0, outer_momentum=0.0,
                         on_failure=on_failure)
    model.weight.grad = torch.tensor([[1.0, -1.0]])
    strategy.on_batch(1)   # params [0.5, 2.5]
    sent = strategy.round_tensors(1)
    strategy.apply(strategy.on_failure(sent))
    if on_failure == "local":   # lr 1, no momentum: the anchor moves to the local params
        assert torch.allclose(model.weight, torch.tensor([[0.5, 2.5]]))
    else:
        assert torch.equal(model.weight.detach(), torch.tensor([[1.0, 2.0]]))
        assert torch.equal(strategy.momentum[0], torch.zeros(1, 2))
    assert torch.equal(model.weight.detach(), strategy.anchor[0])


def test_diloco_state_holds_anchor_and_momentum_and_loads_them_back():
    model = linear([1.0, 2.0])
    strategy, _ = diloco(model)
    strategy.apply([torch.tensor([[0.5, -0.5]])])
    state = {k: [t.clone() for t in v] for k, v in strategy.extra_state().items()}
    assert sorted(state) == ["anchor", "momentum"]
    other, _ = diloco(linear([9.0, 9.0]))
    other.check_extra_state(state)
    other.load_extra_state(state)
    assert torch.equal(other.anchor[0], strategy.anchor[0])
    assert torch.equal(other.momentum[0], strategy.momentum[0])


def test_delayed_diloco_carries_the_inner_steps_since_the_delta_over_to_the_new_anchor():
    """``delayed``: the round's delta is taken at the base, the inner steps go
    on, and the outer step moves them along: params = anchor + (params - base)."""
    model = linear([1.0, 2.0])
    strategy, _ = diloco(model, lr=0.5, outer_lr=1.0, outer_momentum=0.0, delayed=True)
    assert strategy.shared_params() is not None
    model.weight.grad = torch.tensor([[1.0, -1.0]])
    strategy.on_batch(1)   # params [0.5, 2.5]
    (sent,) = strategy.round_tensors(1)
    assert torch.allclose(sent, torch.tensor([[0.5, -0.5]]))
    assert torch.equal(strategy.base[0], torch.tensor([[0.5, 2.5]]))
    model.weight.grad = torch.tensor([[2.0, 2.0]])
    strategy.on_batch(1)   # while the round runs: params [-0.5, 1.5]
    strategy.apply([torch.tensor([[0.25, -0.25]])])   # the others' mean delta
    assert torch.allclose(strategy.anchor[0], torch.tensor([[0.75, 2.25]]))
    # the inner step taken meanwhile (-1, -1) is kept, on top of the new anchor
    assert torch.allclose(model.weight, torch.tensor([[-0.25, 1.25]]))
    assert torch.equal(strategy.shared_params()[0], strategy.anchor[0])
    (delta,) = strategy.round_tensors(1)   # the next delta: every inner step since
    assert torch.allclose(delta, torch.tensor([[1.0, 1.0]]))
    model.weight.grad = torch.tensor([[1.0, 1.0]])
    strategy.on_batch(1)   # while that round runs: params [-0.75, 0.75]
    strategy.apply(None)   # it is skipped: the anchor stays, and only the step since the base
    assert torch.allclose(model.weight, torch.tensor([[0.25, 1.75]]))


def test_delayed_diloco_without_steps_meanwhile_lands_on_the_anchor_and_a_load_drops_the_base():
    model = linear([1.0, 2.0])
    strategy, _ = diloco(model, lr=0.5, outer_lr=0.7, outer_momentum=0.9, delayed=True)
    model.weight.grad = torch.tensor([[1.0, -1.0]])
    strategy.on_batch(1)
    strategy.apply(strategy.round_tensors(1))   # as a round run at once (alone) does
    assert torch.equal(model.weight.detach(), strategy.anchor[0])
    other, _ = diloco(linear([9.0, 9.0]), delayed=True)
    other.round_tensors(1)
    other.load_extra_state(strategy.extra_state())
    assert other.base is None
    other.apply(None)
    assert torch.equal(other._params[0].detach(), strategy.anchor[0])


def test_fragments_split_the_tensors_into_parts_of_about_equal_size():
    assert split_fragments([10, 10, 10, 10], 2) == [[0, 2], [1, 3]]
    assert split_fragments([100, 1, 1, 60, 40], 2) == [[0, 1], [2, 3, 4]]
    assert split_fragments([5, 3], 1) == [[0, 1]]
    parts = split_fragments([7, 300, 2, 120, 120, 64, 9], 3)
    assert sorted(i for part in parts for i in part) == list(range(7))   # each tensor once
    assert split_fragments([7, 300, 2, 120, 120, 64, 9], 3) == parts    # the same every time
    with pytest.raises(ConfigError, match="fragments=3, but the model has 2"):
        split_fragments([5, 3], 3)


def test_diloco_fragments_average_one_fragment_per_epoch_and_leave_the_others_training():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=True))   # weight (4), bias (2)
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        model[0].bias.copy_(torch.tensor([1.0, 1.0]))
    strategy, _ = diloco(model, lr=1.0, outer_lr=1.0, outer_momentum=0.0, fragments=2)
    assert strategy.fragments == [[0], [1]] and strategy.fragment(3) == [1]
    weight, bias = model[0].weight, model[0].bias
    weight.grad, bias.grad = torch.ones(2, 2), torch.ones(2)
    strategy.on_batch(1)   # weight - 1, bias - 1
    (delta,) = strategy.round_tensors(1, epoch=4)   # fragment 0: the weight alone
    assert torch.equal(delta, torch.ones(2, 2))
    strategy.apply([torch.full((2, 2), 0.5)])
    assert torch.equal(weight.detach(), torch.tensor([[0.5, 1.5], [2.5, 3.5]]))   # the anchor
    assert torch.equal(bias.detach(), torch.zeros(2))   # still training, away from its anchor
    assert torch.equal(strategy.anchor[1], torch.ones(2))
    assert torch.equal(strategy.shared_params()[1], strategy.anchor[1])
    (delta,) = strategy.round_tensors(1, epoch=5)   # fragment 1: the bias
    assert torch.equal(delta, torch.ones(2))


@pytest.mark.parametrize("entry, match", [
    (None, "no DiLoCo outer state"),
    ({"anchor": [torch.zeros(1, 2)]}, "DiLoCo momentum"),
    ({"anchor": [torch.zeros(1, 3)], "momentum": [torch.zeros(1, 2)]}, "anchor tensor 0"),
    ({"anchor": [torch.zeros(1, 2)], "momentum": [torch.tensor([[float("nan"), 0.0]])]},
     "momentum tensor 0"),
])
def test_diloco_refuses_an_outer_state_that_does_not_fit(entry, match):
    strategy, _ = diloco(linear([1.0, 2.0]))
    with pytest.raises(ConfigError, match=match):
        strategy.check_extra_state(entry)


# -- choosing and checking -----------------------------------------------------------------


def test_make_strategy_follows_the_mode_and_options():
    model = linear([1.0, 2.0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    params = list(model.parameters())
    assert isinstance(make_strategy(OptimizerConfig(), opt, params), DeDLOCStrategy)
    strategy = make_strategy(OptimizerConfig(mode="diloco", outer_lr=1.0, outer_momentum=0.0,
                                             on_failure="skip"), opt, params)
    assert isinstance(strategy, DiLoCoStrategy)
    assert strategy.on_failure([torch.zeros(1, 2)]) is None
    strategy.apply([torch.tensor([[1.0, 1.0]])])
    assert torch.allclose(model.weight, torch.tensor([[0.0, 1.0]]))


def test_bad_on_failure_is_a_config_error():
    model = linear([1.0])
    with pytest.raises(ConfigError, match="on_failure"):
        dedloc(model, on_failure="retry")
    with pytest.raises(ConfigError, match="on_failure"):
        diloco(model, on_failure="retry")


def test_check_like_wants_finite_float_tensors_of_the_same_shapes():
    reference = [torch.zeros(2), torch.zeros(1, 3)]
    check_like([torch.ones(2), torch.ones(1, 3)], reference, "parameters")
    for bad, match in [(None, "do not match"), ([torch.ones(2)], "2 tensors expected"),
                       ([torch.ones(2), torch.ones(3)], "tensor 1"),
                       ([torch.ones(2, dtype=torch.int64), torch.ones(1, 3)], "tensor 0"),
                       ([torch.tensor([1.0, float("inf")]), torch.ones(1, 3)], "finite")]:
        with pytest.raises(ConfigError, match=match):
            check_like(bad, reference, "parameters")


# -- worker momentum taken over from the wrapped optimizer -----------------------------


def train_steps(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int,
                strategy: DeDLOCStrategy | None = None) -> torch.Tensor:
    """``steps`` steps on a fixed sequence of batches: plainly, or through
    ``strategy`` as a one-peer swarm (the round's average is what it sent)."""
    gen = torch.Generator().manual_seed(3)
    for _ in range(steps):
        x = torch.randn(8, 3, generator=gen)
        loss = ((model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        if strategy is None:
            opt.step()
        else:
            strategy.on_batch(8)
            strategy.apply(strategy.round_tensors(8))
            strategy.reset()
    return model.weight.detach().clone()


def test_auto_takes_over_sgds_momentum_and_steps_exactly_as_sgd():
    plain = linear([0.5, -0.2, 0.1])
    expected = train_steps(plain, torch.optim.SGD(plain.parameters(), lr=0.05,
                                                  momentum=0.9), 12)
    model = linear([0.5, -0.2, 0.1])
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    strategy = DeDLOCStrategy(opt, list(model.parameters()), sent_momentum="auto")
    assert strategy.taken_over == "sgd" and opt.param_groups[0]["momentum"] == 0.0
    assert torch.allclose(train_steps(model, opt, 12, strategy), expected, atol=1e-6)
    assert strategy.momentum is not None   # the momentum is the peer's now


def test_auto_takes_over_adams_first_moment():
    model = linear([0.5, -0.2, 0.1])
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.8, 0.99))
    strategy = DeDLOCStrategy(opt, list(model.parameters()), sent_momentum="auto")
    assert strategy.taken_over == "adam" and opt.param_groups[0]["betas"] == (0.0, 0.99)
    model.weight.grad = torch.ones(1, 3)
    strategy.on_batch(1)
    assert torch.allclose(strategy.round_tensors(1)[0], torch.ones(1, 3))  # bias-corrected
    strategy.reset()
    model.weight.grad = torch.full((1, 3), 3.0)
    strategy.on_batch(1)
    # m = 0.8 * 0.2 + 0.2 * 3 = 0.76, over 1 - 0.64
    assert torch.allclose(strategy.round_tensors(1)[0], torch.full((1, 3), 0.76 / 0.36))


def test_auto_leaves_what_it_cannot_take_over_alone():
    for make in (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True),
                 lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, dampening=0.1),
                 lambda p: torch.optim.Adagrad(p, lr=0.1)):
        model = linear([1.0, 2.0])
        opt = make(model.parameters())
        before = [dict(g) for g in opt.param_groups]
        strategy = DeDLOCStrategy(opt, list(model.parameters()), sent_momentum="auto")
        assert strategy.taken_over is None
        assert [dict(g) for g in opt.param_groups] == before
        model.weight.grad = torch.ones(1, 2)
        strategy.on_batch(1)
        assert torch.equal(strategy.round_tensors(1)[0], torch.ones(1, 2))  # the mean


def test_a_scheduler_that_writes_momentum_back_is_taken_over_again():
    model = linear([1.0, 2.0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    strategy = DeDLOCStrategy(opt, list(model.parameters()), sent_momentum="auto")
    model.weight.grad = torch.ones(1, 2)
    strategy.on_batch(1)
    strategy.round_tensors(1)                        # m = 1
    opt.param_groups[0]["momentum"] = 0.5            # as OneCycleLR does
    strategy.reset()
    strategy.on_batch(1)
    assert torch.equal(strategy.round_tensors(1)[0], torch.full((1, 2), 1.5))  # 0.5 * 1 + 1
    assert opt.param_groups[0]["momentum"] == 0.0


def test_auto_is_the_default_and_diloco_ignores_it():
    assert OptimizerConfig().sent_momentum == "auto"
    assert OptimizerConfig(mode="diloco").sent_momentum == "auto"
    model = linear([1.0, 2.0])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    make_strategy(OptimizerConfig(mode="diloco"), opt, list(model.parameters()))
    assert opt.param_groups[0]["momentum"] == 0.9
