"""The all-reduce service of a node: ``await node.averaging.all_reduce(group, tensors)``.

The rules are in ``_state`` (sans-IO); this module moves the bytes over
``/p2pdl/allreduce/1.0.0`` (protocols/allreduce.md):

* as a **sender**, a member opens one stream to every other member that
  reduces a part: ``ar.begin``, then its values of that part chunk by chunk
  (no half-close: the reducer knows the count); meanwhile the part's
  averages come back on the same stream,
  chunk by chunk, then ``ar.done``.  Sending, the reducer's work and
  receiving overlap.  Client-mode members only ever dial, so they take part
  as senders; auxiliary members send nothing.
* as a **reducer**, a member serves those streams: every incoming chunk is
  decoded and held (at most ``max_chunks_ahead`` per sender); a chunk is
  averaged as soon as every sender still counted has delivered it -- each
  sender's weight capped by the evidence of its progress reports
  (``weight_evidence``: those the node holds, and the one the sender
  attached to its ``ar.begin``, from ``own_report`` on its side) and by the
  share cap -- and sent back to every sender that wants it.
* after the round, the members that use the results tell each other which
  parts they completed (``ar.have``, one stream per pair): a part some
  member lacks is dropped where its reducer is gone, and reported as
  disputed where it is alive (``_state.settle_parts``).

Everything is bounded by the call's ``averaging_timeout`` and the tasks live
in the call's nursery, except incoming streams, which run in the node's
stream handler tasks and are cancelled when the call ends.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import secrets
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..._concurrency import open_service_nursery
from ...errors import (
    ConfigError,
    LocalProtocolError,
    P2PDLError,
    RemoteProtocolError,
    StreamClosedError,
)
from ...service import Opened, Refusal, ServiceContext, Statistics, StreamEndpoint, serve_nothing
from ...wire import FramedStream, TensorChunk, encode_message, open_framed_stream
from .._balancing import round_time
from ..matchmaking.config import MAX_DETAIL_LENGTH
from ._evidence import (
    MAX_COMMITTED_CHUNKS,
    ReducerEvidence,
    chunk_digest,
    commitment_payload,
    decode_chunks,
    pack_sketch,
    report_payload,
    signed_by,
    unpack_report,
)
from ._messages import (
    ALLREDUCE_PROTOCOL_ID,
    CHECK_MESSAGES,
    HAVE_MESSAGES,
    MAX_WEIGHT,
    PROOF_MESSAGES,
    REDUCER_MESSAGES,
    SENDER_MESSAGES,
    Begin,
    Check,
    Dispute,
    Done,
    Have,
    PartCheck,
    Proof,
    Reject,
    Shown,
    SignedReport,
)
from ._state import (
    AUXILIARY_NO_RESULT,
    AllReduceResult,
    Layout,
    PartReceiver,
    PartReducer,
    PartResult,
    RejectError,
    SenderState,
    Settlement,
    check_have_parts,
    contributions,
    default_fractions,
    exchange_roles,
    settle_parts,
)
from ._verify import NONCE_SIZE, Report, RoundVerifier, Verdict, sketch_plan, verifiable
from .config import MAX_EVIDENCE_ROUNDS, AllReduceConfig

if TYPE_CHECKING:
    import torch
    from libp2p.peer.id import ID

    from ...progress import Report
    from ..matchmaking import Group

__all__ = ["AllReduceService", "AllReduceStatistics", "WeightEvidence", "OwnReport",
           "MAX_RECENT_GROUPS", "WEIGHT_FLAG", "OUTLIER_FLAG", "HAVE_GRACE"]

#: ``weight_evidence(run_id, peer, epoch, report)``: the largest sample count the
#: peer's own signed progress reports for that epoch of the run support, after
#: taking ``report`` (the one the peer attached to its ``ar.begin``, or None) as
#: evidence through the checks of a pushed report; None when this node tracks no
#: progress for the run (no evidence either way).
WeightEvidence = Callable[[str, "ID", int, "Report | None"], "int | None"]
#: ``own_report(run_id, epoch)``: this node's own last signed progress report
#: for that epoch of the run (None: none), attached to its ``ar.begin``.
OwnReport = Callable[[str, int], "Report | None"]

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

logger = logging.getLogger(__name__)

#: Finished groups a node remembers, to refuse their late streams at once.
MAX_RECENT_GROUPS = 64

#: How long a reducer waits, after ``ar.done``, for the sender to end the stream (s).
DONE_LINGER = 2.0

#: How often a reducer looks for senders whose connection closed (s).
LIVENESS_POLL = 0.5

#: How long past ``averaging_timeout`` the post-round exchange may last (s).
HAVE_GRACE = 2.0


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
    a reducer.  ``verification_bytes_sent``: what verification added to
    this node's messages (nonces, digests, commitments, ``ar.check``), in
    bytes of their msgpack bodies.
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
    verification_bytes_sent: int = 0


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
        self.exchanged: set[int] = set()
        self.verdicts: dict[int, Verdict] = {}
        # Disputes: this member's encoded chunks of each part it sent (committed
        # to), and, as a reducer that verifies, what it keeps to answer disputes.
        self.encoded: dict[int, list[bytes]] = {}
        self.evidence: ReducerEvidence | None = None
        # part -> how its dispute ended: "cleared", "reducer_lie" or
        # "unanswered", the contributors proven liars, and why
        self.disputes: dict[int, tuple[str, frozenset[int], str]] = {}

    def progressed(self) -> None:
        self._progress.set()
        self._progress = trio.Event()

    async def wait_progress(self) -> None:
        await self._progress.wait()

    def count_stream(self, stream: FramedStream) -> None:
        stats = stream.statistics()
        self.bytes_sent += stats.bytes_sent
        self.bytes_received += stats.bytes_received

    def mark(self, phase: str) -> None:
        self.times.setdefault(phase, trio.current_time() - self.start)

    def finalize(self) -> None:
        """Average what became final; wake the tasks sending results."""
        assert self.reducer is not None
        if self.reducer.finalize():
            if self.reducer.complete:
                self.mark("reduce")
            self.progressed()


class AllReduceService:
    """Butterfly all-reduce for groups from matchmaking (``node.averaging``).

    ``weight_evidence(run_id, peer, epoch, report)``: the largest sample
    count a peer's own signed progress reports for that epoch support, once
    ``report`` (what the peer attached to its ``ar.begin``, or None) was
    taken as evidence; None where this node tracks no progress for the run
    (the node passes ``ProgressService.weight_evidence``).  A reducer caps
    each sender's weight at ``evidence * (1 + weight_slack) +
    weight_slack_samples``, and flags (``context.flags``, kind
    ``weight_beyond_evidence``) and counts the senders it capped.  Without
    it, or where it says None, only the share cap (``max_weight_share``)
    bounds a sender's weight.

    ``own_report(run_id, epoch)``: this node's own last signed progress
    report at that epoch (the node passes ``ProgressService.signed_report``);
    as a sender of positive weight the node attaches it to every
    ``ar.begin``, so that its evidence reaches the reducers with its claim.
    """

    def __init__(self, context: ServiceContext, config: AllReduceConfig | None = None, *,
                 weight_evidence: WeightEvidence | None = None,
                 own_report: OwnReport | None = None) -> None:
        self._host = context.host
        self._key = context.host.libp2p.get_private_key()
        self._wire = context.wire
        self._clock = context.clock
        self._flags = context.flags
        self._introduce = context.introduce
        self._evidence = weight_evidence
        self._own_report = own_report
        self._config = config or AllReduceConfig()
        #: The class this node's reducers are (a modified client may replace it:
        #: ``p2pdl.training.LyingReducer`` does, to show what verification catches).
        self.part_reducer: type[PartReducer] = PartReducer
        self._sessions: dict[bytes, _Session] = {}
        # Finished groups: what a late ``ar.have`` is answered with.
        self._recent: collections.OrderedDict[bytes, _Finished] = collections.OrderedDict()
        self._sessions_changed = trio.Event()
        self._waiting = 0
        self._waiting_by_peer: collections.Counter[Any] = collections.Counter()
        self._counters = dict.fromkeys(COUNTERS, 0)

    @property
    def config(self) -> AllReduceConfig:
        return self._config

    def statistics(self) -> AllReduceStatistics:
        return AllReduceStatistics(len(self._sessions), self._waiting, **self._counters)

    def endpoints(self) -> list[StreamEndpoint]:
        """``/p2pdl/allreduce/1.0.0``: run-scoped, the run of the stream's group."""
        return [StreamEndpoint(ALLREDUCE_PROTOCOL_ID, self._open, self._handle_admitted,
                               self._refuse)]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """No background work: a round runs in the caller's task, streams in theirs."""
        await serve_nothing(task_status)

    # -- the call ---------------------------------------------------------

    async def all_reduce(self, group: Group, tensors: Sequence[torch.Tensor], *,
                         weight: float = 1.0, config: AllReduceConfig | None = None,
                         inplace: bool = False) -> AllReduceResult:
        """Average ``tensors`` with every member of ``group``, weighted by ``weight``.

        Every member calls this with tensors of the same shapes (in the same
        order) and the same ``config.codecs`` / ``chunk_values``.  Returns an
        :class:`AllReduceResult` whose ``tensors`` are the weighted mean over
        the contributors (this member's own values where a part did not
        complete: see ``result.parts``), with the weights as each part's
        reducer counted them: bounded by the evidence of the sender's
        progress reports and by ``max_weight_share`` (docs/allreduce.md,
        Weights; each contribution's ``weight`` is their sum).  With
        ``inplace=True`` the results are also written into ``tensors``.
        Never raises for what other
        members do; raises :class:`~p2pdl.errors.ConfigError` for bad
        arguments.  An auxiliary member (``group.members[i].auxiliary``)
        contributes nothing whatever ``weight`` says; its ``tensors`` only
        give the shapes.
        """
        import torch

        config = config or self._config
        if not isinstance(config, AllReduceConfig):
            raise ConfigError("config must be an AllReduceConfig")
        me = self._my_index(group)
        auxiliary = group.members[me].auxiliary
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
                or not math.isfinite(weight) or not 0 <= weight <= MAX_WEIGHT:
            raise ConfigError(f"weight must be a number in [0, {MAX_WEIGHT:g}], got {weight!r}")
        originals = _check_tensors(tensors)
        if group.group_id in self._sessions:
            raise ConfigError("this node already runs an all-reduce for this group")
        if len(self._sessions) >= config.max_rounds:
            raise ConfigError(f"this node already runs {len(self._sessions)} all-reduces "
                              f"(max_rounds)")
        try:
            fractions = default_fractions(group)
        except LocalProtocolError as exc:
            raise ConfigError(str(exc)) from None
        sizes = [t.numel() for t in originals]
        layout = Layout.for_tensors(sizes, fractions, config.codecs, config.chunk_values,
                                    config.aggregator)
        if auxiliary:
            flat = torch.zeros(layout.numel, dtype=torch.float32)
            weight = 0.0
        else:
            flat = _flatten(originals, layout.numel)
            _check_finite(flat)
        start = trio.current_time()
        session = _Session(group, me, layout, flat, float(weight), auxiliary, config, start)
        if self._own_report is not None and session.weight > 0:
            session.report = self._own_report(group.run_id, group.epoch)
        lo, hi = layout.part_bounds[me]
        if layout.chunks[me]:
            senders = [i for i, m in enumerate(group.members)
                       if i != me and not m.auxiliary]
            session.reducer = self.part_reducer(layout, me, senders, flat[lo:hi],
                                          session.weight, me, start, config.sender_timeout,
                                          max_share=config.max_weight_share,
                                          max_ahead=config.max_chunks_ahead,
                                          outlier_factor=config.outlier_factor,
                                          max_ratio=config.max_weight_ratio)
        self._register(session)
        self._counters["rounds"] += 1
        receivers: dict[int, PartReceiver] = {}
        errors: dict[int, str] = {}
        try:
            with trio.move_on_at(session.deadline):
                async with trio.open_nursery() as nursery:
                    if session.reducer is not None:
                        session.finalize()  # with no other sender, it is done at once
                        nursery.start_soon(self._watch_reducer, session)
                    remote = [r for r in range(len(group)) if r != me and layout.chunks[r]]
                    now = self._clock()
                    for r in remote:  # no values for a reducer this node bans
                        if self._flags.is_banned(group.members[r].peer_id, group.run_id, now):
                            errors[r] = "the reducer is banned from the run"
                            self._counters["parts_failed"] += 1
                    remote = [r for r in remote if r not in errors]
                    pending = len(remote)
                    sent = [0]

                    async def exchange(r: int) -> None:
                        receiver = PartReceiver(layout, r, flat[slice(*layout.part_bounds[r])],
                                                len(group))
                        receivers[r] = receiver
                        try:
                            await self._exchange(session, r, receiver, sent, pending)
                            if all(receivers[x].complete for x in remote if x in receivers) \
                                    and len(receivers) == len(remote):
                                session.mark("gather")
                        except (P2PDLError, trio.TooSlowError) as exc:
                            errors[r] = _describe(exc)
                            self._counters["parts_failed"] += 1
                            logger.info("all-reduce %s: part %d (reducer %s) failed: %s",
                                        group.group_id.hex()[:8], r, group.members[r].peer_id,
                                        errors[r])
                            if session.reducer is not None:
                                # Unreachable or its connection gone: not waited for
                                # as a sender either.
                                self._check_liveness(session, session.reducer, (r,))

                    if auxiliary or not remote:
                        session.mark("scatter")
                    for r in remote:
                        if not auxiliary:
                            nursery.start_soon(exchange, r)
            session.held = _held(session, receivers)
            session.evidence = self._keep_evidence(session)
            session.verifier = self._verifier(session, receivers, originals)
            session.settled.set()
            settlement = Settlement({}, {})
            if not auxiliary:
                with trio.move_on_at(session.deadline + HAVE_GRACE):
                    await self._exchange_haves(session)
                settlement = self._settle(session)
                await self._judge(session)
        finally:
            self._unregister(session)
        return self._result(session, originals, receivers, errors, inplace, settlement)

    def _my_index(self, group: Group) -> int:
        try:
            return group.index_of(self._host.peer_id)
        except ValueError:
            raise ConfigError("this node is not a member of the group") from None

    # -- sender side ------------------------------------------------------

    async def _exchange(self, session: _Session, r: int, receiver: PartReceiver,
                        sent: list[int], pending: int) -> None:
        """Send our values of part ``r`` to its reducer; receive its averages."""
        config = session.config
        peer = session.group.members[r].peer_id
        remaining = max(0.1, session.deadline - trio.current_time())
        with trio.fail_after(min(remaining, config.reducer_timeout)):
            # Both sides show each other their membership of the run first.
            await self._introduce(peer, session.group.run_id)
        remaining = max(0.1, session.deadline - trio.current_time())
        net_stream = await self._host.new_stream(peer, ALLREDUCE_PROTOCOL_ID,
                                                 timeout=min(remaining, config.reducer_timeout))
        async with open_framed_stream(net_stream, self._wire) as stream:
            try:
                chunks, commitment = self._commit(session, r)
                await stream.send_message(Begin(session.group.group_id, session.me, r,
                                                session.layout.digest, session.weight,
                                                want_result=not session.auxiliary,
                                                report=session.report, chunks=chunks,
                                                commitment=commitment))
                async with open_service_nursery() as nursery:
                    nursery.start_soon(self._send_values, stream, session, r, sent, pending)
                    await self._receive_results(stream, session, r, receiver)
                    nursery.cancel_scope.cancel()  # done: anything unsent is not wanted
            except RemoteProtocolError:
                await stream.reset()
                raise
            finally:
                session.count_stream(stream)

    async def _send_values(self, stream: FramedStream, session: _Session, r: int,
                           sent: list[int], pending: int) -> None:
        flat = session.flat
        try:
            if session.weight > 0:
                encoded = session.encoded.get(r)
                for k, chunk in enumerate(session.layout.chunks[r]):
                    payload = encoded[k] if encoded is not None \
                        else chunk.codec.encode(flat[chunk.start:chunk.end])
                    await stream.send_tensor_chunk(chunk.header(), payload)
            # No half-close: the reducer knows the chunk count, and py-libp2p's
            # Yamux breaks a stream whose peer half-closes while it still writes.
        except P2PDLError as exc:  # the stream broke: receiving the results fails too
            logger.debug("all-reduce: sending part %d failed: %s", r, exc)
            return
        sent[0] += 1
        if sent[0] == pending:
            session.mark("scatter")

    def _commit(self, session: _Session, r: int) -> tuple[list[bytes] | None, bytes | None]:
        """This sender's commitment to its chunks of part ``r`` (Disputes): it
        encodes them now (kept to send and to verify with) and signs their
        digests.  (None, None): nothing to commit to (no values, no chunks,
        too many, or a rule without a check)."""
        layout = session.layout
        chunks = layout.chunks[r]
        if session.weight <= 0 or not verifiable(layout.aggregator) or not chunks \
                or len(chunks) > MAX_COMMITTED_CHUNKS:
            return None, None
        payloads = [bytes(c.codec.encode(session.flat[c.start:c.end])) for c in chunks]
        session.encoded[r] = payloads
        digests = [chunk_digest(p) for p in payloads]
        signature = self._key.sign(commitment_payload(session.group.group_id, r, session.me,
                                                      digests))
        self._counters["verification_bytes_sent"] += sum(map(len, digests)) + len(signature)
        return digests, signature

    async def _receive_results(self, stream: FramedStream, session: _Session, r: int,
                               receiver: PartReceiver) -> None:
        timeout = session.config.reducer_timeout
        while not receiver.complete:
            with trio.move_on_after(timeout) as scope:
                item = await stream.receive(REDUCER_MESSAGES)
            if scope.cancelled_caught:
                raise trio.TooSlowError(f"the reducer sent nothing for {timeout:.1f} s "
                                        f"(reducer_timeout)")
            if item is None:
                raise StreamClosedError("the reducer ended the stream before ar.done")
            if isinstance(item, TensorChunk):
                receiver.add_chunk(item.header, item.data)
                continue
            _, message = item
            if isinstance(message, Reject):
                raise _Rejected(f"the reducer refused: {message.code}"
                                + (f" ({message.detail})" if message.detail else ""))
            assert isinstance(message, Done)
            receiver.done(message.segments, message.taus)

    # -- the post-round exchange -------------------------------------------

    async def _exchange_haves(self, session: _Session) -> None:
        """Tell the other members which parts this one completed and hear theirs.

        Dials the members this one dials (``exchange_roles``) and waits for the
        others' streams, for at most ``reducer_timeout + HAVE_GRACE`` (a member
        that lacks a part may wait that long for a silent reducer before it
        settles); a member is not waited for once its stream failed, its
        connection closed, or this node's reducer excluded it as silent or
        broken."""
        dial, answer = exchange_roles(session.group, session.me)
        if not dial and not answer:
            return
        members = session.group.members
        failed: set[int] = set()
        with trio.move_on_after(session.config.reducer_timeout + HAVE_GRACE):
            async with trio.open_nursery() as nursery:

                async def dial_have(j: int) -> None:
                    if not await self._dial_have(session, j):
                        failed.add(j)
                        session.progressed()

                for j in dial:
                    nursery.start_soon(dial_have, j)
                waiting = set(dial) | set(answer)
                while True:
                    waiting -= session.exchanged | failed | session.unheeded
                    waiting = {j for j in waiting
                               if self._host.is_connected(members[j].peer_id)}
                    if not waiting:
                        break
                    with trio.move_on_after(LIVENESS_POLL):
                        await session.wait_progress()
                nursery.cancel_scope.cancel()

    async def _dial_have(self, session: _Session, j: int) -> bool:
        """Send our ``ar.have`` to member ``j``; take its reply as heard (True)."""
        assert session.held is not None
        group = session.group
        peer = group.members[j].peer_id
        try:
            remaining = max(0.1, session.deadline + HAVE_GRACE - trio.current_time())
            net_stream = await self._host.new_stream(peer, ALLREDUCE_PROTOCOL_ID,
                                                     timeout=remaining)
            async with open_framed_stream(net_stream, self._wire) as stream:
                try:
                    mine = self._have(session)
                    await stream.send_message(mine)
                    item = await stream.receive(HAVE_MESSAGES)
                    if item is None:
                        raise StreamClosedError("the member ended the stream before its "
                                                "ar.have")
                    if isinstance(item, TensorChunk):
                        raise RemoteProtocolError("the reply to ar.have must be ar.have")
                    _, reply = item
                    if isinstance(reply, Reject):
                        raise _Rejected(f"refused: {reply.code}")
                    assert isinstance(reply, Have)
                    if reply.group_id != group.group_id or reply.sender != j:
                        raise RemoteProtocolError("the reply to ar.have is for another "
                                                  "group or member")
                    self._heard(session, j, check_have_parts(reply.parts, session.layout))
                    if mine.nonce and reply.nonce:   # both verify: reports both ways
                        await stream.send_message(self._check(session, j, reply))
                        self._hear_check(session, j, await self._receive_check(stream, j))
                    self._exchanged(session, j)
                    return True
                except RemoteProtocolError:
                    self._counters["protocol_errors"] += 1
                    await stream.reset()
                    raise
        except P2PDLError as exc:
            logger.debug("all-reduce %s: no ar.have from member %d (%s): %s",
                         group.group_id.hex()[:8], j, peer, exc)
            return False

    def _settle(self, session: _Session) -> Settlement:
        """Apply the exchange's rule to what this member heard (settle_parts)."""
        assert session.held is not None
        group = session.group
        gone = frozenset(j for j, m in enumerate(group.members)
                         if j != session.me and not self._host.is_connected(m.peer_id))
        settlement = settle_parts(session.held, session.heard, gone, session.me)
        for name, parts in (("parts_dropped", settlement.dropped),
                            ("parts_disputed", settlement.disputed)):
            self._counters[name] += len(parts)
        for part, lacking in settlement.dropped.items():
            logger.info("all-reduce %s: part %d dropped: member(s) %s did not complete it "
                        "and its reducer is gone", group.group_id.hex()[:8], part,
                        list(lacking))
        for part, lacking in settlement.disputed.items():
            logger.info("all-reduce %s: part %d disputed: member(s) %s did not complete it "
                        "(its reducer is still connected)", group.group_id.hex()[:8], part,
                        list(lacking))
        return settlement

    def _heard(self, session: _Session, j: int, parts: frozenset[int]) -> None:
        session.heard[j] = parts
        self._counters["haves_heard"] += 1
        session.progressed()

    async def _serve_have(self, stream: FramedStream, target: _Session | _Finished,
                          have: Have) -> None:
        """A member's ``ar.have``: record it (while this round still runs) and
        answer with ours once our own round has settled."""
        group, me = target.group, target.me
        j = have.sender
        if j >= len(group) or group.members[j].peer_id != stream.peer_id:
            raise RejectError("not_member", f"the stream's peer is not member {j}")
        if j not in exchange_roles(group, me)[1]:
            raise RejectError("not_exchanging", f"member {j} does not dial member {me}")
        parts = check_have_parts(have.parts, target.layout)
        if isinstance(target, _Finished):
            if target.held is None:
                raise RejectError("finished", "this member's round ended unsettled")
            held = target.held
        else:
            session = target
            if j in session.have_streams:
                raise RejectError("duplicate", f"member {j} already sent its ar.have")
            session.have_streams.add(j)
            self._heard(session, j, parts)
            with trio.CancelScope() as scope:
                session.scopes.add(scope)
                try:
                    await session.settled.wait()
                finally:
                    session.scopes.discard(scope)
            if session.held is None:   # the round was cancelled before it settled
                return
            with trio.move_on_at(session.deadline + HAVE_GRACE) as scope:
                session.scopes.add(scope)
                try:
                    mine = self._have(session)
                    await stream.send_message(mine)
                    if mine.nonce and have.nonce:   # both verify: reports, the dialer's first
                        self._hear_check(session, j, await self._receive_check(stream, j))
                        await stream.send_message(self._check(session, j, have))
                finally:
                    session.scopes.discard(scope)
                    self._exchanged(session, j)   # through, or given up: not waited for
            with trio.move_on_after(DONE_LINGER):
                await stream.wait_peer_done()
            return
        await stream.send_message(Have(group.group_id, me, sorted(held)))
        with trio.move_on_after(DONE_LINGER):
            await stream.wait_peer_done()

    # -- verification -----------------------------------------------------

    def _verifier(self, session: _Session, receivers: dict[int, PartReceiver],
                  originals: list[torch.Tensor]) -> RoundVerifier | None:
        """This member's checks of the round, once it settled (None: it checks
        nothing: auxiliary, ``verify`` off, or a rule without a check)."""
        if session.auxiliary or not session.config.verify \
                or not verifiable(session.layout.aggregator) or session.held is None:
            return None
        layout, flat = session.layout, session.flat
        results, claims, digests = {}, {}, {}
        for r in session.held:
            if r == session.me:
                reducer = session.reducer
                assert reducer is not None
                results[r] = reducer.result()
                claims[r] = tuple(reducer.claims)
                digests[r] = reducer.digest()
            else:
                receiver = receivers[r]
                results[r] = flat[slice(*layout.part_bounds[r])]
                claims[r] = receiver.claims
                digests[r] = receiver.digest

        def values(r: int) -> torch.Tensor:
            """This member's values of part ``r`` as its reducer decoded them (a
            new tensor: the verifier computes in it)."""
            lo, hi = layout.part_bounds[r]
            if r == session.me:
                return flat[lo:hi].clone()
            if r in session.encoded:
                return decode_chunks(layout, r, session.encoded[r])
            own = flat.new_empty(hi - lo)
            for chunk in layout.chunks[r]:
                a, b = chunk.start - lo, chunk.end - lo
                piece = own[a:b]
                _restore(piece, originals, layout, chunk.start, chunk.end, offset=chunk.start)
                chunk.codec.decode(bytes(chunk.codec.encode(piece)), chunk.count, out=piece)
            return own

        return RoundVerifier(layout, session.group.group_id, session.me,
                             secrets.token_bytes(NONCE_SIZE), results, claims, digests, values)

    def _have(self, session: _Session) -> Have:
        """This member's ``ar.have``: the parts it completed, and, when it
        verifies, their digests and its nonce."""
        assert session.held is not None
        parts = sorted(session.held)
        verifier = session.verifier
        if verifier is None:
            return Have(session.group.group_id, session.me, parts)
        digests = [verifier.digests[r] for r in parts]
        self._counters["verification_bytes_sent"] += len(verifier.nonce) + sum(map(len, digests))
        return Have(session.group.group_id, session.me, parts, digests, verifier.nonce)

    def _check(self, session: _Session, j: int, have: Have) -> Check:
        """This member's ``ar.check`` for member ``j``'s nonce."""
        verifier = session.verifier
        assert verifier is not None
        if have.digests is None or len(have.digests) != len(have.parts):
            raise RemoteProtocolError("an ar.have with a nonce must name one digest per part")
        reports = verifier.reports_for(j, have.nonce, have.parts, have.digests)
        group_id = session.group.group_id
        checks = []
        for r, digest, report in reports:
            sketch = pack_sketch(report.sketch)
            signature = self._key.sign(report_payload(group_id, r, session.me, have.nonce,
                                                      digest, sketch, report.distances))
            checks.append(PartCheck(r, digest, sketch, list(report.distances), signature))
        check = Check(group_id, session.me, checks)
        self._counters["verification_bytes_sent"] += len(encode_message(check))
        return check

    async def _receive_check(self, stream: FramedStream, j: int) -> Check:
        item = await stream.receive(CHECK_MESSAGES)
        if item is None:
            raise StreamClosedError("the member ended the stream before its ar.check")
        if isinstance(item, TensorChunk):
            raise RemoteProtocolError("expected ar.check")
        _, check = item
        assert isinstance(check, Check)
        if check.sender != j:
            raise RemoteProtocolError("the ar.check is from another member")
        return check

    def _hear_check(self, session: _Session, j: int, check: Check) -> None:
        """Member ``j``'s reports for this member's nonce."""
        verifier = session.verifier
        if verifier is None or check.group_id != session.group.group_id:
            raise RemoteProtocolError("an ar.check for another group")
        reports: list[tuple[int, bytes, Report | None]] = []
        seen = set()
        for part in check.reports:
            if part.part in seen or part.part >= len(session.group):
                raise RemoteProtocolError("an ar.check names a part twice, or no member's")
            seen.add(part.part)
            report = unpack_report(part.sketch, part.distances)
            if report is not None and not signed_by(
                    session.group.members[j].peer_id,
                    report_payload(session.group.group_id, part.part, j, verifier.nonce,
                                   part.digest, part.sketch, part.distances),
                    part.signature):
                report = None   # unsigned (or falsely signed): no evidence, as none
            reports.append((part.part, part.digest, report))
            if report is not None:
                verifier.signed[part.part, j] = part
        verifier.hear_reports(j, reports)

    def _exchanged(self, session: _Session, j: int) -> None:
        session.exchanged.add(j)
        session.progressed()

    async def _judge(self, session: _Session) -> None:
        """The verdicts on the parts this member checks; disputes those that
        failed with their reducers; flags what the outcome proves."""
        verifier = session.verifier
        if verifier is None:
            return
        group = session.group
        session.verdicts = verifier.verdicts()
        failed = [r for r, verdict in sorted(session.verdicts.items())
                  if verdict.status == "failed"]
        if failed:
            with trio.move_on_after(session.config.reducer_timeout):
                async with trio.open_nursery() as nursery:
                    for r in failed:
                        nursery.start_soon(self._dispute, session, r)
        now = self._clock()
        liars: set[int] = set()
        proven: set[int] = set()
        for r, verdict in sorted(session.verdicts.items()):
            self._counters["parts_checked"] += 1
            self._counters["reports_refused"] += len(verdict.liars)
            liars |= verdict.liars
            outcome, lied, why = session.disputes.get(r, ("", frozenset(), ""))
            proven |= lied
            peer = group.members[r].peer_id
            if outcome == "cleared":
                self._counters["disputes_cleared"] += 1
                logger.info("all-reduce %s: part %d (reducer %s) passed once its reducer "
                            "showed the committed data of member(s) %s", group.group_id.hex()[:8],
                            r, peer, sorted(lied))
            if verdict.status == "unverifiable":
                self._counters["parts_unverifiable"] += 1
            elif verdict.status == "failed":
                self._counters["parts_check_failed"] += 1
                flag = REDUCER_LIE_FLAG if outcome == "reducer_lie" else CHECK_FLAG
                self._flags.flag(peer, group.run_id, flag, now, why or verdict.reason)
                logger.warning("all-reduce %s: part %d (reducer %s) failed its check, dropped "
                               "(%s): %s", group.group_id.hex()[:8], r, peer,
                               "its evidence did not clear it" if outcome == "reducer_lie"
                               else "its reducer did not answer the dispute",
                               why or verdict.reason)
        for liar in sorted(proven):   # once per round
            self._counters["report_lies"] += 1
            self._flags.flag(group.members[liar].peer_id, group.run_id, LIE_FLAG, now,
                             "its signed report differs from its own committed chunks")
        for liar in sorted(liars - proven):
            self._flags.flag(group.members[liar].peer_id, group.run_id, REPORT_FLAG, now)
            logger.info("all-reduce %s: member %d (%s) reported a sketch that is a lie on its "
                        "face", group.group_id.hex()[:8], liar, group.members[liar].peer_id)

    # -- disputes ---------------------------------------------------------

    def _keep_evidence(self, session: _Session) -> ReducerEvidence | None:
        """What this reducer keeps to answer disputes (None: it verifies
        nothing, or its part is not complete)."""
        reducer = session.reducer
        if reducer is None or not reducer.complete or not session.config.verify \
                or not verifiable(session.layout.aggregator):
            return None
        return reducer.evidence(session.group.group_id)

    async def _dispute(self, session: _Session, r: int) -> None:
        """Dispute part ``r`` with its reducer: send it the reports this
        member used, check what it shows, and judge the part again."""
        verifier = session.verifier
        assert verifier is not None
        group = session.group
        peer = group.members[r].peer_id
        reports = [SignedReport(j, check) for (part, j), check in sorted(verifier.signed.items())
                   if part == r]
        dispute = Dispute(group.group_id, session.me, verifier.nonce, verifier.digests[r],
                          reports)
        session.disputes[r] = ("unanswered", frozenset(), "")
        self._counters["disputes_opened"] += 1
        try:
            net_stream = await self._host.new_stream(peer, ALLREDUCE_PROTOCOL_ID,
                                                     timeout=session.config.reducer_timeout)
            async with open_framed_stream(net_stream, self._wire) as stream:
                try:
                    await stream.send_message(dispute)
                    shown = await self._receive_proof(stream, session, r)
                except RemoteProtocolError:
                    self._counters["protocol_errors"] += 1
                    await stream.reset()
                    raise
        except RemoteProtocolError as exc:   # false evidence: the reducer's own doing
            session.disputes[r] = ("reducer_lie", frozenset(), f"false evidence: {exc}")
            return
        except P2PDLError as exc:
            logger.info("all-reduce %s: reducer %d (%s) did not answer the dispute of its "
                        "part: %s", group.group_id.hex()[:8], r, peer, exc)
            return
        liars, verdict = verifier.reconsider(r, shown)
        session.verdicts[r] = verdict
        session.disputes[r] = ("reducer_lie" if verdict.status == "failed" else "cleared",
                               liars, verdict.reason)

    async def _receive_proof(self, stream: FramedStream, session: _Session, r: int
                             ) -> dict[int, torch.Tensor]:
        """The reducer's ``ar.proof`` and the chunks it shows, checked against
        their contributors' signed digests: contributor -> its values of part
        ``r`` as the reducer decoded them.  RemoteProtocolError for anything
        false."""
        verifier = session.verifier
        assert verifier is not None
        group, layout = session.group, session.layout
        item = await stream.receive(PROOF_MESSAGES)
        if item is None:
            raise StreamClosedError("the reducer ended the stream before its ar.proof")
        if isinstance(item, TensorChunk):
            raise RemoteProtocolError("expected ar.proof")
        _, proof = item
        if isinstance(proof, Reject):
            raise _Rejected(f"refused: {proof.code}")
        assert isinstance(proof, Proof)
        chunks = layout.chunks[r]
        contributors = {j for claim in verifier.part_claims(r) for j in claim.contributors}
        out: dict[int, torch.Tensor] = {}
        for shown in proof.shown:
            j = shown.contributor
            if j in out or j in (session.me, r) or j not in contributors \
                    or (out and j < max(out)):
                raise RemoteProtocolError(f"ar.proof shows member {j} out of place")
            if len(shown.chunks) != len(chunks) or shown.delivered > len(chunks):
                raise RemoteProtocolError("ar.proof: a commitment of the wrong length")
            if not signed_by(group.members[j].peer_id,
                             commitment_payload(group.group_id, r, j, shown.chunks),
                             shown.commitment):
                raise RemoteProtocolError(f"ar.proof: a commitment member {j} did not sign")
            payloads = []
            for k in range(shown.delivered):
                frame = await stream.receive(PROOF_MESSAGES)
                if not isinstance(frame, TensorChunk):
                    raise RemoteProtocolError("ar.proof: fewer chunks than it announced")
                chunks[k].check(frame.header)
                data = bytes(frame.data)
                if chunk_digest(data) != shown.chunks[k]:
                    raise RemoteProtocolError(f"ar.proof: chunk {k} of member {j} is not the "
                                              f"one it committed to")
                payloads.append(data)
            out[j] = decode_chunks(layout, r, payloads)
        return out

    async def _serve_dispute(self, stream: FramedStream, target: _Session | _Finished,
                             dispute: Dispute) -> None:
        """A verifier disputes this reducer's part: show the committed chunks of
        every contributor whose report, as the verifier heard it, differs
        from what its chunks give (or that it lacks)."""
        group, me = target.group, target.me
        j = dispute.sender
        if j >= len(group) or group.members[j].peer_id != stream.peer_id:
            raise RejectError("not_member", f"the stream's peer is not member {j}")
        if isinstance(target, _Session):
            with trio.move_on_at(target.deadline + HAVE_GRACE):
                await target.settled.wait()
            evidence = target.evidence
        else:
            evidence = target.evidence if trio.current_time() <= target.kept_until else None
        if evidence is None or dispute.digest != evidence.digest \
                or len(dispute.nonce) != NONCE_SIZE:
            raise RejectError("no_evidence", "no evidence kept for that result")
        if j in evidence.answered:
            raise RejectError("duplicate", f"member {j} already disputed this part")
        evidence.answered.add(j)
        reports: dict[int, Report | None] = {}
        for signed in dispute.reports:
            if signed.contributor in reports or signed.contributor >= len(group):
                raise RemoteProtocolError("ar.dispute names a contributor twice, or no member")
            check = signed.report
            reports[signed.contributor] = unpack_report(check.sketch, check.distances) \
                if check.part == me and check.digest == evidence.digest else None
        plan = sketch_plan(group.group_id, me, dispute.nonce, evidence.result.numel())
        shown = evidence.disputed(j, plan, reports)
        self._counters["disputes_answered"] += 1
        await stream.send_message(Proof([
            Shown(c, len(evidence.committed[c][2]), list(evidence.committed[c][0]),
                  evidence.committed[c][1]) for c in shown]))
        chunks = target.layout.chunks[me]
        for c in shown:
            for k, payload in enumerate(evidence.committed[c][2]):
                await stream.send_tensor_chunk(chunks[k].header(), payload)
        logger.info("all-reduce %s: member %d disputed this reducer's part; showed the "
                    "committed chunks of member(s) %s", group.group_id.hex()[:8], j, shown)
        with trio.move_on_after(DONE_LINGER):
            await stream.wait_peer_done()

    # -- reducer side -----------------------------------------------------

    async def _watch_reducer(self, session: _Session) -> None:
        """Exclude late senders; end once the part is averaged and delivered."""
        reducer = session.reducer
        assert reducer is not None
        while True:
            if reducer.complete:
                await session.handlers_idle.wait()
                if session.handlers == 0:
                    return
                continue
            deadline = reducer.next_deadline()
            poll = trio.current_time() + LIVENESS_POLL
            with trio.move_on_at(min(deadline if deadline is not None else math.inf, poll)):
                await session.wait_progress()
            self._check_liveness(session, reducer)
            for sender in reducer.check_timeouts(trio.current_time()):
                session.excluded.add(sender)
                session.unheeded.add(sender)
                self._counters["senders_excluded"] += 1
                logger.info("all-reduce %s: excluded member %d (%s): %s",
                            session.group.group_id.hex()[:8], sender,
                            session.group.members[sender].peer_id,
                            reducer.senders[sender].reason)
            session.finalize()

    def _check_liveness(self, session: _Session, reducer: PartReducer,
                        gone: Sequence[int] = ()) -> None:
        """Fail at once the senders the part waits for whose connection to this
        node closed after this round saw it open, or (``gone``) that this
        node's own stream to them just failed with no connection left: a
        member known gone is not waited for until ``sender_timeout``."""
        lost = []
        for index, state in reducer.senders.items():
            if state.state not in (SenderState.WAITING, SenderState.STREAMING):
                continue
            if self._host.is_connected(session.group.members[index].peer_id):
                session.seen_connected.add(index)
            elif index in session.seen_connected or index in gone:
                reducer.fail(index, "it is unreachable: no connection to this reducer")
                lost.append(index)
        for index in lost:
            session.excluded.add(index)
            self._counters["senders_excluded"] += 1
            logger.info("all-reduce %s: excluded member %d (%s): unreachable, no connection",
                        session.group.group_id.hex()[:8], index,
                        session.group.members[index].peer_id)
        if lost:
            session.finalize()
            session.progressed()

    async def _open(self, stream: FramedStream) -> Opened | None:
        """An incoming stream: its ``ar.begin`` and the session of its group,
        waited for up to ``join_wait``; its run is the group's."""
        try:
            with trio.move_on_after(self._config.join_wait) as scope:
                item = await stream.receive(SENDER_MESSAGES)
            if scope.cancelled_caught or item is None or isinstance(item, TensorChunk):
                raise RemoteProtocolError("an all-reduce stream must start with ar.begin")
            _, begin = item
            if isinstance(begin, (Have, Dispute)):
                finished = self._recent.get(begin.group_id)
                if finished is not None and begin.group_id not in self._sessions:
                    return Opened(finished.group.run_id, (finished, begin))
            assert isinstance(begin, (Begin, Have, Dispute))
            session = await self._find_session_while_open(stream, begin.group_id)
            return Opened(session.group.run_id, (session, begin))
        except RemoteProtocolError as exc:
            # Broken before its ar.begin was read (it may have arrived in the
            # same read as the violation): a member of a running round that has
            # not begun with us is failed at once, not after sender_timeout.
            self._fail_unbegun(stream.peer_id, f"protocol error: {exc}")
            await self._failed(stream, exc)
            return None
        except (RejectError, P2PDLError) as exc:
            await self._failed(stream, exc)
            return None

    def _fail_unbegun(self, peer: Any, reason: str) -> None:
        for session in self._sessions.values():
            reducer = session.reducer
            if reducer is None:
                continue
            for index, member in enumerate(session.group.members):
                if member.peer_id == peer and \
                        reducer.sender_states().get(index) is SenderState.WAITING:
                    self._fail_sender(session, index, reason)

    def _fail_sender(self, session: _Session, sender: int, reason: str) -> None:
        """Fail a sender of this node's part at once (nothing more of it counts)."""
        assert session.reducer is not None
        session.reducer.fail(sender, reason)
        session.excluded.add(sender)
        session.unheeded.add(sender)
        self._counters["senders_failed"] += 1
        session.finalize()
        session.progressed()

    async def _handle_admitted(self, stream: FramedStream,
                               opened: tuple[_Session | _Finished, Begin | Have | Dispute]
                               ) -> None:
        """A sender of some group's all-reduce, or a member's ``ar.have``,
        admitted by the node's gate."""
        target, first = opened
        try:
            if isinstance(first, Have):
                await self._serve_have(stream, target, first)
            elif isinstance(first, Dispute):
                await self._serve_dispute(stream, target, first)
            else:
                assert isinstance(target, _Session)
                await self._serve(stream, target, first)
        except (RejectError, P2PDLError) as exc:
            await self._failed(stream, exc)

    async def _refuse(self, stream: FramedStream, refusal: Refusal) -> None:
        await self._failed(stream, RejectError(refusal.code, refusal.reason))

    async def _failed(self, stream: FramedStream, exc: BaseException) -> None:
        if isinstance(exc, RejectError):
            self._counters["streams_rejected"] += 1
            logger.debug("all-reduce: refused a stream from %s: %s", stream.peer_id, exc)
            try:
                await stream.send_message(Reject(exc.code, exc.detail[:MAX_DETAIL_LENGTH]))
            except P2PDLError:
                pass  # the sender went away; nothing to tell it
        elif isinstance(exc, RemoteProtocolError):
            # Counted here; the host resets the stream, counts it per protocol and
            # logs it once per peer, as for every protocol.
            self._counters["protocol_errors"] += 1
            raise exc
        else:  # the stream broke, or a send found no credit
            logger.debug("all-reduce: stream from %s ended: %s", stream.peer_id, exc)

    async def _find_session_while_open(self, stream: FramedStream, group_id: bytes
                                       ) -> _Session:
        """:meth:`_find_session`, given up as soon as the sender's stream ends."""
        found: list[_Session] = []
        failed: list[BaseException] = []
        async with trio.open_nursery() as nursery:

            async def find() -> None:
                try:
                    found.append(await self._find_session(group_id, stream.peer_id))
                except (RejectError, P2PDLError) as exc:
                    failed.append(exc)
                nursery.cancel_scope.cancel()

            async def watch() -> None:
                await stream.wait_peer_done()
                nursery.cancel_scope.cancel()

            nursery.start_soon(find)
            nursery.start_soon(watch)
        if failed:
            raise failed[0]
        if not found:
            raise StreamClosedError(f"{stream.peer_id} closed its all-reduce stream while "
                                    f"it waited for its group")
        return found[0]

    async def _find_session(self, group_id: bytes, peer: Any) -> _Session:
        """The session of ``group_id``, waiting up to ``join_wait`` for it to start.

        At most ``max_waiting_streams`` streams wait, and at most
        ``max_rounds`` of one peer (a peer is in no more groups with us at once).
        """
        if group_id in self._sessions:
            return self._sessions[group_id]
        if group_id in self._recent:
            raise RejectError("finished")
        if self._waiting >= self._config.max_waiting_streams \
                or self._waiting_by_peer[peer] >= self._config.max_rounds:
            raise RejectError("busy")
        self._waiting += 1
        self._waiting_by_peer[peer] += 1
        try:
            with trio.move_on_after(self._config.join_wait):
                while group_id not in self._sessions:
                    if group_id in self._recent:
                        raise RejectError("finished")
                    await self._sessions_changed.wait()
                return self._sessions[group_id]
        finally:
            self._waiting -= 1
            self._waiting_by_peer[peer] -= 1
            if not self._waiting_by_peer[peer]:
                del self._waiting_by_peer[peer]
        raise RejectError("unknown_group", f"no all-reduce for it within "
                                           f"{self._config.join_wait:.0f} s")

    async def _serve(self, stream: FramedStream, session: _Session, begin: Begin) -> None:
        group, reducer = session.group, session.reducer
        sender = begin.sender
        if sender >= len(group) or group.members[sender].peer_id != stream.peer_id:
            raise RejectError("not_member", f"the stream's peer is not member {sender}")
        if begin.reducer != session.me or reducer is None:
            raise RejectError("not_reducer", f"member {session.me} reduces no part")
        if begin.layout != session.layout.digest:
            raise RejectError("layout_mismatch", "tensor sizes, codecs, chunk size or plan "
                                                 "differ")
        bound = self._weight_bound(session, sender, begin)
        try:
            committed = self._committed(session, sender, begin)
        except RejectError as exc:   # failed at once, not waited out as silent
            self._fail_sender(session, sender, f"{exc.code}: {exc.detail}")
            raise
        reducer.begin(sender, begin.weight, begin.want_result, trio.current_time(), bound,
                      committed, begin.commitment or b"")
        if bound is not None and begin.weight > bound:
            self._capped(session, sender, begin.weight, bound)
        session.handlers += 1
        session.handlers_idle = trio.Event()
        session.finalize()
        session.progressed()
        try:
            with trio.CancelScope() as scope:
                session.scopes.add(scope)
                try:
                    async with open_service_nursery() as nursery:
                        nursery.start_soon(self._take_values, stream, session, sender,
                                           nursery.cancel_scope)
                        if begin.want_result:
                            await self._send_results(stream, session, sender)
                        else:
                            while not reducer.complete:
                                await session.wait_progress()
                        # Every average is out: what the sender may still send is
                        # not needed (it was excluded, or only its end is left).
                        nursery.cancel_scope.cancel()
                finally:
                    session.scopes.discard(scope)
        finally:
            session.count_stream(stream)
            session.handlers -= 1
            if session.handlers == 0:
                session.handlers_idle.set()

    def _committed(self, session: _Session, sender: int, begin: Begin) -> list[bytes] | None:
        """The chunk digests ``sender`` committed to, checked against its
        signature, when this reducer keeps evidence for disputes (verification
        on, a rule with a check, values that count); None when it keeps none.
        RejectError ``uncommitted`` for a missing or false commitment."""
        layout = session.layout
        if not session.config.verify or not verifiable(layout.aggregator) \
                or begin.weight <= 0 or not layout.chunks[session.me] \
                or len(layout.chunks[session.me]) > MAX_COMMITTED_CHUNKS:
            return None
        group = session.group
        if begin.chunks is None or not signed_by(
                group.members[sender].peer_id,
                commitment_payload(group.group_id, session.me, sender, begin.chunks),
                begin.commitment):
            raise RejectError("uncommitted", "no valid signed commitment to the chunks")
        return list(begin.chunks)

    def _weight_bound(self, session: _Session, sender: int, begin: Begin) -> float | None:
        """The most ``sender``'s weight may count: what its progress reports for
        the group's epoch support -- the one on its ``ar.begin`` included --
        with the slack (None: no evidence)."""
        if self._evidence is None or begin.weight <= 0:
            return None
        group = session.group
        # The member at ``sender`` is the stream's authenticated peer (checked
        # before): the report it attached is taken as that peer's own push.
        evidence = self._evidence(group.run_id, group.members[sender].peer_id, group.epoch,
                                  begin.report)
        if evidence is None:
            return None
        config = session.config
        return float(evidence) * (1.0 + config.weight_slack) + config.weight_slack_samples

    def _capped(self, session: _Session, sender: int, claimed: float, bound: float) -> None:
        group = session.group
        peer = group.members[sender].peer_id
        self._counters["weights_capped"] += 1
        detail = (f"group {group.group_id.hex()[:8]} epoch {group.epoch}: weight {claimed:g} "
                  f"capped at {bound:g}, what its progress reports support")
        logger.info("all-reduce %s: member %d (%s): %s", group.group_id.hex()[:8], sender,
                    peer, detail)
        self._flags.flag(peer, group.run_id, WEIGHT_FLAG, self._clock(), detail)

    def _flag_outliers(self, session: _Session, outliers: dict[int, float]) -> None:
        """Flag the senders whose values lay far from the robust result
        (``outlier_values``: repeated, the node's flag book bans them)."""
        group = session.group
        for sender, ratio in sorted(outliers.items()):
            peer = group.members[sender].peer_id
            self._counters["outliers_flagged"] += 1
            detail = (f"group {group.group_id.hex()[:8]} epoch {group.epoch}: values "
                      f"{ratio:.3g}x the reference distance from the "
                      f"{session.config.aggregator.name} result")
            logger.info("all-reduce %s: member %d (%s): %s", group.group_id.hex()[:8], sender,
                        peer, detail)
            self._flags.flag(peer, group.run_id, OUTLIER_FLAG, self._clock(), detail)

    async def _take_values(self, stream: FramedStream, session: _Session, sender: int,
                           results: trio.CancelScope) -> None:
        """Read a sender's chunks until it ends its stream, at most
        ``max_chunks_ahead`` past the first chunk not yet final."""
        reducer = session.reducer
        assert reducer is not None
        try:
            while True:
                while reducer.accepts_chunks(sender) and not reducer.wants_chunk(sender):
                    await session.wait_progress()  # held back: the others are behind
                item = await stream.receive(SENDER_MESSAGES)
                now = trio.current_time()
                if item is None:
                    reducer.end_of_stream(sender, now)
                    break
                if not isinstance(item, TensorChunk):
                    raise RemoteProtocolError("a sender sends ar.begin once, then chunks")
                if reducer.accepts_chunks(sender):
                    reducer.add_chunk(sender, item.header, item.data, now)
                    session.finalize()
                elif reducer.sender_states()[sender].value == "failed":
                    break
        except RemoteProtocolError as exc:
            self._counters["protocol_errors"] += 1
            self._counters["senders_failed"] += 1
            logger.info("all-reduce %s: member %d (%s) broke the protocol: %s",
                        session.group.group_id.hex()[:8], sender, stream.peer_id, exc)
            reducer.fail(sender, f"protocol error: {exc}")
            session.excluded.add(sender)
            session.unheeded.add(sender)
            results.cancel()
            await stream.reset()
        except P2PDLError as exc:
            self._counters["senders_failed"] += 1
            reducer.fail(sender, f"stream closed: {exc}")
            session.excluded.add(sender)
            results.cancel()
        finally:
            session.finalize()
            session.progressed()

    async def _send_results(self, stream: FramedStream, session: _Session, sender: int) -> None:
        """Send the averaged chunks as they become final, then ``ar.done``."""
        reducer = session.reducer
        assert reducer is not None
        for k, chunk in enumerate(reducer.chunks):
            while reducer.final <= k:
                await session.wait_progress()
            await stream.send_tensor_chunk(chunk.header(), reducer.payloads[k])
        await stream.send_message(Done(reducer.segments(), reducer.taus()))
        # The sender ends the stream once it has read everything: wait for
        # that (briefly), so that a reducer that returns -- or exits -- right
        # after the round does not cut off averages still in flight.
        with trio.move_on_after(DONE_LINGER):
            await stream.wait_peer_done()

    # -- bookkeeping ------------------------------------------------------

    def _register(self, session: _Session) -> None:
        self._sessions[session.group.group_id] = session
        self._sessions_changed.set()
        self._sessions_changed = trio.Event()

    def _unregister(self, session: _Session) -> None:
        group_id = session.group.group_id
        if session.reducer is not None and session.reducer.outliers:
            self._flag_outliers(session, session.reducer.outliers)
        if session.reducer is not None and session.reducer.ratio_capped:
            self._counters["weights_ratio_capped"] += len(session.reducer.ratio_capped)
            logger.debug("all-reduce %s: the median cap lowered the weights of members %s",
                         group_id.hex()[:8], sorted(session.reducer.ratio_capped))
        if session.reducer is not None and session.reducer.share_capped:
            self._counters["weights_share_capped"] += len(session.reducer.share_capped)
            logger.debug("all-reduce %s: the share cap lowered the weights of members %s",
                         group_id.hex()[:8], sorted(session.reducer.share_capped))
        self._sessions.pop(group_id, None)
        self._recent[group_id] = _Finished(
            session.group, session.me, session.layout, session.held, session.evidence,
            trio.current_time() + session.config.evidence_seconds)
        while len(self._recent) > MAX_RECENT_GROUPS:
            self._recent.popitem(last=False)
        kept = 0
        for key in reversed(list(self._recent)):   # only the newest keep their evidence
            finished = self._recent[key]
            if finished.evidence is not None:
                kept += 1
                if kept > MAX_EVIDENCE_ROUNDS:
                    self._recent[key] = dataclasses.replace(finished, evidence=None)
        for scope in list(session.scopes):
            scope.cancel()
        self._sessions_changed.set()
        self._sessions_changed = trio.Event()

    def _result(self, session: _Session, originals: list[torch.Tensor],
                receivers: dict[int, PartReceiver], errors: dict[int, str],
                inplace: bool, settlement: Settlement) -> AllReduceResult:
        group, layout, flat = session.group, session.layout, session.flat
        session.mark("total")
        parts = []
        for r, member in enumerate(group.members):
            if r in settlement.dropped:
                lo, hi = layout.part_bounds[r]
                _restore(flat, originals, layout, lo, hi)
                lacking = settlement.dropped[r]
                parts.append(PartResult(r, member.peer_id, lo, hi, False,
                                        error=f"dropped after the round: member(s) "
                                              f"{list(lacking)} did not complete it and its "
                                              f"reducer is gone", lacked_by=lacking))
                continue
            lo, hi = layout.part_bounds[r]
            if not layout.chunks[r]:
                parts.append(PartResult(r, member.peer_id, lo, hi, True))
                continue
            if r == session.me:
                reducer = session.reducer
                assert reducer is not None
                if reducer.complete:
                    flat[lo:hi].copy_(reducer.result())
                    parts.append(PartResult(r, member.peer_id, lo, hi, True,
                                            contributions(layout, r, reducer.segments()),
                                            lacked_by=settlement.disputed.get(r, ())))
                else:
                    parts.append(PartResult(r, member.peer_id, lo, hi, False,
                                            error="the round ended before every sender was "
                                                  "heard (averaging_timeout)"))
                continue
            receiver = receivers.get(r)
            if session.auxiliary:
                parts.append(PartResult(r, member.peer_id, lo, hi, False,
                                        error=AUXILIARY_NO_RESULT))
            elif receiver is not None and receiver.complete \
                    and session.verdicts.get(r, _NOT_CHECKED).status == "failed":
                _restore(flat, originals, layout, lo, hi)
                parts.append(PartResult(r, member.peer_id, lo, hi, False,
                                        error=f"the result failed its check: "
                                              f"{session.verdicts[r].reason}",
                                        check="failed"))
            elif receiver is not None and receiver.complete:
                assert receiver.segments is not None
                verdict = session.verdicts.get(r)
                parts.append(PartResult(r, member.peer_id, lo, hi, True,
                                        contributions(layout, r, receiver.segments),
                                        lacked_by=settlement.disputed.get(r, ()),
                                        check=verdict.status if verdict else None))
            else:
                error = errors.get(r, "the round ended before the reducer finished "
                                      "(averaging_timeout)")
                _restore(flat, originals, layout, lo, hi)
                parts.append(PartResult(r, member.peer_id, lo, hi, False, error=error))
        if "gather" not in session.times and all(
                p.completed for p in parts) and not session.auxiliary:
            session.times["gather"] = session.times["total"]
        outputs = _unflatten(flat, originals)
        if inplace and not session.auxiliary:
            for original, output in zip(originals, outputs, strict=True):
                original.copy_(output)
            outputs = list(originals)
        result = AllReduceResult(outputs, group, tuple(parts), tuple(sorted(session.excluded)),
                                 session.bytes_sent, session.bytes_received,
                                 dict(session.times), _predicted(group, layout),
                                 session.auxiliary, tuple(sorted(session.heard)))
        self._counters["completed" if result.completed else "incomplete"] += 1
        return result


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
    vector_bytes = sum(codec.encoded_size(size)
                       for codec, size in zip(layout.codecs, layout.sizes, strict=True))
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


def _restore(flat: torch.Tensor, originals: list[torch.Tensor], layout: Layout,
             lo: int, hi: int, *, offset: int = 0) -> None:
    """Put this member's own values ``[lo, hi)`` back into ``flat`` (which
    starts at value ``offset`` of the vector)."""
    for t, start, size in zip(originals, layout.tensor_starts, layout.sizes, strict=False):
        a, b = max(lo, start), min(hi, start + size)
        if a < b:
            flat[a - offset:b - offset].copy_(t.detach().reshape(-1)[a - start:b - start])


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
