"""Retry delays (sans-IO: the caller sleeps)."""

from __future__ import annotations

import random

from .config import BackoffPolicy


class Backoff:
    """Successive delays of a :class:`BackoffPolicy`; ``reset`` after a success."""

    def __init__(self, policy: BackoffPolicy, rng: random.Random | None = None) -> None:
        self._policy = policy
        self._rng = rng or random.Random()
        self._next = policy.initial
        self.failures = 0

    def next_delay(self) -> float:
        p = self._policy
        delay = self._next * self._rng.uniform(1 - p.jitter, 1 + p.jitter)
        self._next = min(self._next * p.multiplier, p.maximum)
        self.failures += 1
        return min(delay, p.maximum)

    def reset(self) -> None:
        self._next = self._policy.initial
        self.failures = 0
