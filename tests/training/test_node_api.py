"""p2pdl.training._node_api: ``p2pdl.Node`` has every member ``TrainingNode`` names,
with compatible signatures; anything else is a clear ConfigError."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

import p2pdl
from p2pdl.errors import ConfigError
from p2pdl.training import (
    Optimizer,
    OptimizerConfig,
    TrainingAllReduce,
    TrainingNode,
    TrainingProgress,
    TrainingStateSync,
    TrainingTracker,
)
from p2pdl.training._node_api import REQUIRED_MEMBERS, check_training_node

from .fake_node import FakeNode

pytestmark = pytest.mark.timeout(60)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


def protocol_members(protocol: type) -> dict[str, object]:
    return {name: value for name, value in vars(protocol).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def incompatibilities(implementation: object, protocol: type) -> list[str]:
    """Why ``implementation`` does not provide ``protocol``'s methods (by name and parameters)."""
    problems = []
    for name, member in protocol_members(protocol).items():
        if isinstance(member, property):
            if not hasattr(type(implementation), name) and name not in vars(implementation):
                problems.append(f"no {name}")
            continue
        impl = getattr(implementation, name, None)
        if impl is None:
            problems.append(f"no {name}()")
            continue
        wanted = list(inspect.signature(member).parameters.values())[1:]   # without self
        given = inspect.signature(impl).parameters
        positional = [p for p in given.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        var_keyword = any(p.kind is p.VAR_KEYWORD for p in given.values())
        for i, param in enumerate(wanted):
            if param.kind is param.POSITIONAL_OR_KEYWORD:
                if i >= len(positional) or positional[i].name != param.name:
                    problems.append(f"{name}(): {param.name} is not positional argument {i}")
                    continue
                other = positional[i]
            elif param.kind is param.KEYWORD_ONLY:
                other = given.get(param.name)
                if other is None or other.kind is other.POSITIONAL_ONLY:
                    if not var_keyword:
                        problems.append(f"{name}(): takes no {param.name}=")
                    continue
            else:
                continue
            if param.default is not param.empty and other.default is other.empty:
                problems.append(f"{name}(): {param.name} has no default")
        named = {p.name for p in wanted}
        for other in given.values():
            if other.default is other.empty and other.name not in named \
                    and other.kind not in (other.VAR_POSITIONAL, other.VAR_KEYWORD):
                problems.append(f"{name}(): needs {other.name}, which the optimizer never passes")
    return problems


def test_the_sync_node_provides_every_member_of_training_node():
    with p2pdl.Node(listen=LOOPBACK) as node:
        assert check_training_node(node) is node
        assert incompatibilities(node, TrainingNode) == []
        assert incompatibilities(node.progress, TrainingProgress) == []
        assert incompatibilities(node.allreduce, TrainingAllReduce) == []
        assert incompatibilities(node.statesync, TrainingStateSync) == []
        with node.progress.track("conformance", 8) as tracker:
            assert incompatibilities(tracker, TrainingTracker) == []


def test_required_members_are_exactly_the_protocols():
    named = set()
    for attribute, protocol in [("progress", TrainingProgress), ("allreduce", TrainingAllReduce),
                                ("statesync", TrainingStateSync)]:
        named |= {f"{attribute}.{m}" for m in protocol_members(protocol)}
    assert set(REQUIRED_MEMBERS) == named | {"client_mode"}


def test_a_fake_node_with_the_members_is_accepted():
    node = FakeNode()
    assert check_training_node(node) is node
    assert incompatibilities(node, TrainingNode) == []
    assert incompatibilities(node.allreduce, TrainingAllReduce) == []
    assert incompatibilities(node.statesync, TrainingStateSync) == []
    assert incompatibilities(node.tracker, TrainingTracker) == []


@pytest.mark.parametrize("node, missing", [
    (object(), "client_mode"),
    (SimpleNamespace(client_mode=False, progress=SimpleNamespace(track=None)), "allreduce"),
    (FakeNode(allreduce=SimpleNamespace(all_reduce=None)), "allreduce.start_round"),
])
def test_anything_else_is_a_config_error_naming_what_is_missing(node, missing):
    with pytest.raises(ConfigError, match=f"node must be a running p2pdl.Node .*{missing}"):
        check_training_node(node)


def test_a_trio_node_is_refused_with_the_way_out():
    model = torch.nn.Linear(2, 1)
    with p2pdl.Node(listen=LOOPBACK) as node:
        with pytest.raises(ConfigError, match="trio programs run the training loop in a thread"):
            Optimizer(node=node.trio_node, run_id="trio",
                      optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                      target_batch_size=8)


def test_the_comparison_catches_what_would_break_the_optimizer():
    class Wrong:
        def share(self, run_id, payload, epoch): ...
        def unshare(self, run_id, now): ...
        def fetch(self, run_id, donors, *, min_epoch): ...

    assert incompatibilities(Wrong(), TrainingStateSync) == [
        "share(): epoch is not positional argument 1",
        "share(): payload is not positional argument 2",
        "unshare(): needs now, which the optimizer never passes",
        "fetch(): min_epoch has no default", "fetch(): takes no max_epoch=",
        "fetch(): takes no timeout=",
        "fetch(): takes no digest=", "no offers()"]


def test_the_loss_and_display_name_reach_the_progress_reports():
    from .fake_node import progress as fake_progress  # noqa: PLC0415

    model = torch.nn.Linear(2, 1)
    node = FakeNode()
    node.tracker.view = [fake_progress(0, ready=False)]
    opt = Optimizer(node=node, run_id="named", optimizer=torch.optim.SGD(model.parameters(), 0.1),
                    target_batch_size=64, batch_size_per_step=8, display_name="alice")
    try:
        assert node.progress.names == ["alice"]
        model(torch.ones(1, 2)).sum().backward()
        opt.step(loss=torch.tensor(2.5))
        opt.step(loss=float("nan"))      # not finite: the last loss stays
        opt.step(loss=1.25)
        assert node.tracker.losses == [2.5, 2.5, 1.25]
        assert node.tracker.rounds == []                  # no round yet: none said
        for bad in (torch.ones(2), "low"):
            with pytest.raises(ConfigError, match="step\\(loss=...\\)"):
                opt.step(loss=bad)
    finally:
        opt.close()
    with pytest.raises(ConfigError, match="display_name"):
        OptimizerConfig(display_name="tab\there")
