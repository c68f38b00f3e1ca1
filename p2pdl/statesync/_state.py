"""State sync without I/O: manifests, the donors' vote, exclusions.

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

A donor's snapshots are ``_snapshots`` (:class:`SnapshotTable`); a
fetcher's downloads ``_downloads`` (:class:`PartialStore`,
:class:`ChunkPlan`).  Nothing here does I/O or reads a clock: time is an
argument.  The trio service (``_service``) drives these with plain method
calls.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import math
from collections.abc import Hashable, Mapping
from typing import Generic, TypeVar

from .config import (
    DIGEST_SIZE,
    MAX_CHUNK_SIZE,
    MAX_CHUNKS,
    MAX_EPOCH,
    MIN_CHUNK_SIZE,
)

__all__ = ["Manifest", "chunk_count", "choose_manifest", "StateVote", "vote_on_state",
           "Exclusions"]


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
