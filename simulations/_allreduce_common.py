"""What every worker of bench_allreduce.py shares: the argv, the data, the truth,
the error check and the worker's side of the protocol (on simulations/_harness.py).
Plain torch + stdlib, so that it imports in p2pdl's environment and in
hivemind's (both have torch 2.13);
workers run as ``python -m simulations._<system>_allreduce`` from the
repository root and import it as ``simulations._allreduce_common``.

Data.  Round ``r`` (0 = the untimed warm-up, 1..R timed) gives peer ``i`` the
tensors of :func:`tensor_shapes` (uneven, 13 of them for 10M values: like a
model's parameters), drawn by ``torch.randn`` from a generator seeded with
:func:`seed` (r, i), and the weight ``w_i = 1 + i``.  The truth is
``sum_i w_i x_i / sum_i w_i``, which every worker recomputes itself by
regenerating all peers' inputs (N × numel normals: ~50 ms per 10M).

Correct.  A peer's round is correct when the largest absolute difference
between its result and the truth over all values is at most
:func:`tolerance`: ``1e-5 · max|x|`` for codec none (float32 sums of N terms
err by ~N · 6e-8 · max|x|) and ``max(4, N) · 2^-11 · max|x|`` for fp16, where
``max|x|`` is the largest magnitude of any peer's input in that round and
2^-11 is fp16's unit roundoff.  The fp16 bound is the worst case of each
scheme we measure: rounding every input, every partial sum of a pre-weighted
fp16 sum and the output once each (gloo: N roundings), or rounding the inputs,
the sender's own input and the returned difference ``avg - x`` (|.| <= 2 max|x|)
once each (hivemind: 4).
"""

import argparse
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch

from simulations import _harness as harness

CODECS = ("none", "fp16")
FP16_UNIT_ROUNDOFF = 2.0 ** -11
BASE_SEED = 20_240_601


# ---------------------------------------------------------------- data, truth, check

def tensor_shapes(numel: int) -> list[tuple[int, ...]]:
    """Uneven shapes summing to ``numel`` (for 10M: 4M, [1.5M, 2], [1000, 1000],
    8 × [1000], [37, 101] and the 1,988,263 left as one vector)."""
    shapes: list[tuple[int, ...]] = []
    left = numel

    def take(shape: tuple[int, ...]) -> None:
        nonlocal left
        n = math.prod(shape)
        if 0 < n <= left:
            shapes.append(shape)
            left -= n

    take((numel * 4 // 10,))
    take((numel * 3 // 20, 2))
    take((1000, 1000))
    for _ in range(8):
        take((1000,))
    take((37, 101))
    if left:
        shapes.append((left,))
    return shapes


def weight(rank: int) -> float:
    """Peer ``rank``'s weight (its sample count)."""
    return float(1 + rank)


def seed(round_: int, rank: int) -> int:
    return BASE_SEED + 1000 * round_ + rank


def make_inputs(round_: int, rank: int, numel: int) -> list[torch.Tensor]:
    """Peer ``rank``'s tensors for round ``round_``: fresh tensors, each its own storage."""
    generator = torch.Generator().manual_seed(seed(round_, rank))
    return [torch.randn(shape, generator=generator) for shape in tensor_shapes(numel)]


def tolerance(codec: str, peers: int, max_abs: float) -> float:
    if codec == "none":
        return 1e-5 * max_abs
    if codec == "fp16":
        return max(4, peers) * FP16_UNIT_ROUNDOFF * max_abs
    raise ValueError(f"unknown codec {codec!r}")


def truth(round_: int, peers: int, numel: int) -> tuple[list[torch.Tensor], float]:
    """The weighted mean of all peers' inputs in round ``round_`` and the largest |x|."""
    total = sum(weight(i) for i in range(peers))
    mean: list[torch.Tensor] | None = None
    max_abs = 0.0
    for i in range(peers):
        xs = make_inputs(round_, i, numel)
        for x in xs:
            low, high = torch.aminmax(x)
            max_abs = max(max_abs, -float(low), float(high))
        if mean is None:
            mean = [x.mul_(weight(i) / total) for x in xs]
        else:
            for m, x in zip(mean, xs, strict=True):
                m.add_(x, alpha=weight(i) / total)
    assert mean is not None
    return mean, max_abs


def max_error(result: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> float:
    """Largest |result - expected| over all values (inf if the shapes differ or a value
    is not finite)."""
    if len(result) != len(expected):
        return math.inf
    worst = 0.0
    for got, want in zip(result, expected, strict=True):
        if tuple(got.shape) != tuple(want.shape):
            return math.inf
        err = float((got.detach().to(torch.float32) - want).abs().max()) if want.numel() else 0.0
        if not math.isfinite(err):
            return math.inf
        worst = max(worst, err)
    return worst


# ---------------------------------------------------------------- the worker's side of the protocol

def worker_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The argv every worker gets (see bench_allreduce.py)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--peers", type=int, required=True)
    parser.add_argument("--rounds", type=int, required=True, help="timed rounds (plus warm-up 0)")
    parser.add_argument("--codec", choices=CODECS, required=True)
    parser.add_argument("--numel", type=int, required=True)
    parser.add_argument("--timeout", type=float, required=True,
                        help="seconds left for the whole run: bound every wait by it")
    parser.add_argument("--aggregator", default="mean",
                        help="p2pdl's aggregation rule (p2pdl.averaging.AGGREGATORS; "
                             "bench_robust.py); other systems take only the mean")
    args = parser.parse_args(argv)
    args.deadline = time.time() + args.timeout
    return args


class Worker:
    """One peer's side of the parent <-> worker protocol (see bench_allreduce.py), on
    simulations._harness's events and commands.

    ``prepare`` (heavy) before ``ready``; ``exchange``, ``ready`` and ``done`` block
    on stdin until the parent releases every peer: call them from a thread in an
    async worker (``trio.to_thread.run_sync`` / ``loop.run_in_executor``) so the
    event loop keeps serving peers meanwhile.  Every wait ends at the run's
    deadline."""

    def __init__(self, argv: Sequence[str] | None = None) -> None:
        self.args = worker_args(argv)
        self.rank, self.peers = self.args.rank, self.args.peers
        self.rounds, self.codec, self.numel = self.args.rounds, self.args.codec, self.args.numel
        self.aggregator: str = self.args.aggregator
        self.deadline: float = self.args.deadline
        self.weight = weight(self.rank)
        self.total_weight = sum(weight(i) for i in range(self.peers))
        self._truth: list[torch.Tensor] | None = None
        self._tol = math.inf
        # the peers share 2 cores here: one intra-op thread each, for every system alike
        torch.set_num_threads(1)

    def left(self) -> float:
        """Seconds left before the run's deadline."""
        return max(0.0, self.deadline - time.time())

    def exchange(self, info: dict) -> list[dict]:
        """Tell the others ``info`` (addresses, a port) through the parent; every
        peer's info, in rank order, once all have told theirs."""
        return harness.exchange(info, timeout=self.left())

    # -- rounds

    def prepare(self, round_: int) -> list[torch.Tensor]:
        """This peer's inputs for ``round_``; also computes the truth that the round is
        checked against."""
        self._truth, max_abs = truth(round_, self.peers, self.numel)
        self._tol = tolerance(self.codec, self.peers, max_abs)
        return make_inputs(round_, self.rank, self.numel)

    def ready(self, round_: int) -> float:
        """Say ready for ``round_``, wait for the parent's go; returns time.time() at the go."""
        harness.emit("ready", round=round_, rank=self.rank)
        harness.wait_command("go", timeout=self.left())
        return time.time()

    def done(self, round_: int, t_start: float, t_end: float, error: str | None = None,
             note: str | None = None, cpu_s: float | None = None) -> None:
        """Report the round's times (time.time()), and why it failed (``error``) or anything
        worth knowing (``note``: goes into the row's note), and the CPU-seconds the round
        took this peer's process (``cpu_s``, where it measures them); wait until every peer
        is done."""
        extra: dict[str, Any] = {"note": note} if note else {}
        if cpu_s is not None:
            extra["cpu_s"] = cpu_s
        harness.emit("done", round=round_, rank=self.rank, t_start=t_start, t_end=t_end,
                     error=error, **extra)
        harness.wait_command("next", timeout=self.left())

    def check(self, round_: int, result: Sequence[torch.Tensor] | None) -> float:
        """Compare ``result`` (None: the round failed) with the truth and report it."""
        err = math.inf if result is None or self._truth is None else max_error(result, self._truth)
        harness.emit("result", round=round_, rank=self.rank,
                     max_err=err if math.isfinite(err) else None, tol=self._tol,
                     ok=err <= self._tol)
        self._truth = None
        return err

    def reporting(self) -> Any:
        """Around the worker's main: an exception is sent as ``fatal`` and raised again."""
        return harness.reporting(rank=self.rank)


def log(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)
