"""Norms of large float32 tensors without large temporaries.

``torch.linalg.vector_norm(t, dtype=torch.float64)`` first makes a float64
copy of the whole of ``t``: for a chunk of a million values that is 8 MB of
fresh pages, and where a page fault is dear (virtual machines: several
microseconds a page, so ~10 ms per 10 MB) the copy costs more than the norm.
:func:`norm64` converts and sums block by block instead, in a float64
buffer of WIDE_BLOCK_VALUES values that each thread keeps (2 MiB: converted
into again and again, it costs no fresh pages, and a few wide blocks cost
fewer calls than many narrow ones, each of which wakes torch's threads);
:func:`norm_upper` bounds the norm from above with float32 sums and no
temporary at all (for allowances, where a bound serves and speed counts).
"""

from __future__ import annotations

import math
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["BLOCK_VALUES", "FLOAT32_SUM_SLACK", "WIDE_BLOCK_VALUES", "norm64", "norm_upper"]

#: Values per block of :func:`norm_upper` (its float32 sums' slack grows with it).
BLOCK_VALUES = 1 << 15
#: Values per block of :func:`norm64`, and of the float64 buffer each thread
#: that calls it keeps (2 MiB).
WIDE_BLOCK_VALUES = 1 << 18
#: A float32 sum of a block's squares (non-negative terms, each rounded, then
#: added in any order) is within ``BLOCK_VALUES * 2**-24`` (0.2 %) of the
#: exact sum; :func:`norm_upper` raises each block's sum by twice that.
FLOAT32_SUM_SLACK = 2 * BLOCK_VALUES * 2.0**-24


def norm64(t: torch.Tensor, *, floor: float | None = None) -> float:
    """The Euclidean norm of ``t``'s values (of ``max(|t_i|, floor)`` with
    ``floor``), each block's sum of squares in float64 and the blocks' sums
    added exactly (``math.fsum``)."""
    flat = t.reshape(-1)
    numel = flat.numel()
    wide = _wide_buffer(min(numel, WIDE_BLOCK_VALUES))
    sums = []
    for i in range(0, numel, WIDE_BLOCK_VALUES):
        piece = wide[:min(WIDE_BLOCK_VALUES, numel - i)]
        piece.copy_(flat[i:i + WIDE_BLOCK_VALUES])
        if floor is not None:
            piece.abs_().clamp_(min=floor)
        sums.append(float(piece.dot(piece)))
    return math.sqrt(math.fsum(sums))


_kept = threading.local()


def _wide_buffer(numel: int) -> torch.Tensor:
    """This thread's float64 buffer of at least ``numel`` values (at most
    WIDE_BLOCK_VALUES are asked for)."""
    import torch

    buffer = getattr(_kept, "wide", None)
    if buffer is None or buffer.numel() < numel:
        buffer = _kept.wide = torch.empty(max(numel, 1), dtype=torch.float64)
    return buffer


def norm_upper(t: torch.Tensor) -> float:
    """An upper bound of the Euclidean norm of float32 ``t``, at most 0.2 %
    above it: each block's sum of squares in float32 (``torch.dot``, no
    temporary), raised by FLOAT32_SUM_SLACK, the blocks' sums added exactly;
    :func:`norm64` where a float32 square overflows (values beyond 1.8e19)."""
    flat = t.reshape(-1)
    sums = []
    for i in range(0, flat.numel(), BLOCK_VALUES):
        piece = flat[i:i + BLOCK_VALUES]
        sums.append(float(piece.dot(piece)))
    total = math.fsum(sums)
    if not math.isfinite(total):
        return norm64(t)
    return math.sqrt(total * (1 + FLOAT32_SUM_SLACK))
