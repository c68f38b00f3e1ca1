"""Messages of the all-reduce protocol ``/p2pdl/allreduce/1.0.0`` (protocols/allreduce.md).

One stream per (sender, reducer) pair, opened by the sender:

1. sender -> reducer: ``ar.begin``, then the sender's values of the
   reducer's part as TENSOR frames (chunk by chunk, in order); no
   half-close, the reducer knows the count;
2. reducer -> sender: the averaged chunks as TENSOR frames, in order, as soon
   as each is reduced, then ``ar.done`` (who contributed to which chunks);
   or ``ar.reject`` at any point, and the stream ends.

After the round, one stream per pair of members that use the results: each
side sends ``ar.have`` (the parts it completed) once, the dialer first.
"""

from __future__ import annotations

from typing import Annotated

from ...progress import Report
from ...wire import MaxLen, Message, MessageSet, Range
from ..matchmaking.config import GROUP_ID_SIZE, MAX_CODE_LENGTH, MAX_DETAIL_LENGTH, MAX_GROUP_SIZE
from ._verify import NONCE_SIZE, SKETCH_BUCKETS

__all__ = ["ALLREDUCE_PROTOCOL_ID", "Begin", "Segment", "Done", "Reject", "Have", "PartCheck",
           "Check", "REJECT_CODES", "SENDER_MESSAGES", "REDUCER_MESSAGES", "HAVE_MESSAGES",
           "CHECK_MESSAGES", "LAYOUT_DIGEST_SIZE", "RESULT_DIGEST_SIZE", "MAX_WEIGHT",
           "MAX_SEGMENTS", "MAX_TAU"]

ALLREDUCE_PROTOCOL_ID = "/p2pdl/allreduce/1.0.0"
#: This protocol's id (every protocol package exports it under this name).
PROTOCOL_ID = ALLREDUCE_PROTOCOL_ID

#: Bytes of a layout digest (SHA-256).
LAYOUT_DIGEST_SIZE = 32
#: Bytes of a result digest (SHA-256 of a part's averaged chunks as sent).
RESULT_DIGEST_SIZE = 32
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
}


class Begin(Message, tag="ar.begin"):
    """A sender opens its stream to a reducer.

    ``weight``: how much its values count (samples); 0 sends no values.
    ``want_result``: send me the averaged part (False for auxiliary peers,
    who contribute nothing and need nothing).  ``report``: the sender's own
    latest signed progress report for the group's run and epoch, the
    evidence of ``weight`` (None: the reducer judges by the reports it holds;
    old senders send none, and old reducers ignore it).
    """

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    sender: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    reducer: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    layout: Annotated[bytes, MaxLen(LAYOUT_DIGEST_SIZE)]
    weight: Annotated[float, Range(0.0, MAX_WEIGHT)]
    want_result: bool = True
    report: Report | None = None


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
    from r6 reducers)."""

    segments: Annotated[list[Segment], MaxLen(MAX_SEGMENTS)]
    taus: Annotated[list[Annotated[float, Range(0.0, MAX_TAU)]],
                    MaxLen(MAX_SEGMENTS)] | None = None


class Reject(Message, tag="ar.reject"):
    """The reducer refuses (``code``: REJECT_CODES) and ends the stream."""

    code: Annotated[str, MaxLen(MAX_CODE_LENGTH)]
    detail: Annotated[str, MaxLen(MAX_DETAIL_LENGTH)] = ""


class Have(Message, tag="ar.have"):
    """After the round: the parts member ``sender`` completed (indices of
    members whose non-empty part it received whole, or reduced itself);
    ``digests``: the SHA-256 of each of those parts' result, in the order of
    ``parts`` (None from r6 members); ``nonce``: the sender's verification
    nonce (empty: it verifies nothing)."""

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    sender: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    parts: Annotated[list[Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]],
                     MaxLen(MAX_GROUP_SIZE)]
    digests: Annotated[list[Annotated[bytes, MaxLen(RESULT_DIGEST_SIZE)]],
                       MaxLen(MAX_GROUP_SIZE)] | None = None
    nonce: Annotated[bytes, MaxLen(NONCE_SIZE)] = b""


class PartCheck(Message, tag="ar.part_check"):
    """A contributor's report on ``part`` for the addressed verifier's nonce:
    the digest of the result it holds, its sketch (SKETCH_BUCKETS float32,
    little-endian) and its distance to the result in each chunk."""

    part: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    digest: Annotated[bytes, MaxLen(RESULT_DIGEST_SIZE)]
    sketch: Annotated[bytes, MaxLen(4 * SKETCH_BUCKETS)]
    distances: Annotated[list[float], MaxLen(MAX_SEGMENTS)]


class Check(Message, tag="ar.check"):
    """After both ``ar.have``: member ``sender``'s reports on the parts it
    contributed to, for the addressed member's nonce."""

    group_id: Annotated[bytes, MaxLen(GROUP_ID_SIZE)]
    sender: Annotated[int, Range(0, MAX_GROUP_SIZE - 1)]
    reports: Annotated[list[PartCheck], MaxLen(MAX_GROUP_SIZE)]


#: What a reducer accepts first on a stream (``ar.begin``, or the dialer's
#: ``ar.have`` of the post-round exchange); what a sender accepts from a
#: reducer; what a dialer of the exchange accepts in reply.
SENDER_MESSAGES = MessageSet(Begin, Have)
REDUCER_MESSAGES = MessageSet(Done, Reject)
HAVE_MESSAGES = MessageSet(Have, Reject)
#: What either member of an exchange accepts once the ``ar.have`` are through.
CHECK_MESSAGES = MessageSet(Check)
