"""One part of the butterfly all-reduce, sans-IO: its reducer and its receivers.

No trio and no sockets: time is passed in, tensors are plain torch tensors.
``_reducing`` and ``_sending`` move the bytes (protocols/allreduce.md).

* :class:`PartReducer` -- a reducer's state for its part: the weighted sum
  of its own values and every sender's chunks, which sender delivered what,
  exclusions (``sender_timeout``, broken streams), and the averaged chunks,
  final in order as soon as every sender still counted has delivered them.
* :class:`PartReceiver` -- a sender's state for one remote part: the
  averaged chunks arriving in order, checked and decoded into the output,
  then the reducer's account of who contributed.
* :class:`SenderState` -- where each sender of a part stands.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ...errors import LocalProtocolError, RemoteProtocolError
from ...wire import TensorHeader
from .._aggregators import AUTO
from ._evidence import ReducerEvidence, chunk_digest, claims_bytes, payload_hasher
from ._messages import MAX_SEGMENTS, Segment
from ._state import Layout, RejectError
from ._verify import ChunkClaim
from ._weights import MIN_CAPPED_CONTRIBUTORS, cap_shares, cap_to_median

if TYPE_CHECKING:
    import torch


__all__ = ["PartReducer", "PartReceiver", "SenderState", "MIN_OUTLIER_VALUES"]


class SenderState(enum.Enum):
    WAITING = "waiting"      # no ar.begin yet
    STREAMING = "streaming"  # sending its chunks
    DONE = "done"            # sent every chunk (or has weight 0)
    EXCLUDED = "excluded"    # later than sender_timeout: its further chunks are ignored
    FAILED = "failed"        # its stream broke or it broke the protocol


_FINISHED = (SenderState.DONE, SenderState.EXCLUDED, SenderState.FAILED)

#: Values of a part a contributor's values must span before it is judged as
#: an outlier.  Distances are judged over the whole part, not chunk by chunk:
#: in a chunk of a few values (a small tensor: a bias, a norm's scale) honest
#: distances do not concentrate, and one honest peer of four landed ten times
#: the median distance by chance.
MIN_OUTLIER_VALUES = 64


@dataclasses.dataclass
class _Sender:
    index: int
    state: SenderState = SenderState.WAITING
    weight: float = 0.0        # what counts: the claim, capped at its bound
    claimed: float = 0.0       # what its ar.begin said
    want_result: bool = False
    next_chunk: int = 0
    last_activity: float = 0.0
    blocking: bool = True      # the first chunk not yet final waits for it
    reason: str = ""
    committed: tuple[bytes, ...] | None = None   # its chunk digests (Disputes)
    commitment: bytes = b""    # its signature over them
    payloads: list[bytes] = dataclasses.field(default_factory=list)   # kept, if committed


class PartReducer:
    """A reducer's part: the senders' chunks, then the averages, chunk by chunk.

    ``senders``: the member indices expected to send (every member that
    contributes, this one excluded).  ``local``: this member's own values of
    the part (float32, 1-D) and ``local_weight`` their weight; with weight 0
    they count for nothing (an auxiliary peer).  Of a chunk a sparse codec
    (``topk``) carries, they are replaced, in place, by the codec's decoding
    of them, as every sender's values are decoded.

    Each sender's chunks are decoded (strictly) as they arrive and held until
    their chunk is **final**: every expected sender has delivered it or is
    finished (done, excluded, failed).  Only then are the weights of exactly
    that chunk's contributors known, so only then is it averaged: each
    sender's weight is its claim capped at the bound given to :meth:`begin`
    (the evidence of its progress reports; this member's own weight has
    none), then, under a robust rule, at ``max_ratio`` times the lower
    median of the chunk's positive weights (:func:`cap_to_median`), then no
    contributor counts for more than ``max_share`` of the chunk's total
    (:func:`cap_shares`), and the average is the weighted mean
    in member order -- or, with a robust aggregation rule of the layout
    (``Layout.aggregator``), that rule's aggregate of exactly those values
    and weights.  With no positive weight at all it is the reducer's own
    values (zeros for an auxiliary reducer), so nothing is ever NaN.
    Under a robust rule, in chunks with at least MIN_CAPPED_CONTRIBUTORS
    contributors, a sender whose values lie more than ``outlier_factor``
    times the reference distance from the chunks' results (the
    contributors' median distance, at least ``tau`` under CenteredClip),
    over all those chunks together, is in :attr:`outliers` (None: nobody is).
    :meth:`finalize` averages the chunks that became final and returns them
    in order; each is then sent to every sender that wants results, and this
    member's own copy goes through the same codec so that every member holds
    the very same values.

    Memory: the service reads a sender only while :meth:`wants_chunk`
    (at most ``max_ahead`` chunks past the first chunk not final), so a
    reducer holds at most ``max_ahead`` chunks per sender.  Timeouts count
    only for senders the part waits for: one that has not begun, or one whose
    next chunk is the first not final (its clock restarts when it becomes
    that one, so time spent held back does not count).
    """

    def __init__(self, layout: Layout, part: int, senders: Sequence[int],
                 local: torch.Tensor, local_weight: float, me: int, now: float,
                 sender_timeout: float, *, max_share: float = 1.0,
                 max_ahead: int = 2**31, outlier_factor: float | None = None,
                 max_ratio: float | None = None) -> None:
        import torch

        self.layout = layout
        self.part = part
        self.me = me
        self.chunks = layout.chunks[part]
        self.sender_timeout = sender_timeout
        self.max_share = float(max_share)
        self.max_ahead = int(max_ahead)
        # The median cap applies under robust rules only (the mean weighs by samples).
        self.max_ratio = max_ratio if layout.aggregator.robust else None
        self.local = local
        for chunk in self.chunks:
            if chunk.codec.sparse:
                # As every sender's arrive: so a result is nonzero only where
                # some contributor's decoded values are (Codec.for_results).
                piece = local[chunk.start - chunk.part_start:chunk.end - chunk.part_start]
                chunk.codec.decode(chunk.codec.encode(piece), chunk.count, out=piece,
                                   trusted=True)
        self.local_weight = float(local_weight)
        self.sum = torch.empty_like(local)    # the averages, chunk by chunk
        self.weights = [0.0] * len(self.chunks)
        self.contributors: list[list[int]] = [[] for _ in self.chunks]
        self.senders = {s: _Sender(s, last_activity=now) for s in senders if s != me}
        self.held: list[dict[int, torch.Tensor]] = [{} for _ in self.chunks]
        # Buffers of held chunks, reused once their chunk is averaged (a fresh
        # allocation per chunk costs as much again as decoding it).
        self._largest = max((c.count for c in self.chunks), default=0)
        self._free: list[torch.Tensor] = []
        self._buffers: dict[tuple[int, int], torch.Tensor] = {}
        self.share_capped: set[int] = set()  # members whose weight the share cap lowered
        self.ratio_capped: set[int] = set()  # members whose weight the median cap lowered
        self.final = 0                      # chunks [0, final) are averaged
        self.payloads: list[memoryview] = []  # the averaged chunks as they travel
        self.aggregator = layout.aggregator
        self.outlier_factor = outlier_factor
        # per member: the sums over the chunks it was judged in of its squared
        # (scaled) distance, of the squared reference distance, and the values
        self._judged: dict[int, list[float]] = {}
        #: what this reducer says of each averaged chunk (verification)
        self.claims: list[ChunkClaim] = []
        self._result_digest: bytes | None = None   # once complete

    # -- events -----------------------------------------------------------

    def begin(self, sender: int, weight: float, want_result: bool, now: float,
              bound: float | None = None, committed: Sequence[bytes] | None = None,
              commitment: bytes = b"") -> None:
        """A sender's ``ar.begin``; ``bound``: the most its weight may count
        (None: no bound); ``committed``: the digests of the chunks it
        committed to (the caller checked ``commitment``, its signature over
        them): each chunk must match its digest, and the payloads are kept
        (:meth:`evidence`).  Raises :class:`RejectError`."""
        state = self.senders.get(sender)
        if state is None:
            raise RejectError("not_member", f"member {sender} is not a sender of part "
                              f"{self.part}")
        if state.state in (SenderState.EXCLUDED, SenderState.FAILED):
            raise RejectError("excluded", state.reason)
        if state.state is not SenderState.WAITING:
            raise RejectError("duplicate", f"member {sender} already began")
        if not (math.isfinite(weight) and weight >= 0):
            raise RejectError("layout_mismatch", f"weight {weight!r}")
        if committed is not None and len(committed) != len(self.chunks):
            raise RejectError("uncommitted", f"{len(committed)} chunk digests for "
                                             f"{len(self.chunks)} chunks")
        state.committed = tuple(committed) if committed is not None else None
        state.commitment = bytes(commitment)
        state.claimed = float(weight)
        state.weight = state.claimed if bound is None else min(state.claimed, float(bound))
        state.want_result = bool(want_result)
        state.last_activity = now
        # A sender whose weight counts for nothing sends its chunks all the
        # same (it does not know): they are read and dropped.
        state.state = SenderState.STREAMING if state.weight > 0 and self.chunks \
            else SenderState.DONE
        self._refresh(now)

    def accepts_chunks(self, sender: int) -> bool:
        """Whether chunks from ``sender`` still count (else they are read and dropped)."""
        state = self.senders.get(sender)
        return state is not None and state.state is SenderState.STREAMING

    def wants_chunk(self, sender: int) -> bool:
        """Whether to read ``sender``'s next chunk now: it counts, and it is
        fewer than ``max_ahead`` chunks past the first chunk not final (the
        sender the part waits for is always read, so this never deadlocks)."""
        state = self.senders.get(sender)
        return state is not None and state.state is SenderState.STREAMING \
            and state.next_chunk < self._ready() + self.max_ahead

    def add_chunk(self, sender: int, header: TensorHeader, payload: memoryview | bytes,
                  now: float, scratch: torch.Tensor | None = None) -> None:
        """Take a sender's next chunk (decoded and held until it is final).
        RemoteProtocolError if it is not the chunk expected (wrong place,
        size or codec, too many, non-finite values): the caller then calls
        :meth:`fail`.  ``scratch`` is not used (kept for callers)."""
        state = self.senders[sender]
        if state.state is not SenderState.STREAMING:
            raise LocalProtocolError(f"sender {sender} is {state.state.value}")
        if state.next_chunk >= len(self.chunks):
            raise RemoteProtocolError(f"sender {sender} sent more than the "
                                      f"{len(self.chunks)} chunks of part {self.part}")
        chunk = self.chunks[state.next_chunk]
        codec = chunk.check(header)
        if state.committed is not None:
            if chunk_digest(payload) != state.committed[chunk.index]:
                raise RemoteProtocolError(f"chunk {chunk.index} of sender {sender} is not the "
                                          f"one it committed to")
            state.payloads.append(bytes(payload))
        import torch

        # A copy of our own: the wire's receive buffer goes back to its pool.
        buffer = self._free.pop() if self._free else torch.empty(self._largest,
                                                                 dtype=torch.float32)
        try:
            values = codec.decode(payload, chunk.count, out=buffer[:chunk.count])
        except BaseException:
            self._free.append(buffer)
            raise
        self.held[chunk.index][sender] = values
        self._buffers[chunk.index, sender] = buffer
        state.next_chunk += 1
        state.last_activity = now
        if state.next_chunk == len(self.chunks):
            state.state = SenderState.DONE
        self._refresh(now)

    def end_of_stream(self, sender: int, now: float) -> None:
        """The sender closed its side.  Before its last chunk, that is a failure."""
        state = self.senders[sender]
        if state.state is SenderState.STREAMING:
            self.fail(sender, f"it closed its stream after {state.next_chunk} of "
                              f"{len(self.chunks)} chunks")
        self._refresh(now)

    def fail(self, sender: int, reason: str) -> None:
        """The sender's stream broke or it broke the protocol: what it sent so
        far counts, nothing more will."""
        state = self.senders.get(sender)
        if state is not None and state.state is not SenderState.DONE:
            state.state = SenderState.FAILED
            state.reason = reason

    def check_timeouts(self, now: float) -> list[int]:
        """Exclude the senders silent for ``sender_timeout`` while the part waits for them."""
        self._refresh(now)
        excluded = []
        for state in self.senders.values():
            if self._waits_for(state) and now - state.last_activity >= self.sender_timeout:
                state.state = SenderState.EXCLUDED
                state.reason = (f"sent nothing for {now - state.last_activity:.1f} s "
                                f"(sender_timeout)")
                excluded.append(state.index)
        if excluded:
            self._refresh(now)
        return excluded

    def next_deadline(self) -> float | None:
        """When :meth:`check_timeouts` may next exclude someone (None: never)."""
        times = [s.last_activity + self.sender_timeout for s in self.senders.values()
                 if self._waits_for(s)]
        return min(times) if times else None

    def _waits_for(self, state: _Sender) -> bool:
        return state.state is SenderState.WAITING \
            or (state.state is SenderState.STREAMING and state.blocking)

    def _refresh(self, now: float) -> None:
        """Restart the clock of each sender that the part now waits for and
        did not before (it was ahead, held back by :meth:`wants_chunk`)."""
        ready = self._ready()
        for state in self.senders.values():
            if state.state is not SenderState.STREAMING:
                continue
            blocking = state.next_chunk == ready
            if blocking and not state.blocking:
                state.last_activity = max(state.last_activity, now)
            state.blocking = blocking

    # -- results ----------------------------------------------------------

    def _ready(self) -> int:
        """How many chunks are final now (a prefix)."""
        ready = len(self.chunks)
        for state in self.senders.values():
            if state.state not in _FINISHED:
                ready = min(ready, state.next_chunk)
        return ready

    def _note_outliers(self, members: list[int], weights: list[float],
                       distances: list[float], values: int) -> None:
        """Add one chunk's distances to each contributor's account (not this
        member's).  Distances are scaled by ``sqrt(weight / median weight)``:
        an honest mean of fewer samples is noisier by about that factor, so a
        slow honest peer is not taken for an outlier.  The chunk's reference
        is the median scaled distance, and at least ``tau`` under CenteredClip."""
        if self.outlier_factor is None or len(members) < MIN_CAPPED_CONTRIBUTORS:
            return
        typical = sorted(weights)[(len(weights) - 1) // 2]
        scaled = [d * math.sqrt(w / typical) for d, w in zip(distances, weights, strict=True)]
        reference = sorted(scaled)[(len(scaled) - 1) // 2]
        if self.aggregator.name == "centered_clip" and self.aggregator.tau != AUTO:
            reference = max(reference, float(self.aggregator.tau))
        for member, distance in zip(members, scaled, strict=True):
            if member != self.me:
                account = self._judged.setdefault(member, [0.0, 0.0, 0])
                account[0] += distance * distance
                account[1] += reference * reference
                account[2] += values

    @property
    def outliers(self) -> dict[int, float]:
        """The contributors whose values lay more than ``outlier_factor`` times
        the reference distance from the results of the chunks averaged so far,
        over all of them together (the root of the summed squared distances
        over that of the summed squared references), each with its ratio;
        only contributors judged over at least MIN_OUTLIER_VALUES values."""
        found = {}
        for member, (distance, reference, values) in self._judged.items():
            if values < MIN_OUTLIER_VALUES or self.outlier_factor is None:
                continue
            ratio = math.sqrt(distance / reference) if reference > 0 else \
                (math.inf if distance > 0 else 0.0)
            if ratio > self.outlier_factor:
                found[member] = ratio
        return found

    def finalize(self) -> list[int]:
        """Average the chunks that became final; their indices, in order."""
        ready = self._ready()
        done = []
        while self.final < ready:
            k = self.final
            chunk = self.chunks[k]
            lo = chunk.start - chunk.part_start
            out = self.sum[lo:lo + chunk.count]
            mine = self.local[lo:lo + chunk.count]
            held = self.held[k]
            self.held[k] = {}
            entries = [(self.me, self.local_weight, mine)] if self.local_weight > 0 else []
            entries += [(s, self.senders[s].weight, v) for s, v in held.items()]
            entries.sort(key=lambda e: e[0])
            claimed = [w for _, w, _ in entries]
            bounded = cap_to_median(claimed, self.max_ratio)
            weights = cap_shares(bounded, self.max_share)
            for (index, _, _), weight, median_capped, capped in zip(
                    entries, claimed, bounded, weights, strict=True):
                if median_capped < weight:
                    self.ratio_capped.add(index)
                elif capped < weight:
                    self.share_capped.add(index)
            total = math.fsum(weights)
            positive = [(values, weight) for (_, _, values), weight
                        in zip(entries, weights, strict=True) if weight > 0]
            radii: list[float] = []
            if total > 0 and self.aggregator.robust and len(positive) > 1:
                distances = self.aggregator.aggregate([v for v, _ in positive],
                                                      [w for _, w in positive], out, radii)
                assert distances is not None
                self._note_outliers([i for (i, _, _), w in zip(entries, weights, strict=True)
                                     if w > 0], [w for _, w in positive], distances,
                                    chunk.count)
            elif total > 0:
                out.zero_()
                for (_, _, values), weight in zip(entries, weights, strict=True):
                    out.add_(values, alpha=weight / total)
            else:  # nobody with a positive weight: the reducer's own values
                out.copy_(mine)
            for s in held:
                self._free.append(self._buffers.pop((k, s)))
            self.weights[k] = total
            self.contributors[k] = [index for (index, _, _), weight
                                    in zip(entries, weights, strict=True) if weight > 0]
            self.claims.append(ChunkClaim(
                tuple(self.contributors[k]), tuple(w for w in weights if w > 0),
                self._radius(radii)))
            codec = chunk.result_codec
            payload = codec.encode(out)
            if codec.name != "none":  # our copy goes through the codec as everyone's
                codec.decode(payload, chunk.count, out=out, trusted=True)
            self.payloads.append(payload)
            done.append(k)
            self.final += 1
        return done

    def _radius(self, radii: list[float]) -> float | None:
        """The radius a chunk was averaged with, as :class:`ChunkClaim` says it:
        None under the mean; under CenteredClip the one used, and with fewer
        than two contributors (nothing to clip) the rule's, or 0 for auto."""
        if self.aggregator.name != "centered_clip":
            return None
        if radii:
            return radii[0]
        return 0.0 if self.aggregator.tau == AUTO else float(self.aggregator.tau)

    @property
    def complete(self) -> bool:
        return self.final == len(self.chunks)

    def result(self) -> torch.Tensor:
        """The averaged part (meaningful once complete)."""
        return self.sum

    def receivers(self) -> list[int]:
        """The senders that want the averages and may get them."""
        return [s.index for s in self.senders.values()
                if s.want_result and s.state is not SenderState.FAILED
                and s.state is not SenderState.WAITING]

    def segments(self) -> list[Segment]:
        """Runs of final chunks with the same contributors and weights (for
        ``ar.done``)."""
        segments: list[Segment] = []
        for k in range(self.final):
            claim = self.claims[k]
            who, weights = list(claim.contributors), list(claim.weights)
            if segments and segments[-1].contributors == who \
                    and segments[-1].weights == weights:
                last = segments[-1]
                segments[-1] = Segment(last.first, k + 1, who, last.weight, weights)
            else:
                segments.append(Segment(k, k + 1, who, self.weights[k], weights))
        return segments

    def taus(self) -> list[float] | None:
        """Each final chunk's CenteredClip radius (for ``ar.done``; None under
        another rule)."""
        if self.aggregator.name != "centered_clip":
            return None
        return [float(claim.tau or 0.0) for claim in self.claims[:self.final]]

    def digest(self) -> bytes:
        """The result digest: BLAKE3 of the averaged chunks' payloads, in
        order, then of the claims (``ar.done``'s segments and radii): what
        every receiver of the complete part computes from what it got."""
        if self._result_digest is None or not self.complete:
            self._result_digest = self.digest_of(self.payloads)
        return self._result_digest

    def digest_of(self, payloads: Sequence[bytes | memoryview]) -> bytes:
        """The result digest of ``payloads`` (one per chunk) under this part's claims."""
        digest = payload_hasher()
        for payload in payloads:
            digest.update(payload)
        digest.update(claims_bytes(self.segments(), self.taus()))
        return digest.digest()

    def payload_for(self, sender: int, k: int) -> bytes | memoryview:
        """Chunk ``k``'s averaged payload as sent to ``sender``: the same for
        every sender (a modified client may differ: equivocation, which the
        signed results prove)."""
        return self.payloads[k]

    def digest_for(self, sender: int) -> bytes:
        """The result digest of what ``sender`` receives (:meth:`digest`)."""
        return self.digest()

    def evidence(self, group_id: bytes) -> ReducerEvidence:
        """What this reducer keeps to answer disputes once its part is
        complete: the result, its claims and digest, and the committed
        contributors' chunks (protocols/allreduce.md, Disputes)."""
        committed = {j: (state.committed, state.commitment, tuple(state.payloads))
                     for j, state in self.senders.items()
                     if state.committed is not None and state.payloads}
        return ReducerEvidence(self.layout, group_id, self.part, self.result(), self.claims,
                               self.digest(), committed)

    def sender_states(self) -> dict[int, SenderState]:
        return {s.index: s.state for s in self.senders.values()}


class PartReceiver:
    """A sender's view of one remote part: averaged chunks arrive in order and
    are decoded into ``out`` (the part's slice of the output); then
    ``ar.done`` says who contributed.  Every check failure is a
    RemoteProtocolError."""

    def __init__(self, layout: Layout, part: int, out: torch.Tensor, group_size: int, *,
                 keep: bool = False) -> None:
        self.layout = layout
        self.part = part
        #: with ``keep``: chunk -> its payload as received, for the chunks whose
        #: codec does not give it back from the decoded values (``reencodes``)
        self.kept: dict[int, bytes] | None = {} if keep else None
        self.chunks = layout.chunks[part]
        self.out = out
        self.group_size = group_size
        self.received = 0
        self.segments: tuple[Segment, ...] | None = None
        #: what the reducer said of each chunk (``ar.done``); None when it said
        #: too little to be checked (no weights, or no radii under CenteredClip)
        self.claims: tuple[ChunkClaim, ...] | None = None
        self._digest = payload_hasher()
        #: the result digest, once ``ar.done`` came (payloads, then claims)
        self.result_digest: bytes | None = None
        #: the reducer's signature over it (None: it sent none)
        self.signature: bytes | None = None
        #: ``ar.done``'s radii (None: none)
        self.taus: tuple[float, ...] | None = None

    def add_chunk(self, header: TensorHeader, payload: memoryview | bytes) -> None:
        if self.segments is not None or self.received >= len(self.chunks):
            raise RemoteProtocolError(f"reducer of part {self.part} sent more than its "
                                      f"{len(self.chunks)} chunks")
        chunk = self.chunks[self.received]
        codec = chunk.check(header, result=True)
        lo = chunk.start - chunk.part_start
        codec.decode(payload, chunk.count, out=self.out[lo:lo + chunk.count])
        self._digest.update(payload)
        if self.kept is not None and not codec.reencodes:
            self.kept[self.received] = bytes(payload)
        self.received += 1

    @property
    def digest(self) -> bytes:
        """The result digest of the complete part (``PartReducer.digest``)."""
        assert self.result_digest is not None, "the part is not complete"
        return self.result_digest

    def done(self, segments: Sequence[Segment], taus: Sequence[float] | None = None,
             signature: bytes | None = None,
             signed: Callable[[bytes, bytes | None], bool] | None = None) -> None:
        """``ar.done``: the claims, checked, complete the part.  With ``signed``
        (``signed(digest, signature)``: whether the reducer signed that result
        digest) a part whose signature does not verify is a protocol error."""
        if self.received != len(self.chunks):
            raise RemoteProtocolError(f"reducer of part {self.part} said done after "
                                      f"{self.received} of {len(self.chunks)} chunks")
        position = 0
        for seg in segments:
            if seg.first != position or seg.end <= seg.first:
                raise RemoteProtocolError("ar.done segments must cover the chunks in order")
            if list(seg.contributors) != sorted(set(seg.contributors)) or any(
                    c >= self.group_size for c in seg.contributors):
                raise RemoteProtocolError("ar.done contributors must be ascending member "
                                          "indices")
            position = seg.end
        if position != len(self.chunks) or len(segments) > MAX_SEGMENTS:
            raise RemoteProtocolError(f"ar.done segments cover {position} of "
                                      f"{len(self.chunks)} chunks")
        claims = self._claims(segments, taus)
        digest = self._digest.copy()
        digest.update(claims_bytes(segments, taus))
        if signed is not None and not signed(digest.digest(), signature):
            raise RemoteProtocolError(f"ar.done of part {self.part} without its reducer's "
                                      f"valid signature over the result")
        self.result_digest = digest.digest()
        self.signature = signature
        self.taus = None if taus is None else tuple(taus)
        self.segments = tuple(segments)
        self.claims = claims

    def _claims(self, segments: Sequence[Segment], taus: Sequence[float] | None
                ) -> tuple[ChunkClaim, ...] | None:
        """One claim per chunk from ``ar.done``; RemoteProtocolError when its
        weights or radii do not fit the chunks; None when it has none."""
        clip = self.layout.aggregator.name == "centered_clip"
        if any(seg.weights is None for seg in segments) or (clip and taus is None):
            return None
        if clip and len(taus or ()) != len(self.chunks):
            raise RemoteProtocolError(f"ar.done names {len(taus or ())} radii for "
                                      f"{len(self.chunks)} chunks")
        if not clip and taus is not None:
            raise RemoteProtocolError("ar.done names radii under a rule without any")
        claims = []
        for seg in segments:
            weights = tuple(float(w) for w in seg.weights or ())
            if len(weights) != len(seg.contributors) or any(w <= 0 for w in weights):
                raise RemoteProtocolError("ar.done weights must be one positive weight per "
                                          "contributor")
            for k in range(seg.first, seg.end):
                claims.append(ChunkClaim(tuple(seg.contributors), weights,
                                         float(taus[k]) if clip and taus else None))
        return tuple(claims)

    @property
    def complete(self) -> bool:
        return self.segments is not None
