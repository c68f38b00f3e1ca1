"""Giving memory freed after bursts of input back to the operating system.

glibc's malloc keeps freed memory for reuse and returns it to the system
only from the top of its heap.  After a burst of input -- many streams'
frames arriving at once, then released -- the freed chunks sit between live
ones and the resident set stays up: measured after
``simulations/fuzz_wire.py``'s attack, 277 MiB of a 300 MiB heap were free
and still resident (``--gc-check``), and ``malloc_trim(0)`` gave them back.
:func:`serve_heap_trim` calls it, at most every ``interval`` seconds and
only when the resident set grew by ``HEAP_TRIM_GROWTH`` since the last
call, so a node whose memory is simply in use is not trimmed again and
again.  Where there is no glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os

import trio

__all__ = ["HeapTrimPolicy", "serve_heap_trim", "resident_bytes", "trim_heap",
           "HEAP_TRIM_GROWTH"]

logger = logging.getLogger(__name__)

#: Growth of the resident set since the last trim that makes the next one due.
HEAP_TRIM_GROWTH = 32 * 1024 * 1024


def resident_bytes() -> int | None:
    """This process's resident set, from ``/proc`` (None where there is none)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


_libc: ctypes.CDLL | None | bool = None


def trim_heap() -> bool:
    """``malloc_trim(0)``: give the heap's free pages back.  False where it is not glibc."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    _libc.malloc_trim(0)  # type: ignore[union-attr]
    return True


class HeapTrimPolicy:
    """When to trim (sans-IO): the resident set grew by ``growth`` since the last trim."""

    def __init__(self, growth: int = HEAP_TRIM_GROWTH) -> None:
        self.growth = growth
        self._baseline: int | None = None

    def due(self, resident: int) -> bool:
        if self._baseline is None or resident < self._baseline:
            self._baseline = resident
            return False
        return resident - self._baseline >= self.growth

    def trimmed(self, resident: int) -> None:
        self._baseline = resident


async def serve_heap_trim(interval: float, policy: HeapTrimPolicy | None = None) -> None:
    """Every ``interval`` seconds, trim the heap if ``policy`` says it is due."""
    policy = policy or HeapTrimPolicy()
    while True:
        await trio.sleep(interval)
        before = resident_bytes()
        if before is None or not policy.due(before):
            continue
        if not trim_heap():
            return
        after = resident_bytes() or before
        policy.trimmed(after)
        if before - after >= policy.growth // 2:
            logger.debug("gave %.0f MiB of freed memory back (resident %.0f MiB)",
                         (before - after) / 2**20, after / 2**20)
