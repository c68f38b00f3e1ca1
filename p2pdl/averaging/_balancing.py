"""Load balancing of the butterfly all-reduce: who reduces how much.  No I/O.

The averaged vector (``V`` bytes) is cut into one part per reducer; peer i
reduces the fraction ``w_i``.  In a round, every **sender** (a peer that
contributes a vector: full and client peers) sends the parts of its vector
that others reduce and receives their averages back; every **reducer**
receives its part from every other sender and sends the average back to
each.  Per direction, peer i moves

    traffic_i = [i sends] * (1 - w_i) + w_i * (S - [i sends])      (in units of V)

where S is the number of senders: ``1 + (S - 2) w_i`` for a full peer (the
DeDLOC paper's formula), ``w_i * S`` for an auxiliary peer (it reduces but
sends no vector and needs no result), ``1`` for a client (``w_i = 0``: it
cannot accept connections).  Links are full duplex and sending, reducing and
receiving are pipelined, so the round lasts as long as its slowest resource:

    minimise xi  subject to  V * traffic_i / bandwidth_i <= xi          (every peer)
                             V * w_i * S / reduce_rate_i <= xi   (reducers with a known rate)
                             sum w_i = 1,  w_i >= 0,  w_i = 0 for clients

(a reducer combines its part of all S vectors, its own included).  Going
beyond hivemind, the reducers' compute (``reduce_rate``, bytes
of input per second) enters the program too.  It is a linear program,
solved by scipy's HiGHS; ``xi`` is the plan's predicted round time.  Among
the optimal plans the one with the least total link time is taken (a second
program), so that spare capacity goes to the fastest links.  Fractions
below MIN_FRACTION are dropped (their load goes to the others); when that
makes a plan slower than equal shares, equal shares are taken.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ..errors import LocalProtocolError

__all__ = ["PeerCapacity", "LoadPlan", "plan_load", "equal_shares", "part_sizes",
           "MIN_FRACTION"]

#: Fractions below this are rounded to 0 (a part too small to be worth a reducer).
MIN_FRACTION = 1e-3


@dataclasses.dataclass(frozen=True)
class PeerCapacity:
    """What the plan knows of one peer.

    ``bandwidth``: bytes per second the peer can send and receive at once
    (the lesser of its measured up and down rates).  ``reduce_rate``: bytes
    of incoming parts it can reduce per second (None: not a bottleneck).
    ``client``: it cannot accept connections (it reduces nothing).
    ``auxiliary``: it reduces but contributes no vector.
    """

    bandwidth: float
    reduce_rate: float | None = None
    client: bool = False
    auxiliary: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth) and self.bandwidth > 0):
            raise LocalProtocolError(f"bandwidth must be a positive number, got "
                                     f"{self.bandwidth!r}")
        if self.reduce_rate is not None and not (math.isfinite(self.reduce_rate)
                                                 and self.reduce_rate > 0):
            raise LocalProtocolError(f"reduce_rate must be positive or None, got "
                                     f"{self.reduce_rate!r}")
        if self.client and self.auxiliary:
            raise LocalProtocolError("a client-mode peer cannot be auxiliary (nobody can "
                                     "send it parts to reduce)")


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """Fractions of the vector each peer reduces, and the predicted round time."""

    fractions: tuple[float, ...]
    predicted_s: float
    bottleneck: int   # the peer whose link or compute sets the round time

    def sizes(self, numel: int) -> tuple[int, ...]:
        """Part sizes in elements for a vector of ``numel`` (they sum to it)."""
        return part_sizes(numel, self.fractions)


def _senders(peers: Sequence[PeerCapacity]) -> int:
    return sum(not p.auxiliary for p in peers)


def round_time(peers: Sequence[PeerCapacity], fractions: Sequence[float],
               vector_bytes: float) -> tuple[float, int]:
    """The model's round time for given fractions, and the bottleneck peer."""
    senders = _senders(peers)
    worst, index = 0.0, 0
    for i, (peer, w) in enumerate(zip(peers, fractions, strict=True)):
        sends = 0 if peer.auxiliary else 1
        traffic = sends * (1 - w) + w * (senders - sends)
        t = vector_bytes * traffic / peer.bandwidth
        if peer.reduce_rate is not None and w > 0:
            t = max(t, vector_bytes * w * senders / peer.reduce_rate)
        if t > worst:
            worst, index = t, i
    return worst, index


def plan_load(peers: Sequence[PeerCapacity], vector_bytes: float) -> LoadPlan:
    """The fractions that minimise the round time (module docstring).

    Raises :class:`LocalProtocolError` when no peer can reduce (all clients)
    or no peer contributes a vector.
    """
    from scipy.optimize import linprog  # noqa: PLC0415 - scipy is slow to import

    n = len(peers)
    if n == 0 or _senders(peers) == 0:
        raise LocalProtocolError("an all-reduce needs at least one peer that contributes")
    if all(p.client for p in peers):
        raise LocalProtocolError("every peer is in client mode: nobody can reduce")
    if not (math.isfinite(vector_bytes) and vector_bytes > 0):
        raise LocalProtocolError(f"vector_bytes must be positive, got {vector_bytes!r}")
    senders = _senders(peers)
    # Variables: w_0..w_{n-1}, xi (seconds).  Rates are scaled to vectors per
    # second so that HiGHS's tolerances (1e-7) are far below the times involved.
    a_ub: list[list[float]] = []
    b_ub: list[float] = []
    for i, peer in enumerate(peers):
        sends = 0 if peer.auxiliary else 1
        # sends*(1 - w_i) + w_i*(S - sends) <= xi * b_i
        row = [0.0] * (n + 1)
        row[i] = (senders - sends) - sends
        row[n] = -peer.bandwidth / vector_bytes  # vectors per second: xi is in seconds
        a_ub.append(row)
        b_ub.append(-float(sends))
        if peer.reduce_rate is not None:
            # w_i * S / r_i <= xi  (reducing S vectors' parts, its own included)
            row = [0.0] * (n + 1)
            row[i] = senders * vector_bytes / peer.reduce_rate
            row[n] = -1.0
            a_ub.append(row)
            b_ub.append(0.0)
    a_eq = [[1.0] * n + [0.0]]
    bounds = [(0.0, 0.0) if p.client else (0.0, 1.0) for p in peers] + [(0.0, None)]
    result = linprog(c=[0.0] * n + [1.0], A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=[1.0],
                     bounds=bounds, method="highs")
    if result.status != 0:  # cannot happen for a valid input; say so if it does
        raise LocalProtocolError(f"the load-balancing program failed: {result.message}")
    # The optimum is often not unique (the slowest peer's own vector may set
    # the time whatever the others do).  Among the optimal plans, take the one
    # with the least total link time, which loads the fastest links most.
    best = float(result.x[n])
    secondary = [((senders - (0 if p.auxiliary else 1)) - (0 if p.auxiliary else 1))
                 * vector_bytes / p.bandwidth for p in peers] + [0.0]
    second = linprog(c=secondary, A_ub=a_ub + [[0.0] * n + [1.0]],
                     b_ub=b_ub + [best * (1 + 1e-7) + 1e-9], A_eq=a_eq, b_eq=[1.0],
                     bounds=bounds, method="highs")
    candidates = [result] + ([second] if second.status == 0 else [])
    plans = []
    for found in reversed(candidates):   # the least link time first, on a tie
        fractions = _clean([max(0.0, float(x)) for x in found.x[:n]], peers)
        plans.append(LoadPlan(tuple(fractions), *round_time(peers, fractions, vector_bytes)))
    # Dropping fractions below MIN_FRACTION moves their load onto the others,
    # which can cost a little time: never end worse than equal shares.
    plans.append(equal_shares(peers, vector_bytes))
    return min(plans, key=lambda plan: plan.predicted_s)


def equal_shares(peers: Sequence[PeerCapacity], vector_bytes: float) -> LoadPlan:
    """Every peer that can reduce gets the same fraction (the baseline the LP beats)."""
    reducers = [i for i, p in enumerate(peers) if not p.client]
    if not reducers or _senders(peers) == 0:
        raise LocalProtocolError("an all-reduce needs a reducer and a contributor")
    fractions = [1.0 / len(reducers) if i in reducers else 0.0 for i in range(len(peers))]
    predicted, bottleneck = round_time(peers, fractions, vector_bytes)
    return LoadPlan(tuple(fractions), predicted, bottleneck)


def _clean(fractions: list[float], peers: Sequence[PeerCapacity]) -> list[float]:
    """Drop fractions below MIN_FRACTION and renormalise to sum 1."""
    kept = [w if w >= MIN_FRACTION and not p.client else 0.0
            for w, p in zip(fractions, peers, strict=True)]
    total = sum(kept)
    if total <= 0:  # cannot happen: the fractions sum to 1 over at most 1/MIN_FRACTION peers
        kept = [0.0 if p.client else 1.0 for p in peers]
        total = sum(kept)
    return [w / total for w in kept]


def part_sizes(numel: int, fractions: Sequence[float]) -> tuple[int, ...]:
    """Integer part sizes proportional to ``fractions`` that sum to ``numel``.

    Largest remainders get the leftover elements; a zero fraction gets 0.
    """
    if numel < 0:
        raise LocalProtocolError(f"numel must be >= 0, got {numel}")
    total = sum(fractions)
    if not fractions or total <= 0 or any(f < 0 or not math.isfinite(f) for f in fractions):
        raise LocalProtocolError(f"fractions must be >= 0 with a positive sum: {fractions!r}")
    exact = [numel * f / total for f in fractions]
    sizes = [math.floor(x) for x in exact]
    leftover = numel - sum(sizes)
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - sizes[i]), i))
    for i in order:
        if leftover == 0:
            break
        if fractions[i] > 0:
            sizes[i] += 1
            leftover -= 1
    return tuple(sizes)
