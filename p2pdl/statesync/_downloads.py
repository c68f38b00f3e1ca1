"""A fetcher's downloads, sans-IO: verified chunks of unfinished downloads
kept for resuming (:class:`PartialStore`), and one download's plan
(:class:`ChunkPlan`: which chunk to ask of which donor next, what a success
or a failure changes -- retries, dropped donors, busy backoff).  Time is an
argument; ``_fetcher`` drives them.
"""

from __future__ import annotations

import collections
import enum
import heapq
import math
from collections.abc import Callable, Sequence
from typing import Generic

from ._state import (
    D,
    Manifest,
)
from .config import (
    StateSyncConfig,
)

__all__ = ["PartialDownload", "PartialStore", "Failure", "ChunkPlan", "MAX_BUSY_BACKOFF"]

#: Longest rest a fetcher gives a donor that keeps refusing ``busy`` (s).
MAX_BUSY_BACKOFF = 2.0


class PartialDownload:
    """The verified chunks of one run's unfinished download of one manifest."""

    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest
        self.chunks: dict[int, bytes] = {}
        self.nbytes = 0

    def add(self, index: int, data: bytes) -> None:
        if index not in self.chunks:
            self.chunks[index] = data
            self.nbytes += len(data)

    @property
    def complete(self) -> bool:
        return len(self.chunks) == self.manifest.num_chunks

    def payload(self) -> bytes:
        return b"".join(self.chunks[i] for i in range(self.manifest.num_chunks))


class PartialStore:
    """Unfinished downloads, one per run, bounded in runs and bytes.

    A later fetch of the same manifest resumes from the chunks kept here.
    Starting a download of another manifest for a run discards the run's old
    one.  When the bytes kept would exceed ``max_bytes`` (or the runs
    ``max_runs``), the partial downloads of other runs are dropped, least
    recently used first.
    """

    def __init__(self, max_bytes: int, max_runs: int) -> None:
        self._max_bytes = max_bytes
        self._max_runs = max_runs
        self._partials: collections.OrderedDict[str, PartialDownload] = \
            collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._partials)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._partials.values())

    def get(self, run_id: str) -> PartialDownload | None:
        return self._partials.get(run_id)

    def open(self, run_id: str, manifest: Manifest) -> PartialDownload:
        """The run's partial download of ``manifest``: the kept one, or a new, empty one."""
        partial = self._partials.get(run_id)
        if partial is None or partial.manifest != manifest:
            partial = self._partials[run_id] = PartialDownload(manifest)
        self._partials.move_to_end(run_id)
        while len(self._partials) > self._max_runs:
            self._partials.popitem(last=False)
        return partial

    def add(self, run_id: str, partial: PartialDownload, index: int, data: bytes) -> None:
        """Keep a verified chunk, making room by dropping other runs' partials.

        A partial download no longer in the store (dropped for room) still
        takes the chunk: the fetch that holds it finishes; only resuming it
        later is lost.
        """
        if self._partials.get(run_id) is partial:
            while self.nbytes + len(data) > self._max_bytes and len(self._partials) > 1:
                oldest = next(iter(self._partials))
                if oldest == run_id:
                    break
                del self._partials[oldest]
        partial.add(index, data)

    def discard(self, run_id: str, partial: PartialDownload | None = None) -> None:
        """Forget the run's partial download (only ``partial``, if given)."""
        if partial is None or self._partials.get(run_id) is partial:
            self._partials.pop(run_id, None)


class Failure(enum.Enum):
    """How a chunk request failed (what the fetcher does about it differs)."""

    #: No answer in time, an unreachable donor, a closed stream, an error reply:
    #: the chunk counts one attempt; the donor one failure in a row.
    ERROR = "error"
    #: A chunk that fails its hash, or any other protocol violation: the chunk
    #: counts one attempt and the donor is dropped.
    BAD = "bad"
    #: The donor no longer keeps the snapshot: dropped, no attempt counted.
    GONE = "gone"
    #: The donor serves too many uploads: it rests (busy_backoff, doubling).
    BUSY = "busy"


class ChunkPlan(Generic[D]):
    """One download of ``manifest`` from ``donors``: what to ask of whom next.

    Call :meth:`next_requests` for requests to start (they count as in
    flight), then :meth:`on_chunk` or :meth:`on_failure` for each.  The plan
    is over when :attr:`done` or :attr:`failed` (a reason) is set.  Verified
    chunks go to ``partial`` (from :class:`PartialStore`); chunks already in
    it are not asked for.

    Assignment: each missing chunk, lowest index first, goes to the usable
    donor with the fewest requests in flight (then the fewest chunks
    assigned so far, then the donors' order), avoiding donors that already
    failed that chunk while another can take it.  At most
    ``max_parallel_chunks`` requests are in flight, ``max_chunks_per_donor``
    per donor.
    """

    def __init__(self, manifest: Manifest, donors: Sequence[D], config: StateSyncConfig,
                 partial: PartialDownload,
                 store: Callable[[int, bytes], None] | None = None) -> None:
        if partial.manifest != manifest:
            raise ValueError("the partial download is of another manifest")
        self.manifest = manifest
        self.config = config
        self.partial = partial
        self._store = store or partial.add
        self.donors: tuple[D, ...] = tuple(dict.fromkeys(donors))
        self.resumed = len(partial.chunks)
        self.inflight: dict[int, D] = {}
        # Chunks to ask for, lowest first (a heap: a plan of 16384 chunks must
        # not rescan them all after every reply).
        self._queue = [i for i in range(manifest.num_chunks) if i not in partial.chunks]
        self._queued = set(self._queue)
        self._donor_inflight: dict[D, int] = dict.fromkeys(self.donors, 0)
        self._assigned: dict[D, int] = dict.fromkeys(self.donors, 0)
        self.delivered: dict[D, int] = dict.fromkeys(self.donors, 0)
        self.dropped: dict[D, str] = {}
        #: Donors that sent a chunk failing its SHA-256 -> the first such chunk.
        self.mismatched: dict[D, int] = {}
        self._failures_in_row: dict[D, int] = dict.fromkeys(self.donors, 0)
        self._busy_in_row: dict[D, int] = dict.fromkeys(self.donors, 0)
        self._resting_until: dict[D, float] = {}
        self._attempts: dict[int, int] = collections.defaultdict(int)
        self._failed_by: dict[int, set[D]] = collections.defaultdict(set)
        self.failed: str | None = None
        if not self.donors:
            self.failed = "no donor offers this state"

    # -- state ------------------------------------------------------------------

    @property
    def done(self) -> bool:
        return self.partial.complete

    @property
    def over(self) -> bool:
        return self.done or self.failed is not None

    def gone(self) -> list[D]:
        """Donors that no longer keep the state (worth reading manifests again)."""
        return [d for d, reason in self.dropped.items() if reason == "gone"]

    def bad(self) -> list[D]:
        """Donors dropped for a protocol violation (a chunk that failed its hash...)."""
        return [d for d, reason in self.dropped.items() if reason.startswith("bad")]

    def usable_donors(self) -> list[D]:
        return [d for d in self.donors if d not in self.dropped]

    def _available(self, donor: D, now: float) -> bool:
        return donor not in self.dropped and \
            self._donor_inflight[donor] < self.config.max_chunks_per_donor and \
            self._resting_until.get(donor, -math.inf) <= now

    def missing(self) -> list[int]:
        """Chunks neither verified nor in flight, in order."""
        return [i for i in range(self.manifest.num_chunks)
                if i not in self.partial.chunks and i not in self.inflight]

    def _requeue(self, index: int) -> None:
        if index not in self._queued and index not in self.partial.chunks:
            heapq.heappush(self._queue, index)
            self._queued.add(index)

    # -- decisions --------------------------------------------------------------

    def next_requests(self, now: float) -> list[tuple[int, D]]:
        """Requests to start now, as ``(chunk index, donor)``; they count as in flight."""
        if self.over:
            return []
        out: list[tuple[int, D]] = []
        waiting: list[int] = []
        room = self.config.max_parallel_chunks - len(self.inflight)
        while room > 0 and self._queue:
            available = [d for d in self.donors if self._available(d, now)]
            if not available:
                break
            index = heapq.heappop(self._queue)
            self._queued.discard(index)
            if index in self.partial.chunks or index in self.inflight:
                continue
            failed_by = self._failed_by.get(index, set())
            fresh = [d for d in available if d not in failed_by]
            if not fresh:
                if any(d not in failed_by for d in self.usable_donors()):
                    waiting.append(index)  # a donor that has not failed it will be free soon
                    continue
                fresh = available  # every usable donor failed it once: try again
            donor = min(fresh, key=lambda d: (self._donor_inflight[d], self._assigned[d]))
            self.inflight[index] = donor
            self._donor_inflight[donor] += 1
            self._assigned[donor] += 1
            out.append((index, donor))
            room -= 1
        for index in waiting:
            self._requeue(index)
        return out

    def next_wakeup(self, now: float) -> float | None:
        """When a resting donor may be asked again (None: no donor rests)."""
        times = [t for d, t in self._resting_until.items() if t > now and d not in self.dropped]
        return min(times) if times else None

    def _release(self, index: int, donor: D) -> None:
        if self.inflight.get(index) == donor:
            del self.inflight[index]
            self._donor_inflight[donor] -= 1

    def on_chunk(self, index: int, donor: D, data: bytes) -> bool:
        """A donor sent chunk ``index``: True if it verified (and is kept).

        A chunk that fails verification is :attr:`Failure.BAD`: the donor is dropped.
        """
        self._release(index, donor)
        if not self.manifest.verify_chunk(index, data):
            self._requeue(index)
            self.mismatched.setdefault(donor, index)
            self._fail(index, donor, Failure.BAD, 0.0, "a chunk that fails its SHA-256")
            return False
        self._failures_in_row[donor] = 0
        self._busy_in_row[donor] = 0
        if index not in self.partial.chunks:
            self._store(index, data)
            self.delivered[donor] += 1
        return True

    def on_failure(self, index: int, donor: D, failure: Failure, now: float,
                   detail: str = "") -> None:
        """Chunk ``index`` did not come from ``donor``."""
        self._release(index, donor)
        self._requeue(index)
        self._fail(index, donor, failure, now, detail)

    def _fail(self, index: int, donor: D, failure: Failure, now: float, detail: str) -> None:
        config = self.config
        if failure is Failure.BUSY:
            self._busy_in_row[donor] += 1
            busy = self._busy_in_row[donor]
            if busy >= config.max_busy_refusals:
                self._drop(donor, f"busy {busy} times in a row")
            else:
                self._resting_until[donor] = now + min(
                    MAX_BUSY_BACKOFF, config.busy_backoff * 2.0 ** (busy - 1))
        elif failure is Failure.GONE:
            self._drop(donor, "gone")
        else:
            self._attempts[index] += 1
            self._failed_by[index].add(donor)
            if failure is Failure.BAD:
                self._drop(donor, f"bad: {detail}" if detail else "bad")
            else:
                self._failures_in_row[donor] += 1
                if self._failures_in_row[donor] >= config.max_donor_failures:
                    self._drop(donor, f"{self._failures_in_row[donor]} failures in a row"
                               + (f", the last: {detail}" if detail else ""))
            if self._attempts[index] >= config.max_chunk_attempts and self.failed is None:
                self.failed = (f"chunk {index} failed {self._attempts[index]} times "
                               f"(max_chunk_attempts)" + (f"; the last: {detail}" if detail
                                                          else ""))
        if self.failed is None and not self.done and not self.usable_donors():
            reasons = "; ".join(f"{_name(d)}: {r}" for d, r in self.dropped.items())
            self.failed = f"no donor left ({reasons})"

    def _drop(self, donor: D, reason: str) -> None:
        if donor not in self.dropped:
            self.dropped[donor] = reason

    def contributors(self) -> tuple[D, ...]:
        """Donors that delivered chunks, in the donors' order."""
        return tuple(d for d in self.donors if self.delivered[d])


def _name(donor: object) -> str:
    text = str(donor)
    return text if len(text) <= 16 else "…" + text[-8:]
