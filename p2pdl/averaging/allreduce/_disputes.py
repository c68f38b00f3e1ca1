"""Verification and disputes in the all-reduce service (``_service``): a
member's checks of the others' parts, the dispute of a failed one with its
reducer, and the reducer's answer (the sans-IO logic is ``_verify`` and
``_evidence``).

:class:`_DisputeSide` is a part of :class:`AllReduceService`, which holds
the state its methods use.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ...errors import (
    P2PDLError,
    RemoteProtocolError,
)
from ...wire import FramedStream, TensorChunk, open_framed_stream
from ._accusations import Equivocation, find_equivocations
from ._evidence import (
    ReducerEvidence,
    answer_payload,
    chunk_digest,
    chunks_digest,
    commitment_payload,
    decode_chunks,
    own_chunk_values,
    signed_by,
    unpack_report,
)
from ._messages import (
    ALLREDUCE_PROTOCOL_ID,
    PROOF_MESSAGES,
    Committed,
    Dispute,
    Done,
    Proof,
    ProvenDispute,
    Reject,
    Shown,
    SignedReport,
)
from ._parts import PartReceiver
from ._proofs import check_header, judge
from ._session import (
    CHECK_FLAG,
    DONE_LINGER,
    EQUIVOCATION_FLAG,
    HAVE_GRACE,
    LIE_FLAG,
    REDUCER_LIE_FLAG,
    REPORT_FLAG,
    _Finished,
    _receive_message,
    _Rejected,
    _restore,
    _Session,
)
from ._state import RejectError
from ._verify import NONCE_SIZE, Report, RoundVerifier, Verdict, sketch_plan, verifiable

if TYPE_CHECKING:
    import torch


__all__ = ["_DisputeSide"]

logger = logging.getLogger(__name__)


class _DisputeSide:
    """Verification and disputes of :class:`AllReduceService`."""

    def _verifier(self, session: _Session, receivers: dict[int, PartReceiver],
                  originals: list[torch.Tensor]) -> RoundVerifier | None:
        """This member's checks of the round, once it settled (None: it checks
        nothing: auxiliary, ``verify`` off, or a rule without a check)."""
        if session.joint is None or session.held is None:
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
                assert receiver.segments is not None
                session.dones[r] = Done(list(receiver.segments),
                                        None if receiver.taus is None else list(receiver.taus),
                                        receiver.signature)
                session.kept_results[r] = receiver.kept or {}

        me, encoded = session.me, session.encoded   # (not the session: no cycle through it)

        def values(r: int, own: torch.Tensor) -> torch.Tensor | list[torch.Tensor]:
            """This member's values of part ``r`` as its reducer decoded them:
            written into ``own`` (the verifier computes in it), or views of
            them: of its own part, and per chunk of its payloads where the
            codec has one (read before the verifier writes ``own``)."""
            lo, hi = layout.part_bounds[r]
            if r == me:
                return flat[lo:hi]
            if r in encoded:
                return own_chunk_values(layout, r, encoded[r], own)
            for chunk in layout.chunks[r]:
                a, b = chunk.start - lo, chunk.end - lo
                piece = own[a:b]
                _restore(piece, originals, layout, chunk.start, chunk.end, offset=chunk.start)
                chunk.codec.decode(bytes(chunk.codec.encode(piece)), chunk.count, out=piece,
                                   trusted=True)
            return own

        verifier = RoundVerifier(layout, session.group.group_id, session.me, session.joint,
                                 results, claims, digests, values, self._scratch)
        for r in session.held:
            signature = self._result_signature(session) if r == session.me \
                else receivers[r].signature
            if signature is not None:
                verifier.signatures[r] = signature
        return verifier

    async def _judge(self, session: _Session) -> None:
        """The verdicts on the parts this member checks; disputes those that
        failed with their reducers; flags what the outcome proves."""
        verifier = session.verifier
        if verifier is None:
            return
        group = session.group
        session.verdicts = verifier.verdicts()
        withheld = verifier.joint.withheld
        if withheld:
            self._counters["nonces_withheld"] += len(withheld)
            logger.info("all-reduce %s: member(s) %s committed to a secret and did not reveal "
                        "it: left out of this member's joint nonce", group.group_id.hex()[:8],
                        sorted(withheld))
        proofs = self._equivocations(session)
        for r, proof in proofs.items():
            why = (f"it signed two different results of its part (members "
                   f"{session.me} and {proof[0]} hold them)")
            session.verdicts[r] = Verdict("failed", reason=why)
            session.disputes[r] = ("equivocation", frozenset(), why)
        failed = [r for r, verdict in sorted(session.verdicts.items())
                  if verdict.status == "failed" and r not in proofs]
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
                flag = {"reducer_lie": REDUCER_LIE_FLAG,
                        "equivocation": EQUIVOCATION_FLAG}.get(outcome, CHECK_FLAG)
                self._flags.flag(peer, group.run_id, flag, now, why or verdict.reason)
                logger.warning("all-reduce %s: part %d (reducer %s) failed its check, dropped "
                               "(%s): %s", group.group_id.hex()[:8], r, peer,
                               {"reducer_lie": "its evidence did not clear it",
                                "equivocation": "proven by its own signatures"}.get(
                                   outcome, "its reducer did not answer the dispute"),
                               why or verdict.reason)
        for _, (_, proof) in sorted(proofs.items()):
            self._counters["equivocations"] += 1
            self._accuse(group.run_id, proof)
        for r, (outcome, lied, _) in sorted(session.disputes.items()):
            # Found here: the same lies proven by others' published proofs flag nothing more.
            if outcome == "reducer_lie":
                self._board.first_lie(REDUCER_LIE_FLAG, group.group_id, r,
                                      group.members[r].peer_id.to_bytes())
            for liar in lied:   # once per round, whatever the parts
                self._board.first_lie(LIE_FLAG, group.group_id, -1,
                                      group.members[liar].peer_id.to_bytes())
        for liar in sorted(proven):   # once per round
            self._counters["report_lies"] += 1
            self._flags.flag(group.members[liar].peer_id, group.run_id, LIE_FLAG, now,
                             "its signed report differs from its own committed chunks")
        for liar in sorted(liars - proven):
            self._flags.flag(group.members[liar].peer_id, group.run_id, REPORT_FLAG, now)
            logger.info("all-reduce %s: member %d (%s) reported a sketch that is a lie on its "
                        "face", group.group_id.hex()[:8], liar, group.members[liar].peer_id)

    def _equivocations(self, session: _Session) -> dict[int, tuple[int, Equivocation]]:
        """The parts whose reducer signed another result for a member than for
        this one (its ``ar.have`` said so): part -> (that member, the proof)."""
        verifier = session.verifier
        assert verifier is not None
        group = session.group
        mine = {r: s for r, s in verifier.signatures.items() if r != session.me}
        return find_equivocations(group.group_id,
                                  [m.peer_id.to_bytes() for m in group.members],
                                  verifier.digests, mine, session.results_heard)

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
                    shown, answer, payloads = await self._receive_proof(stream, session, r,
                                                                        dispute)
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
        if (liars or verdict.status == "failed") and answer.signature is not None \
                and self._shares_accusations(group.run_id):
            self._publish_dispute(session, r, dispute, answer, payloads)

    def _publish_dispute(self, session: _Session, r: int, dispute: Dispute, answer: Proof,
                         shown: list[list[bytes]]) -> None:
        """Keep the proof of a dispute that proved a lie, and claim it in the
        run's accusations (certificate runs): checked here first exactly as a
        judge will check it, so that only a proof that proves what this
        member found travels."""
        verifier = session.verifier
        assert verifier is not None
        group, layout = session.group, session.layout
        result = verifier.results[r]
        kept = session.kept_results.get(r, {})
        result_payloads = []
        for k, chunk in enumerate(layout.chunks[r]):
            lo = chunk.start - chunk.part_start
            result_payloads.append(kept[k] if k in kept else
                                   bytes(chunk.result_codec.encode(
                                       result[lo:lo + chunk.count])))
        own, own_payloads = None, []
        held = {c.contributor: c.delivered for c in answer.committed or ()}
        if session.me in held and r in session.commitments and r in session.encoded:
            digests, signature = session.commitments[r]
            delivered = held[session.me]
            own = Shown(session.me, delivered, digests, signature)
            own_payloads = [bytes(p) for p in session.encoded[r][:delivered]]
        header = ProvenDispute(group.run_id, [m.peer_id.to_bytes() for m in group.members],
                               layout.preimage, r, dispute, session.dones[r], own, answer)
        try:
            plan = check_header(header, group.run_id)
            finding = judge(header, plan, result_payloads, own_payloads, shown)
        except RemoteProtocolError as exc:
            self._counters["proofs_unpublishable"] += 1
            logger.info("all-reduce %s: the proof of part %d's dispute would not convince "
                        "others (%s): the flags stay this member's", group.group_id.hex()[:8],
                        r, exc)
            return
        if not finding.proves:
            self._counters["proofs_unpublishable"] += 1
            return
        self._keep_proof(group.run_id, header, layout, result_payloads, own_payloads, shown)

    async def _receive_proof(self, stream: FramedStream, session: _Session, r: int,
                             dispute: Dispute
                             ) -> tuple[dict[int, torch.Tensor], Proof, list[list[bytes]]]:
        """The reducer's ``ar.proof`` and the chunks it shows, checked against
        their contributors' signed digests: contributor -> its values of part
        ``r`` as the reducer decoded them; the answer; each shown
        contributor's payloads.  RemoteProtocolError for anything false (a
        signed answer that is not the reducer's, or names other commitments
        than it shows, included)."""
        verifier = session.verifier
        assert verifier is not None
        group, layout = session.group, session.layout
        proof = await _receive_message(stream, PROOF_MESSAGES, "ar.proof", "reducer")
        if isinstance(proof, Reject):
            raise _Rejected(f"refused: {proof.code}")
        assert isinstance(proof, Proof)
        if proof.signature is not None:
            entries = [(c.contributor, c.delivered, c.chunks) for c in proof.committed or ()]
            bound = {c: (n, d) for c, n, d in entries}
            if not signed_by(group.members[r].peer_id, answer_payload(
                    r, [m.peer_id.to_bytes() for m in group.members], layout.digest, dispute,
                    [s.contributor for s in proof.shown], entries), proof.signature) \
                    or any(bound.get(s.contributor) != (s.delivered, chunks_digest(s.chunks))
                           for s in proof.shown):
                raise RemoteProtocolError("ar.proof: an answer the reducer did not sign as "
                                          "it is")
        chunks = layout.chunks[r]
        shown_payloads: list[list[bytes]] = []
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
                             commitment_payload(group.group_id, r, j, layout.digest, shown.chunks),
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
            shown_payloads.append(payloads)
        return out, proof, shown_payloads

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
        committed = evidence.committed_entries()
        # (the dispute names this reducer's result digest: checked above)
        signature = self._key.sign(answer_payload(
            me, [m.peer_id.to_bytes() for m in group.members], target.layout.digest, dispute,
            shown, committed))
        # A verifier that stops reading holds this answer up for reducer_timeout at most.
        with trio.move_on_after(self._config.reducer_timeout) as scope:
            await stream.send_message(Proof(
                [Shown(c, len(evidence.committed[c][2]), list(evidence.committed[c][0]),
                       evidence.committed[c][1]) for c in shown],
                [Committed(c, n, d) for c, n, d in committed], signature))
            chunks = target.layout.chunks[me]
            for c in shown:
                for k, payload in enumerate(evidence.committed[c][2]):
                    await stream.send_tensor_chunk(chunks[k].header(), payload)
        if scope.cancelled_caught:
            await stream.reset()
            return
        logger.info("all-reduce %s: member %d disputed this reducer's part; showed the "
                    "committed chunks of member(s) %s", group.group_id.hex()[:8], j, shown)
        with trio.move_on_after(DONE_LINGER):
            await stream.wait_peer_done()
