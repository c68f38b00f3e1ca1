"""Merging states that peers at one epoch disagree on: :func:`merge_states`.

When the peers at an epoch hold several states and none has a majority
(a round that failed differently for different members, two groups that
averaged apart), every peer that checks downloads each offered state and
merges them with the same rule, so that they all end with the same one:

* a floating-point tensor: per value, the **weighted lower median** of the
  states' values (each state weighted by the number of peers that offer
  it): the first value, in sorted order, at which the cumulative weight
  reaches half the total.  It is one of the inputs' values, computed
  without rounding, so every peer that merges the same inputs gets the same
  bits; and a state held by a minority cannot move a value outside the
  range of the majority's (a liar offering poison among honest peers that
  hold more of the weight is outvoted value by value);
* anything else (integers, strings, integer tensors): the value of the
  heaviest state (ties: the state listed first).

Inputs are given in a fixed order (the caller sorts them by digest), so
ties break alike everywhere.  Sans-IO: no network, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["merge_states", "weighted_lower_median"]


def weighted_lower_median(tensors: Sequence[torch.Tensor],
                          weights: Sequence[float]) -> torch.Tensor:
    """Per value, the first sorted value whose cumulative weight reaches half the total.

    ``tensors``: one or more of one shape and floating dtype; ``weights``:
    one positive weight each.  The result has their shape and dtype.
    """
    if len(tensors) != len(weights) or not tensors:
        raise ValueError("one weight per tensor, at least one tensor")
    first = tensors[0]
    if len(tensors) == 1:
        return first.detach().clone()
    values = torch.stack([t.detach().reshape(-1) for t in tensors])
    ordered, order = torch.sort(values, dim=0, stable=True)
    w = torch.tensor([float(x) for x in weights], dtype=torch.float64)[order]
    reached = w.cumsum(0) * 2 >= math.fsum(float(x) for x in weights)
    pick = reached.to(torch.int8).argmax(0, keepdim=True)
    return ordered.gather(0, pick).reshape(first.shape)


def merge_states(states: Sequence[Any], weights: Sequence[float], what: str = "state") -> Any:
    """Merge nested states (dicts, lists, tuples, tensors, plain values) of one
    structure: floating tensors by :func:`weighted_lower_median`, the rest
    from the heaviest state (the first on a tie).

    ConfigError when the structures differ (other keys, lengths, shapes or
    dtypes): such states cannot be merged.
    """
    if len(states) != len(weights) or not states:
        raise ValueError("one weight per state, at least one state")
    if any(not (w > 0) for w in weights):
        raise ValueError("weights must be positive")
    heaviest = max(range(len(states)), key=lambda i: (weights[i], -i))
    return _merge(list(states), list(weights), heaviest, what)


def _merge(states: list[Any], weights: list[float], heaviest: int, where: str) -> Any:
    first = states[0]
    if isinstance(first, torch.Tensor):
        for s in states[1:]:
            if not isinstance(s, torch.Tensor) or s.shape != first.shape \
                    or s.dtype != first.dtype:
                raise ConfigError(f"the states differ in structure at {where}")
        if first.is_floating_point():
            return weighted_lower_median(states, weights)
        return states[heaviest].detach().clone()
    if isinstance(first, dict):
        for s in states[1:]:
            if not isinstance(s, dict) or s.keys() != first.keys():
                raise ConfigError(f"the states differ in structure at {where}")
        return {k: _merge([s[k] for s in states], weights, heaviest, f"{where}.{k}")
                for k in first}
    if isinstance(first, (list, tuple)):
        for s in states[1:]:
            if type(s) is not type(first) or len(s) != len(first):
                raise ConfigError(f"the states differ in structure at {where}")
        merged = [_merge([s[i] for s in states], weights, heaviest, f"{where}[{i}]")
                  for i in range(len(first))]
        return merged if isinstance(first, list) else tuple(merged)
    for s in states[1:]:
        if isinstance(s, (torch.Tensor, dict, list, tuple)):
            raise ConfigError(f"the states differ in structure at {where}")
    return states[heaviest]
