"""What one all_reduce call is while it runs (:class:`_Session`), what a node
remembers of a finished one (:class:`_Finished`), its statistics, the flag
kinds it raises, its timing constants, and the helpers that flatten and
restore tensors; shared by the service and its sides (``_service``).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import trio

from ...errors import (
    ConfigError,
    LocalProtocolError,
    P2PDLError,
    RemoteProtocolError,
    StreamClosedError,
)
from ...service import Statistics
from ...wire import FramedStream, Message, MessageSet, TensorChunk
from .._balancing import round_time
from ._evidence import ReducerEvidence
from ._messages import Done
from ._parts import PartReceiver, PartReducer
from ._state import Layout, PartResult
from ._verify import JointNonce, RoundVerifier, Verdict
from .config import AllReduceConfig

if TYPE_CHECKING:
    import torch

    from ...progress import Report
    from ..matchmaking import Group

__all__ = ["WEIGHT_FLAG", "OUTLIER_FLAG", "CHECK_FLAG", "REPORT_FLAG", "LIE_FLAG",
           "REDUCER_LIE_FLAG", "EQUIVOCATION_FLAG", "FALSE_ACCUSATION_FLAG",
           "MAX_RECENT_GROUPS", "DONE_LINGER", "LIVENESS_POLL", "HAVE_GRACE", "JOIN_WAIT",
           "AllReduceStatistics", "COUNTERS", "_Session", "_NOT_CHECKED", "_Rejected",
           "_Finished", "_held", "_describe", "_predicted", "_check_tensors", "_flatten",
           "_check_finite", "_receive_message", "_restore", "_unflatten"]

#: The FlagBook kind of a sender whose weight exceeded what its reports support.
WEIGHT_FLAG = "weight_beyond_evidence"


#: The flag of a sender whose values lay far from a robust rule's result.
OUTLIER_FLAG = "outlier_values"


#: The flag a member raises on a reducer whose part failed its check.
CHECK_FLAG = "reducer_check_failed"


#: The flag a member raises on a contributor whose report was a lie on its face.
REPORT_FLAG = "report_beyond_bound"


#: The flag of a contributor whose signed report its own committed chunks refute.
LIE_FLAG = "report_lie"


#: The flag of a reducer whose part still failed once it showed its evidence
#: (or that showed false evidence).
REDUCER_LIE_FLAG = "reducer_lie"


#: The flag of a reducer proven to have signed two different results of one part.
EQUIVOCATION_FLAG = "equivocation"


#: The flag of a member whose published accusation did not check out.
FALSE_ACCUSATION_FLAG = "false_accusation"


#: Finished groups a node remembers, to refuse their late streams at once.
MAX_RECENT_GROUPS = 64
#: TENSOR frames per direction a round keeps the times of, for the capacity estimate.
MAX_ROUND_FRAMES = 65536


#: How long a reducer waits, after ``ar.done``, for the sender to end the stream (s).
DONE_LINGER = 2.0


#: How often a reducer looks for senders whose connection closed (s).
LIVENESS_POLL = 0.5


#: How long past ``averaging_timeout`` the post-round exchange may last (s).
HAVE_GRACE = 2.0
#: Seconds a verifying member waits, once it revealed its secret, for the
#: secrets of the members it committed to wait for (then joins without them).
JOIN_WAIT = 1.0


@dataclasses.dataclass(frozen=True)
class AllReduceStatistics(Statistics):
    """What ``AllReduceService.statistics()`` says: counters (every one present,
    from 0), the calls running (``active``) and the streams waiting for theirs.

    ``weights_capped``: senders whose weight this node's reducer lowered to
    what their progress reports support (each is flagged
    ``weight_beyond_evidence``).  ``weights_share_capped``: (round, member)
    pairs whose weight the share cap lowered in some chunk of this node's part;
    ``weights_ratio_capped``: those the median cap lowered (robust rules,
    ``max_weight_ratio``).
    ``outliers_flagged``: (round, member) pairs whose values lay more than
    ``outlier_factor`` times the reference distance from the robust result
    of some chunk of this node's part (each is flagged ``outlier_values``).
    ``haves_heard``: members whose ``ar.have`` a round heard after it ended.
    ``parts_dropped``: parts this node completed and then dropped, because a
    member lacked them and their reducer was gone; ``parts_disputed``: parts
    it completed that a member lacked while their reducer was connected.
    ``parts_checked``: other members' parts this node verified (Verification);
    ``parts_check_failed``: those whose check failed, disputes included
    (dropped here, the reducer flagged ``reducer_lie`` or
    ``reducer_check_failed``); ``parts_unverifiable``: those it could not
    judge (a report missing under the mean); ``reports_refused``:
    contributors' reports that were lies on their face (each flagged
    ``report_beyond_bound``).  ``disputes_opened``: failed checks this node
    disputed with their reducer; ``disputes_cleared``: those whose part
    passed once the reducer showed its contributors' committed chunks;
    ``report_lies``: contributors those chunks proved liars (each flagged
    ``report_lie``); ``disputes_answered``: disputes this node answered as
    a reducer.  ``equivocations``: parts whose reducer this node caught
    signing two different results (each flagged ``equivocation``).
    ``accusations_published``: proofs this node published in a run's
    accusation record; ``accusations_upheld``: proofs published by other
    members that checked out (the accused flagged ``equivocation``);
    ``accusations_false``: those that did not (their publisher flagged
    ``false_accusation``).  ``verification_bytes_sent``: what verification
    added to this node's messages (nonces, digests, commitments, result
    signatures, ``ar.check``), in bytes of their msgpack bodies.
    ``reports_sketched``: the sketches this node computed for its reports
    (one per part it contributed to and distinct joint nonce asked for: as
    many as parts when the members share one).  ``nonces_withheld``:
    members that committed to a secret this node waited for and never
    revealed it (left out of its joint nonce).  ``proofs_kept``: proofs of
    disputes this node keeps and claims in a run's record (Accusations);
    ``proofs_unpublishable``: disputes that proved a lie here whose proof
    would not convince others (a reducer before r14, or a result its codec
    does not reproduce); ``proofs_served``: kept proofs sent to members that
    fetched them; ``proofs_fetched``: others' proofs this node fetched and
    judged; ``proofs_unfetched``: fetches that failed (tried again, up to
    MAX_FETCH_TRIES times); ``lies_proven``: lies those proofs proved
    (the liar flagged ``reducer_lie`` or ``report_lie``, once per lie);
    false proofs count in ``accusations_false``.  ``bytes_sent`` and
    ``bytes_received``: the tensor bytes of this node's rounds (its values to
    reducers, its part's results to senders, and back), as
    :class:`AllReduceResult` counts them; ``round_seconds``: the seconds its
    rounds took, from the call to the result (over ``completed`` plus
    ``incomplete``: the mean round time).  ``capacity_samples``: rounds'
    transfers (per direction) that counted as samples of this node's rates
    (``AllReduceService.capacity``).
    """

    active: int
    waiting: int
    rounds: int = 0
    completed: int = 0
    incomplete: int = 0
    parts_failed: int = 0
    senders_excluded: int = 0
    senders_failed: int = 0
    streams_rejected: int = 0
    protocol_errors: int = 0
    weights_capped: int = 0
    weights_share_capped: int = 0
    weights_ratio_capped: int = 0
    outliers_flagged: int = 0
    haves_heard: int = 0
    parts_dropped: int = 0
    parts_disputed: int = 0
    parts_checked: int = 0
    parts_check_failed: int = 0
    parts_unverifiable: int = 0
    reports_refused: int = 0
    disputes_opened: int = 0
    disputes_cleared: int = 0
    report_lies: int = 0
    disputes_answered: int = 0
    equivocations: int = 0
    accusations_published: int = 0
    accusations_upheld: int = 0
    accusations_false: int = 0
    verification_bytes_sent: int = 0
    reports_sketched: int = 0
    nonces_withheld: int = 0
    proofs_kept: int = 0
    proofs_unpublishable: int = 0
    proofs_served: int = 0
    proofs_fetched: int = 0
    proofs_unfetched: int = 0
    lies_proven: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    round_seconds: float = 0.0
    capacity_samples: int = 0


#: The counters of :meth:`AllReduceService.statistics`.
COUNTERS = AllReduceStatistics.counter_names()


class _Session:
    """One all_reduce call: its layout, output, reducer and handler tasks."""

    def __init__(self, group: Group, me: int, layout: Layout, flat: torch.Tensor,
                 weight: float, auxiliary: bool, config: AllReduceConfig, start: float) -> None:
        self.group = group
        self.me = me
        self.layout = layout
        self.flat = flat
        self.weight = weight
        self.auxiliary = auxiliary
        self.config = config
        self.start = start
        self.deadline = start + config.averaging_timeout
        self.reducer: PartReducer | None = None
        self._progress = trio.Event()
        self.scopes: set[trio.CancelScope] = set()
        self.handlers = 0
        self.handlers_idle = trio.Event()
        self.handlers_idle.set()
        self.bytes_sent = 0
        self.bytes_received = 0
        # direction ("up", "down") -> (trio time, bytes) of the TENSOR frames
        # the round's streams moved that way, at most MAX_ROUND_FRAMES (the
        # capacity estimator's samples)
        self.frames: dict[str, list[tuple[float, int]]] = {"up": [], "down": []}
        # this node's reducing: input bytes and seconds (the reduce rate's sample)
        self.reduce_bytes = 0
        self.reduce_seconds = 0.0
        self.excluded: set[int] = set()
        self.seen_connected: set[int] = set()   # senders this node was connected to
        self.times: dict[str, float] = {}
        self.report: Report | None = None   # the evidence of our weight, for every reducer
        # The post-round exchange: the parts this member completed (None until
        # its own round settled), and what the others said they completed.
        self.held: frozenset[int] | None = None
        self.settled = trio.Event()
        self.heard: dict[int, frozenset[int]] = {}
        self.have_streams: set[int] = set()     # members that opened their exchange stream
        # Senders this reducer excluded as silent or broken: not waited for in the
        # exchange (one whose stream merely closed may be a member that lacks a part).
        self.unheeded: set[int] = set()
        # Verification: this member's checks of the others' parts (None: it
        # verifies nothing), the members whose exchange (ar.have, and ar.check
        # when both verify) is through, and the verdicts once the exchange ended.
        self.verifier: RoundVerifier | None = None
        # This member's share in the joint nonce (None: it verifies nothing),
        # and when its round settled (the exchange's waits count from then).
        self.joint: JointNonce | None = None
        self.settled_at = math.inf
        self.exchanged: set[int] = set()
        self.verdicts: dict[int, Verdict] = {}
        # Disputes: this member's encoded chunks of each part it sent (committed
        # to), and, as a reducer that verifies, what it keeps to answer disputes.
        self.encoded: dict[int, list[bytes | memoryview]] = {}
        self.evidence: ReducerEvidence | None = None
        # part -> this member's commitment to its chunks (digests, signature),
        # and the ar.done of each part it received (segments, radii): what a
        # proof of a dispute shows of them.
        self.commitments: dict[int, tuple[list[bytes], bytes]] = {}
        self.dones: dict[int, Done] = {}
        # part -> chunk -> its payload as received, where its codec does not
        # give it back from the decoded values (uint8)
        self.kept_results: dict[int, dict[int, bytes]] = {}
        # part -> how its dispute ended: "cleared", "reducer_lie" or
        # "unanswered", the contributors proven liars, and why
        self.disputes: dict[int, tuple[str, frozenset[int], str]] = {}
        # Signed results: this reducer's signature over its part's result
        # digest (by digest: one, unless a modified client equivocates), and
        # what each member's ar.have said it holds: member -> part -> (result
        # digest, its reducer's signature).
        self.result_signatures: dict[bytes, bytes] = {}
        self.results_heard: dict[int, dict[int, tuple[bytes, bytes]]] = {}

    def progressed(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def wait_progress(self) -> None:
        await self._progress.wait()

    def count_stream(self, stream: FramedStream) -> None:
        stats = stream.statistics()
        self.bytes_sent += stats.bytes_sent
        self.bytes_received += stats.bytes_received
        for direction, log in zip(("up", "down"), stream.tensor_log(), strict=True):
            frames = self.frames[direction]
            frames.extend(log[:max(0, MAX_ROUND_FRAMES - len(frames))])

    def mark(self, phase: str) -> None:
        self.times.setdefault(phase, trio.current_time() - self.start)

    def finalize(self) -> None:
        """Average what became final; wake the tasks sending results.  The
        seconds it took and the bytes of input it reduced (each chunk's
        encoded size times its contributors) count towards the node's
        measured reduce rate."""
        assert self.reducer is not None
        began = time.perf_counter()
        done = self.reducer.finalize()
        if done:
            self.reduce_seconds += time.perf_counter() - began
            chunks = self.layout.chunks[self.me]
            self.reduce_bytes += sum(chunks[k].codec.encoded_size(chunks[k].count)
                                     * len(self.reducer.contributors[k]) for k in done)
            if self.reducer.complete:
                self.mark("reduce")
            self.progressed()


#: A verdict for parts that were not checked.
_NOT_CHECKED = Verdict("unchecked")


class _Rejected(P2PDLError):
    """A reducer refused this sender."""


@dataclasses.dataclass(frozen=True)
class _Finished:
    """A finished round, remembered to answer a late ``ar.have`` (and to refuse
    late streams ``finished``): no values, only what this member completed."""

    group: Group
    me: int
    layout: Layout
    held: frozenset[int] | None
    evidence: ReducerEvidence | None = None   # what answers disputes, until kept_until
    kept_until: float = 0.0


def _held(session: _Session, receivers: dict[int, PartReceiver]) -> frozenset[int]:
    """The non-empty parts this member completed: its own, averaged; the
    others, received whole."""
    held = {r for r, receiver in receivers.items() if receiver.complete}
    if session.reducer is not None and session.reducer.complete:
        held.add(session.me)
    return frozenset(held)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _predicted(group: Group, layout: Layout) -> float | None:
    """The plan's round time for this vector, if the members said their bandwidths."""
    if not any(m.bandwidth for m in group.members):
        return None
    members = len(layout.fractions)   # (results may travel larger: topk)
    vector_bytes = sum((codec.encoded_size(size) + codec.for_results(members).encoded_size(size))
                       / 2 for codec, size in zip(layout.codecs, layout.sizes, strict=True))
    if vector_bytes == 0:
        return 0.0
    try:
        return round_time(group.capacities(), layout.fractions, vector_bytes)[0]
    except LocalProtocolError:
        return None


def _check_tensors(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    import torch

    if isinstance(tensors, torch.Tensor):
        raise ConfigError("tensors must be a sequence of tensors, not one tensor "
                          "(wrap it in a list)")
    try:
        items = list(tensors)
    except TypeError:
        raise ConfigError(f"tensors must be a sequence of tensors, got "
                          f"{type(tensors).__name__}") from None
    if not items:
        raise ConfigError("tensors is empty: there is nothing to average")
    for i, t in enumerate(items):
        if not isinstance(t, torch.Tensor):
            raise ConfigError(f"tensors[{i}] is a {type(t).__name__}, not a torch.Tensor")
        if not t.is_floating_point():
            raise ConfigError(f"tensors[{i}] has dtype {t.dtype}; only floating-point "
                              f"tensors can be averaged")
    return items


def _flatten(tensors: list[torch.Tensor], numel: int) -> torch.Tensor:
    import torch

    flat = torch.empty(numel, dtype=torch.float32)
    position = 0
    for t in tensors:
        n = t.numel()
        flat[position:position + n].copy_(t.detach().reshape(-1))
        position += n
    return flat


def _check_finite(flat: torch.Tensor) -> None:
    import torch

    # One reduction: NaN propagates through min and max, and an infinity is one of them.
    if flat.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(flat))).all()):
        raise ConfigError("the tensors hold NaN or infinite values; they cannot be averaged")


async def _receive_message(stream: FramedStream, messages: MessageSet, what: str,
                           sender: str) -> Message:
    """The next message on ``stream``, one of ``messages`` (``what``, for the
    errors): StreamClosedError when the stream ends first (``sender`` ended
    it), RemoteProtocolError for a TENSOR frame."""
    item = await stream.receive(messages)
    if item is None:
        raise StreamClosedError(f"the {sender} ended the stream before its {what}")
    if isinstance(item, TensorChunk):
        raise RemoteProtocolError(f"expected {what}")
    return item[1]


def _restore(flat: torch.Tensor, originals: list[torch.Tensor], layout: Layout,
             lo: int, hi: int, *, offset: int = 0) -> None:
    """Put this member's own values ``[lo, hi)`` back into ``flat`` (which
    starts at value ``offset`` of the vector)."""
    for t, start, size in zip(originals, layout.tensor_starts, layout.sizes, strict=False):
        a, b = max(lo, start), min(hi, start + size)
        if a < b:
            flat[a - offset:b - offset].copy_(t.detach().reshape(-1)[a - start:b - start])


def _sent_error(layout: Layout, me: int, originals: list[torch.Tensor],
                parts: Sequence[PartResult], encoded: Mapping[int, Sequence[bytes | memoryview]]
                ) -> list[torch.Tensor]:
    """``AllReduceResult.sent_error``: per tensor (float32, its shape), this
    member's values less their decoding, in the chunks of completed parts
    whose reducer counted this member; 0 elsewhere.  ``encoded``: the
    payloads this member kept of the parts it committed to (the others are
    encoded again: encoding is deterministic)."""
    import torch

    error = torch.zeros(layout.numel, dtype=torch.float32)
    for part in parts:
        r = part.reducer
        if not part.completed:
            continue
        payloads = encoded.get(r)
        for k, chunk in enumerate(layout.chunks[r]):
            # (of its own part only what a sparse codec dropped: PartReducer)
            if chunk.codec.name == "none" or (r == me and not chunk.codec.sparse) or not any(
                    c.start <= chunk.start and chunk.end <= c.end and me in c.contributors
                    for c in part.contributions):
                continue
            piece = error[chunk.start:chunk.end]
            _restore(piece, originals, layout, chunk.start, chunk.end, offset=chunk.start)
            payload = payloads[k] if payloads is not None and k < len(payloads) \
                else bytes(chunk.codec.encode(piece))
            piece.sub_(chunk.codec.decode(payload, chunk.count, trusted=True))
    return [piece.view(t.shape) for piece, t in zip(_split(error, originals), originals,
                                                      strict=True)]


def _split(flat: torch.Tensor, originals: list[torch.Tensor]) -> list[torch.Tensor]:
    """``flat`` cut into pieces of the tensors' sizes."""
    out, position = [], 0
    for t in originals:
        out.append(flat[position:position + t.numel()])
        position += t.numel()
    return out


def _zeros_like(originals: list[torch.Tensor]) -> list[torch.Tensor]:
    """float32 zeros of the tensors' shapes."""
    import torch

    return [torch.zeros(t.shape, dtype=torch.float32) for t in originals]


def _unflatten(flat: torch.Tensor, originals: list[torch.Tensor]) -> list[torch.Tensor]:
    outputs = []
    position = 0
    for t in originals:
        n = t.numel()
        piece = flat[position:position + n].view(t.shape)
        outputs.append(piece if piece.dtype == t.dtype and piece.device == t.device
                       else piece.to(dtype=t.dtype, device=t.device))
        position += n
    return outputs
