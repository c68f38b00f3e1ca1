"""Accusations that travel, sans-IO (protocols/allreduce.md, Accusations).

A reducer signs the result digest of its part in its ``ar.done``; members
show each other those signatures in ``ar.have``.  Two valid signatures of
one reducer over different digests of one part of one group are an
**equivocation**: proof, to anyone who holds the reducer's peer id, that it
sent different results (or claims) to different members.  The proof is
small and checks itself, so it travels: in certificate runs each member
publishes the proofs it found in the DHT, under its own signed subkey of
``p2pdl/accusations/<run id>`` (a key of the run: stored at and read from
members only), and every member that reads one checks it.  A true one
bans the accused; a false one counts against its publisher, whose
signature the DHT checked.

:class:`AccusationBoard` holds what this node publishes, the runs it
reads, and what it has already checked (bounded).
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

import msgpack
from libp2p.peer.id import ID

from ...wire import MaxLen, Message, Range
from ..matchmaking.config import GROUP_ID_SIZE, MAX_GROUP_SIZE, MAX_PEER_ID_SIZE
from ._evidence import SIGNATURE_SIZE, result_payload, signed_by
from ._messages import PROOF_DIGEST_SIZE

__all__ = ["ACCUSATIONS_PREFIX", "MAX_ACCUSATIONS", "MAX_CHECKED_ACCUSATIONS",
           "MAX_WATCHED_RUNS", "MAX_FETCH_TRIES", "Equivocation", "DisputeClaim", "Accusations",
           "AccusationBoard",
           "equivocation_problem", "find_equivocations"]

#: DHT key prefix of a run's accusations: ``p2pdl/accusations/<run id>``.
ACCUSATIONS_PREFIX = "p2pdl/accusations/"
#: Proofs one member publishes per run (its most recent).
MAX_ACCUSATIONS = 16
#: Proofs a node remembers having checked (least recent forgotten first).
MAX_CHECKED_ACCUSATIONS = 4096
#: Runs a node reads the accusations of (those of its most recent groups).
MAX_WATCHED_RUNS = 16
#: Times a node tries to fetch one published dispute proof before it gives up.
MAX_FETCH_TRIES = 3
_DIGEST_SIZE = 32


class Equivocation(Message, tag="ar.equivocation"):
    """Reducer ``reducer`` (its peer id) signed two different result digests
    of part ``part`` of group ``group_id``: ``digests`` and ``signatures``,
    two of each, in the same order."""

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    part: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    reducer: Annotated[bytes, MaxLen(MAX_PEER_ID_SIZE)]
    digests: Annotated[list[Annotated[bytes, MaxLen(_DIGEST_SIZE)]], MaxLen(2)]
    signatures: Annotated[list[Annotated[bytes, MaxLen(SIGNATURE_SIZE)]], MaxLen(2)]

    @property
    def key(self) -> tuple[bytes, int, bytes]:
        """What one proof is about: (group, part, reducer)."""
        return self.group_id, self.part, self.reducer


class DisputeClaim(Message, tag="ar.dispute_claim"):
    """A dispute's proof its publisher keeps and serves (``ar.fetch_proof``):
    the group, the part and the proof's digest (``_proofs.proof_digest``)."""

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    part: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    digest: Annotated[bytes, MaxLen(PROOF_DIGEST_SIZE)]


class Accusations(Message, tag="ar.accusations"):
    """One member's published proofs in one run (the value of its subkey of
    ``p2pdl/accusations/<run id>``): equivocations, which check themselves,
    and claims of disputes' proofs, fetched from the member (nil from
    members before r14)."""

    equivocations: Annotated[list[Equivocation], MaxLen(MAX_ACCUSATIONS)]
    disputes: Annotated[list[DisputeClaim], MaxLen(MAX_ACCUSATIONS)] | None = None


def equivocation_problem(proof: Equivocation) -> str | None:
    """Why ``proof`` proves nothing (None: it is a true proof)."""
    if len(proof.digests) != 2 or len(proof.signatures) != 2:
        return "not two digests and two signatures"
    if proof.digests[0] == proof.digests[1]:
        return "the two digests are the same"
    try:
        reducer = ID(proof.reducer)
    except Exception:   # untrusted bytes
        return "the reducer is no peer id"
    for digest, signature in zip(proof.digests, proof.signatures, strict=True):
        if not signed_by(reducer, result_payload(proof.group_id, proof.part, digest),
                         signature):
            return "a signature is not the reducer's over its digest"
    return None


def find_equivocations(group_id: bytes, reducers: Sequence[bytes], digests: Mapping[int, bytes],
                       signatures: Mapping[int, bytes],
                       heard: Mapping[int, Mapping[int, tuple[bytes, bytes]]]
                       ) -> dict[int, tuple[int, Equivocation]]:
    """The parts whose reducer signed, for another member, a result other than
    this member's: part -> (that member, the proof).

    ``reducers``: each part's reducer (peer id bytes, by member index);
    ``digests`` and ``signatures``: the result digest of each part this
    member holds and its reducer's signature (parts it reduces itself left
    out); ``heard``: member -> part -> (digest, signature) from its ``ar.have``.
    A signature that does not verify proves nothing and is ignored."""
    proofs: dict[int, tuple[int, Equivocation]] = {}
    for j, results in sorted(heard.items()):
        for r, (digest, signature) in sorted(results.items()):
            mine = signatures.get(r)
            if r in proofs or mine is None or digest == digests[r]:
                continue
            proof = Equivocation(group_id, r, reducers[r], [digests[r], digest],
                                 [mine, signature])
            if equivocation_problem(proof) is None:
                proofs[r] = (j, proof)
    return proofs


def _fingerprint(owner: bytes, proof: Equivocation) -> bytes:
    return hashlib.sha256(msgpack.packb(
        [owner, proof.group_id, proof.part, proof.reducer, proof.digests, proof.signatures],
        use_bin_type=True)).digest()


class AccusationBoard:
    """What one node publishes and reads.

    ``accuse(run_id, proof)`` adds a proof of its own (the run's most recent
    MAX_ACCUSATIONS kept); ``pending()`` names the runs whose record changed
    since ``published(run_id)``; ``watch(run_id)`` adds a run to read (the
    MAX_WATCHED_RUNS most recent); ``unchecked(owner, proofs)`` filters
    what a read brought to the proofs not checked before,
    ``first_proof(proof)`` says whether a lie is proven for the first time
    (each remembered, MAX_CHECKED_ACCUSATIONS at most), and ``judge(owner,
    record)`` sorts a record's new proofs into true and false."""

    def __init__(self) -> None:
        self._mine: dict[str, collections.OrderedDict[tuple[bytes, int, bytes],
                                                      Equivocation]] = {}
        self._claims: dict[str, collections.OrderedDict[bytes, DisputeClaim]] = {}
        self._tries: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self._pending: set[str] = set()
        self._watched: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._checked: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._proven: collections.OrderedDict[tuple[object, ...], None] = \
            collections.OrderedDict()

    def accuse(self, run_id: str, proof: Equivocation) -> bool:
        """Publish ``proof`` in ``run_id`` (False: it is there already)."""
        return self._add(run_id, self._mine.setdefault(run_id, collections.OrderedDict()),
                         proof.key, proof)

    def claim(self, run_id: str, claim: DisputeClaim) -> bool:
        """Publish ``claim`` in ``run_id`` (False: it is there already)."""
        return self._add(run_id, self._claims.setdefault(run_id, collections.OrderedDict()),
                         claim.digest, claim)

    def _add(self, run_id: str, table: collections.OrderedDict[Any, Any], key: Any,
             item: Any) -> bool:
        """Add ``item`` to one of ``run_id``'s published lists (its most recent
        MAX_ACCUSATIONS kept), to be published."""
        if key in table:
            return False
        table[key] = item
        _bound(table, MAX_ACCUSATIONS)
        self._pending.add(run_id)
        self.watch(run_id)
        return True

    def record(self, run_id: str) -> Accusations:
        """This node's record of ``run_id`` (what it stores under its subkey)."""
        claims = list(self._claims.get(run_id, {}).values())
        return Accusations(list(self._mine.get(run_id, {}).values()), claims or None)

    def pending(self) -> list[str]:
        return sorted(self._pending)

    def published(self, run_id: str) -> None:
        self._pending.discard(run_id)

    def watch(self, run_id: str) -> None:
        self._watched[run_id] = None
        self._watched.move_to_end(run_id)
        while len(self._watched) > MAX_WATCHED_RUNS:
            self._watched.popitem(last=False)

    def watched(self) -> list[str]:
        return list(self._watched)

    def first_proof(self, proof: Equivocation) -> bool:
        """Whether ``proof`` is the first true one this node has of its lie (one
        lie is flagged once, however many members prove it)."""
        return self._first(proof.key)

    def first_lie(self, kind: str, group_id: bytes, part: int, peer: bytes) -> bool:
        """Whether a dispute's proof of ``peer``'s lie of ``kind`` (in part
        ``part`` of group ``group_id``; -1: in any part) is the first this
        node has (as :meth:`first_proof`)."""
        return self._first((kind, group_id, part, peer))

    def _first(self, key: tuple[object, ...]) -> bool:
        """Whether ``key`` is proven here for the first time (now remembered)."""
        if key in self._proven:
            self._proven.move_to_end(key)
            return False
        self._proven[key] = None
        _bound(self._proven, MAX_CHECKED_ACCUSATIONS)
        return True

    def unfetched(self, owner: bytes, record: Accusations) -> list[DisputeClaim]:
        """``owner``'s dispute claims not judged yet nor given up on (each
        fetched MAX_FETCH_TRIES times at most: :meth:`fetched`)."""
        fresh = []
        for claim in record.disputes or ():
            mark = hashlib.sha256(owner + claim.digest).digest()
            if mark in self._checked:
                self._checked.move_to_end(mark)
                continue
            fresh.append(claim)
        return fresh

    def fetched(self, owner: bytes, claim: DisputeClaim, *, judged: bool) -> None:
        """A fetch of ``owner``'s ``claim`` ended: ``judged`` (its proof came
        and was judged, or was false), or failed (tried again later, up to
        MAX_FETCH_TRIES times in all)."""
        mark = hashlib.sha256(owner + claim.digest).digest()
        tries = self._tries.pop(mark, 0) + 1
        if judged or tries >= MAX_FETCH_TRIES:
            self._checked[mark] = None
            _bound(self._checked, MAX_CHECKED_ACCUSATIONS)
        else:
            self._tries[mark] = tries
            _bound(self._tries, MAX_CHECKED_ACCUSATIONS)

    def judge(self, owner: bytes, record: Accusations
              ) -> tuple[list[Equivocation], list[tuple[Equivocation, str]]]:
        """``owner``'s published ``record``, its proofs not checked before:
        the true ones, and the false ones with what is wrong with each."""
        true, false = [], []
        for proof in self.unchecked(owner, record.equivocations):
            problem = equivocation_problem(proof)
            if problem is None:
                true.append(proof)
            else:
                false.append((proof, problem))
        return true, false

    def unchecked(self, owner: bytes, proofs: list[Equivocation]) -> list[Equivocation]:
        """The proofs of ``owner``'s record not checked before (now remembered)."""
        fresh = []
        for proof in proofs:
            mark = _fingerprint(owner, proof)
            if mark in self._checked:
                self._checked.move_to_end(mark)
                continue
            self._checked[mark] = None
            fresh.append(proof)
        _bound(self._checked, MAX_CHECKED_ACCUSATIONS)
        return fresh


def _bound(table: collections.OrderedDict[Any, Any], limit: int) -> None:
    """Drop ``table``'s least recent entries beyond ``limit``."""
    while len(table) > limit:
        table.popitem(last=False)
