"""The weight caps every reducer applies to a chunk's contributors, sans-IO
(protocols/allreduce.md, Reducing): the median cap under a robust rule, then
the share cap.  Verifiers check a reducer's claims against them (``_verify``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["MIN_CAPPED_CONTRIBUTORS", "cap_shares", "cap_to_median", "capped"]

#: Contributors of positive weight a chunk needs before the share cap applies.
MIN_CAPPED_CONTRIBUTORS = 3


def cap_shares(weights: Sequence[float], max_share: float) -> list[float]:
    """``weights`` with none above ``max_share`` of their total, when at least
    MIN_CAPPED_CONTRIBUTORS are positive (else unchanged).

    The weights above the cap are lowered to one common value ``c`` that
    holds exactly the share: ``c = max_share * sum(min(w, c))`` (water
    filling); the others are unchanged.  With ``n`` positive weights the
    share is at least ``1/n`` (all equal), so a solution always exists.
    ``max_share >= 1`` changes nothing.
    """
    values = [float(w) for w in weights]
    positive = sorted((w for w in values if w > 0), reverse=True)
    n = len(positive)
    if n < MIN_CAPPED_CONTRIBUTORS or max_share >= 1:
        return values
    share = max(float(max_share), 1.0 / n)
    if positive[0] <= share * math.fsum(positive):
        return values
    cap = positive[0]
    for k in range(1, n):  # k weights capped: c = share * (k c + the rest)
        if k * share >= 1:  # cannot happen for share >= 1/n; defensive
            break
        cap = share * math.fsum(positive[k:]) / (1.0 - k * share)
        if positive[k] <= cap:
            break
    return [min(w, cap) for w in values]


def cap_to_median(weights: Sequence[float], ratio: float | None) -> list[float]:
    """``weights`` with none above ``ratio`` times the lower median of the
    positive ones (unchanged with fewer than two positive weights, or
    ``ratio`` None).

    The median is a weight of the majority: while fewer than half of the
    contributors inflate their claims, every weight counts at most ``ratio``
    typical honest weights, whatever it claims.
    """
    values = [float(w) for w in weights]
    positive = sorted(w for w in values if w > 0)
    if ratio is None or len(positive) < 2:
        return values
    cap = float(ratio) * positive[(len(positive) - 1) // 2]
    return [min(w, cap) for w in values]


def capped(weights: Sequence[float], max_share: float, max_ratio: float | None) -> list[float]:
    """``weights`` as a reducer counts them: the median cap, then the share cap."""
    return cap_shares(cap_to_median(weights, max_ratio), max_share)
