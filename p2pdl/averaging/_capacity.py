"""A peer's own capacity, measured from its rounds: what it offers the load plan.  No I/O.

The leader's load plan (``_balancing``) gives each member a share of the
vector by its bandwidth.  Typed in by nobody, every share would be equal;
so each node measures its own, from the all-reduce's streams:

* after each round, per direction, the bulk data (TENSOR frames) the
  round's streams moved, each frame at the time its write ended (it was
  read whole: ``FramedStream.tensor_log``; the messages, some sent long
  after the data, do not count), gives one **sample** of its rate: the
  highest rate over a window of a quarter of the transfer's span
  (WINDOWS_PER_SPAN; at least MIN_SAMPLE_SECONDS) sliding over it
  (:func:`peak_rate`), if the round moved at least MIN_SAMPLE_BYTES over at
  least MIN_SAMPLE_SECONDS (a small round's rate says more about latency
  than bandwidth).  The peak, not the mean over the span: streams to
  several peers end at different times (a slow peer's last), and the link
  was full only while several were running;
* the estimate of a direction is the **second highest** of its last WINDOW
  samples (the only one, while there is one): a round slowed by a slow
  member, or by compute, lowers no estimate, and one round measured too
  fast raises none;
* the **bandwidth** the node offers (``form_group(bandwidth=...)``, when
  the caller gives none) is the lesser of its two directions' estimates:
  the plan's model has one rate for sending and receiving at once;
* its **reduce rate** (``form_group(reduce_rate=...)``, likewise): per
  round, the bytes of input its reducer averaged (each chunk's encoded size
  times its contributors) over the seconds that took (the aggregation and
  the result's encoding), a sample from MIN_SAMPLE_BYTES and
  MIN_REDUCE_SECONDS; estimated like a direction.

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
from collections.abc import Sequence

__all__ = ["CapacityEstimator", "CapacityEstimate", "MIN_SAMPLE_BYTES", "MIN_SAMPLE_SECONDS",
           "MIN_REDUCE_SECONDS", "WINDOW", "WINDOWS_PER_SPAN", "DIRECTIONS", "KINDS",
           "peak_rate"]

#: A round's transfer in one direction counts as a sample only from this many bytes.
MIN_SAMPLE_BYTES = 1 << 20
#: ... and over at least this many seconds.
MIN_SAMPLE_SECONDS = 0.05
#: Samples kept per direction (the last ones).
WINDOW = 8
#: A sample is the peak rate over a window of the transfer's span / this.
WINDOWS_PER_SPAN = 4
#: The directions measured.
DIRECTIONS = ("up", "down")
#: What is measured: the two directions, and reducing (input bytes per second).
KINDS = (*DIRECTIONS, "reduce")
#: A round's reducing counts as a sample only from this many seconds (it is
#: CPU work, far shorter than a transfer; the same MIN_SAMPLE_BYTES of input).
MIN_REDUCE_SECONDS = 0.001


@dataclasses.dataclass(frozen=True)
class CapacityEstimate:
    """What a node measured of itself (bytes/s; None: no sample yet):
    ``reduce`` is the bytes of input its reducer averaged per second
    (``form_group``'s ``reduce_rate``)."""

    up: float | None
    down: float | None
    samples: int
    reduce: float | None = None

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
        self._samples = {k: collections.deque[float](maxlen=window) for k in KINDS}
        self._count = 0

    def record(self, direction: str, nbytes: int, seconds: float) -> bool:
        """One round's transfer in ``direction`` (``"up"`` or ``"down"``), or
        its reducing (``"reduce"``: input bytes, seconds of work, from
        MIN_REDUCE_SECONDS); whether it counted as a sample."""
        if direction not in self._samples:
            raise ValueError(f"direction must be one of {KINDS}, got {direction!r}")
        least = MIN_REDUCE_SECONDS if direction == "reduce" else self.min_seconds
        if nbytes < self.min_bytes or not (math.isfinite(seconds) and seconds >= least):
            return False
        self._samples[direction].append(nbytes / seconds)
        self._count += 1
        return True

    def record_frames(self, direction: str, frames: Sequence[tuple[float, int]]) -> bool:
        """One round's frames in ``direction`` ((time, bytes), any order): a
        sample of :func:`peak_rate` over a window of the span /
        WINDOWS_PER_SPAN (at least ``min_seconds``); whether it counted."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
        if not frames:
            return False
        ordered = sorted(frames)
        span = ordered[-1][0] - ordered[0][0]
        total = sum(size for _, size in ordered)
        if total < self.min_bytes or span < self.min_seconds:
            return False
        rate = peak_rate(ordered, max(self.min_seconds, span / WINDOWS_PER_SPAN))
        if rate is None or rate <= 0:
            return False
        self._samples[direction].append(rate)
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
        return CapacityEstimate(self.rate("up"), self.rate("down"), self._count,
                                self.rate("reduce"))


def peak_rate(frames: Sequence[tuple[float, int]], window: float) -> float | None:
    """The highest rate (bytes/s) over ``window`` seconds sliding over
    ``frames`` ((time, bytes) in time order, each frame's bytes done at its
    time): for each frame's time t, the bytes of the frames after t up to
    t + window, over window; only windows that end by the last frame count
    (a window past it would count time with no frames).  None with a span
    shorter than ``window`` or fewer than two frames."""
    if len(frames) < 2 or window <= 0 or frames[-1][0] - frames[0][0] < window:
        return None
    times = [t for t, _ in frames]
    sums = [0]
    for _, size in frames:
        sums.append(sums[-1] + size)
    best = 0.0
    end = 0
    last = times[-1]
    for i, start in enumerate(times):
        if start + window > last:
            break
        while end < len(times) and times[end] <= start + window:
            end += 1
        best = max(best, (sums[end] - sums[i + 1]) / window)
    return best

