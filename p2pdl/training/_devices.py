"""Tensors on accelerators: what a round sends is staged in host memory.

The all-reduce works on host (CPU) float32 tensors.  Parameters, gradients
and optimizer state may live on any torch device; :class:`HostStaging`
copies what a round sends from its device into host buffers it keeps from
round to round (page-locked where CUDA is available, so the copies run
asynchronously: one synchronisation per round, not one per tensor), and
:func:`to_device` brings a round's results back next to the tensor they
update.  Host tensors pass through without a copy.  Device memory stays
what the training needs: nothing is staged on the device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["HostStaging", "to_device"]


class HostStaging:
    """Host buffers for the device tensors a round sends, reused every round.

    ``stage(tensors)`` returns the tensors with every non-CPU one replaced by
    its host copy; the copies are complete when it returns.  A buffer is
    reused by the next ``stage`` (the caller finishes with a round's tensors
    before staging the next round's).
    """

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor | None] = []
        #: bytes held in host buffers (for tools and benchmarks)
        self.nbytes = 0

    def stage(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        staged: list[torch.Tensor] = []
        devices: set[torch.device] = set()
        for i, t in enumerate(tensors):
            if t.device.type == "cpu":
                staged.append(t)
                continue
            buffer = self._buffer(i, t)
            buffer.copy_(t.detach(), non_blocking=buffer.is_pinned())
            devices.add(t.device)
            staged.append(buffer)
        for device in devices:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        return staged

    def _buffer(self, i: int, like: torch.Tensor) -> torch.Tensor:
        while len(self._buffers) <= i:
            self._buffers.append(None)
        buffer = self._buffers[i]
        if buffer is None or buffer.shape != like.shape or buffer.dtype != like.dtype:
            if buffer is not None:
                self.nbytes -= buffer.numel() * buffer.element_size()
            pin = like.device.type == "cuda" and torch.cuda.is_available()
            buffer = torch.empty(like.shape, dtype=like.dtype, device="cpu", pin_memory=pin)
            self._buffers[i] = buffer
            self.nbytes += buffer.numel() * buffer.element_size()
        return buffer


def to_device(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` with ``like``'s shape, dtype and device (no copy where they match)."""
    return value.to(device=like.device, dtype=like.dtype, non_blocking=True).view_as(like)
