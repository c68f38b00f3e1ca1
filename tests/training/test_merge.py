"""p2pdl.training._merge: the weighted lower median and merging whole states."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from p2pdl.errors import ConfigError
from p2pdl.training._merge import merge_states, weighted_lower_median

pytestmark = pytest.mark.timeout(60)


def test_the_weighted_lower_median_per_value():
    a, b, c = torch.tensor([1.0, 5.0, -1.0]), torch.tensor([2.0, 4.0, 0.0]), \
        torch.tensor([100.0, -100.0, 7.0])
    assert weighted_lower_median([a, b, c], [1, 1, 1]).tolist() == [2.0, 4.0, 0.0]
    # a state held by three peers outweighs two others together
    assert weighted_lower_median([a, b, c], [3, 1, 1]).tolist() == [1.0, 5.0, -1.0]
    # an even split: the lower of the two
    assert weighted_lower_median([a, c], [1, 1]).tolist() == [1.0, -100.0, -1.0]
    assert weighted_lower_median([a], [5]).tolist() == a.tolist()
    assert weighted_lower_median([a.view(3, 1), b.view(3, 1)], [1, 2]).shape == (3, 1)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(-1e6, 1e6, width=32), min_size=4, max_size=4),
                          st.integers(1, 5)), min_size=1, max_size=6), st.randoms())
def test_the_median_is_an_input_value_within_the_majoritys_range_whatever_the_order(
        rows, rnd):
    tensors = [torch.tensor(v, dtype=torch.float32) for v, _ in rows]
    weights = [w for _, w in rows]
    result = weighted_lower_median(tensors, weights)
    order = list(range(len(rows)))
    rnd.shuffle(order)
    again = weighted_lower_median([tensors[i] for i in order], [weights[i] for i in order])
    assert torch.equal(result, again)   # the same bits, whatever the order of the inputs
    stacked = torch.stack(tensors)
    total = sum(weights)
    for j in range(4):
        column, m = stacked[:, j].tolist(), float(result[j])
        assert m in column
        # at least half the weight lies at or below it, more than half at or above it
        below = sum(w for v, w in zip(column, weights, strict=True) if v <= m)
        above = sum(w for v, w in zip(column, weights, strict=True) if v >= m)
        assert 2 * below >= total and 2 * above > total


def adam_state(seed: int) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    return {"epoch": 4, "params": [p.detach().clone() for p in model.parameters()],
            "optimizer": opt.state_dict(), "note": f"peer {seed}"}


def test_whole_states_merge_value_by_value_and_the_rest_comes_from_the_heaviest():
    states = [adam_state(s) for s in (1, 2, 3)]
    merged = merge_states(states, [1, 2, 1])
    assert merged["epoch"] == 4 and merged["note"] == "peer 2"   # the heaviest's
    for k in range(2):
        expected = weighted_lower_median([s["params"][k] for s in states], [1, 2, 1])
        assert torch.equal(merged["params"][k], expected)
    moments = [s["optimizer"]["state"][0]["exp_avg"] for s in states]
    assert torch.equal(merged["optimizer"]["state"][0]["exp_avg"],
                       weighted_lower_median(moments, [1, 2, 1]))
    assert merged["optimizer"]["param_groups"] == states[1]["optimizer"]["param_groups"]
    # a tie between plain values goes to the state listed first
    assert merge_states([{"x": 1}, {"x": 2}], [1, 1]) == {"x": 1}
    # integer tensors are not averaged: the heaviest state's
    ints = merge_states([torch.tensor([1, 2]), torch.tensor([5, 6])], [1, 3])
    assert ints.tolist() == [5, 6]


@pytest.mark.parametrize("other", [
    {"epoch": 4, "params": [torch.zeros(2, 3)]},                      # a tensor missing
    {"epoch": 4, "params": [torch.zeros(3, 2), torch.zeros(2)]},      # another shape
    {"epoch": 4, "params": [torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2)]},
    {"epoch": 4, "params": (torch.zeros(2, 3), torch.zeros(2))},      # a tuple, not a list
    {"epoch": 4, "parameters": [torch.zeros(2, 3), torch.zeros(2)]},  # another key
    {"epoch": torch.zeros(1), "params": [torch.zeros(2, 3), torch.zeros(2)]},
])
def test_states_of_another_structure_are_not_merged(other):
    mine = {"epoch": 4, "params": [torch.zeros(2, 3), torch.zeros(2)]}
    with pytest.raises(ConfigError, match="differ in structure"):
        merge_states([mine, other], [1, 1])


def test_bad_arguments():
    with pytest.raises(ValueError):
        merge_states([], [])
    with pytest.raises(ValueError):
        merge_states([{}], [0])
    with pytest.raises(ValueError):
        weighted_lower_median([torch.zeros(1)], [1, 2])
