"""The all-reduce service of a node: ``await node.allreduce.all_reduce(group, tensors)``.

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

from ...errors import (
    ConfigError,
    LocalProtocolError,
    P2PDLError,
    RemoteProtocolError,
    StreamClosedError,
)
from ...service import Opened, Refusal, ServiceContext, StreamEndpoint, serve_nothing
from ...wire import FramedStream, TensorChunk
from .._capacity import CapacityEstimate, CapacityEstimator
from ..matchmaking.config import MAX_DETAIL_LENGTH
from ._accusations import ACCUSATIONS_PREFIX, AccusationBoard
from ._accusing import ACCUSATIONS_SCHEMA, _AccusationSide
from ._disputes import _DisputeSide
from ._exchange import _ExchangeSide
from ._messages import (
    ALLREDUCE_PROTOCOL_ID,
    MAX_WEIGHT,
    SENDER_MESSAGES,
    Begin,
    Dispute,
    FetchProof,
    Have,
    Reject,
)
from ._parts import PartReceiver, PartReducer
from ._proofs import KeptProofs
from ._reducing import _ReducerSide
from ._sending import _SenderSide
from ._session import (
    _NOT_CHECKED,
    COUNTERS,
    HAVE_GRACE,
    MAX_RECENT_GROUPS,
    OUTLIER_FLAG,
    WEIGHT_FLAG,
    AllReduceStatistics,
    _check_finite,
    _check_tensors,
    _describe,
    _Finished,
    _flatten,
    _held,
    _predicted,
    _restore,
    _sent_error,
    _Session,
    _unflatten,
    _zeros_like,
)
from ._state import (
    AUXILIARY_NO_RESULT,
    AllReduceResult,
    Layout,
    PartResult,
    RejectError,
    Settlement,
    contributions,
    default_fractions,
)
from ._verify import NONCE_SIZE, JointNonce, Scratch, verifiable
from .config import MAX_EVIDENCE_ROUNDS, AllReduceConfig

if TYPE_CHECKING:
    import torch
    from libp2p.peer.id import ID

    from ...dht import DHTService
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

logger = logging.getLogger(__name__)


class AllReduceService(_SenderSide, _ExchangeSide, _DisputeSide, _ReducerSide,
                       _AccusationSide):
    """Butterfly all-reduce for groups from matchmaking (``node.allreduce``).

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

    ``dht``: where proofs of equivocation and claims of disputes' proofs
    travel in certificate runs (published and read under
    ``p2pdl/accusations/<run id>``; the node passes its DHT).  Without it,
    they stay this node's own.
    """

    def __init__(self, context: ServiceContext, config: AllReduceConfig | None = None, *,
                 weight_evidence: WeightEvidence | None = None,
                 own_report: OwnReport | None = None, dht: DHTService | None = None) -> None:
        self._host = context.host
        self._members = context.members
        self._dht = dht
        self._board = AccusationBoard()
        self._proofs = KeptProofs()
        self._board_changed = trio.Event()
        if dht is not None:
            dht.scope_run_keys(ACCUSATIONS_PREFIX, lambda rest: rest)
            dht.register_schema(ACCUSATIONS_SCHEMA)
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
        self._counters["round_seconds"] = 0.0
        #: Verification's buffers, kept from round to round.
        self._scratch = Scratch()
        self._capacity = CapacityEstimator()

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
        """Publishes and reads accusations (certificate runs); a round runs in
        the caller's task, streams in theirs."""
        if self._dht is None:
            await serve_nothing(task_status)
            return
        task_status.started()
        await self._accusations_loop()

    async def all_reduce(self, group: Group, tensors: Sequence[torch.Tensor], *,
                         weight: float = 1.0, config: AllReduceConfig | None = None,
                         inplace: bool = False, sent_error: bool = False) -> AllReduceResult:
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
        With ``sent_error=True`` the result says what the codecs rounded off
        this member's values (``AllReduceResult.sent_error``).  Never raises for what other
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
                                    config.aggregator, config.caps)
        if auxiliary:
            flat = torch.zeros(layout.numel, dtype=torch.float32)
            weight = 0.0
        else:
            flat = _flatten(originals, layout.numel)
            _check_finite(flat)
        start = trio.current_time()
        session = _Session(group, me, layout, flat, float(weight), auxiliary, config, start)
        if not auxiliary and config.verify and verifiable(layout.aggregator):
            session.joint = JointNonce(group.group_id, me, secrets.token_bytes(NONCE_SIZE))
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
        self._watch(group.run_id)   # its accusations are read from now on
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

                    # what a proof of a dispute shows again (certificate runs)
                    keep = session.joint is not None \
                        and self._shares_accusations(group.run_id)

                    async def exchange(r: int) -> None:
                        receiver = PartReceiver(layout, r, flat[slice(*layout.part_bounds[r])],
                                                len(group), keep=keep)
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
            session.settled_at = trio.current_time()
            session.settled.set()
            settlement = Settlement({}, {})
            if not auxiliary:
                with trio.move_on_at(session.deadline + HAVE_GRACE):
                    await self._exchange_haves(session)
                settlement = self._settle(session)
                await self._judge(session)
        finally:
            self._unregister(session)
            if session.verifier is not None:
                self._counters["reports_sketched"] += session.verifier.sketches
                session.verifier.close()
        return self._result(session, originals, receivers, errors, inplace, settlement,
                            sent_error)

    def capacity(self) -> CapacityEstimate:
        """This node's rates as its rounds measured them (``_capacity``): what
        ``average_round`` offers the leader's load plan when the caller says
        no bandwidth."""
        return self._capacity.estimate()

    def _measure(self, session: _Session) -> None:
        """The round's transfers as samples of this node's rates."""
        for direction, frames in session.frames.items():
            if self._capacity.record_frames(direction, frames):
                self._counters["capacity_samples"] += 1
        if self._capacity.record("reduce", session.reduce_bytes, session.reduce_seconds):
            self._counters["capacity_samples"] += 1

    def _my_index(self, group: Group) -> int:
        try:
            return group.index_of(self._host.peer_id)
        except ValueError:
            raise ConfigError("this node is not a member of the group") from None

    async def _open(self, stream: FramedStream) -> Opened | None:
        """An incoming stream: its ``ar.begin`` and the session of its group,
        waited for up to ``join_wait``; its run is the group's."""
        try:
            with trio.move_on_after(self._config.join_wait) as scope:
                item = await stream.receive(SENDER_MESSAGES)
            if scope.cancelled_caught or item is None or isinstance(item, TensorChunk):
                raise RemoteProtocolError("an all-reduce stream must start with ar.begin")
            _, begin = item
            if isinstance(begin, FetchProof):   # the run is the one it names
                return Opened(begin.run_id, (None, begin))
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

    async def _handle_admitted(self, stream: FramedStream,
                               opened: tuple[_Session | _Finished | None,
                                             Begin | Have | Dispute | FetchProof]) -> None:
        """A sender of some group's all-reduce, a member's ``ar.have`` or
        ``ar.dispute``, or a member fetching a proof, admitted by the node's
        gate."""
        target, first = opened
        try:
            if isinstance(first, FetchProof):
                await self._serve_fetch(stream, first)
                return
            assert target is not None
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
                inplace: bool, settlement: Settlement, want_error: bool = False
                ) -> AllReduceResult:
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
        # (read before ``inplace`` overwrites the values sent)
        rounded = None if not want_error else [] if session.auxiliary or session.weight <= 0 \
            else _sent_error(layout, session.me, originals, parts, session.encoded)
        if inplace and not session.auxiliary:
            for original, output in zip(originals, outputs, strict=True):
                original.copy_(output)
            outputs = list(originals)
        result = AllReduceResult(outputs, group, tuple(parts), tuple(sorted(session.excluded)),
                                 session.bytes_sent, session.bytes_received,
                                 dict(session.times), _predicted(group, layout),
                                 session.auxiliary, tuple(sorted(session.heard)),
                                 _zeros_like(originals) if rounded == [] else rounded)
        self._counters["completed" if result.completed else "incomplete"] += 1
        self._measure(session)
        self._counters["bytes_sent"] += session.bytes_sent
        self._counters["bytes_received"] += session.bytes_received
        self._counters["round_seconds"] += session.times.get("total", 0.0)
        return result
