"""Norms of large float32 tensors, summed in float64, without large temporaries.

``torch.linalg.vector_norm(t, dtype=torch.float64)`` first makes a float64
copy of the whole of ``t``: for a chunk of a million values that is 8 MB of
fresh pages, and where a page fault is dear (virtual machines: several
microseconds a page, so ~10 ms per 10 MB) the copy costs more than the norm.
:func:`norm64` converts and sums block by block instead, in temporaries of
BLOCK_VALUES values that the allocator hands out again and again.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["BLOCK_VALUES", "norm64"]

#: Values per block (256 KiB in float64).
BLOCK_VALUES = 1 << 15


def norm64(t: torch.Tensor, *, floor: float | None = None) -> float:
    """The Euclidean norm of ``t``'s values (of ``max(|t_i|, floor)`` with
    ``floor``), each block's sum of squares in float64 and the blocks' sums
    added exactly (``math.fsum``)."""
    import torch

    flat = t.reshape(-1)
    sums = []
    for i in range(0, flat.numel(), BLOCK_VALUES):
        piece = flat[i:i + BLOCK_VALUES].to(torch.float64, copy=True)
        if floor is not None:
            piece.abs_().clamp_(min=floor)
        sums.append(float(torch.dot(piece, piece)))
    return math.sqrt(math.fsum(sums))
