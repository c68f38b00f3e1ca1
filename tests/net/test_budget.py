"""The input budget and the heap trimming policy (sans-IO)."""

from __future__ import annotations

import pytest

from p2pdl.errors import ConfigError
from p2pdl.net import HostConfig, InputBudget
from p2pdl.net._memory import HeapTrimPolicy, resident_bytes, trim_heap


def test_budget_holds_per_peer_and_per_node():
    budget = InputBudget(per_peer=100, per_node=150)
    assert budget.try_hold("a", 100)
    assert not budget.try_hold("a", 1)  # a's own limit
    assert budget.try_hold("b", 50)
    assert not budget.try_hold("c", 1)  # the node's limit, whoever asks
    assert (budget.held("a"), budget.held("c"), budget.total, budget.refusals) == (100, 0, 150, 2)
    budget.release("a", 60)
    assert budget.try_hold("c", 10)
    budget.release("a", 40)
    budget.release("b", 50)
    budget.release("c", 10)
    assert budget.total == 0 and budget.peak == 150
    with pytest.raises(AssertionError):
        budget.release("a", 1)


def test_budget_limits_are_checked():
    with pytest.raises(ConfigError, match="input_budget_per_peer"):
        HostConfig(input_budget_per_peer=2, input_budget_per_node=1)
    with pytest.raises(ConfigError, match="heap_trim_interval"):
        HostConfig(heap_trim_interval=0)


def test_heap_trim_is_due_after_growth_only():
    policy = HeapTrimPolicy(growth=100)
    assert not policy.due(1000)  # the first look sets the baseline
    assert not policy.due(1099)
    assert policy.due(1100)
    policy.trimmed(1050)  # memory in use stays: the baseline moves up
    assert not policy.due(1100)
    assert not policy.due(500)  # it fell: that is the new baseline
    assert policy.due(600)


def test_trimming_the_heap_is_harmless():
    assert resident_bytes() is None or resident_bytes() > 0
    assert trim_heap() in (True, False)
