"""A peer's own capacity, measured from its rounds: what it offers the load plan.  No I/O.

The leader's load plan (``_balancing``) gives each member a share of the
vector by its bandwidth.  Typed in by nobody, every share would be equal;
so each node measures its own, from the all-reduce's streams:

* after each round, per direction, the bytes its streams moved over the
  span from the first write (read) to the last one, across the round's
  streams (``FramedStream.statistics``: ``sent_span``, ``received_span``),
  is one **sample** of its rate, if the round moved at least
  MIN_SAMPLE_BYTES over at least MIN_SAMPLE_SECONDS (a small round's rate
  says more about latency than bandwidth);
* the estimate of a direction is the **second highest** of its last WINDOW
  samples (the only one, while there is one): a round slowed by a slow
  member, or by compute, lowers no estimate, and one round measured too
  fast raises none;
* the **bandwidth** the node offers (``form_group(bandwidth=...)``, when
  the caller gives none) is the lesser of its two directions' estimates:
  the plan's model has one rate for sending and receiving at once.

A sample is a lower bound of the link's capacity: a round limited by
another member, by the reducers' compute or by the protocol moves less
than the link could.  The estimate is therefore what the evidence
supports, never more (protocols/matchmaking.md bounds what a member may
declare against the others').
"""

from __future__ import annotations

import collections
import dataclasses
import math

__all__ = ["CapacityEstimator", "CapacityEstimate", "MIN_SAMPLE_BYTES", "MIN_SAMPLE_SECONDS",
           "WINDOW", "DIRECTIONS"]

#: A round's transfer in one direction counts as a sample only from this many bytes.
MIN_SAMPLE_BYTES = 1 << 20
#: ... and over at least this many seconds.
MIN_SAMPLE_SECONDS = 0.05
#: Samples kept per direction (the last ones).
WINDOW = 8
#: The directions measured.
DIRECTIONS = ("up", "down")


@dataclasses.dataclass(frozen=True)
class CapacityEstimate:
    """What a node measured of itself (bytes/s; None: no sample yet)."""

    up: float | None
    down: float | None
    samples: int

    @property
    def bandwidth(self) -> float | None:
        """The rate the load plan takes: the lesser known direction (None: none known)."""
        known = [r for r in (self.up, self.down) if r is not None]
        return min(known) if known else None


class CapacityEstimator:
    """Samples of a node's rates, per direction (see the module's notes)."""

    def __init__(self, window: int = WINDOW, *, min_bytes: int | None = None,
                 min_seconds: float | None = None) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self.min_bytes = MIN_SAMPLE_BYTES if min_bytes is None else min_bytes
        self.min_seconds = MIN_SAMPLE_SECONDS if min_seconds is None else min_seconds
        self._samples = {d: collections.deque[float](maxlen=window) for d in DIRECTIONS}
        self._count = 0

    def record(self, direction: str, nbytes: int, seconds: float) -> bool:
        """One round's transfer in ``direction`` (``"up"`` or ``"down"``);
        whether it counted as a sample."""
        if direction not in self._samples:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        if nbytes < self.min_bytes or not (math.isfinite(seconds) and seconds
                                           >= self.min_seconds):
            return False
        self._samples[direction].append(nbytes / seconds)
        self._count += 1
        return True

    def rate(self, direction: str) -> float | None:
        """The estimate of ``direction`` (bytes/s): the second highest of its
        samples, the only one while there is one; None without samples."""
        samples = sorted(self._samples[direction], reverse=True)
        if not samples:
            return None
        return samples[1] if len(samples) > 1 else samples[0]

    def estimate(self) -> CapacityEstimate:
        return CapacityEstimate(self.rate("up"), self.rate("down"), self._count)
