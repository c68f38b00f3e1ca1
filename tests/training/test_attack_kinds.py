"""The attacks of ``p2pdl train --attack``: what each does to a member's gradients."""

from __future__ import annotations

import pytest
import torch

from p2pdl.cli._args import ATTACK_KINDS
from p2pdl.service import FlagBook
from p2pdl.training import ALIE, ATTACKS, GaussianNoise, GradientScaler

pytestmark = pytest.mark.timeout(60)


class _Stub:
    """What an attack uses of a p2pdl Optimizer: its torch optimizer and ``step``."""

    def __init__(self, params):
        self.optimizer = torch.optim.SGD(params, lr=0.1)
        self.sent: list[torch.Tensor] = []

    def step(self, batch_size=None):
        self.sent.append(torch.cat([p.grad.flatten().clone()
                                    for g in self.optimizer.param_groups for p in g["params"]]))
        return True

    @property
    def local_epoch(self):
        return 7


def _param(values):
    p = torch.nn.Parameter(torch.zeros(len(values)))
    p.grad = torch.tensor(values, dtype=torch.float32)
    return p


def test_every_kind_of_the_cli_has_an_attack():
    assert tuple(ATTACKS) == ATTACK_KINDS


def test_scaling_and_noise_change_the_gradients_they_send():
    p = _param([1.0, -2.0, 3.0])
    stub = _Stub([p])
    GradientScaler(stub, scale=-20.0).step()
    assert stub.sent[-1].tolist() == [-20.0, 40.0, -60.0]
    p.grad = torch.tensor([1.0, -2.0, 3.0])
    GaussianNoise(stub, scale=1000.0).step()
    sent = stub.sent[-1]
    rms = float(torch.tensor([1.0, -2.0, 3.0]).pow(2).mean().sqrt())
    assert float((sent - torch.tensor([1.0, -2.0, 3.0])).abs().max()) > 10 * rms
    # everything else is the optimizer's
    assert GradientScaler(stub).local_epoch == 7


def test_alie_sends_its_mean_minus_z_deviations():
    p = _param([0.0, 0.0])
    stub = _Stub([p])
    attack = ALIE(stub, z=1.5, decay=0.5)
    grads = [[1.0, 10.0], [3.0, 10.0], [1.0, 10.0], [3.0, 10.0]]
    for g in grads:
        p.grad = torch.tensor(g)
        attack.step()
    sent = stub.sent[-1]
    # a constant coordinate is sent as it is; a varying one below its mean
    assert sent[1] == pytest.approx(10.0)
    assert sent[0] < 2.0 - 0.5
    assert all(torch.isfinite(s).all() for s in stub.sent)


def test_the_flag_book_keeps_when_each_kind_was_first_flagged():
    book = FlagBook()
    peer = b"\x00\x24\x08\x01\x12\x20" + bytes(32)
    book.flag(peer, "run", "reducer_lie", 100.0)
    book.flag(peer, "run", "reducer_lie", 150.0)
    book.flag(peer, "run", "report_lie", 120.0)
    book.flag(peer, "other", "report_lie", 90.0)
    [(name, kinds)] = book.first_flagged("run").items()
    assert kinds == {"reducer_lie": 100.0, "report_lie": 120.0}
    assert book.first_flagged("other")[name] == {"report_lie": 90.0}
    assert book.first_flagged("none") == {}
