"""The post-round exchange of the all-reduce service (``_service``):
``ar.have`` both ways, and, when both members verify, ``ar.reveal`` (the
secrets of the joint nonce), ``ar.joint`` (each one's joint nonce) and
``ar.check`` (the signed reports).

:class:`_ExchangeSide` is a part of :class:`AllReduceService`, which holds
the state its methods use.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from ...errors import (
    P2PDLError,
    RemoteProtocolError,
    StreamClosedError,
)
from ...wire import FramedStream, TensorChunk, encode_message, open_framed_stream
from ._evidence import (
    pack_sketch,
    report_payload,
    signed_by,
    unpack_report,
)
from ._messages import (
    ALLREDUCE_PROTOCOL_ID,
    CHECK_MESSAGES,
    HAVE_MESSAGES,
    JOINT_MESSAGES,
    REVEAL_MESSAGES,
    Check,
    Have,
    Joint,
    PartCheck,
    Reject,
    Reveal,
)
from ._session import (
    DONE_LINGER,
    HAVE_GRACE,
    JOIN_WAIT,
    LIVENESS_POLL,
    _Finished,
    _receive_message,
    _Rejected,
    _Session,
)
from ._state import (
    RejectError,
    Settlement,
    check_have_parts,
    exchange_roles,
    settle_parts,
)
from ._verify import NONCE_SIZE, Report, RoundVerifier

__all__ = ["_ExchangeSide"]

logger = logging.getLogger(__name__)


class _ExchangeSide:
    """The post-round exchange of :class:`AllReduceService`."""

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
                if session.verifier is not None:
                    nursery.start_soon(self._prepare, session.verifier)
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

    @staticmethod
    async def _prepare(verifier: RoundVerifier) -> None:
        """The verifier's work that needs no nonce (its terms, the result
        norms), done while the exchange waits for messages: one part at a
        time, the haves and secrets handled in between."""
        await trio.lowlevel.checkpoint()
        for _ in verifier.prepare():
            await trio.lowlevel.checkpoint()

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
                    self._hear_results(session, j, reply)
                    self._hear_commitment(session, j, reply)
                    if mine.commitment and reply.commitment:   # both verify
                        await self._verify_pair(session, stream, j, reply)
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
        finally:
            self._give_up(session, j)   # through or failed: not waited for in the joint nonce

    async def _verify_pair(self, session: _Session, stream: FramedStream, j: int,
                           theirs: Have) -> None:
        """Both members of the pair verify: once this member's set of
        committed members is closed, reveal its secret and hear member
        ``j``'s; once the closed set revealed, tell ``j`` this member's joint
        nonce and hear ``j``'s; then reports both ways, each for the other's
        joint nonce (protocols/allreduce.md, Verification)."""
        verifier, joint = session.verifier, session.joint
        assert verifier is not None and joint is not None
        dial, answer = exchange_roles(session.group, session.me)
        partners = sorted(set(dial) | set(answer))
        # The answering side's stream lasts until the round's deadline plus
        # HAVE_GRACE: half of that grace is left for the reveal and the reports.
        reveal_by = min(session.settled_at + session.config.reducer_timeout,
                        session.deadline + HAVE_GRACE / 2)
        await self._until(session, partners, lambda: joint.committed(partners), reveal_by)
        joint.close()
        await stream.send_message(Reveal(joint.secret))
        reveal = await _receive_message(stream, REVEAL_MESSAGES, "ar.reveal", "member")
        assert isinstance(reveal, Reveal)
        if not joint.reveal(j, reveal.nonce):
            raise RemoteProtocolError("its ar.reveal is not the nonce it committed to")
        session.progressed()
        await self._until(session, partners, joint.revealed,
                          trio.current_time() + JOIN_WAIT)
        await stream.send_message(Joint(verifier.nonce))
        wanted = await _receive_message(stream, JOINT_MESSAGES, "ar.joint", "member")
        assert isinstance(wanted, Joint)
        if len(wanted.nonce) != NONCE_SIZE:
            raise RemoteProtocolError("an ar.joint must carry a nonce of NONCE_SIZE bytes")
        self._counters["verification_bytes_sent"] += 2 * NONCE_SIZE
        await stream.send_message(self._check(session, j, theirs, wanted.nonce))
        self._hear_check(session, j, await self._receive_check(stream, j))

    async def _until(self, session: _Session, partners: list[int], ready: Callable[[], bool],
                     deadline: float) -> None:
        """Wait until ``ready()`` or ``deadline``; partners that left, or
        that this member's reducer excluded as silent or broken, are given up
        on meanwhile."""
        members = session.group.members
        joint = session.joint
        with trio.move_on_at(deadline):
            while not ready():
                for j in partners:
                    if j in session.unheeded or not self._host.is_connected(members[j].peer_id):
                        if joint is not None and j not in joint.gone:
                            joint.gone.add(j)
                            session.progressed()
                if ready():
                    break
                with trio.move_on_after(LIVENESS_POLL):
                    await session.wait_progress()

    def _give_up(self, session: _Session, j: int) -> None:
        """Member ``j``'s exchange ended: its commitment and secret are in, or
        never will be."""
        joint = session.joint
        if joint is not None and j not in joint.gone:
            joint.gone.add(j)
            session.progressed()

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
            self._hear_results(session, j, have)
            self._hear_commitment(session, j, have)
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
                    if mine.commitment and have.commitment:   # both verify
                        await self._verify_pair(session, stream, j, have)
                finally:
                    session.scopes.discard(scope)
                    self._give_up(session, j)
                    self._exchanged(session, j)   # through, or given up: not waited for
            with trio.move_on_after(DONE_LINGER):
                await stream.wait_peer_done()
            return
        await stream.send_message(Have(group.group_id, me, sorted(held)))
        with trio.move_on_after(DONE_LINGER):
            await stream.wait_peer_done()

    def _have(self, session: _Session) -> Have:
        """This member's ``ar.have``: the parts it completed, and, when it
        verifies, their digests, their reducers' signatures and its
        commitment to its secret."""
        assert session.held is not None
        parts = sorted(session.held)
        verifier = session.verifier
        if verifier is None:
            return Have(session.group.group_id, session.me, parts)
        digests = [verifier.digests[r] for r in parts]
        results = [verifier.signatures.get(r, b"") for r in parts]
        commitment = verifier.joint.commitment
        self._counters["verification_bytes_sent"] += len(commitment) \
            + sum(map(len, digests)) + sum(map(len, results))
        return Have(session.group.group_id, session.me, parts, digests, b"", results,
                    commitment)

    def _hear_commitment(self, session: _Session, j: int, have: Have) -> None:
        """Member ``j``'s commitment to its secret (none: it verifies nothing
        with this member, and is not waited for)."""
        joint = session.joint
        if joint is None:
            return
        if len(have.commitment) == NONCE_SIZE and have.digests is not None:
            joint.commit(j, have.commitment)
        else:
            joint.gone.add(j)
        session.progressed()

    def _hear_results(self, session: _Session, j: int, have: Have) -> None:
        """The result digests member ``j`` holds and their reducers' signatures
        (compared with this member's own in ``_judge``: equivocation)."""
        if have.digests is None or have.results is None:
            return
        if len(have.digests) != len(have.parts) or len(have.results) != len(have.parts):
            raise RemoteProtocolError("an ar.have must name one digest and one result "
                                      "signature per part")
        session.results_heard[j] = {r: (digest, signature) for r, digest, signature
                                    in zip(have.parts, have.digests, have.results, strict=True)
                                    if signature}

    def _check(self, session: _Session, j: int, have: Have, nonce: bytes) -> Check:
        """This member's ``ar.check`` for member ``j``'s joint ``nonce``."""
        verifier = session.verifier
        assert verifier is not None
        if have.digests is None or len(have.digests) != len(have.parts):
            raise RemoteProtocolError("an ar.have with a commitment must name one digest per "
                                      "part")
        reports = verifier.reports_for(j, nonce, have.parts, have.digests)
        group_id = session.group.group_id
        checks = []
        for r, digest, report in reports:
            sketch = pack_sketch(report.sketch)
            signature = self._key.sign(report_payload(group_id, r, session.me, nonce,
                                                      digest, sketch, report.distances))
            checks.append(PartCheck(r, digest, sketch, list(report.distances), signature))
        check = Check(group_id, session.me, checks)
        self._counters["verification_bytes_sent"] += len(encode_message(check))
        return check

    async def _receive_check(self, stream: FramedStream, j: int) -> Check:
        check = await _receive_message(stream, CHECK_MESSAGES, "ar.check", "member")
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
