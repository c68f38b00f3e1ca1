"""Messages of the all-reduce protocol ``/p2pdl/allreduce/1.0.0`` (protocols/allreduce.md).

One stream per (sender, reducer) pair, opened by the sender:

1. sender -> reducer: ``ar.begin``, then the sender's values of the
   reducer's part as TENSOR frames (chunk by chunk, in order); no
   half-close, the reducer knows the count;
2. reducer -> sender: the averaged chunks as TENSOR frames, in order, as soon
   as each is reduced, then ``ar.done`` (who contributed to which chunks);
   or ``ar.reject`` at any point, and the stream ends.

After the round, one stream per pair of members that use the results: each
side sends ``ar.have`` (the parts it completed) once, the dialer first; when
both verify, each then sends ``ar.check`` (its signed reports).  A member
whose check of a part failed opens one more stream to its reducer:
``ar.dispute`` (the reports it used), answered by ``ar.proof`` and the
committed chunks of the contributors whose reports the reducer disputes.
In a certificate run a member fetches a dispute's published proof from its
publisher: ``ar.fetch_proof``, answered by ``ar.proven_dispute`` and its
chunks.
"""

from __future__ import annotations

from typing import Annotated

from ...progress import Report
from ...wire import MaxLen, Message, MessageSet, Range
from ..matchmaking.config import (
    GROUP_ID_SIZE,
    MAX_CODE_LENGTH,
    MAX_DETAIL_LENGTH,
    MAX_GROUP_SIZE,
    MAX_PEER_ID_SIZE,
    MAX_RUN_ID_LENGTH,
)
from ._evidence import CHUNK_DIGEST_SIZE, MAX_COMMITTED_CHUNKS, SIGNATURE_SIZE
from ._verify import NONCE_SIZE, SKETCH_BUCKETS

__all__ = ["ALLREDUCE_PROTOCOL_ID", "Begin", "Segment", "Done", "Reject", "Have", "Reveal",
           "Joint", "PartCheck", "Check", "SignedReport", "Dispute", "Shown", "Committed",
           "Proof", "FetchProof", "ProvenDispute", "FETCHED_MESSAGES", "COMMITTED_DIGEST_SIZE",
           "PROOF_DIGEST_SIZE", "MAX_LAYOUT_PREIMAGE",
           "REJECT_CODES", "SENDER_MESSAGES", "REDUCER_MESSAGES", "HAVE_MESSAGES",
           "REVEAL_MESSAGES", "JOINT_MESSAGES", "CHECK_MESSAGES",
           "PROOF_MESSAGES", "LAYOUT_DIGEST_SIZE", "RESULT_DIGEST_SIZE", "MAX_WEIGHT",
           "MAX_SEGMENTS", "MAX_TAU"]

ALLREDUCE_PROTOCOL_ID = "/p2pdl/allreduce/1.0.0"

#: Bytes of a layout digest (SHA-256).
LAYOUT_DIGEST_SIZE = 32
#: Bytes of a result digest (BLAKE3 of a part's averaged chunks as sent).
RESULT_DIGEST_SIZE = 32
#: Bytes of a committed contributor's digest of chunk digests (SHA-256).
COMMITTED_DIGEST_SIZE = 32
#: Bytes of a published dispute proof's digest (SHA-256 of its ``ar.proven_dispute``).
PROOF_DIGEST_SIZE = 32
#: Largest layout preimage a published proof may carry (bytes).
MAX_LAYOUT_PREIMAGE = 262144
#: Largest weight a sender may give (samples are counted in far fewer).
MAX_WEIGHT = 1e15
#: Largest CenteredClip radius an ``ar.done`` may name.
MAX_TAU = 1e300
#: Most segments one ``ar.done`` lists (a reducer merges runs of chunks with the
#: same contributors, so a round has at most one segment per chunk; bounded anyway).
MAX_SEGMENTS = 65536

#: Why a reducer refused a sender (protocols/allreduce.md, Errors).
REJECT_CODES = {
    "unknown_group": "the reducer runs no all-reduce for this group (not yet within the "
                     "wait, or never)",
    "finished": "the reducer's all-reduce for this group already ended",
    "not_member": "the stream's peer is not the group member at the claimed index",
    "not_reducer": "the addressed peer reduces no part in this group",
    "layout_mismatch": "the sender's tensors, codecs or plan differ from the reducer's",
    "duplicate": "this sender already has a stream for this group",
    "excluded": "the sender was excluded (it was later than sender_timeout, or broke the "
                "protocol)",
    "busy": "the reducer holds as many waiting streams as it may",
    "not_admitted": "the reducer's admission gate refused the sender for this group's run",
    "not_exchanging": "the addressed member takes no part in the post-round exchange with "
                      "this member (ar.have)",
    "uncommitted": "the sender's ar.begin carries no valid commitment to its chunks, and "
                   "the reducer verifies",
    "no_evidence": "the reducer no longer holds (or never held) what its contributors sent "
                   "for this group, or the dispute names another result",
}


class Begin(Message, tag="ar.begin"):
    """A sender opens its stream to a reducer.

    ``weight``: how much its values count (samples); 0 sends no values.
    ``want_result``: send me the averaged part (False for auxiliary peers,
    who contribute nothing and need nothing).  ``report``: the sender's own
    latest signed progress report for the group's run and epoch, the
    evidence of ``weight`` (None: the reducer judges by the reports it holds;
    old senders send none, and old reducers ignore it).  ``chunks``: the
    BLAKE3 digest of each chunk payload it will send, in order, and ``commitment``
    its signature over them (protocols/allreduce.md, Disputes; None from r8
    senders and with a rule that has no check).
    """

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    sender: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    reducer: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    layout: Annotated[bytes, MaxLen(LAYOUT_DIGEST_SIZE)]
    weight: Annotated[float, Range(0.0, MAX_WEIGHT)]
    want_result: bool = True
    report: Report | None = None
    chunks: Annotated[list[Annotated[bytes, MaxLen(CHUNK_DIGEST_SIZE)]],
                      MaxLen(MAX_COMMITTED_CHUNKS)] | None = None
    commitment: Annotated[bytes, MaxLen(SIGNATURE_SIZE)] | None = None


class Segment(Message, tag="ar.segment"):
    """Chunks ``[first, end)`` of the part were averaged over ``contributors``
    (member indices, ascending) whose weights sum to ``weight``; ``weights``:
    each one's weight as the reducer counted it (None from r6 reducers)."""

    first: Annotated[int, Range(0, 2**32)]
    end: Annotated[int, Range(0, 2**32)]
    contributors: Annotated[list[Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]],
                            MaxLen(MAX_GROUP_SIZE)]
    weight: Annotated[float, Range(0.0, MAX_WEIGHT * MAX_GROUP_SIZE)]
    weights: Annotated[list[Annotated[float, Range(0.0, MAX_WEIGHT)]],
                       MaxLen(MAX_GROUP_SIZE)] | None = None


class Done(Message, tag="ar.done"):
    """Every averaged chunk was sent; who contributed to which; under
    CenteredClip, ``taus``: the radius of each chunk (None under the mean, and
    from r6 reducers); ``signature``: the reducer's over the part's result
    digest (None under a rule without a check, and from r9 reducers)."""

    segments: Annotated[list[Segment], MaxLen(MAX_SEGMENTS)]
    taus: Annotated[list[Annotated[float, Range(0.0, MAX_TAU)]],
                    MaxLen(MAX_SEGMENTS)] | None = None
    signature: Annotated[bytes, MaxLen(SIGNATURE_SIZE)] | None = None


class Reject(Message, tag="ar.reject"):
    """The reducer refuses (``code``: REJECT_CODES) and ends the stream."""

    code: Annotated[str, MaxLen(MAX_CODE_LENGTH)]
    detail: Annotated[str, MaxLen(MAX_DETAIL_LENGTH)] = ""


class Have(Message, tag="ar.have"):
    """After the round: the parts member ``sender`` completed (indices of
    members whose non-empty part it received whole, or reduced itself);
    ``digests``: the digest of each of those parts' result, in the order of
    ``parts`` (None from r6 members); ``nonce``: a verification nonce of a
    member before r12 (empty from r12 members); ``results``: each of those
    parts' reducer's signature over its digest (None from r9 members);
    ``commitment``: the commitment to the sender's secret nonce (empty: it
    verifies nothing, or it is a member before r12)."""

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    sender: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    parts: Annotated[list[Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]],
                     MaxLen(MAX_GROUP_SIZE)]
    digests: Annotated[list[Annotated[bytes, MaxLen(RESULT_DIGEST_SIZE)]],
                       MaxLen(MAX_GROUP_SIZE)] | None = None
    nonce: Annotated[bytes, MaxLen(NONCE_SIZE)] = b""
    results: Annotated[list[Annotated[bytes, MaxLen(SIGNATURE_SIZE)]],
                       MaxLen(MAX_GROUP_SIZE)] | None = None
    commitment: Annotated[bytes, MaxLen(NONCE_SIZE)] = b""


class Reveal(Message, tag="ar.reveal"):
    """The sender's secret nonce, once the members whose secrets make its
    joint nonce are fixed (Verification)."""

    nonce: Annotated[bytes, MaxLen(NONCE_SIZE)]


class Joint(Message, tag="ar.joint"):
    """The joint nonce the sender verifies with: the reports it wants are for it."""

    nonce: Annotated[bytes, MaxLen(NONCE_SIZE)]


class PartCheck(Message, tag="ar.part_check"):
    """A contributor's report on ``part`` for the addressed verifier's joint nonce:
    the digest of the result it holds, its sketch (SKETCH_BUCKETS float32,
    little-endian), its distance to the result in each chunk, and its
    signature over all that (None from r8 members)."""

    part: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    digest: Annotated[bytes, MaxLen(RESULT_DIGEST_SIZE)]
    sketch: Annotated[bytes, MaxLen(4 * SKETCH_BUCKETS)]
    distances: Annotated[list[float], MaxLen(MAX_SEGMENTS)]
    signature: Annotated[bytes, MaxLen(SIGNATURE_SIZE)] | None = None


class Check(Message, tag="ar.check"):
    """After both ``ar.have``: member ``sender``'s reports on the parts it
    contributed to, for the addressed member's nonce."""

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    sender: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    reports: Annotated[list[PartCheck], MaxLen(MAX_GROUP_SIZE)]


class SignedReport(Message, tag="ar.signed_report"):
    """A contributor's report as a verifier heard it (in ``ar.dispute``)."""

    contributor: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    report: PartCheck


class Dispute(Message, tag="ar.dispute"):
    """Member ``sender``'s check of the addressed reducer's part failed: its
    joint nonce, the digest of the result it holds, and the reports it used."""

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    sender: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    nonce: Annotated[bytes, MaxLen(NONCE_SIZE)]
    digest: Annotated[bytes, MaxLen(RESULT_DIGEST_SIZE)]
    reports: Annotated[list[SignedReport], MaxLen(MAX_GROUP_SIZE)]


class Shown(Message, tag="ar.shown"):
    """A contributor whose committed chunks follow an ``ar.proof``: its
    chunk digests and its signature over them, as its ``ar.begin`` carried,
    and how many of its chunks (the first ``delivered``) the reducer received."""

    contributor: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    delivered: Annotated[int, Range(0, MAX_COMMITTED_CHUNKS)]
    chunks: Annotated[list[Annotated[bytes, MaxLen(CHUNK_DIGEST_SIZE)]],
                      MaxLen(MAX_COMMITTED_CHUNKS)]
    commitment: Annotated[bytes, MaxLen(SIGNATURE_SIZE)]


class Committed(Message, tag="ar.committed"):
    """A committed contributor as a reducer's answer binds it: how many of its
    chunks the reducer received and the SHA-256 of its chunk digests."""

    contributor: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    delivered: Annotated[int, Range(0, MAX_COMMITTED_CHUNKS)]
    chunks: Annotated[bytes, MaxLen(COMMITTED_DIGEST_SIZE)]


class Proof(Message, tag="ar.proof"):
    """The reducer's answer to ``ar.dispute``: the contributors whose reports
    it disputes (or that the verifier lacks), in ascending order; their
    chunks follow as TENSOR frames, contributor by contributor, in order.
    ``committed``: every committed contributor it holds, ascending, and
    ``signature``: its signature over the answer (Accusations; both nil from
    reducers before r14)."""

    shown: Annotated[list[Shown], MaxLen(MAX_GROUP_SIZE)]
    committed: Annotated[list[Committed], MaxLen(MAX_GROUP_SIZE)] | None = None
    signature: Annotated[bytes, MaxLen(SIGNATURE_SIZE)] | None = None


class FetchProof(Message, tag="ar.fetch_proof"):
    """A member of run ``run_id`` asks the publisher of a dispute's proof
    (Accusations) for it, by its digest."""

    run_id: Annotated[str, MaxLen(MAX_RUN_ID_LENGTH)]
    digest: Annotated[bytes, MaxLen(PROOF_DIGEST_SIZE)]


class ProvenDispute(Message, tag="ar.proven_dispute"):
    """A dispute as its verifier publishes it, all but the chunks (which
    follow as TENSOR frames: the result's, then the verifier's own first
    ``own.delivered``, then each shown contributor's first ``delivered``).

    ``run_id``; ``members``: the group's member peer ids (binary), in group
    order; ``layout``: the layout's digest preimage (msgpack, The layout);
    ``part``: the disputed part (its reducer's index); ``dispute``: the
    verifier's ``ar.dispute`` as it sent it; ``done``: the part's ``ar.done``
    as the verifier received it; ``own``: the verifier's own commitment to
    its chunks of the part (nil: it contributed none); ``answer``: the
    reducer's signed ``ar.proof``."""

    run_id: Annotated[str, MaxLen(MAX_RUN_ID_LENGTH)]
    members: Annotated[list[Annotated[bytes, MaxLen(MAX_PEER_ID_SIZE)]],
                       MaxLen(MAX_GROUP_SIZE)]
    layout: Annotated[bytes, MaxLen(MAX_LAYOUT_PREIMAGE)]
    part: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    dispute: Dispute
    done: Done
    own: Shown | None
    answer: Proof


#: What a reducer accepts first on a stream (``ar.begin``, the dialer's
#: ``ar.have`` of the post-round exchange, or a verifier's ``ar.dispute``);
#: what a sender accepts from a reducer; what a dialer of the exchange
#: accepts in reply.
SENDER_MESSAGES = MessageSet(Begin, Have, Dispute, FetchProof)
REDUCER_MESSAGES = MessageSet(Done, Reject)
HAVE_MESSAGES = MessageSet(Have, Reject)
#: What either member of an exchange accepts once the ``ar.have`` are through,
#: in turn.
REVEAL_MESSAGES = MessageSet(Reveal)
JOINT_MESSAGES = MessageSet(Joint)
CHECK_MESSAGES = MessageSet(Check)
#: What a disputing verifier accepts from the reducer.
PROOF_MESSAGES = MessageSet(Proof, Reject)
#: What a member that fetches a published proof accepts from its publisher.
FETCHED_MESSAGES = MessageSet(ProvenDispute, Reject)
