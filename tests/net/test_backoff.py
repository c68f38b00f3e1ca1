"""Retry delays (sans-IO)."""

from __future__ import annotations

import random

import pytest

from p2pdl.errors import ConfigError
from p2pdl.net import Backoff, BackoffPolicy


def test_delays_grow_to_the_maximum_with_bounded_jitter():
    policy = BackoffPolicy(initial=0.5, maximum=30, multiplier=2, jitter=0.2)
    backoff = Backoff(policy, random.Random(1))
    delays = [backoff.next_delay() for _ in range(12)]
    assert 0.4 <= delays[0] <= 0.6
    assert all(d <= 30 for d in delays)
    assert delays[-1] >= 24
    assert backoff.failures == 12
    backoff.reset()
    assert backoff.next_delay() <= 0.6 and backoff.failures == 1


def test_invalid_policy():
    with pytest.raises(ConfigError):
        BackoffPolicy(initial=0)
    with pytest.raises(ConfigError):
        BackoffPolicy(jitter=1.5)
