"""How a reducer combines the group's copies of one chunk, sans-IO.

An :class:`Aggregator` takes the contributors' values of one chunk as the
rows of a matrix and their weights (already bounded by evidence and the
share cap) and returns one row.  Four rules:

* ``mean`` -- the weighted mean: exact, cheapest, and not robust: one
  contributor with finite values of any size moves it anywhere.
* ``centered_clip`` -- CenteredClip (Karimireddy et al. 2021, as BTARD
  uses it per all-reduce part): the fixed point ``v`` of
  ``v <- v + sum_i p_i * min(1, tau / |x_i - v|) * (x_i - v)`` (``p_i`` the
  normalised weights, ``|.|`` the Euclidean norm over the chunk), to
  ``tolerance * tau``.  At the fixed point the contributors' clipped
  differences cancel, and each is at most ``tau`` long whatever its values:
  when the honest contributors' values lie within ``tau`` of the result,
  it is within ``(p_bad / p_honest) * tau`` of the honest (weighted) mean.
  ``tau="auto"`` takes the radius from each chunk's own contributors:
  AUTO_TAU_FACTOR times the weighted lower median of their distances to the
  weighted medoid, the medoid's own counted as 0 (:func:`auto_tau`), which a
  minority cannot move outside the honest distances.
* ``trimmed_mean`` -- per coordinate, the weighted mean of the values that
  remain once a ``trim`` share of the total weight is cut from each end.
* ``median`` -- the weighted coordinate-wise (lower) median.

Every rule is deterministic (the same inputs give the same bits on the
same build), returns only finite values for finite inputs, and with one
contributor returns its values.  The rows are read in blocks of
BLOCK_VALUES columns: beyond the rows themselves a rule allocates
``O(contributors x BLOCK_VALUES)`` (a sort of one block for the
coordinate-wise rules; CenteredClip's Gram matrix reads GRAM_VALUES values
of all rows at a time).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgpack

from ..errors import ConfigError

if TYPE_CHECKING:
    import torch

__all__ = ["Aggregator", "AGGREGATORS", "MAX_CLIP_ITERATIONS", "AUTO_TAU_FACTOR", "AUTO",
           "centered_clip", "centered_clip_reference", "auto_tau", "GRAM_VALUES"]

#: The aggregation rules, by name.
AGGREGATORS = ("mean", "centered_clip", "trimmed_mean", "median")
#: The most CenteredClip iterations a configuration may ask for.
MAX_CLIP_ITERATIONS = 1000
#: Columns a rule reads at a time (its scratch memory is rows x this many values).
BLOCK_VALUES = 2**15
#: CenteredClip's Gram matrix reads this many values of all rows at a time
#: (at least BLOCK_VALUES / 8 columns): 8 bytes of scratch per value.
GRAM_VALUES = 2**19
#: Up to this many rows CenteredClip's Gram matrix is summed as one dot
#: product per pair (a matrix product of so few rows runs at half the speed).
GRAM_DOT_ROWS = 5
#: ``tau="auto"``: the radius is this many times the chunk's typical distance
#: (the weighted lower median of the contributors' distances to the medoid).
AUTO_TAU_FACTOR = 1.0
#: The value of ``Aggregator.tau`` that asks for the radius of each chunk.
AUTO = "auto"


@dataclasses.dataclass(frozen=True)
class Aggregator:
    """An aggregation rule and its parameters.  Every member of a group must
    use the same one (it is part of the all-reduce layout digest).

    Attributes:
        name: one of AGGREGATORS.  Default ``mean``.
        tau: CenteredClip's clipping radius, in the units of the averaged
            values (the Euclidean norm of one chunk's difference), or
            ``"auto"``: each chunk's own, AUTO_TAU_FACTOR times the weighted
            lower median of its contributors' distances to their weighted
            medoid, the medoid's own (0) included (:func:`auto_tau`), so no
            tuning per model.  Default 1.0
            (BTARD's ALBERT runs); a number must be chosen near the norm of
            honest differences, or gradients clipped in the Optimizer
            (``OptimizerConfig.clip_sent_norm``: what each peer sends) so
            that it is.
        iterations: CenteredClip's most iterations.  They cost almost
            nothing (they run on a Gram matrix of the contributors, not on
            the values), so the default is 100, past BTARD's 20: the result
            is then a fixed point to ``tolerance``, which reducer
            verification relies on.  1..MAX_CLIP_ITERATIONS.
        tolerance: CenteredClip stops once a step is at most
            ``tolerance * tau``.  Default 1e-6.
        trim: ``trimmed_mean``'s share of the total weight cut from each
            end, in [0, 0.5).  Default 0.25.
    """

    name: str = "mean"
    tau: float | str = 1.0
    iterations: int = 100
    tolerance: float = 1e-6
    trim: float = 0.25

    def __post_init__(self) -> None:
        def check(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"Aggregator: {what}")

        check(self.name in AGGREGATORS,
              f"name must be one of {', '.join(AGGREGATORS)}, got {self.name!r}")
        check(self.tau == AUTO or (_number(self.tau) and self.tau > 0),
              f"tau must be a positive number or {AUTO!r}")
        check(isinstance(self.iterations, int) and not isinstance(self.iterations, bool)
              and 1 <= self.iterations <= MAX_CLIP_ITERATIONS,
              f"iterations must be an integer in 1..{MAX_CLIP_ITERATIONS}")
        check(_number(self.tolerance) and self.tolerance >= 0,
              "tolerance must be a number >= 0")
        check(_number(self.trim) and 0 <= self.trim < 0.5, "trim must be in [0, 0.5)")

    @property
    def robust(self) -> bool:
        """Whether the rule bounds what one contributor's values can do."""
        return self.name != "mean"

    def describe(self) -> list[object]:
        """The rule and the parameters it uses, as every member must agree on
        them (msgpack-friendly, part of the layout digest)."""
        if self.name == "centered_clip":
            tau = AUTO if self.tau == AUTO else float(self.tau)
            return [self.name, tau, int(self.iterations), float(self.tolerance)]
        if self.name == "trimmed_mean":
            return [self.name, float(self.trim)]
        return [self.name]

    def digest(self) -> bytes | None:
        """SHA-256 of :meth:`describe` (what matchmaking compares); None
        for the mean, as peers that know no other rule send."""
        if self.name == "mean":
            return None
        return hashlib.sha256(msgpack.packb(["p2pdl/aggregator/1", self.describe()])).digest()

    def aggregate(self, rows: Sequence[torch.Tensor], weights: Sequence[float],
                  out: torch.Tensor, radii: list[float] | None = None) -> list[float] | None:
        """Write the aggregate of ``rows`` (one 1-D float32 tensor per
        contributor, or a matrix of them) with positive ``weights`` into
        ``out``.  Returns each row's distance to the result (the Euclidean
        norm of ``row - out``) for the robust rules, None for the mean.
        Under CenteredClip the radius used (``tau``, or the chunk's own with
        ``"auto"``; 0 for a single row) is appended to ``radii`` if given.

        The rows are read in blocks of BLOCK_VALUES columns, so beyond them
        only ``O(rows x BLOCK_VALUES)`` is allocated.
        """
        import torch

        n = len(rows)
        if n != len(weights) or n == 0:
            raise ValueError("one positive weight per row, at least one row")
        total = math.fsum(weights)
        if self.name == "mean":
            if n == 1:
                out.copy_(rows[0])
                return None
            out.zero_()
            for k in range(n):
                out.add_(rows[k], alpha=weights[k] / total)
            return None
        if n == 1:
            out.copy_(rows[0])
            if radii is not None and self.name == "centered_clip":
                radii.append(0.0 if self.tau == AUTO else float(self.tau))
            return [0.0]
        p = torch.tensor([w / total for w in weights], dtype=torch.float64)
        if self.name == "centered_clip":
            tau = None if self.tau == AUTO else float(self.tau)
            return centered_clip(rows, p, out, tau, self.iterations, self.tolerance, radii)
        for lo in range(0, out.numel(), BLOCK_VALUES):
            hi = min(out.numel(), lo + BLOCK_VALUES)
            block = torch.stack([row[lo:hi] for row in rows])
            if self.name == "median":
                _weighted_quantile(block, p.to(torch.float32), 0.5, out[lo:hi])
            else:
                _trimmed_mean(block, p.to(torch.float32), self.trim, out[lo:hi])
        return [float(torch.dist(row, out)) for row in rows]


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


def centered_clip(rows: Sequence[torch.Tensor], p: torch.Tensor, out: torch.Tensor,
                  tau: float | None, iterations: int, tolerance: float,
                  radii: list[float] | None = None) -> list[float]:
    """CenteredClip's fixed point of ``rows`` with normalised weights ``p``,
    written into ``out``; each row's distance to it.  ``tau`` None: the
    chunk's own radius, :func:`auto_tau`.  The radius used is appended to
    ``radii`` if given.

    The fixed point ``v = v + sum_i p_i min(1, tau / |x_i - v|) (x_i - v)``
    is the minimiser of the convex ``sum_i p_i huber_tau(|x_i - v|)``.  It is
    found by iteratively reweighted least squares, ``v <- sum_i a_i x_i /
    sum_i a_i`` with ``a_i = p_i min(1, tau / |x_i - v|)``: the same fixed
    point as BTARD's step (which is this one scaled by ``sum_i a_i``), and
    reached in far fewer steps when many values are clipped.  It starts at
    the weighted medoid (the row with the least weighted sum of distances to
    the others: a contributor's own values, so honest when most of the
    weight is), not at the coordinate median, whose sort costs ten times the
    rest; the start changes the steps taken, not the fixed point.

    Every iterate is ``sum_j beta_j x_j`` with ``sum_j beta_j = 1``, so the
    steps run on the coefficients ``beta`` and the Gram matrix ``G`` of the
    differences ``d_j = x_j - x_0`` (float64, built block by block):
    ``|x_i - v|^2 = G_ii - 2 (G beta)_i + beta' G beta``.  The values are
    read twice in all (the Gram matrix, then ``out = sum_j beta_j x_j``),
    however many steps are taken.
    """
    import torch

    n = len(rows)
    numel = out.numel()
    p = p.to(torch.float64)
    gram = torch.zeros((n, n), dtype=torch.float64)
    # d_0 is zero: the Gram matrix of d_1 .. d_{n-1}, in blocks of GRAM_VALUES
    # values in all (fewer, wider blocks: each costs a few calls' overhead).
    block = max(BLOCK_VALUES // 8, GRAM_VALUES // max(1, n - 1))
    width = min(block, max(1, numel))
    wide = torch.empty((n - 1, width), dtype=torch.float64)
    inner = gram[1:, 1:]
    pairs = [(i, j) for i in range(n - 1) for j in range(i, n - 1)] if n <= GRAM_DOT_ROWS \
        else None
    sums: dict[tuple[int, int], list[float]] = {pair: [] for pair in pairs or ()}
    for lo in range(0, numel if n > 1 else 0, block):
        hi = min(numel, lo + block)
        d64 = wide[:, :hi - lo]
        for i, row in enumerate(rows[1:]):
            # The float32 difference, rounded as float32, written as float64.
            torch.sub(row[lo:hi], rows[0][lo:hi], out=d64[i])
        if pairs is None:
            inner.addmm_(d64, d64.T)
            continue
        for i, j in pairs:
            sums[i, j].append(float(d64[i].dot(d64[j])))
    for (i, j), values in sums.items():
        inner[i, j] = inner[j, i] = math.fsum(values)
    diagonal = torch.diagonal(gram)
    distances = torch.sqrt(torch.clamp(diagonal.unsqueeze(0) + diagonal.unsqueeze(1)
                                       - 2 * gram, min=0.0))
    medoid = int(torch.argmin(distances @ p))
    beta = torch.zeros(n, dtype=torch.float64)
    beta[medoid] = 1.0
    if tau is None:
        tau = auto_tau(distances, p, medoid)
    if radii is not None:
        radii.append(tau)
    if tau <= 0:   # more than half of the weight holds the medoid's very values
        out.copy_(rows[medoid])
        return distances[medoid].tolist()
    limit = (tolerance * tau) ** 2
    for _ in range(iterations):
        squared = _squared_distances(gram, beta)
        a = p * torch.clamp(tau / torch.clamp(torch.sqrt(squared), min=1e-300), max=1.0)
        delta = a / a.sum() - beta
        beta = beta + delta
        if float(delta @ (gram @ delta)) <= limit:
            break
    out.zero_()
    for row, coefficient in zip(rows, beta.tolist(), strict=True):
        if coefficient != 0.0:
            out.add_(row, alpha=coefficient)
    return torch.sqrt(_squared_distances(gram, beta)).tolist()


def auto_tau(distances: torch.Tensor, p: torch.Tensor, medoid: int) -> float:
    """The radius of ``tau="auto"``: AUTO_TAU_FACTOR times the weighted lower
    median of the rows' distances to the ``medoid`` (weights ``p``), the
    medoid itself counted at distance 0 with its weight, from the pairwise
    ``distances`` (float64).  With two rows it is their distance, so neither
    is clipped (their weighted mean).

    While the rows of less than half of the weight lie elsewhere, the median
    is the distance of an honest row (or 0): honest rows near the honest
    mean are barely clipped, every other row is clipped to that radius.
    (Leaving the medoid out would let a malicious row of one third of three
    rows' weight, heavier than the third, set the radius to its own
    distance.)
    """
    import torch

    n = len(p)
    others = [i for i in range(n) if i != medoid]
    if not others:
        return 0.0
    if n == 2:
        return AUTO_TAU_FACTOR * float(distances[medoid, others[0]])
    radii = distances[medoid].to(torch.float64).clone()
    radii[medoid] = 0.0
    weights = p.to(torch.float64)
    order = torch.argsort(radii, stable=True)
    cumulative = torch.cumsum(weights[order], dim=0) / weights.sum()
    index = int(torch.searchsorted(cumulative, torch.tensor(0.5 - 1e-12, dtype=torch.float64)))
    index = min(index, n - 1)
    return AUTO_TAU_FACTOR * float(radii[order[index]])


def _squared_distances(gram: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    import torch

    g_beta = gram @ beta
    return torch.clamp(torch.diagonal(gram) - 2 * g_beta + beta @ g_beta, min=0.0)


def centered_clip_reference(rows: torch.Tensor, p: torch.Tensor, v: torch.Tensor, tau: float,
                            iterations: int, tolerance: float) -> int:
    """CenteredClip as written: every step over the values themselves
    (float64).  The check of :func:`centered_clip`; slow."""
    import torch

    x = rows.to(torch.float64)
    w = p.to(torch.float64)
    u = v.to(torch.float64)
    steps = iterations
    for k in range(iterations):
        diff = x - u
        norms = torch.linalg.vector_norm(diff, dim=1)
        scale = torch.clamp(tau / torch.clamp(norms, min=1e-300), max=1.0)
        step = torch.mv(diff.T, w * scale)
        u = u + step
        if float(torch.linalg.vector_norm(step)) ** 2 <= (tolerance * tau) ** 2:
            steps = k + 1
            break
    v.copy_(u.to(torch.float32))
    return steps


def _weighted_quantile(rows: torch.Tensor, p: torch.Tensor, q: float,
                       out: torch.Tensor) -> None:
    """Per column, the first sorted value whose cumulative weight reaches
    ``q`` of the total (the lower weighted median for q = 0.5)."""
    import torch

    values, order = torch.sort(rows, dim=0, stable=True)
    cumulative = torch.cumsum(p[order], dim=0)
    # The first row whose cumulative weight reaches q (a float guard below
    # q keeps equal weights on the lower median, as torch.median does).
    reached = cumulative >= (q - 1e-6)
    index = torch.argmax(reached.to(torch.uint8), dim=0, keepdim=True)
    out.copy_(torch.gather(values, 0, index).squeeze(0))


def _trimmed_mean(rows: torch.Tensor, p: torch.Tensor, trim: float,
                  out: torch.Tensor) -> None:
    """Per column, the weighted mean of the values in the weight interval
    ``[trim, 1 - trim]`` of the sorted values (partly cut rows count for
    the part that remains)."""
    import torch

    values, order = torch.sort(rows, dim=0, stable=True)
    weights = p[order]
    upper = torch.cumsum(weights, dim=0)
    lower = upper - weights
    kept = torch.clamp(torch.minimum(upper, torch.tensor(1.0 - trim))
                       - torch.maximum(lower, torch.tensor(float(trim))), min=0.0)
    total = kept.sum(dim=0)
    torch.sum(values * kept, dim=0, out=out)
    out.div_(torch.clamp(total, min=1e-30))
