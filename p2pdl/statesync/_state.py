"""State sync without I/O: manifests, the donor's snapshots, a download's plan.

A **snapshot** is one payload (the training state, serialized by the caller)
of one run at one epoch, cut into chunks of ``chunk_size`` bytes (the last
may be shorter).  Its **manifest** names it: the epoch, the size, the chunk
size, the SHA-256 of the whole payload (its ``digest``) and the SHA-256 of
every chunk.  A fetcher takes the state that the donors at one epoch agree
on (:func:`vote_on_state`), then checks every chunk against its manifest and
the whole payload against the digest.

* :class:`Manifest` -- building and checking manifests, chunk bounds.
* :func:`vote_on_state` -- the donors' vote: which ``(epoch, digest)`` to
  accept, who holds it, who lost, who claims an epoch past the limit.
* :func:`choose_manifest` -- which offered manifest to download, from whom.
* :class:`Exclusions` -- donors not to use again in a run at an epoch
  (caught lying), bounded.
* :class:`SnapshotTable` -- a donor's snapshots (the newest ``keep`` per run).
* :class:`PartialStore` -- verified chunks of unfinished downloads, for resuming.
* :class:`ChunkPlan` -- one download: which chunk to ask of which donor next,
  what a success or a failure changes (retries, dropped donors, busy backoff).

Nothing here does I/O or reads a clock: time is an argument.  The trio
service (``_service``) drives these with plain method calls.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import hashlib
import heapq
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

from ..errors import ConfigError
from .config import (
    DIGEST_SIZE,
    MAX_CHUNK_SIZE,
    MAX_CHUNKS,
    MAX_EPOCH,
    MIN_CHUNK_SIZE,
    StateSyncConfig,
)

__all__ = ["Manifest", "chunk_count", "choose_manifest", "StateVote", "vote_on_state",
           "Exclusions", "Snapshot",
           "SnapshotTable", "PartialDownload", "PartialStore", "Failure", "ChunkPlan",
           "MAX_BUSY_BACKOFF"]

#: Longest rest a fetcher gives a donor that keeps refusing ``busy`` (s).
MAX_BUSY_BACKOFF = 2.0

D = TypeVar("D", bound=Hashable)


def chunk_count(size: int, chunk_size: int) -> int:
    """Chunks of a payload of ``size`` bytes (``ceil(size / chunk_size)``)."""
    return -(-size // chunk_size)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a snapshot is: its epoch, size, chunking and digests.

    ``chunk_digests`` is the SHA-256 of every chunk, concatenated (32 bytes
    each, in order).  Two manifests are equal exactly when they describe the
    same chunks of the same payload at the same epoch.
    """

    epoch: int
    size: int
    chunk_size: int
    digest: bytes
    chunk_digests: bytes

    @classmethod
    def build(cls, epoch: int, payload: bytes | memoryview, chunk_size: int) -> Manifest:
        """The manifest of ``payload`` at ``epoch``, cut into ``chunk_size`` chunks."""
        view = memoryview(payload).cast("B")
        digests = b"".join(hashlib.sha256(view[start:start + chunk_size]).digest()
                           for start in range(0, len(view), chunk_size))
        return cls(epoch, len(view), chunk_size, hashlib.sha256(view).digest(), digests)

    @property
    def num_chunks(self) -> int:
        return chunk_count(self.size, self.chunk_size)

    def chunk_bounds(self, index: int) -> tuple[int, int]:
        """``(start, end)`` of chunk ``index`` in the payload."""
        if not 0 <= index < self.num_chunks:
            raise IndexError(f"chunk {index} of {self.num_chunks}")
        start = index * self.chunk_size
        return start, min(start + self.chunk_size, self.size)

    def chunk_digest(self, index: int) -> bytes:
        return self.chunk_digests[index * DIGEST_SIZE:(index + 1) * DIGEST_SIZE]

    def verify_chunk(self, index: int, data: bytes) -> bool:
        """True if ``data`` is chunk ``index``: its length and its SHA-256 match."""
        start, end = self.chunk_bounds(index)
        return len(data) == end - start and \
            hashlib.sha256(data).digest() == self.chunk_digest(index)

    def verify_payload(self, payload: bytes) -> bool:
        return len(payload) == self.size and hashlib.sha256(payload).digest() == self.digest

    def problem(self, max_state_bytes: int) -> str | None:
        """Why this manifest (from a donor) is unacceptable, or None if it is fine."""
        if not 0 <= self.epoch <= MAX_EPOCH:
            return f"epoch {self.epoch} out of 0..{MAX_EPOCH}"
        if not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            return f"chunk_size {self.chunk_size} out of {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}"
        if not 1 <= self.size <= max_state_bytes:
            return f"size {self.size} out of 1..{max_state_bytes} (max_state_bytes)"
        if self.num_chunks > MAX_CHUNKS:
            return f"{self.num_chunks} chunks, more than {MAX_CHUNKS}"
        if len(self.digest) != DIGEST_SIZE:
            return f"a digest of {len(self.digest)} bytes, not {DIGEST_SIZE}"
        if len(self.chunk_digests) != self.num_chunks * DIGEST_SIZE:
            return (f"{len(self.chunk_digests)} bytes of chunk digests for {self.num_chunks} "
                    f"chunks of {DIGEST_SIZE} bytes")
        return None


def choose_manifest(offers: Mapping[D, Manifest], min_epoch: int = 0
                    ) -> tuple[Manifest, tuple[D, ...]] | None:
    """The manifest to download and the donors that offer it, or None.

    The newest epoch of at least ``min_epoch`` wins; among manifests of that
    epoch, the one most donors offer (an honest majority outvotes a liar);
    ties go to the smallest digest, so that every fetcher picks the same.
    Donors keep the order of ``offers``.
    """
    by_manifest: dict[Manifest, list[D]] = collections.defaultdict(list)
    for donor, manifest in offers.items():
        if manifest.epoch >= min_epoch:
            by_manifest[manifest].append(donor)
    if not by_manifest:
        return None
    best = min(by_manifest, key=lambda m: (-m.epoch, -len(by_manifest[m]), m.digest,
                                           m.chunk_size, m.chunk_digests))
    return best, tuple(by_manifest[best])


@dataclasses.dataclass(frozen=True)
class StateVote(Generic[D]):
    """What :func:`vote_on_state` decided.

    Attributes:
        epoch: the winning epoch (None: no state won).
        digest: the winning digest (None: no state won).
        holders: the donors that offer the winner, in the offers' order.
        losers: the donors at the winning epoch that offer another digest.
        ahead: the donors that offer an epoch past ``max_epoch``: their claim
            is beyond what the caller's evidence allows.
        lone: the winner is the state of the only donor there is: nobody
            confirmed it.
        reason: why no state won (empty when one did).
    """

    epoch: int | None
    digest: bytes | None
    holders: tuple[D, ...] = ()
    losers: tuple[D, ...] = ()
    ahead: tuple[D, ...] = ()
    lone: bool = False
    reason: str = ""

    @property
    def won(self) -> bool:
        return self.digest is not None


def vote_on_state(offers: Mapping[D, tuple[int, bytes]], *, min_epoch: int = 0,
                  max_epoch: int | None = None, min_agreeing: int = 2) -> StateVote[D]:
    """The state to accept from donors' ``offers`` (``{donor: (epoch, digest)}``).

    Offers past ``max_epoch`` (None: no limit) do not count and are listed in
    ``ahead``.  Of the others, the epochs within ``min_epoch..max_epoch`` are
    tried newest first; an epoch's winner is the digest that at least
    ``min_agreeing`` donors at that epoch offer and that more than half of
    the donors at that epoch offer (a tie elects nobody).  The first epoch
    with a winner wins.

    A lone donor: when exactly one donor offers anything (at any epoch, the
    ``ahead`` ones not counted) and its epoch is within the range, its state
    wins with ``lone`` set, whatever ``min_agreeing`` says.
    """
    ahead = tuple(d for d, (epoch, _) in offers.items()
                  if max_epoch is not None and epoch > max_epoch)
    counted = {d: offer for d, offer in offers.items() if d not in ahead}
    top = math.inf if max_epoch is None else max_epoch
    if len(counted) == 1:
        ((donor, (epoch, digest)),) = counted.items()
        if min_epoch <= epoch <= top:
            return StateVote(epoch, digest, (donor,), (), ahead, lone=True)
    by_epoch: dict[int, list[D]] = collections.defaultdict(list)
    for donor, (epoch, _) in counted.items():
        if min_epoch <= epoch <= top:
            by_epoch[epoch].append(donor)
    results: list[str] = []
    for epoch in sorted(by_epoch, reverse=True):
        donors = by_epoch[epoch]
        counts = collections.Counter(counted[d][1] for d in donors)
        digest, votes = min(counts.items(), key=lambda item: (-item[1], item[0]))
        if votes >= min_agreeing and 2 * votes > len(donors):
            holders = tuple(d for d in donors if counted[d][1] == digest)
            losers = tuple(d for d in donors if counted[d][1] != digest)
            return StateVote(epoch, digest, holders, losers, ahead)
        results.append(f"epoch {epoch}: {len(donors)} donor(s), {len(counts)} digest(s), "
                       f"at most {votes} agreeing")
    if not results:
        limit = f"{min_epoch}..{max_epoch}" if max_epoch is not None else f"{min_epoch} or newer"
        reason = f"no donor offers an epoch in {limit}"
    else:
        reason = (f"no state has at least {min_agreeing} agreeing donors and a majority of "
                  f"its epoch's (" + "; ".join(results[:4]) + ")")
    if ahead:
        reason += f"; {len(ahead)} donor(s) offer an epoch past {max_epoch}"
    return StateVote(None, None, (), (), ahead, reason=reason)


class Exclusions(Generic[D]):
    """Donors caught lying in a run at an epoch, not to be used for it again.

    A donor excluded at ``(run_id, epoch)`` is ignored whenever it offers that
    epoch of that run.  Bounded: at most ``max_epochs`` (run, epoch) pairs,
    the least recently added dropped first, and ``max_donors`` donors each
    (the oldest dropped first).
    """

    def __init__(self, max_epochs: int, max_donors: int) -> None:
        self._max_epochs = max_epochs
        self._max_donors = max_donors
        self._sets: collections.OrderedDict[tuple[str, int], dict[D, None]] = \
            collections.OrderedDict()

    def __len__(self) -> int:
        return sum(len(s) for s in self._sets.values())

    def add(self, run_id: str, epoch: int, donor: D) -> bool:
        """Exclude ``donor``; True if it was not excluded there yet."""
        key = (run_id, epoch)
        donors = self._sets.setdefault(key, {})
        self._sets.move_to_end(key)
        new = donor not in donors
        donors[donor] = None
        while len(donors) > self._max_donors:
            del donors[next(iter(donors))]
        while len(self._sets) > self._max_epochs:
            self._sets.popitem(last=False)
        return new

    def excluded(self, run_id: str, epoch: int, donor: D) -> bool:
        return donor in self._sets.get((run_id, epoch), ())

    def of(self, run_id: str, epoch: int) -> list[D]:
        """The donors excluded at ``(run_id, epoch)``, oldest first."""
        return list(self._sets.get((run_id, epoch), ()))


# -- the donor's side ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One shared payload and its manifest."""

    run_id: str
    manifest: Manifest
    payload: bytes

    def chunk(self, index: int) -> bytes:
        start, end = self.manifest.chunk_bounds(index)
        return self.payload[start:end]


class SnapshotTable:
    """A donor's snapshots: per run, the newest ``keep`` ones, newest first.

    Not thread safe by itself: the service holds a lock around it.
    """

    def __init__(self, keep: int, max_runs: int) -> None:
        self._keep = keep
        self._max_runs = max_runs
        self._runs: dict[str, list[Snapshot]] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def runs(self) -> list[str]:
        return sorted(self._runs)

    def check_share(self, run_id: str, epoch: int) -> None:
        """Raise :class:`ConfigError` if a snapshot of ``run_id`` at ``epoch`` cannot be added."""
        kept = self._runs.get(run_id)
        if kept is None:
            if len(self._runs) >= self._max_runs:
                raise ConfigError(f"this node already shares {len(self._runs)} runs (max_runs)")
        elif epoch < kept[0].manifest.epoch:
            raise ConfigError(f"epoch {epoch} of run {run_id!r} is behind the shared epoch "
                              f"{kept[0].manifest.epoch}")

    def add(self, snapshot: Snapshot) -> list[Snapshot]:
        """Make ``snapshot`` the newest of its run; returns the snapshots dropped."""
        self.check_share(snapshot.run_id, snapshot.manifest.epoch)
        kept = self._runs.setdefault(snapshot.run_id, [])
        if kept and kept[0].manifest == snapshot.manifest:
            return []  # the same state again: nothing changes
        # The same payload at another epoch is kept once; fetchers of the old
        # epoch's manifest find it by digest.
        kept[:] = [s for s in kept if s.manifest.digest != snapshot.manifest.digest]
        kept.insert(0, snapshot)
        dropped = kept[self._keep:]
        del kept[self._keep:]
        return dropped

    def remove(self, run_id: str) -> int:
        """Drop every snapshot of ``run_id``; returns how many there were."""
        return len(self._runs.pop(run_id, ()))

    def newest(self, run_id: str) -> Snapshot | None:
        kept = self._runs.get(run_id)
        return kept[0] if kept else None

    def find(self, run_id: str, digest: bytes) -> Snapshot | None:
        for snapshot in self._runs.get(run_id, ()):
            if snapshot.manifest.digest == digest:
                return snapshot
        return None


# -- the fetcher's side ----------------------------------------------------------


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

