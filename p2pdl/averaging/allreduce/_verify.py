"""Checking a reducer's result without trusting its word, sans-IO.

A reducer returns the aggregate of its part; this module lets the members
that received it check it (protocols/allreduce.md, Verification).  The
check rests on the aggregation rule's own fixed-point condition.  With
``p_j`` the contributors' capped weights over their sum and ``x_j`` their
values of a chunk as the reducer decoded them, the result ``v`` satisfies

* the weighted mean: ``sum_j p_j (x_j - v) = 0``;
* CenteredClip with radius ``tau``: ``sum_j p_j (x_j - v) / max(tau, |x_j - v|) = 0``
  (its fixed point, divided by ``tau``: every term is at most 1 long,
  whatever ``tau`` the reducer claims; as ``tau`` goes to 0 it becomes the
  geometric median's condition, so a reducer that claims a tiny radius must
  still return a robust aggregate).

Nobody but the reducer holds every ``x_j``, but each contributor holds its
own, so each reports a **sketch** of its own terms: ``s_j = sum_k p_jk S(t_jk)``
over the part's chunks ``k`` (``t_jk`` its term in chunk ``k``), where ``S``
is a sketch in the manner of a count sketch -- value ``i`` of the part is
added, with a sign ``+-1``, into one of SKETCH_BUCKETS buckets, drawn from
the verifying member's **nonce** (:func:`sketch_plan`: AES-128-CTR keyed by
SHAKE-256, the same on every machine).  The values lie in rows of
SKETCH_BUCKETS: a row's values go to the buckets shifted by the row's own
random shift, each with its row's random sign times its column's, so whole
rows are summed at once (``index_add_``) and yet every value has its own
sign.  The
nonce is revealed only after every result was received and every
contributor's values were fixed, so neither the reducer nor a contributor
can aim at the sketch.  ``S`` is linear, so an honest reducer's
contributors' sketches sum to about zero; and it keeps norms: ``|S(t)|`` is
within a few percent of ``|t|`` for a vector spread over many values, and
beyond NORM_SLACK times it only with odds of 1 in 65536 for one concentrated
on a few.

What a contributor can lie about is bounded: each ``t_jk`` is at most 1
long, so ``|s_j| <= NORM_SLACK * sqrt(sum_k p_jk^2)`` (:func:`sketch_bound`).
A sketch beyond that is a lie on its face; a sketch that is missing or a lie
counts as unknown within that bound.  So a reducer (whose own values count
as a contributor's) and the contributors colluding with it can hide a
shift of its result only while their weight, times NORM_SLACK, outweighs
what the shift does to the honest terms.  A shift far beyond the honest
spread turns every honest term into about the same unit vector: it is
caught while the colluding share of the weight is below about
``1 / (1 + NORM_SLACK)``.  A small shift ``delta`` moves each unclipped
honest term by ``delta / tau``: it is caught beyond about ``NORM_SLACK *
p_bad / p_unclipped * tau``, the order of what CenteredClip concedes to a
malicious contributor anyway.  Under the mean there is no such bound:
verification is meaningful under CenteredClip.

The radius itself is the reducer's claim: a fixed ``tau`` must be the
layout's; with ``tau="auto"`` it must lie within a factor TAU_SLACK (and the
chunk's rounding) of the weighted median of the contributors' own distances
to the result, which
each contributor reports beside its sketch (a radius far larger would let
far values count as if unclipped; one far smaller would make the check's
numerical allowance, which grows as ``1 / tau``, too loose to mean
anything).

The numerical slack of an honest result (its codec's rounding, float32
sums, CenteredClip's stopping rule) is bounded from the result alone
(:func:`tolerance`), so the verdict depends on the reports and the result,
never on the reducer's word.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from .._aggregators import Aggregator
from .._norms import norm64, norm_upper
from ._weights import capped

if TYPE_CHECKING:
    import torch

#: How far a claimed weight may lie above the caps' fixed point (relative to
#: the chunk's largest weight): rounding of the reducer's water filling.
CAPS_TOLERANCE = 1e-9

#: The all-reduce's ``Layout`` (``_state``, which imports this module): only
#: its attributes are used here.
Layout = Any

__all__ = ["SKETCH_BUCKETS", "NORM_SLACK", "NONCE_SIZE", "TAU_SLACK", "RESIDUAL_SLACK",
           "REPORT_TOLERANCE", "CAPS_TOLERANCE", "ChunkClaim", "Report", "Verdict",
           "sketch_plan", "SketchPlan", "SketchPlanner", "Scratch", "verifiable", "deviates",
           "contributor_terms", "sketch", "contributor_report", "sketch_bound", "tolerance",
           "check_part", "nonce_commitment", "joint_nonce", "JointNonce", "RoundVerifier"]

#: Buckets of a sketch (a report holds this many float64 values per part).
SKETCH_BUCKETS = 256
#: A sketch's norm is taken to be at most this many times its vector's: a
#: vector spread over many values keeps its norm within about
#: ``sqrt(2 / SKETCH_BUCKETS)`` (9 %); beyond 1.5 takes three of its few
#: largest values landing in one bucket with one sign (odds 1 / 65536).
NORM_SLACK = 1.5
#: Bytes of a verifier's nonce (its secret, and the joint nonce).
NONCE_SIZE = 32
#: Reports a verifier keeps for reuse (one per part and distinct nonce).
MAX_SKETCHED = 4096
#: ``tau="auto"``: a claimed radius must lie within this factor of the weighted
#: median of the contributors' distances to the result (the radius is the
#: median distance to the medoid, about sqrt(2) times that for spread values).
TAU_SLACK = 4.0
#: Under CenteredClip, what the sum of the terms may miss zero by in each chunk
#: besides rounding (in units of the terms, which are at most 1 long): the
#: result is a fixed point only to its stopping rule (``tolerance * tau``
#: per step, ``iterations`` steps at most, and a few chunks converge slowly).
#: A shift that hides in it moves a chunk by about a hundredth of ``tau``.
RESIDUAL_SLACK = 1e-2
#: float32 sums: each value of a result may be off by this many units in the
#: last place of float32 per contributor (besides the codec's rounding).
FLOAT32_ULPS = 2.0
#: A signed report differs from the one recomputed from committed data when
#: its sketch is further from it than this times the sketch's bound (or,
#: under the mean, than this times the larger of the two norms), or one of
#: its distances further than this times the larger distance.
REPORT_TOLERANCE = 1e-6
_FLOAT32_EPSILON = 2.0 ** -23
_DOMAIN = b"p2pdl/allreduce/verify/3"
_COMMIT_NONCE_DOMAIN = b"p2pdl/allreduce/nonce-commitment/1"
_JOINT_DOMAIN = b"p2pdl/allreduce/joint-nonce/1"


@dataclasses.dataclass(frozen=True)
class ChunkClaim:
    """What a reducer says of one chunk of its part: the contributors
    (ascending), each one's weight as it counted it, and CenteredClip's radius
    (None under the mean)."""

    contributors: tuple[int, ...]
    weights: tuple[float, ...]
    tau: float | None = None

    def share(self, member: int) -> float:
        """``member``'s weight over the chunk's total (0 when it is no contributor)."""
        total = math.fsum(self.weights)
        if total <= 0 or member not in self.contributors:
            return 0.0
        return self.weights[self.contributors.index(member)] / total


@dataclasses.dataclass(frozen=True)
class Report:
    """A contributor's report on one part, for one verifier's nonce: the
    ``sketch`` of its weighted terms (SKETCH_BUCKETS values) and its distance
    to the result in each chunk (0 where it contributed nothing)."""

    sketch: tuple[float, ...]
    distances: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The check of one part.

    ``status``: ``"ok"``, ``"failed"`` (the sketches do not sum to zero within
    the bounds, or a claimed radius is not the rule's: the result is not its
    rule's aggregate of what the contributors sent -- or contributors lied
    within their bounds, which only their data can tell), or
    ``"unverifiable"`` (a rule without a check, or, under the mean, a
    contributor's sketch missing).  ``liars``: contributors whose report is a
    lie on its face (a sketch beyond its bound, or malformed).  ``missing``:
    contributors with no report.  ``excess``: the norm of the known sketches'
    sum minus what rounding and the unknown sketches allow (positive when
    failed).  ``reason``: for people.
    """

    status: str
    liars: frozenset[int] = frozenset()
    missing: frozenset[int] = frozenset()
    excess: float = 0.0
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class SketchPlan:
    """Where a part's values go in a sketch (:func:`sketch_plan`).

    The part's ``numel`` values lie in rows of SKETCH_BUCKETS (the last one
    may be short): value ``i`` is in row ``i // SKETCH_BUCKETS``, column
    ``c = i % SKETCH_BUCKETS``.  ``rows`` holds each row's **slot** (int64,
    0 to ``2 * SKETCH_BUCKETS - 1``): its shift ``h = slot mod
    SKETCH_BUCKETS`` and its sign ``+1`` for a slot of SKETCH_BUCKETS or
    more, else ``-1``; ``pattern`` a sign (float32 ``+-1``) per column.
    Value ``i`` goes into bucket ``(c + h) mod SKETCH_BUCKETS`` with the
    sign of its row times ``pattern[c]``."""

    numel: int
    rows: torch.Tensor
    pattern: torch.Tensor


def sketch_plan(group_id: bytes, part: int, nonce: bytes, numel: int) -> SketchPlan:
    """The sketch plan of a part of ``numel`` values for ``nonce``.  The key
    is the first 16 bytes of SHAKE-256(domain, group, part, nonce); of the
    AES-128-CTR keystream of that key (initial counter block 0), bytes 0 to
    31 are the pattern (column ``c``'s sign is ``+1`` when bit ``c mod 8``
    of byte ``c // 8`` is set, else ``-1``), and bytes ``32 + 2r`` and
    ``33 + 2r``, read as a little-endian 16-bit number ``u``, give row ``r``
    its slot ``u mod (2 * SKETCH_BUCKETS)``: its shift is the low byte, its
    sign ``+1`` when bit 8 is set.  (AES in counter mode is a keyed
    pseudorandom function: without the nonce the plan cannot be told from
    independent draws, and it costs two keystream bytes per row of
    SKETCH_BUCKETS values.)"""
    return SketchPlanner().plan(group_id, part, nonce, numel)


#: Keystream bytes of a plan before its rows' slots: the columns' signs.
_PATTERN_BYTES = SKETCH_BUCKETS // 8


class SketchPlanner:
    """Makes :func:`sketch_plan`'s plans and sketches under them, with its
    buffers kept from one sketch to the next (fresh pages cost more than the
    arithmetic done in them)."""

    def __init__(self) -> None:
        self._accumulator: torch.Tensor | None = None
        self._gather: torch.Tensor | None = None

    def plan(self, group_id: bytes, part: int, nonce: bytes, numel: int) -> SketchPlan:
        """:func:`sketch_plan`."""
        import torch

        rows = -(-numel // SKETCH_BUCKETS)
        key = hashlib.shake_256(_DOMAIN + len(group_id).to_bytes(1, "big") + group_id
                                + part.to_bytes(2, "big") + nonce).digest(16)
        encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        stream = encryptor.update(bytes(_PATTERN_BYTES + 2 * rows)) + encryptor.finalize()
        raw = torch.frombuffer(bytearray(stream), dtype=torch.uint8)
        bits = (raw[:_PATTERN_BYTES].to(torch.int64).unsqueeze(1)
                >> torch.arange(8, dtype=torch.int64)) & 1
        pattern = bits.reshape(-1).to(torch.float32).mul_(2).sub_(1)
        words = raw[_PATTERN_BYTES:].to(torch.int64)
        slots = words[0::2] | ((words[1::2] & 1) << 8)
        return SketchPlan(numel, slots, pattern)

    def sketch(self, plan: SketchPlan, terms: torch.Tensor) -> tuple[float, ...]:
        """The sketch of ``terms`` (float32, ``plan.numel`` values) under ``plan``."""
        import torch

        if terms.numel() != plan.numel:
            raise ValueError(f"a plan of {plan.numel} values for {terms.numel()} terms")
        buckets = SKETCH_BUCKETS
        if self._accumulator is None:
            self._accumulator = torch.empty(2 * buckets, buckets, dtype=torch.float32)
            columns = torch.arange(buckets)
            # row h, bucket b: the column that shift h takes to bucket b
            self._gather = (columns.unsqueeze(0) - columns.unsqueeze(1)) % buckets
        accumulator = self._accumulator.zero_()
        full = plan.numel // buckets
        if full:
            accumulator.index_add_(0, plan.rows[:full],
                                   terms[:full * buckets].view(full, buckets))
        tail = plan.numel - full * buckets
        if tail:
            accumulator[int(plan.rows[full]), :tail] += terms[full * buckets:]
        signed = accumulator[buckets:].sub_(accumulator[:buckets]).mul_(plan.pattern)
        assert self._gather is not None
        shifted = signed.gather(1, self._gather)
        return tuple(shifted.sum(0, dtype=torch.float64).tolist())


class Scratch:
    """Memory kept from one round's verification to the next: a
    :class:`SketchPlanner` and float32 buffers for a member's values and
    terms.  Fresh pages cost more than the arithmetic done in them (a page
    fault takes microseconds in a virtual machine: ~10 ms for the 10 MB of a
    part of 2.5M values), and every round needs the same sizes again.

    :meth:`take` hands out a buffer (a free one large enough, else a new
    one); :meth:`give` takes it back once its round is over.  At most
    MAX_FREE buffers are kept free (the largest), so what it holds is bounded
    by what the rounds that used it at once took."""

    #: Free buffers kept at most.
    MAX_FREE = 64

    def __init__(self) -> None:
        self.planner = SketchPlanner()
        self._free: list[torch.Tensor] = []

    @property
    def nbytes(self) -> int:
        """Bytes of the free buffers."""
        return sum(4 * b.numel() for b in self._free)

    def take(self, numel: int) -> torch.Tensor:
        """A float32 buffer of at least ``numel`` values (contents undefined):
        the smallest free one large enough, else a new one of ``numel``."""
        import torch

        fits = [i for i, b in enumerate(self._free) if b.numel() >= numel]
        if fits:
            return self._free.pop(min(fits, key=lambda i: self._free[i].numel()))
        return torch.empty(max(1, numel), dtype=torch.float32)

    def give(self, buffers: Sequence[torch.Tensor]) -> None:
        """Buffers :meth:`take` handed out, back for the next round."""
        self._free.extend(buffers)
        if len(self._free) > self.MAX_FREE:
            self._free.sort(key=lambda b: b.numel(), reverse=True)
            del self._free[self.MAX_FREE:]


def deviates(claimed: Report, true: Report, bound: float | None) -> bool:
    """Whether a signed report ``claimed`` differs from ``true``, recomputed
    from the contributor's committed data, beyond rounding
    (REPORT_TOLERANCE)."""
    if len(claimed.sketch) != len(true.sketch) or len(claimed.distances) != len(true.distances):
        return True
    if not all(math.isfinite(v) for v in claimed.sketch + claimed.distances):
        return True
    off = math.sqrt(math.fsum((a - b) ** 2 for a, b in zip(claimed.sketch, true.sketch,
                                                            strict=True)))
    scale = bound if bound is not None else max(
        math.sqrt(math.fsum(v * v for v in claimed.sketch)),
        math.sqrt(math.fsum(v * v for v in true.sketch)))
    if off > REPORT_TOLERANCE * scale + 1e-30:
        return True
    return any(abs(a - b) > REPORT_TOLERANCE * max(a, b) + 1e-30
               for a, b in zip(claimed.distances, true.distances, strict=True))


def verifiable(aggregator: Aggregator) -> bool:
    """Whether results under ``aggregator`` can be checked (mean, CenteredClip)."""
    return aggregator.name in ("mean", "centered_clip")


def contributor_terms(layout: Layout, part: int,
                      values: torch.Tensor | Sequence[torch.Tensor], result: torch.Tensor,
                      claims: Sequence[ChunkClaim], member: int, *,
                      out: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, tuple[float, ...]]:
    """``member``'s weighted terms of ``part`` (float32, one per value: in
    chunk ``k``, ``p_jk * (x_jk - v_k) / max(tau_k, |x_jk - v_k|)``, or
    ``p_jk * (x_jk - v_k)`` under the mean; 0 where it contributed nothing)
    and its distance to the result per chunk.  ``values``: its values of the
    part exactly as the reducer decoded them (decode its own encoded chunks);
    ``result``: the part as received.  The terms do not depend on a nonce:
    a member computes them once and sketches them for every verifier.  With
    ``out`` (float32, the part's size, ``values`` itself or apart from it)
    they are written there.  ``values`` may also be one tensor per chunk, of
    any float type whose values are exact in float32 (a float16 view of an
    fp16 payload: :func:`own_chunk_values`), read without a copy."""
    import torch

    terms = out if out is not None else torch.empty(result.numel(), dtype=torch.float32)
    per_chunk = not isinstance(values, torch.Tensor)
    distances = []
    for k, (chunk, claim) in enumerate(zip(layout.chunks[part], claims, strict=True)):
        share = claim.share(member)
        lo = chunk.start - chunk.part_start
        hi = lo + chunk.count
        if share == 0:
            terms[lo:hi] = 0.0
            distances.append(0.0)
            continue
        x = values[k] if per_chunk else values[lo:hi]
        if x.dtype != torch.float16:   # float16 minus float32 is computed in float32
            x = x.to(torch.float32)
        difference = torch.sub(x, result[lo:hi].to(torch.float32), out=terms[lo:hi])
        distance = norm64(difference)
        distances.append(distance)
        scale = 1.0 if claim.tau is None else max(float(claim.tau), distance)
        if scale > 0:
            difference.mul_(share / scale)
        else:   # the term is the zero vector
            difference.zero_()
    return terms, tuple(distances)


def sketch(plan: SketchPlan, terms: torch.Tensor) -> tuple[float, ...]:
    """The sketch of ``terms`` under ``plan`` (:func:`sketch_plan`): per
    bucket, the sum of the values that go there with their signs (float32
    sums per row slot, the buckets' sums in float64)."""
    return SketchPlanner().sketch(plan, terms)


def contributor_report(layout: Layout, part: int, values: torch.Tensor, result: torch.Tensor,
                       claims: Sequence[ChunkClaim], member: int, plan: SketchPlan) -> Report:
    """What ``member`` reports of ``part`` for a verifier's ``plan``
    (:func:`sketch_plan`): the sketch of its terms and its distance to the
    result per chunk (:func:`contributor_terms`)."""
    terms, distances = contributor_terms(layout, part, values, result, claims, member)
    return Report(sketch(plan, terms), distances)


def sketch_bound(claims: Sequence[ChunkClaim], member: int) -> float | None:
    """The largest norm ``member``'s sketch may have (NORM_SLACK times the
    longest its weighted terms can be); None under the mean (no bound)."""
    total = 0.0
    for claim in claims:
        share = claim.share(member)
        if share == 0:
            continue
        if claim.tau is None:
            return None
        total += share * share
    return NORM_SLACK * math.sqrt(total)


def result_norms(layout: Layout, part: int, result: torch.Tensor
                 ) -> tuple[tuple[float, float], ...]:
    """Per chunk of ``part``: its codec's error norm at the result's values,
    and an upper bound of their norm (:func:`norm_upper`), what
    :func:`tolerance` reads of the result (computed once, before the reports)."""
    norms = []
    for chunk in layout.chunks[part]:
        lo = chunk.start - chunk.part_start
        values = result[lo:lo + chunk.count]
        upper = norm_upper(values)
        norms.append((chunk.result_codec.error_norm(values, upper), upper))
    return tuple(norms)


def tolerance(layout: Layout, part: int, result: torch.Tensor,
              claims: Sequence[ChunkClaim], distances: Sequence[float] | None = None,
              norms: Sequence[tuple[float, float]] | None = None) -> float:
    """How large the sum of an honest reducer's contributors' sketches may be.

    The result may differ from the exact fixed point by ``e``: its codec's
    rounding (the codec's documented bound), float32 sums (FLOAT32_ULPS per
    contributor of the magnitude of the values summed: the result's, plus
    ``distances[k]``, a typical contributor's distance to it in chunk ``k``)
    and, under CenteredClip, the stopping rule (RESIDUAL_SLACK in units of
    the terms).  That moves the sum of the terms by at most ``|e|`` (mean) or
    ``2 |e| / tau`` (CenteredClip's term ``y / max(tau, |y|)`` changes by at
    most ``2 / tau`` per unit of ``y``), and its sketch by at most NORM_SLACK
    times that.  A chunk of radius 0 adds nothing here (:func:`check_part`
    counts its contributors near the result as unknown instead).  ``norms``:
    :func:`result_norms` of the result, if the caller has them."""
    if norms is None:
        norms = result_norms(layout, part, result)
    squared = 0.0
    for k, claim in enumerate(claims):
        if not claim.contributors:
            continue
        norm = _rounding(norms[k], len(claim.contributors),
                         distances[k] if distances is not None else 0.0)
        if claim.tau is None:
            squared += norm * norm
        elif claim.tau > 0:
            squared += (2 * norm / claim.tau + RESIDUAL_SLACK) ** 2
    return NORM_SLACK * math.sqrt(squared)


def _rounding(norms: tuple[float, float], contributors: int, distance: float) -> float:
    """A bound of the norm of an honest result's rounding in a chunk, from
    its :func:`result_norms` (``norms``)."""
    codec, upper = norms
    magnitude = upper + math.sqrt(contributors) * distance
    return codec + FLOAT32_ULPS * (contributors + 1) * _FLOAT32_EPSILON * magnitude


def check_part(layout: Layout, part: int, result: torch.Tensor,
               claims: Sequence[ChunkClaim], reports: Mapping[int, Report | None],
               norms: Sequence[tuple[float, float]] | None = None) -> Verdict:
    """The verdict on ``part`` from the result as received, the reducer's
    ``claims`` (one per chunk) and every contributor's report (None or
    absent: none came).

    A report of the wrong shape, with a non-finite value, a negative distance
    or a sketch beyond :func:`sketch_bound` makes its contributor a liar; a
    liar's and a missing contributor's sketch counts as unknown within its
    bound (under the mean, unbounded: unverifiable), and so, in a chunk of
    radius 0 (the medoid's values), does the term of a contributor at
    distance 0 (any vector up to 1 long there).  The part fails when the
    known sketches sum to a norm beyond :func:`tolerance` plus the unknown
    ones' bounds, or when a claimed radius is not the rule's (fixed ``tau``:
    the layout's; ``auto``: within a factor TAU_SLACK of the weighted median
    of the reported distances of the chunk's contributors).  ``norms``:
    :func:`result_norms` of the result, if the caller has them."""
    import torch

    aggregator = layout.aggregator
    if not verifiable(aggregator):
        return Verdict("unverifiable", reason=f"the {aggregator.name} rule has no check")
    chunks = layout.chunks[part]
    if len(claims) != len(chunks):
        return Verdict("failed", reason="the claims do not cover the part's chunks")
    beyond = _caps_broken(layout, claims)
    if beyond:
        return Verdict("failed", reason=beyond)
    contributors = sorted({j for claim in claims for j in claim.contributors})
    liars, missing = set(), set()
    known: dict[int, Report] = {}
    for j in contributors:
        report = reports.get(j)
        if report is None:
            missing.add(j)
            continue
        if len(report.sketch) != SKETCH_BUCKETS or len(report.distances) != len(chunks) \
                or not all(math.isfinite(v) for v in report.sketch) \
                or not all(math.isfinite(d) and d >= 0 for d in report.distances):
            liars.add(j)
            continue
        bound = sketch_bound(claims, j)
        if bound is not None and math.sqrt(math.fsum(v * v for v in report.sketch)) > bound:
            liars.add(j)
            continue
        known[j] = report
    slack = 0.0
    for j in sorted(liars | missing):
        bound = sketch_bound(claims, j)
        if bound is None:
            return Verdict("unverifiable", frozenset(liars), frozenset(missing),
                           reason=f"under the mean, member {j}'s sketch is unknown")
        slack += bound
    if norms is None:
        norms = result_norms(layout, part, result)
    radius = _radius_lie(aggregator, claims, known, norms)
    if radius:
        return Verdict("failed", frozenset(liars), frozenset(missing), reason=radius)
    typical = []
    for k, claim in enumerate(claims):
        reported = _reported(claim, known, k)
        typical.append(_weighted_median(reported) if reported else 0.0)
        if claim.tau == 0 and claim.contributors:
            near = _rounding(norms[k], len(claim.contributors), 0.0)
            slack += NORM_SLACK * math.fsum(claim.share(j) for j in claim.contributors
                                            if j in known and known[j].distances[k] <= near)
    allowance = tolerance(layout, part, result, claims, typical, norms) + slack
    total = torch.zeros(SKETCH_BUCKETS, dtype=torch.float64)
    for j in sorted(known):
        total += torch.tensor(known[j].sketch, dtype=torch.float64)
    excess = float(torch.linalg.vector_norm(total)) - allowance
    if excess > 0:
        return Verdict("failed", frozenset(liars), frozenset(missing), excess,
                       f"the contributors' sketches sum {excess:.3g} beyond what rounding "
                       f"and the unknown sketches allow")
    return Verdict("ok", frozenset(liars), frozenset(missing), excess)


def _caps_broken(layout: Layout, claims: Sequence[ChunkClaim]) -> str:
    """Why the claimed weights are not what the layout's caps allow ("" when
    they are): every reducer applies the caps last, so its claims must be
    their own fixed point (within CAPS_TOLERANCE of the largest weight)."""
    if layout.caps is None:
        return ""
    share, ratio = layout.caps
    for k, claim in enumerate(claims):
        weights = list(claim.weights)
        if len(weights) != len(claim.contributors):
            return f"chunk {k}: one weight per contributor is claimed"
        top = max(weights, default=0.0)
        for j, claimed, allowed in zip(claim.contributors, weights,
                                       capped(weights, share, ratio), strict=True):
            if claimed - allowed > CAPS_TOLERANCE * top:
                return (f"chunk {k}: member {j}'s weight {claimed:.6g} is beyond the caps "
                        f"({allowed:.6g})")
    return ""


def _reported(claim: ChunkClaim, known: Mapping[int, Report], k: int
              ) -> list[tuple[float, float]]:
    """(distance, weight) of the chunk's contributors that reported."""
    return [(known[j].distances[k], w) for j, w
            in zip(claim.contributors, claim.weights, strict=True) if j in known and w > 0]


def _radius_lie(aggregator: Aggregator, claims: Sequence[ChunkClaim],
                known: Mapping[int, Report], norms: Sequence[tuple[float, float]]) -> str:
    """Why a claimed radius is not the rule's ("" when every one is).  The
    distances of contributors that did not report (or lied) are unknown: the
    upper check takes them as infinite, the lower one as 0, so a missing
    report never makes an honest radius look wrong.  Both checks allow the
    chunk's rounding (``_rounding`` of its ``norms``) besides the factor
    TAU_SLACK: contributors whose values differ by a few units in the last
    place have distances to the result that rounding alone sets (one of two
    may be 0), and a radius computed before the codec may be below what the
    codec's rounding adds to every distance."""
    for k, claim in enumerate(claims):
        if aggregator.name == "mean":
            if claim.tau is not None:
                return f"chunk {k}: a radius under the mean"
            continue
        if claim.tau is None or not math.isfinite(claim.tau) or claim.tau < 0:
            return f"chunk {k}: no valid radius"
        if aggregator.tau != "auto":
            if claim.tau != float(aggregator.tau):
                return f"chunk {k}: radius {claim.tau:g}, not the rule's {aggregator.tau:g}"
            continue
        unknown = [w for j, w in zip(claim.contributors, claim.weights, strict=True)
                   if j not in known and w > 0]
        reported = _reported(claim, known, k)
        high = _weighted_median(reported + [(math.inf, w) for w in unknown])
        low = _weighted_median(reported + [(0.0, w) for w in unknown])
        rounding = _rounding(norms[k], len(claim.contributors), 0.0)
        if claim.tau > TAU_SLACK * high * (1 + 1e-9) + rounding:
            return (f"chunk {k}: radius {claim.tau:.3g} beyond {TAU_SLACK:g} times the "
                    f"contributors' median distance {high:.3g}")
        if claim.tau * TAU_SLACK + rounding < low * (1 - 1e-9):
            return (f"chunk {k}: radius {claim.tau:.3g} below the contributors' median "
                    f"distance {low:.3g} over {TAU_SLACK:g}")
    return ""


def _weighted_median(pairs: Sequence[tuple[float, float]]) -> float:
    """The upper weighted median of (value, weight) pairs (0 for none)."""
    if not pairs:
        return 0.0
    ordered = sorted(pairs)
    total = math.fsum(w for _, w in ordered)
    cumulative = 0.0
    for value, weight in ordered:
        cumulative += weight
        if cumulative >= total / 2:
            return value
    return ordered[-1][0]


def nonce_commitment(group_id: bytes, member: int, secret: bytes) -> bytes:
    """What ``member`` commits to before it reveals its ``secret`` nonce:
    SHA-256(domain, group, member, secret)."""
    return hashlib.sha256(_COMMIT_NONCE_DOMAIN + len(group_id).to_bytes(1, "big") + group_id
                          + member.to_bytes(2, "big") + secret).digest()


def joint_nonce(group_id: bytes, secrets: Mapping[int, bytes]) -> bytes:
    """The nonce a verifier's plans use: SHA-256(domain, group, then each
    member of ``secrets`` in ascending order with its revealed secret)."""
    digest = hashlib.sha256(_JOINT_DOMAIN + len(group_id).to_bytes(1, "big") + group_id)
    for member in sorted(secrets):
        digest.update(member.to_bytes(2, "big") + len(secrets[member]).to_bytes(1, "big")
                      + secrets[member])
    return digest.digest()


class JointNonce:
    """One member's share in the round's joint nonce, sans-IO
    (protocols/allreduce.md, Verification): commit, then reveal, then join.

    Every verifying member draws a ``secret`` and sends only its commitment
    in its ``ar.have``.  Once it holds the commitments of every partner it
    waits for (or gave up on them), it **closes** the set: only those
    members' secrets, with its own, make its joint nonce, and only now does
    it reveal its secret.  A secret revealed later by another member cannot
    have been chosen knowing this one's: its commitment came first.  Once
    the closed set's secrets are revealed (or it gave up on some), it
    **joins** them into its nonce (:func:`joint_nonce`).  Honest members
    that heard the same reveals get the same nonce, so a contributor's
    report for one serves them all.  If a member of the closed set never
    revealed, the nonce is made of this member's secret alone: whoever
    withholds (after seeing the others' secrets) chooses only between two
    nonces, the full one and one it has no say in, however many withhold;
    it costs the contributors one sketch per part for each such member."""

    def __init__(self, group_id: bytes, me: int, secret: bytes) -> None:
        self.group_id = group_id
        self.me = me
        self.secret = secret
        self.commitment = nonce_commitment(group_id, me, secret)
        #: member -> the commitment its ar.have carried
        self.commitments: dict[int, bytes] = {}
        #: member -> its secret, checked against its commitment
        self.secrets: dict[int, bytes] = {}
        #: members given up on (their exchange failed, or they left)
        self.gone: set[int] = set()
        #: the members whose secrets make the nonce (None until closed)
        self.closed: frozenset[int] | None = None
        #: the joint nonce (None until joined)
        self.nonce: bytes | None = None

    def commit(self, member: int, commitment: bytes) -> None:
        """``member``'s commitment, as its ``ar.have`` carried it (the first counts)."""
        self.commitments.setdefault(member, commitment)

    def committed(self, partners: Sequence[int]) -> bool:
        """Whether every one of ``partners`` committed or was given up on."""
        return all(j in self.commitments or j in self.gone for j in partners)

    def close(self) -> frozenset[int]:
        """Freeze the members whose secrets will count: those that committed
        so far.  Only after this may the secret be revealed."""
        if self.closed is None:
            self.closed = frozenset(self.commitments)
        return self.closed

    def reveal(self, member: int, secret: bytes) -> bool:
        """``member``'s revealed secret: False when it is not the one it
        committed to (or it committed to none)."""
        if len(secret) != NONCE_SIZE or member not in self.commitments \
                or nonce_commitment(self.group_id, member, secret) != self.commitments[member]:
            return False
        self.secrets.setdefault(member, secret)
        return True

    def revealed(self) -> bool:
        """Whether every member of the closed set revealed or was given up on."""
        closed = self.close()
        return all(j in self.secrets or j in self.gone for j in closed)

    def join(self) -> bytes:
        """The joint nonce (fixed by the first call): this member's secret
        and those of the closed set, when every one was revealed; else this
        member's secret alone."""
        if self.nonce is None:
            closed = self.close()
            secrets = {j: s for j, s in self.secrets.items() if j in closed}
            if len(secrets) < len(closed):
                secrets = {}
            secrets[self.me] = self.secret
            self.nonce = joint_nonce(self.group_id, secrets)
        return self.nonce

    @property
    def withheld(self) -> frozenset[int]:
        """Members of the closed set that never revealed."""
        return frozenset(j for j in (self.closed or ()) if j not in self.secrets)


class RoundVerifier:
    """One member's verification of one round, sans-IO.

    Built once the member's round settled, with the parts it holds: for each,
    the result as it holds it, the reducer's claims (None: the reducer said
    too little to be checked) and its digest; and ``values``, which returns
    this member's own values of a part, as its reducer decoded them: written
    into the float32 tensor it is given (of the part's size), or a tensor
    of its own that stays unchanged while the terms are computed, or one
    tensor per chunk (:func:`contributor_terms`).  Its
    buffers come from ``scratch`` (a :class:`Scratch` kept by the caller
    from round to round; a fresh one if None), and go back to it on
    :meth:`close`.  It
    takes part in the round's joint nonce through ``joint`` (this member's
    :class:`JointNonce`; :attr:`nonce` is the joint nonce, fixed on first
    use), answers each other member's joint nonce with this
    member's reports on the parts it contributed to (:meth:`reports_for`:
    one sketch per part and nonce, so members that share a nonce cost one),
    collects the others' reports (:meth:`hear_reports`) and gives a verdict
    per part (:meth:`verdicts`): every part it holds but its own, since
    only the reducer holds every contributor's values of its own part.
    """

    def __init__(self, layout: Layout, group_id: bytes, me: int, joint: JointNonce,
                 results: Mapping[int, torch.Tensor],
                 claims: Mapping[int, Sequence[ChunkClaim] | None],
                 digests: Mapping[int, bytes],
                 values: Callable[[int, torch.Tensor],
                                  torch.Tensor | Sequence[torch.Tensor]],
                 scratch: Scratch | None = None) -> None:
        self.layout = layout
        self.group_id = group_id
        self.me = me
        self.joint = joint
        self.results = dict(results)
        self.claims = dict(claims)
        self.digests = dict(digests)
        self._values = values
        #: part -> this member's terms and distances (the same for every nonce)
        self._terms: dict[int, tuple[torch.Tensor, tuple[float, ...]]] = {}
        #: (part, nonce) -> this member's report (one sketch per distinct nonce)
        self._sketched: dict[tuple[int, bytes], Report] = {}
        #: sketches computed
        self.sketches = 0
        self._scratch = scratch if scratch is not None else Scratch()
        self._buffers: list[torch.Tensor] = []
        #: part -> contributor -> its report (None: its digest differed from ours,
        #: or the report was malformed)
        self.heard: dict[int, dict[int, Report | None]] = {}
        #: (part, contributor) -> the signed report as it came (the caller's wire
        #: form), for a dispute
        self.signed: dict[tuple[int, int], Any] = {}
        #: part -> its reducer's signature over ``digests[part]`` (signed results)
        self.signatures: dict[int, bytes] = {}
        #: part -> :func:`result_norms` of a part this member checks
        self._norms: dict[int, tuple[tuple[float, float], ...]] = {}

    @property
    def nonce(self) -> bytes:
        """The joint nonce this member's plans use (joined on first use)."""
        return self.joint.join()

    @property
    def checked_parts(self) -> list[int]:
        """The parts this member verifies: those it holds with claims, but its own."""
        return sorted(r for r in self.results
                      if r != self.me and self.claims.get(r) is not None)

    def reports_for(self, verifier: int, nonce: bytes, parts: Sequence[int],
                    digests: Sequence[bytes]) -> list[tuple[int, bytes, Report]]:
        """This member's reports, for ``verifier``'s ``nonce``, on the parts
        both hold (``parts``/``digests``: what the verifier said it holds) and
        this member contributed to, but the verifier's own; each with the
        digest of the result this member holds."""
        theirs = dict(zip(parts, digests, strict=False))
        out = []
        for r in sorted(self.results):
            if r == verifier or r not in theirs or not self._contributed(r):
                continue
            out.append((r, self.digests[r], self._report(r, nonce)))
        return out

    def prepare(self) -> Iterator[int]:
        """What needs no nonce, computed ahead, one part at a time (the
        caller may do other work between parts; each part yielded is done):
        this member's terms of every part it contributed to, and the result
        norms of every part it checks.  Reports and verdicts compute what is
        still missing themselves."""
        for r in sorted(self.results):
            if self._contributed(r) and r not in self._terms:
                self._terms_of(r)
                yield r
        for r in self.checked_parts:
            if r not in self._norms:
                self._norms_of(r)
                yield r

    def _contributed(self, part: int) -> bool:
        """Whether the reducer of ``part`` counted this member (its claims name it)."""
        claims = self.claims.get(part)
        return claims is not None and any(self.me in c.contributors for c in claims)

    def _terms_of(self, part: int) -> tuple[torch.Tensor, tuple[float, ...]]:
        """This member's terms of ``part`` and its distances (computed once)."""
        if part not in self._terms:
            claims = self.claims[part]
            assert claims is not None
            numel = self.results[part].numel()
            buffer = self._scratch.take(numel)
            self._buffers.append(buffer)
            values = self._values(part, buffer[:numel])
            self._terms[part] = contributor_terms(self.layout, part, values,
                                                  self.results[part], claims, self.me,
                                                  out=buffer[:numel])
        return self._terms[part]

    def _norms_of(self, part: int) -> tuple[tuple[float, float], ...]:
        """:func:`result_norms` of a part this member checks (computed once)."""
        if part not in self._norms:
            self._norms[part] = result_norms(self.layout, part, self.results[part])
        return self._norms[part]

    def _report(self, part: int, nonce: bytes) -> Report:
        """This member's report on ``part`` for ``nonce`` (sketched once per nonce)."""
        known = self._sketched.get((part, nonce))
        if known is not None:
            return known
        terms, distances = self._terms_of(part)
        planner = self._scratch.planner
        plan = planner.plan(self.group_id, part, nonce, terms.numel())
        report = Report(planner.sketch(plan, terms), distances)
        self.sketches += 1
        if len(self._sketched) < MAX_SKETCHED:
            self._sketched[part, nonce] = report
        return report

    def hear_reports(self, member: int, reports: Sequence[tuple[int, bytes, Report | None]]
                     ) -> None:
        """``member``'s reports for this member's nonce.  A report on a part
        this member does not check, a second one, or one whose digest is not
        the result this member holds counts as none (the member or the
        reducer lied; which one, only signatures can tell)."""
        for part, digest, report in reports:
            if part not in self.checked_parts or member in self.heard.get(part, {}):
                continue
            self.heard.setdefault(part, {})[member] = \
                report if digest == self.digests.get(part) else None

    def verdicts(self) -> dict[int, Verdict]:
        """A verdict on every part this member checks, from what it heard and its
        own report (it contributed to the part, or not)."""
        return {r: check_part(self.layout, r, self.results[r], self.part_claims(r),
                              self._reports(r), self._norms_of(r)) for r in self.checked_parts}

    def part_claims(self, part: int) -> Sequence[ChunkClaim]:
        """The reducer's claims of a part this member checks."""
        claims = self.claims[part]
        assert claims is not None
        return claims

    def _reports(self, part: int) -> dict[int, Report | None]:
        """The reports on ``part`` as heard, with this member's own."""
        reports = dict(self.heard.get(part, {}))
        if self._contributed(part):
            reports[self.me] = self._report(part, self.nonce)
        return reports

    def close(self) -> None:
        """Give this verifier's buffers back to its scratch: its round is
        over (its terms are computed again if it is asked for a report)."""
        self._terms.clear()
        self._norms.clear()
        self._sketched.clear()
        buffers, self._buffers = self._buffers, []
        self._scratch.give(buffers)

    def plan(self, part: int) -> SketchPlan:
        """This member's sketch plan of ``part``."""
        return sketch_plan(self.group_id, part, self.nonce, self.results[part].numel())

    def reconsider(self, part: int, shown: Mapping[int, torch.Tensor]
                   ) -> tuple[frozenset[int], Verdict]:
        """The verdict on ``part`` once its reducer showed the committed values
        (``shown``: contributor -> its values as the reducer decoded them,
        checked against its signed digests) of the contributors whose
        reports it disputes: each one's report is recomputed from them, and
        those whose report as heard differs are proven liars (returned)."""
        claims = self.part_claims(part)
        reports = self._reports(part)
        plan = self.plan(part)
        liars = set()
        for j, values in sorted(shown.items()):
            if j == self.me or not any(j in c.contributors for c in claims):
                continue
            true = contributor_report(self.layout, part, values, self.results[part], claims,
                                      j, plan)
            heard = reports.get(j)
            if heard is not None and deviates(heard, true, sketch_bound(claims, j)):
                liars.add(j)
            reports[j] = true
        return frozenset(liars), check_part(self.layout, part, self.results[part], claims,
                                            reports, self._norms_of(part))
