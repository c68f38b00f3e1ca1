"""Disputes' proofs that travel, sans-IO (protocols/allreduce.md, Accusations).

A dispute ends with a verdict its verifier reached from data others signed:
each contributor's commitment to its chunks and its signed report, the
reducer's signed result digest, and -- from r14 -- the reducer's signed
answer, which binds the group's members, the layout, the verifier's joint
nonce, the result, the reports it was shown, the contributors it showed
and every committed contributor it holds.  So the verdict can be reached
again by anyone who is handed those messages and the chunks: an
:class:`~._messages.ProvenDispute` and its TENSOR frames.

:func:`check_header` checks what needs no chunks (every signature and
binding) and says which chunks must follow; :func:`judge` decodes them and
reaches the verdict as the verifier did: the reports of the shown
contributors and the verifier's own recomputed from their committed
chunks, the others' as they signed them (unrefuted by the reducer, which
signed that it was shown them), then the part's check.  A **reducer lie**
is a part that still fails; a **report lie** is a shown contributor whose
signed report differs from what its chunks give.  Nothing in the proof is
the verifier's own word but its own committed chunks, which the reducer's
signature binds, so a verifier cannot frame anyone with it; a proof that
does not check out is evidence against its publisher only.

:func:`proof_digest` names a proof (what a published claim points at).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from libp2p.peer.id import ID

from ...errors import RemoteProtocolError
from ...wire import encode_message
from ._evidence import (
    answer_payload,
    chunk_digest,
    chunks_digest,
    commitment_payload,
    decode_chunks,
    report_payload,
    signed_by,
    unpack_report,
)
from ._messages import ProvenDispute, Shown
from ._parts import PartReceiver
from ._state import Layout
from ._verify import Report, check_part, contributor_report, deviates, sketch_bound, sketch_plan

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_PROOF_VALUES", "MAX_KEPT_PROOFS", "MAX_KEPT_PROOF_BYTES", "ProofPlan",
           "Finding", "KeptProof", "KeptProofs", "proof_digest", "check_header", "judge"]

#: The most values a published proof's layout may describe (a judge decodes
#: at most one part of it, several times over).
MAX_PROOF_VALUES = 2**34
#: Proofs a node keeps to serve (its most recent).
MAX_KEPT_PROOFS = 16
#: Chunk bytes those proofs may hold (the oldest dropped first; the newest
#: is kept even alone beyond it).
MAX_KEPT_PROOF_BYTES = 256 * 2**20


def proof_digest(header: ProvenDispute) -> bytes:
    """SHA-256 of the proof's ``ar.proven_dispute`` as it is encoded on the wire."""
    return hashlib.sha256(encode_message(header)).digest()


@dataclasses.dataclass(frozen=True)
class ProofPlan:
    """What :func:`check_header` found: the proof's layout, the members' peer
    ids, and how many chunks of each kind follow (the result's, the
    verifier's own, and each shown contributor's, in order)."""

    layout: Layout
    members: tuple[ID, ...]
    result_chunks: int
    own_chunks: int
    shown_chunks: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Finding:
    """What a proof proves: the reducer lied (its part fails once every
    contributor's data or unrefuted signed word is in), and/or these
    contributors (member indices) signed reports their own chunks refute."""

    reducer_lied: bool
    liars: frozenset[int]
    reason: str

    @property
    def proves(self) -> bool:
        return self.reducer_lied or bool(self.liars)


def _commitment(header: ProvenDispute, members: Sequence[ID], layout: Layout,
                shown: Shown, bound: dict[int, tuple[int, bytes]]) -> None:
    """Check one commitment: its signer's signature and the reducer's binding."""
    dispute = header.dispute
    c = shown.contributor
    if c >= len(members) or bound.get(c) != (shown.delivered, chunks_digest(shown.chunks)):
        raise RemoteProtocolError(f"member {c}'s commitment is not the one the reducer holds")
    if len(shown.chunks) != len(layout.chunks[header.part]) \
            or shown.delivered > len(shown.chunks):
        raise RemoteProtocolError(f"member {c}'s commitment has the wrong length")
    if not signed_by(members[c], commitment_payload(dispute.group_id, header.part, c,
                                                    layout.digest, shown.chunks),
                     shown.commitment):
        raise RemoteProtocolError(f"member {c} did not sign its commitment")


def check_header(header: ProvenDispute, run_id: str) -> ProofPlan:
    """Check everything in ``header`` that needs no chunks: RemoteProtocolError
    (a false proof: its publisher's doing) unless the reducer signed the
    answer over exactly these members, layout, nonce, result, reports, shown
    contributors and commitments, and every commitment is its contributor's."""
    if header.run_id != run_id:
        raise RemoteProtocolError("a proof of another run")
    dispute, answer, part = header.dispute, header.answer, header.part
    try:
        members = tuple(ID(m) for m in header.members)
    except Exception:   # untrusted bytes
        raise RemoteProtocolError("a member is no peer id") from None
    if part >= len(members) or dispute.sender >= len(members) or dispute.sender == part:
        raise RemoteProtocolError("the part or the verifier is no member, or they are one")
    layout = Layout.from_preimage(header.layout, MAX_PROOF_VALUES)
    if len(layout.fractions) != len(members):
        raise RemoteProtocolError("a layout of another group size")
    if answer.signature is None or answer.committed is None:
        raise RemoteProtocolError("the reducer's answer is not signed (a reducer before r14)")
    committed = [(c.contributor, c.delivered, c.chunks) for c in answer.committed]
    shown = [s.contributor for s in answer.shown]
    if [c for c, _, _ in committed] != sorted({c for c, _, _ in committed}) \
            or shown != sorted(set(shown)):
        raise RemoteProtocolError("commitments or shown contributors out of order")
    payload = answer_payload(part, header.members, layout.digest, dispute, shown, committed)
    if not signed_by(members[part], payload, answer.signature):
        raise RemoteProtocolError("the answer is not the reducer's signed answer")
    bound = {c: (n, d) for c, n, d in committed}
    for s in answer.shown:
        if s.contributor in (part, dispute.sender):
            raise RemoteProtocolError("the reducer shows itself or the verifier")
        _commitment(header, members, layout, s, bound)
    if header.own is not None:
        if header.own.contributor != dispute.sender:
            raise RemoteProtocolError("the verifier's own commitment names another member")
        _commitment(header, members, layout, header.own, bound)
    return ProofPlan(layout, members, len(layout.chunks[part]),
                     header.own.delivered if header.own is not None else 0,
                     tuple(s.delivered for s in answer.shown))


def judge(header: ProvenDispute, plan: ProofPlan, result: Sequence[bytes],
          own: Sequence[bytes], shown: Sequence[Sequence[bytes]]) -> Finding:
    """The verdict of a proof whose header :func:`check_header` passed, from
    its chunk payloads: ``result`` (the part's averaged chunks, as received),
    ``own`` (the verifier's first ``own.delivered``) and ``shown`` (each
    shown contributor's first ``delivered``).  RemoteProtocolError when the
    chunks are not the committed ones or the result not the signed one."""
    import torch

    layout, part, dispute = plan.layout, header.part, header.dispute
    if len(result) != plan.result_chunks or len(own) != plan.own_chunks \
            or [len(s) for s in shown] != list(plan.shown_chunks):
        raise RemoteProtocolError("a proof with other chunks than its header announces")
    values = torch.empty(layout.part_numel(part), dtype=torch.float32)
    receiver = PartReceiver(layout, part, values, len(plan.members))
    for chunk, payload in zip(layout.chunks[part], result, strict=True):
        receiver.add_chunk(chunk.header(result=True), payload)
    receiver.done(header.done.segments, header.done.taus)
    if receiver.digest != dispute.digest:
        raise RemoteProtocolError("the result is not the one the dispute names")
    claims = receiver.claims
    if claims is None:
        raise RemoteProtocolError("the result's claims cannot be checked")
    check = sketch_plan(dispute.group_id, part, dispute.nonce, values.numel())
    reports: dict[int, Report | None] = {}
    for s in dispute.reports:
        j, r = s.contributor, s.report
        if j in reports or j >= len(plan.members):
            raise RemoteProtocolError("the dispute names a contributor twice, or no member")
        report = unpack_report(r.sketch, r.distances)
        if report is not None and not signed_by(
                plan.members[j], report_payload(dispute.group_id, r.part, j, dispute.nonce,
                                                r.digest, r.sketch, r.distances),
                r.signature):
            report = None   # unsigned: none, as the verifier counted it
        reports[j] = report if r.part == part and r.digest == dispute.digest else None

    def committed_values(committed: Shown, payloads: Sequence[bytes]) -> torch.Tensor:
        for k, payload in enumerate(payloads):
            if chunk_digest(payload) != committed.chunks[k]:
                raise RemoteProtocolError(f"chunk {k} of member {committed.contributor} is "
                                          f"not the one it committed to")
        return decode_chunks(layout, part, payloads)

    liars = set()
    contributors = {j for claim in claims for j in claim.contributors}
    if dispute.sender in contributors:
        if header.own is None:
            raise RemoteProtocolError("the verifier contributed but shows no commitment")
        reports[dispute.sender] = contributor_report(
            layout, part, committed_values(header.own, own), values, claims, dispute.sender,
            check)
    else:
        reports.pop(dispute.sender, None)
    for s, payloads in zip(header.answer.shown, shown, strict=True):
        j = s.contributor
        if j not in contributors:
            continue
        true = contributor_report(layout, part, committed_values(s, payloads), values, claims,
                                  j, check)
        heard = reports.get(j)
        if heard is not None and deviates(heard, true, sketch_bound(claims, j)):
            liars.add(j)
        reports[j] = true
    verdict = check_part(layout, part, values, claims, reports)
    failed = verdict.status == "failed"
    reason = verdict.reason if failed else (
        f"member(s) {sorted(liars)} signed reports their chunks refute" if liars
        else "the part passes its check with every contributor's data")
    return Finding(failed, frozenset(liars), reason)



@dataclasses.dataclass(frozen=True)
class KeptProof:
    """A proof this node published: its run, header and chunk payloads."""

    run_id: str
    header: ProvenDispute
    result: tuple[bytes, ...]
    own: tuple[bytes, ...]
    shown: tuple[tuple[bytes, ...], ...]
    #: its layout (what its chunks' headers come from)
    layout: Layout | None = None

    @property
    def nbytes(self) -> int:
        return sum(map(len, self.result)) + sum(map(len, self.own)) + sum(
            len(p) for payloads in self.shown for p in payloads)


class KeptProofs:
    """The proofs a node keeps to serve (by digest): the MAX_KEPT_PROOFS most
    recent, MAX_KEPT_PROOF_BYTES of chunks at most (the oldest dropped first,
    the newest kept even alone beyond it)."""

    def __init__(self, max_proofs: int = MAX_KEPT_PROOFS,
                 max_bytes: int = MAX_KEPT_PROOF_BYTES) -> None:
        self.max_proofs = max_proofs
        self.max_bytes = max_bytes
        self._kept: dict[bytes, KeptProof] = {}

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self._kept.values())

    def add(self, proof: KeptProof) -> bytes:
        """Keep ``proof``; its digest."""
        digest = proof_digest(proof.header)
        self._kept.pop(digest, None)
        self._kept[digest] = proof
        while len(self._kept) > 1 and (len(self._kept) > self.max_proofs
                                       or self.nbytes > self.max_bytes):
            del self._kept[next(iter(self._kept))]
        return digest

    def get(self, run_id: str, digest: bytes) -> KeptProof | None:
        """The kept proof of ``digest`` in ``run_id`` (None: none)."""
        proof = self._kept.get(digest)
        return proof if proof is not None and proof.run_id == run_id else None
