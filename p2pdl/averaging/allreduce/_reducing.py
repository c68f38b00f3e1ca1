"""The reducer side of the all-reduce service (``_service``): a sender's
stream, its commitment and weight bound, its values in, the averages out,
timeouts and exclusions (the sans-IO logic is ``_parts.PartReducer``).

:class:`_ReducerSide` is a part of :class:`AllReduceService`, which holds
the state its methods use.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import trio

from ..._concurrency import open_service_nursery
from ...errors import (
    P2PDLError,
    RemoteProtocolError,
)
from ...wire import FramedStream, TensorChunk
from ._evidence import (
    MAX_COMMITTED_CHUNKS,
    commitment_payload,
    result_payload,
    signed_by,
)
from ._messages import (
    SENDER_MESSAGES,
    Begin,
    Done,
)
from ._parts import PartReducer, SenderState
from ._session import (
    DONE_LINGER,
    LIVENESS_POLL,
    OUTLIER_FLAG,
    WEIGHT_FLAG,
    _Session,
)
from ._state import RejectError
from ._verify import verifiable

if TYPE_CHECKING:

    pass

__all__ = ["_ReducerSide"]

logger = logging.getLogger(__name__)


class _ReducerSide:
    """The reducer side of :class:`AllReduceService`."""

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
                commitment_payload(group.group_id, session.me, sender, layout.digest,
                                   begin.chunks),
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

    def _result_signature(self, session: _Session, digest: bytes | None = None
                          ) -> bytes | None:
        """This reducer's signature over its complete part's result digest
        (``digest``, default its own; None under a rule without a check),
        signed once per digest."""
        reducer = session.reducer
        assert reducer is not None and reducer.complete
        if not verifiable(session.layout.aggregator):
            return None
        digest = reducer.digest() if digest is None else digest
        signature = session.result_signatures.get(digest)
        if signature is None:
            signature = session.result_signatures[digest] = self._key.sign(
                result_payload(session.group.group_id, session.me, digest))
        return signature

    async def _send_results(self, stream: FramedStream, session: _Session, sender: int) -> None:
        """Send the averaged chunks as they become final, then ``ar.done``."""
        reducer = session.reducer
        assert reducer is not None
        for k, chunk in enumerate(reducer.chunks):
            while reducer.final <= k:
                await session.wait_progress()
            await stream.send_tensor_chunk(chunk.header(result=True),
                                            reducer.payload_for(sender, k))
        await stream.send_message(Done(reducer.segments(), reducer.taus(),
                                       self._result_signature(session,
                                                              reducer.digest_for(sender))))
        # The sender ends the stream once it has read everything: wait for
        # that (briefly), so that a reducer that returns -- or exits -- right
        # after the round does not cut off averages still in flight.
        with trio.move_on_after(DONE_LINGER):
            await stream.wait_peer_done()
