"""The butterfly all-reduce, sans-IO: the layout every member computes, the
post-round exchange and the results (one part's reducer and receivers are
in ``_parts``).

No trio and no sockets: time is passed in, tensors are plain torch tensors.
``_service`` moves the bytes (protocols/allreduce.md).

* :class:`Layout` -- the averaged vector (the caller's tensors, flattened to
  float32 and concatenated), cut into one contiguous **part** per member by
  the plan's fractions, each part cut into **chunks**: at tensor boundaries
  (each tensor has its codec) and every ``chunk_values`` values.  Members
  check that they agree through its ``digest``.
* the post-round exchange: who dials whom (:func:`exchange_roles`), and
  what a member does with what the others say they hold (:func:`settle_parts`).
* :class:`AllReduceResult`, :class:`PartResult`, :class:`Contribution`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack

from ...errors import LocalProtocolError, RemoteProtocolError
from ...wire import TensorHeader
from .._aggregators import Aggregator
from .._balancing import part_sizes
from .._codecs import Codec, CodecPolicy, choose_codec, codec_from_header
from ._messages import Segment
from ._weights import MIN_CAPPED_CONTRIBUTORS, cap_shares, cap_to_median

if TYPE_CHECKING:
    import torch
    from libp2p.peer.id import ID

    from ..matchmaking import Group

__all__ = ["ChunkSpec", "Layout", "RejectError", "Contribution", "PartResult", "AllReduceResult",
           "LAYOUT_VERSION", "MIN_CAPPED_CONTRIBUTORS", "cap_shares", "cap_to_median",
           "default_fractions", "exchange_roles", "settle_parts", "Settlement",
           "check_have_parts"]

#: Version of the layout rules; part of the digest.  2: chunk and result
#: digests are BLAKE3 (1: SHA-256), so members of either never share a group;
#: 3: commitments bind the layout; 4: sketch plans by rows.
LAYOUT_VERSION = 4
#: The error of the parts an auxiliary member does not reduce (it gets no averages).
AUXILIARY_NO_RESULT = "auxiliary peers receive no results"


class RejectError(Exception):
    """A reducer refuses a sender: ``code`` is one of ``REJECT_CODES``."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


@dataclasses.dataclass(frozen=True)
class ChunkSpec:
    """One chunk: values ``[start, start + count)`` of the flat vector, in part
    ``part`` (whose first value is ``part_start``), ``index``-th of its part."""

    part: int
    index: int
    start: int
    count: int
    part_start: int
    part_numel: int
    codec: Codec
    #: how the reducer's result of the chunk travels (``codec.for_results``)
    result_codec: Codec

    @property
    def end(self) -> int:
        return self.start + self.count

    def header(self, result: bool = False) -> TensorHeader:
        """The TENSOR header this chunk's values (``result``: its reducer's
        result) travel with."""
        codec = self.result_codec if result else self.codec
        return TensorHeader(self.part, "float32", (self.part_numel,),
                            self.start - self.part_start, self.count, codec.name,
                            codec.meta())

    def check(self, header: TensorHeader, result: bool = False) -> Codec:
        """Raise RemoteProtocolError unless ``header`` is exactly this chunk's
        (of its values, or with ``result`` of its result); its codec."""
        if (header.part != self.part or header.dtype != "float32"
                or tuple(header.shape) != (self.part_numel,)
                or header.offset != self.start - self.part_start or header.count != self.count):
            raise RemoteProtocolError(
                f"expected chunk {self.index} of part {self.part} (values "
                f"[{self.start - self.part_start}, +{self.count}) of {self.part_numel}, "
                f"float32), got part {header.part} [{header.offset}, +{header.count}) of "
                f"{tuple(header.shape)} {header.dtype}")
        codec = codec_from_header(header.codec, header.meta)
        expected = self.result_codec if result else self.codec
        if codec != expected:
            raise RemoteProtocolError(f"chunk {self.index} of part {self.part} travels as "
                                      f"{expected.name} {expected.meta() or ''}, got "
                                      f"{header.codec} {header.meta or ''}")
        return codec


class Layout:
    """How the averaged vector is cut.  Every member computes the same layout
    from the same inputs; ``digest`` (SHA-256) lets them check.

    ``sizes``: values per tensor, in order.  ``codecs``: one per tensor.
    ``fractions``: one per group member (the plan), at least one positive.
    ``aggregator``: how reducers combine the copies of a chunk; part of the
    digest unless it is the plain mean (so that the digest of a mean layout
    is that of peers that know no other rule).  ``caps``: under a rule other
    than the mean, the weight caps every reducer applies, ``(max_share,
    max_ratio)``, which verifiers check the claims against (None: not
    checked); part of the digest when given.
    """

    def __init__(self, sizes: Sequence[int], codecs: Sequence[Codec],
                 fractions: Sequence[float], chunk_values: int,
                 aggregator: Aggregator | None = None,
                 caps: tuple[float, float | None] | None = None) -> None:
        if len(sizes) != len(codecs):
            raise LocalProtocolError("one codec per tensor")
        if chunk_values < 1:
            raise LocalProtocolError("chunk_values must be positive")
        self.sizes = tuple(int(s) for s in sizes)
        self.codecs = tuple(codecs)
        self.fractions = tuple(float(f) for f in fractions)
        self.chunk_values = int(chunk_values)
        self.aggregator = aggregator if aggregator is not None else Aggregator()
        self.numel = sum(self.sizes)
        counts = part_sizes(self.numel, self.fractions)
        bounds = []
        start = 0
        for count in counts:
            bounds.append((start, start + count))
            start += count
        self.part_bounds: tuple[tuple[int, int], ...] = tuple(bounds)
        tensor_starts = [0]
        for size in self.sizes:
            tensor_starts.append(tensor_starts[-1] + size)
        self.tensor_starts = tuple(tensor_starts)
        self.chunks: tuple[tuple[ChunkSpec, ...], ...] = tuple(
            self._cut(part, lo, hi) for part, (lo, hi) in enumerate(self.part_bounds))
        preimage: list[Any] = [LAYOUT_VERSION, list(self.sizes),
                               [[c.name, c.meta()] for c in self.codecs],
                               list(self.fractions), self.chunk_values]
        self.caps: tuple[float, float | None] | None = None
        if self.aggregator.name != "mean":
            preimage.append(self.aggregator.describe())
            if caps is not None:
                share, ratio = caps
                self.caps = (float(share), None if ratio is None else float(ratio))
                preimage.append(["caps", *self.caps])
        #: the digest's preimage (msgpack): enough to build the layout again
        #: (:meth:`from_preimage`)
        self.preimage = msgpack.packb(preimage)
        self.digest = hashlib.sha256(self.preimage).digest()

    @classmethod
    def from_preimage(cls, preimage: bytes, max_numel: int = 2**40) -> Layout:
        """The layout whose digest preimage is ``preimage`` (another peer's
        word: RemoteProtocolError for anything that is not one, or that
        describes more than ``max_numel`` values); its digest is
        SHA-256(``preimage``) exactly."""
        try:
            items = msgpack.unpackb(preimage, use_list=True, strict_map_key=True,
                                    max_bin_len=0, max_ext_len=0)
            version, sizes, codecs, fractions, chunk_values, *rest = items
            if version != LAYOUT_VERSION or len(rest) > 2:
                raise ValueError("another layout version")
            if not all(type(n) is int and n >= 0 for n in sizes) or sum(sizes) > max_numel:
                raise ValueError("bad sizes")
            aggregator, caps = None, None
            if rest:
                aggregator = _aggregator_of(rest[0])
                if aggregator.name == "mean":
                    raise ValueError("the mean is never described")
                if len(rest) == 2:
                    tag, share, ratio = rest[1]
                    if tag != "caps":
                        raise ValueError("caps expected")
                    caps = (float(share), None if ratio is None else float(ratio))
            layout = cls(sizes, [codec_from_header(name, meta) for name, meta in codecs],
                         [float(f) for f in fractions], chunk_values, aggregator, caps)
        except RemoteProtocolError:
            raise
        except Exception as exc:   # untrusted bytes
            raise RemoteProtocolError(f"not a layout preimage: {exc}") from None
        if layout.preimage != preimage:
            raise RemoteProtocolError("not a layout preimage in its canonical form")
        return layout

    @classmethod
    def for_tensors(cls, sizes: Sequence[int], fractions: Sequence[float],
                    policy: CodecPolicy, chunk_values: int,
                    aggregator: Aggregator | None = None,
                    caps: tuple[float, float | None] | None = None) -> Layout:
        return cls(sizes, [choose_codec(size, policy) for size in sizes], fractions,
                   chunk_values, aggregator, caps)

    def _cut(self, part: int, lo: int, hi: int) -> tuple[ChunkSpec, ...]:
        chunks: list[ChunkSpec] = []
        position = lo
        tensor = 0
        while position < hi:
            while self.tensor_starts[tensor + 1] <= position:
                tensor += 1
            end = min(hi, self.tensor_starts[tensor + 1], position + self.chunk_values)
            codec = self.codecs[tensor]
            chunks.append(ChunkSpec(part, len(chunks), position, end - position, lo, hi - lo,
                                    codec, codec.for_results(len(self.fractions))))
            position = end
        return tuple(chunks)

    def part_numel(self, part: int) -> int:
        lo, hi = self.part_bounds[part]
        return hi - lo

    def encoded_bytes(self, part: int, result: bool = False) -> int:
        """Bytes of one copy of ``part``'s values (``result``: of its result)
        on the wire (payloads only)."""
        return sum((c.result_codec if result else c.codec).encoded_size(c.count)
                   for c in self.chunks[part])


def default_fractions(group: Group) -> tuple[float, ...]:
    """The plan of a group: the leader's fractions if it sent them, else
    equal shares among the members that accept connections."""
    if group.fractions is not None:
        return tuple(group.fractions)
    reducers = [not m.client_mode for m in group.members]
    if not any(reducers):
        raise LocalProtocolError("every member of the group is in client mode: nobody can "
                                 "reduce")
    share = 1.0 / sum(reducers)
    return tuple(share if r else 0.0 for r in reducers)


def exchange_roles(group: Group, me: int) -> tuple[list[int], list[int]]:
    """Who this member exchanges ``ar.have`` with after the round: ``(dial,
    answer)``, the members it opens a stream to and those that open one to it.

    Only members that use the results take part (not auxiliary ones).  In
    each pair, a member in client mode dials (it accepts no stream);
    otherwise the lower index dials.  Two members in client mode cannot
    reach each other and do not exchange.
    """
    members = group.members
    if members[me].auxiliary:
        return [], []
    dial, answer = [], []
    for j, other in enumerate(members):
        if j == me or other.auxiliary:
            continue
        mine, theirs = members[me].client_mode, other.client_mode
        if mine and theirs:
            continue
        if mine or (not theirs and me < j):
            dial.append(j)
        else:
            answer.append(j)
    return dial, answer


def check_have_parts(parts: Sequence[int], layout: Layout) -> frozenset[int]:
    """The parts of an ``ar.have``, checked: distinct members whose part is not
    empty.  Raises RemoteProtocolError otherwise."""
    held = frozenset(parts)
    if len(held) != len(parts):
        raise RemoteProtocolError("ar.have lists a part twice")
    for part in held:
        if part >= len(layout.chunks) or not layout.chunks[part]:
            raise RemoteProtocolError(f"ar.have lists part {part}, which is not a "
                                      f"non-empty part of the group")
    return held


@dataclasses.dataclass(frozen=True)
class Settlement:
    """What a member does with its complete parts once the exchange is over.

    ``dropped``: parts it completed that it treats as incomplete: a member
    heard lacks them and their reducer is gone.  ``disputed``: parts it
    completed that a member heard lacks while their reducer is still
    connected (kept; the caller compares states).  Both map part -> the
    members heard that lack it.
    """

    dropped: dict[int, tuple[int, ...]]
    disputed: dict[int, tuple[int, ...]]


def settle_parts(held: frozenset[int], heard: dict[int, frozenset[int]],
                 gone: frozenset[int], me: int) -> Settlement:
    """The rule of the post-round exchange (protocols/allreduce.md).

    ``held``: the non-empty parts this member completed; ``heard``: member ->
    the parts it said it completed; ``gone``: members no longer connected to
    this one.  A part this member holds that some member heard lacks is
    **dropped** when its reducer is gone (no update there, as for every member
    that lost it), else **disputed**: a member cannot make the others drop a
    part whose reducer is alive and can be asked.
    """
    dropped: dict[int, tuple[int, ...]] = {}
    disputed: dict[int, tuple[int, ...]] = {}
    for part in sorted(held):
        lacking = tuple(sorted(j for j, parts in heard.items() if part not in parts))
        if not lacking:
            continue
        if part != me and part in gone:
            dropped[part] = lacking
        else:
            disputed[part] = lacking
    return Settlement(dropped, disputed)


@dataclasses.dataclass(frozen=True)
class Contribution:
    """Values ``[start, end)`` of the flat vector were averaged over
    ``contributors`` (member indices) with total weight ``weight``."""

    start: int
    end: int
    contributors: tuple[int, ...]
    weight: float


@dataclasses.dataclass(frozen=True)
class PartResult:
    """One part of the vector, as this member ended it.

    ``completed``: the averages of every chunk arrived (then ``contributions``
    says who counted where); otherwise the part keeps this member's own values
    and ``error`` says why.  ``lacked_by``: the members that said after the
    round that they did not complete this part (the post-round exchange);
    a part this member completed is then dropped (not completed) if its
    reducer is gone, else kept and ``disputed``.  ``check``: the verdict of
    this member's check of the result (``"ok"``, ``"unverifiable"``, or
    ``"failed"``: then the part is dropped, not completed); None when it was
    not checked (this member's own part, a part not received, ``verify``
    off, a rule without a check).
    """

    reducer: int
    peer_id: ID
    start: int
    end: int
    completed: bool
    contributions: tuple[Contribution, ...] = ()
    error: str | None = None
    lacked_by: tuple[int, ...] = ()
    check: str | None = None

    @property
    def disputed(self) -> bool:
        """Completed here, and some member heard after the round lacks it."""
        return self.completed and bool(self.lacked_by)


@dataclasses.dataclass(frozen=True)
class AllReduceResult:
    """What :meth:`~p2pdl.averaging.AllReduceService.all_reduce` returns.

    Attributes:
        tensors: the averaged tensors (the caller's, written in place, with
            ``inplace=True``), in the caller's shapes and dtypes.
        group: the group.
        parts: one :class:`PartResult` per member, in group order (a member
            that reduces nothing has an empty part, always complete).
        completed: every part completed.
        excluded: members this peer's reducer excluded (late or broken).
        bytes_sent / bytes_received: p2pdl frame bytes of this call's streams.
        times: seconds from the start of the call to: ``scatter`` (this
            peer's values sent to every reducer), ``reduce`` (its own part
            averaged), ``gather`` (every part's averages received), ``total``.
        predicted_s: the plan's predicted round time, when known.
        auxiliary: this member is auxiliary: it receives no averages, so
            ``completed`` only asks whether its own part was averaged and
            delivered (the other parts hold zeros).
        heard: the members whose ``ar.have`` this member heard after the
            round (the post-round exchange; the parts each completed).
        sent_error: asked for with ``all_reduce(..., sent_error=True)``: per
            tensor (float32, its shape), this member's values less what
            the reducers decoded of them, where a completed part took them
            (0 elsewhere: its own part but what a sparse codec dropped of
            it, exact codecs, parts that did not complete, where its values
            stayed its own).  A sender that adds
            it to its next round's values (error feedback) loses none of
            what the codecs rounded off; None when not asked for.
    """

    tensors: list[torch.Tensor]
    group: Group
    parts: tuple[PartResult, ...]
    excluded: tuple[int, ...]
    bytes_sent: int
    bytes_received: int
    times: dict[str, float]
    predicted_s: float | None = None
    auxiliary: bool = False
    heard: tuple[int, ...] = ()
    sent_error: list[torch.Tensor] | None = None

    @property
    def disputed(self) -> tuple[int, ...]:
        """Parts where this member may now differ from others: completed here
        while a member heard after the round lacks them and their reducer is
        still connected, or dropped here because they failed this member's
        check (members that did not fail it keep them)."""
        return tuple(p.reducer for p in self.parts if p.disputed or p.check == "failed")

    @property
    def completed(self) -> bool:
        """Every part averaged (an auxiliary member: its own part)."""
        if self.auxiliary:
            return all(p.completed for p in self.parts if p.error != AUXILIARY_NO_RESULT)
        return all(p.completed for p in self.parts)

    def contributors(self) -> set[int]:
        """Members whose values counted somewhere."""
        return {c for p in self.parts for seg in p.contributions for c in seg.contributors}

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly digest: completion, parts, bytes, times."""
        return {"completed": self.completed,
                "parts": [{"reducer": p.reducer, "values": p.end - p.start,
                           "completed": p.completed, "error": p.error,
                           "lacked_by": list(p.lacked_by)} for p in self.parts],
                "heard": list(self.heard),
                "excluded": list(self.excluded), "bytes_sent": self.bytes_sent,
                "bytes_received": self.bytes_received, "times": dict(self.times),
                "predicted_s": self.predicted_s}


def contributions(layout: Layout, part: int,
                  segments: Sequence[Segment]) -> tuple[Contribution, ...]:
    """Segments (in chunks) as value ranges of the flat vector."""
    chunks = layout.chunks[part]
    return tuple(Contribution(chunks[s.first].start, chunks[s.end - 1].end,
                              tuple(s.contributors), float(s.weight)) for s in segments)


def _aggregator_of(description: Any) -> Aggregator:
    """The rule ``Aggregator.describe`` gave ``description`` (ValueError if none)."""
    name, *params = description
    if name == "centered_clip":
        tau, iterations, tolerance = params
        return Aggregator(name, tau=tau, iterations=iterations, tolerance=tolerance)
    if name == "trimmed_mean":
        (trim,) = params
        return Aggregator(name, trim=trim)
    if params:
        raise ValueError(f"rule {name!r} takes no parameters")
    return Aggregator(name)
