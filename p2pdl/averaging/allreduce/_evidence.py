"""What settles a dispute over a reducer's result, sans-IO.

Verification (``_verify``) finds that a part's result and its contributors'
reports do not agree, but not who lied: the reducer, or a contributor whose
report was false (to frame an honest reducer).  This module holds what
tells them apart (protocols/allreduce.md, Disputes):

* **commitments**: a sender signs the digest (BLAKE3) of every chunk payload it will
  send a reducer (:func:`commitment_payload`) and sends them in its
  ``ar.begin``; the reducer refuses a chunk that differs from its digest and
  keeps what it received (:class:`ReducerEvidence`), so it can show later,
  to anyone, exactly what each contributor sent, under the contributor's
  own signature;
* **signed reports**: a contributor signs each report it sends
  (:func:`report_payload`);
* **the answer to a dispute**: the reducer recomputes, from the committed
  chunks, the report each contributor should have sent for the disputing
  verifier's joint nonce and shows the chunks of every contributor whose report
  differs from that, or that the verifier lacks
  (:meth:`ReducerEvidence.disputed`).  The verifier checks the chunks
  against the signed digests, recomputes those reports itself and checks
  the part again with them (``RoundVerifier.reconsider``): a signed report
  that differs from its signer's own committed data proves that
  contributor a liar; a part that still fails proves the reducer one (its
  result is not its rule's aggregate of what it received, every input now
  being the contributors' own data or their unrefuted signed word).

The rounding of an honest report is far below ``REPORT_TOLERANCE``, and
a lie within it moves a sketch by a millionth of its bound: nothing that
turns a check.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import blake3
import msgpack

from ._verify import (
    SKETCH_BUCKETS,
    ChunkClaim,
    Report,
    SketchPlan,
    contributor_report,
    deviates,
    sketch_bound,
)

if TYPE_CHECKING:
    import torch

#: The all-reduce's ``Layout`` (``_state``, which imports this module).
Layout = Any

__all__ = ["CHUNK_DIGEST_SIZE", "SIGNATURE_SIZE", "MAX_COMMITTED_CHUNKS", "chunk_digest",
           "payload_hasher", "commitment_payload", "report_payload", "claims_bytes",
           "chunks_digest", "members_digest", "reports_digest", "answer_payload",
           "result_payload", "signed_by", "pack_sketch", "unpack_report", "decode_chunks",
           "own_chunk_values",
           "ReducerEvidence"]

#: Bytes of a chunk digest (BLAKE3 of its payload).
CHUNK_DIGEST_SIZE = 32
#: Bytes of a signature (Ed25519, the identity keys' type).
SIGNATURE_SIZE = 64
#: Most chunks one commitment covers (its digests must fit one message); a
#: part of more chunks is sent uncommitted and is not verified.
MAX_COMMITTED_CHUNKS = 16384
_COMMIT_DOMAIN = "p2pdl/allreduce/commit/2"
_ANSWER_DOMAIN = "p2pdl/allreduce/answer/1"
_MEMBERS_DOMAIN = "p2pdl/allreduce/members/1"
_REPORTS_DOMAIN = "p2pdl/allreduce/reports/1"
_REPORT_DOMAIN = "p2pdl/allreduce/report/1"
_RESULT_DOMAIN = "p2pdl/allreduce/result/1"
_CLAIMS_DOMAIN = "p2pdl/allreduce/claims/1"


def payload_hasher() -> blake3.blake3:
    """A fresh hash of payloads: BLAKE3 with 32-byte digests, for chunk and
    result digests (several times as fast as SHA-256 on the megabytes a
    round hashes; the small digests elsewhere stay SHA-256)."""
    return blake3.blake3()


def chunk_digest(payload: bytes | bytearray | memoryview) -> bytes:
    """The digest of one chunk's payload, as it travels (BLAKE3, 32 bytes)."""
    return blake3.blake3(payload).digest()


def commitment_payload(group_id: bytes, part: int, sender: int, layout: bytes,
                       chunks: Sequence[bytes]) -> bytes:
    """What a sender signs to commit to its chunks of ``part`` under the
    layout of digest ``layout`` (which says how they decode)."""
    return msgpack.packb([_COMMIT_DOMAIN, group_id, part, sender, layout, list(chunks)],
                         use_bin_type=True)


def chunks_digest(chunks: Sequence[bytes]) -> bytes:
    """SHA-256 of a commitment's chunk digests, concatenated in order."""
    return hashlib.sha256(b"".join(chunks)).digest()


def members_digest(peer_ids: Sequence[bytes]) -> bytes:
    """SHA-256 of a group's member peer ids (binary), in group order."""
    return hashlib.sha256(msgpack.packb([_MEMBERS_DOMAIN, list(peer_ids)],
                                        use_bin_type=True)).digest()


def reports_digest(reports: Sequence[Any]) -> bytes:
    """SHA-256 of the signed reports of an ``ar.dispute``, in its order: each
    one's contributor and every field of its part check."""
    return hashlib.sha256(msgpack.packb([_REPORTS_DOMAIN, [
        [int(r.contributor), int(r.report.part), r.report.digest, r.report.sketch,
         [float(d) for d in r.report.distances], r.report.signature] for r in reports]],
        use_bin_type=True)).digest()


def answer_payload(part: int, members: Sequence[bytes], layout: bytes, dispute: Any,
                   shown: Sequence[int], committed: Sequence[tuple[int, int, bytes]]) -> bytes:
    """What a reducer signs with its answer to ``dispute`` (an ``ar.dispute``
    of part ``part``) in ``ar.proof``: the group, the :func:`members_digest`
    of its member peer ids, the layout digest, the dispute's joint nonce and
    result digest, its :func:`reports_digest`, the contributors the answer
    shows, and every committed contributor the reducer holds as
    ``(contributor, chunks delivered, chunks_digest)``."""
    return msgpack.packb([_ANSWER_DOMAIN, dispute.group_id, part, members_digest(members),
                          layout, dispute.nonce, dispute.digest,
                          reports_digest(dispute.reports), [int(c) for c in shown],
                          [[int(c), int(n), d] for c, n, d in committed]], use_bin_type=True)


def report_payload(group_id: bytes, part: int, contributor: int, nonce: bytes, digest: bytes,
                   sketch: bytes, distances: Sequence[float]) -> bytes:
    """What a contributor signs with a report: the verifier's joint nonce, the
    digest of the result it holds, its sketch as sent and its distances."""
    return msgpack.packb([_REPORT_DOMAIN, group_id, part, contributor, nonce, digest, sketch,
                          [float(d) for d in distances]], use_bin_type=True)


def claims_bytes(segments: Sequence[Any], taus: Sequence[float] | None) -> bytes:
    """A part's claims (its ``ar.done``: segments and radii) as its result
    digest covers them, after the averaged chunks' payloads."""
    return msgpack.packb([
        _CLAIMS_DOMAIN,
        [[int(s.first), int(s.end), [int(c) for c in s.contributors], float(s.weight),
          None if s.weights is None else [float(w) for w in s.weights]] for s in segments],
        None if taus is None else [float(t) for t in taus]], use_bin_type=True)


def result_payload(group_id: bytes, part: int, digest: bytes) -> bytes:
    """What a reducer signs with its ``ar.done``: the result digest of its part."""
    return msgpack.packb([_RESULT_DOMAIN, group_id, part, digest], use_bin_type=True)


def signed_by(peer: Any, payload: bytes, signature: bytes | None) -> bool:
    """Whether ``signature`` over ``payload`` verifies under the key in
    ``peer`` (a libp2p peer id)."""
    if not signature:
        return False
    try:
        key = peer.extract_public_key()
        return key is not None and bool(key.verify(payload, signature))
    except Exception:   # untrusted bytes: any failure means "not signed by it"
        return False


def pack_sketch(sketch: Sequence[float]) -> bytes:
    """A sketch as it travels: SKETCH_BUCKETS float32, little-endian."""
    return struct.pack(f"<{SKETCH_BUCKETS}f", *sketch)


def unpack_report(sketch: bytes, distances: Sequence[float]) -> Report | None:
    """A report from its wire form (None: the sketch has the wrong size)."""
    if len(sketch) != 4 * SKETCH_BUCKETS:
        return None
    return Report(struct.unpack(f"<{SKETCH_BUCKETS}f", sketch), tuple(distances))


def own_chunk_values(layout: Layout, part: int, payloads: Sequence[bytes | memoryview],
                     out: torch.Tensor) -> list[torch.Tensor]:
    """This node's own values of ``part`` as a reducer decodes its chunk
    payloads, one tensor per chunk: a view of the payload where the codec
    has one (:meth:`Codec.decoded_view`: no copy), else decoded into
    ``out``'s slice of the chunk (float32, the part's size); zeros (in
    ``out``) for the chunks after ``payloads``, as :func:`decode_chunks`."""
    values = []
    for k, chunk in enumerate(layout.chunks[part]):
        lo = chunk.start - chunk.part_start
        piece = out[lo:lo + chunk.count]
        if k >= len(payloads):
            values.append(piece.zero_())
            continue
        view = chunk.codec.decoded_view(payloads[k], chunk.count)
        values.append(view if view is not None else
                      chunk.codec.decode(payloads[k], chunk.count, out=piece, trusted=True))
    return values


def decode_chunks(layout: Layout, part: int, payloads: Sequence[bytes | memoryview],
                  out: torch.Tensor | None = None, *, trusted: bool = False) -> torch.Tensor:
    """A sender's values of ``part`` as a reducer decodes its chunk payloads
    (the first ``len(payloads)`` chunks; zeros after them, where the sender
    delivered nothing and so contributed nothing), in ``out`` (float32, the
    part's size) if given, else in a new tensor.  ``trusted``: this node's
    own payloads (not checked for finiteness)."""
    import torch

    numel = layout.part_numel(part)
    if out is None:
        out = torch.empty(numel, dtype=torch.float32)
    done = 0
    for chunk, payload in zip(layout.chunks[part], payloads, strict=False):
        lo = chunk.start - chunk.part_start
        chunk.codec.decode(payload, chunk.count, out=out[lo:lo + chunk.count], trusted=trusted)
        done = lo + chunk.count
    out[done:numel].zero_()
    return out


class ReducerEvidence:
    """What a reducer keeps of its part after the round, to answer disputes:
    the result as it sent it, its claims, its result digest, and each
    committed contributor's chunk digests, signature and payloads."""

    def __init__(self, layout: Layout, group_id: bytes, part: int, result: torch.Tensor,
                 claims: Sequence[ChunkClaim], digest: bytes,
                 committed: Mapping[int, tuple[Sequence[bytes], bytes, Sequence[bytes]]]
                 ) -> None:
        self.layout = layout
        self.group_id = group_id
        self.part = part
        self.result = result
        self.claims = tuple(claims)
        self.digest = digest
        #: contributor -> (chunk digests, commitment signature, payloads)
        self.committed = dict(committed)
        #: the verifiers whose dispute was answered (one each)
        self.answered: set[int] = set()

    @property
    def nbytes(self) -> int:
        """The payload bytes kept."""
        return sum(len(p) for _, _, payloads in self.committed.values() for p in payloads)

    def committed_entries(self) -> list[tuple[int, int, bytes]]:
        """Every committed contributor as an answer binds it: ``(contributor,
        chunks delivered, chunks_digest)``, ascending (:func:`answer_payload`)."""
        return [(c, len(payloads), chunks_digest(chunks))
                for c, (chunks, _, payloads) in sorted(self.committed.items())]

    def true_report(self, contributor: int, plan: SketchPlan) -> Report:
        """What ``contributor`` should report for ``plan``, from its committed chunks."""
        payloads = self.committed[contributor][2]
        values = decode_chunks(self.layout, self.part, payloads)
        return contributor_report(self.layout, self.part, values, self.result, self.claims,
                                  contributor, plan)

    def disputed(self, verifier: int, plan: SketchPlan,
                 reports: Mapping[int, Report | None]) -> list[int]:
        """The contributors to show a verifier whose ``plan`` (from its nonce)
        and ``reports`` (as it heard them; None or absent: none, or a lie on
        its face) are given: every committed contributor but the verifier
        whose report is missing or differs from its committed data."""
        out = []
        for j in sorted(self.committed):
            if j == verifier or not any(j in c.contributors for c in self.claims):
                continue
            heard = reports.get(j)
            if heard is None or deviates(heard, self.true_report(j, plan),
                                         sketch_bound(self.claims, j)):
                out.append(j)
        return out
