"""Accusations that travel, in the all-reduce service (``_service``): the
proofs of equivocation and the claims of disputes' proofs this node found,
published in certificate runs; the other members' proofs, read and checked,
disputes' proofs fetched from their publishers and judged; this node's kept
proofs served to the run's members (the sans-IO parts are ``_accusations``
and ``_proofs``).

:class:`_AccusationSide` is a part of :class:`AllReduceService`, which holds
the state its methods use.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import trio
from libp2p.peer.id import ID

from ...dht import Schema, owner_of
from ...errors import LocalProtocolError, P2PDLError, RemoteProtocolError
from ...wire import FramedStream, TensorChunk, open_framed_stream
from ._accusations import ACCUSATIONS_PREFIX, Accusations, DisputeClaim, Equivocation
from ._messages import (
    ALLREDUCE_PROTOCOL_ID,
    FETCHED_MESSAGES,
    FetchProof,
    ProvenDispute,
    Reject,
)
from ._proofs import Finding, KeptProof, ProofPlan, check_header, judge, proof_digest
from ._session import (
    DONE_LINGER,
    EQUIVOCATION_FLAG,
    FALSE_ACCUSATION_FLAG,
    LIE_FLAG,
    REDUCER_LIE_FLAG,
    _receive_message,
    _Rejected,
)
from ._state import Layout, RejectError

__all__ = ["_AccusationSide", "ACCUSATION_TTL", "ACCUSATIONS_SCHEMA"]

logger = logging.getLogger(__name__)

#: How long a published record lives in the DHT (s): as long as the ban it
#: brings (``FlagBook.ban_seconds``' default); republished while it changes.
ACCUSATION_TTL = 3600.0
#: The DHT schema of accusation records (one owned, signed subkey per member).
ACCUSATIONS_SCHEMA = Schema(ACCUSATIONS_PREFIX, Accusations, dictionary=True,
                            signed_subkeys=True)


class _AccusationSide:
    """Publishing and reading accusations for :class:`AllReduceService`."""

    def _shares_accusations(self, run_id: str) -> bool:
        """Accusations travel in certificate runs this node holds a certificate of."""
        return self._dht is not None and self._members.credential(run_id) is not None

    def _watch(self, run_id: str) -> None:
        """Read ``run_id``'s accusations from now on (the run of a group this
        node averages in, auxiliary or not)."""
        if self._shares_accusations(run_id):
            new = run_id not in self._board.watched()
            self._board.watch(run_id)   # the most recent runs stay watched
            if new:
                self._board_changed.set()

    def _accuse(self, run_id: str, proof: Equivocation) -> None:
        """Publish ``proof`` in ``run_id`` (certificate runs; elsewhere the
        ban stays this node's own)."""
        self._board.first_proof(proof)   # found here: the others' copies flag nothing more
        if self._shares_accusations(run_id) and self._board.accuse(run_id, proof):
            self._board_changed.set()

    def _keep_proof(self, run_id: str, header: ProvenDispute, layout: Layout,
                    result: Sequence[bytes], own: Sequence[bytes],
                    shown: Sequence[Sequence[bytes]]) -> None:
        """Keep a dispute's proof (checked, of ``layout``) to serve, and claim it
        in ``run_id``'s record."""
        digest = self._proofs.add(KeptProof(run_id, header, tuple(result), tuple(own),
                                            tuple(tuple(p) for p in shown), layout))
        self._counters["proofs_kept"] += 1
        if self._board.claim(run_id, DisputeClaim(header.dispute.group_id, header.part,
                                                  digest)):
            self._board_changed.set()

    async def _serve_fetch(self, stream: FramedStream, request: FetchProof) -> None:
        """A member of the run (the gate admitted it) fetches a kept proof:
        its ``ar.proven_dispute``, then its chunks (result, own, shown)."""
        kept = self._proofs.get(request.run_id, request.digest)
        if kept is None:
            raise RejectError("no_evidence", "no proof kept by that digest in that run")
        header, layout = kept.header, kept.layout
        assert layout is not None
        chunks = layout.chunks[header.part]
        self._counters["proofs_served"] += 1
        with trio.move_on_after(self._config.reducer_timeout) as scope:
            await stream.send_message(header)
            for n, payloads in enumerate((kept.result, kept.own, *kept.shown)):
                for k, payload in enumerate(payloads):
                    await stream.send_tensor_chunk(chunks[k].header(result=n == 0), payload)
        if scope.cancelled_caught:
            await stream.reset()
            return
        with trio.move_on_after(DONE_LINGER):
            await stream.wait_peer_done()

    async def _fetch_proof(self, run_id: str, owner: ID, claim: DisputeClaim) -> None:
        """Fetch ``owner``'s proof of ``claim``, judge it and flag what it
        proves, or its publisher when it is false.  P2PDLError (not
        RemoteProtocolError) when it could not be fetched."""
        now = self._clock()
        try:
            net_stream = await self._host.new_stream(owner, ALLREDUCE_PROTOCOL_ID,
                                                     timeout=self._config.reducer_timeout)
            async with open_framed_stream(net_stream, self._wire) as stream:
                try:
                    with trio.fail_after(self._config.reducer_timeout):
                        finding, header, plan = await self._receive_fetched(stream, run_id,
                                                                             claim)
                except RemoteProtocolError:
                    self._counters["protocol_errors"] += 1
                    await stream.reset()
                    raise
        except RemoteProtocolError as exc:
            self._counters["accusations_false"] += 1
            self._flags.flag(owner, run_id, FALSE_ACCUSATION_FLAG, now,
                             f"its published proof of a dispute is false: {exc}")
            return
        except trio.TooSlowError:
            raise _Rejected("the proof did not come within reducer_timeout") from None
        self._counters["proofs_fetched"] += 1
        if not finding.proves:
            self._counters["accusations_false"] += 1
            self._flags.flag(owner, run_id, FALSE_ACCUSATION_FLAG, now,
                             f"its published proof of a dispute proves nothing: "
                             f"{finding.reason}")
            return
        self._counters["accusations_upheld"] += 1
        group_id, part, me = header.dispute.group_id, header.part, self._host.peer_id
        # One flag per lie: a reducer's per part, a contributor's per round.
        lies = [(REDUCER_LIE_FLAG, part, part)] if finding.reducer_lied else []
        lies += [(LIE_FLAG, j, -1) for j in sorted(finding.liars)]
        for kind, j, where in lies:
            accused = plan.members[j]
            if accused != me and self._board.first_lie(kind, group_id, where,
                                                       accused.to_bytes()):
                self._counters["lies_proven"] += 1
                self._flags.flag(accused, run_id, kind, now,
                                 f"proven by the dispute {owner} published (group "
                                 f"{group_id.hex()[:8]}, part {part}): {finding.reason}")

    async def _receive_fetched(self, stream: FramedStream, run_id: str, claim: DisputeClaim
                               ) -> tuple[Finding, ProvenDispute, ProofPlan]:
        """Ask for ``claim``'s proof on ``stream`` and judge what comes."""
        await stream.send_message(FetchProof(run_id, claim.digest))
        header = await _receive_message(stream, FETCHED_MESSAGES, "ar.proven_dispute",
                                        "publisher")
        if isinstance(header, Reject):
            raise _Rejected(f"refused: {header.code}")
        assert isinstance(header, ProvenDispute)
        if proof_digest(header) != claim.digest or header.part != claim.part \
                or header.dispute.group_id != claim.group_id:
            raise RemoteProtocolError("a proof other than the one its claim names")
        plan = check_header(header, run_id)
        chunks = plan.layout.chunks[header.part]
        received: list[list[bytes]] = []
        for n, count in enumerate((plan.result_chunks, plan.own_chunks, *plan.shown_chunks)):
            payloads = []
            for k in range(count):
                frame = await stream.receive(FETCHED_MESSAGES)
                if not isinstance(frame, TensorChunk):
                    raise RemoteProtocolError("a proof with fewer chunks than it announces")
                chunks[k].check(frame.header, result=n == 0)
                payloads.append(bytes(frame.data))
            received.append(payloads)
        finding = judge(header, plan, received[0], received[1], received[2:])
        return finding, header, plan

    async def _accusations_loop(self) -> None:
        """Publish what changed, then read every watched run, every
        ``accusation_interval`` seconds or when a proof was added."""
        while True:
            with trio.move_on_after(self._config.accusation_interval):
                await self._board_changed.wait()
            self._board_changed = trio.Event()
            for run_id in self._board.pending():
                await self._publish_accusations(run_id)
            for run_id in self._board.watched():
                await self.read_accusations(run_id)

    async def _publish_accusations(self, run_id: str) -> None:
        dht = self._dht
        assert dht is not None
        record = self._board.record(run_id)
        try:
            stored = await dht.store(ACCUSATIONS_PREFIX + run_id, record,
                                     dht.now() + ACCUSATION_TTL, subkey=dht.own_subkey())
        except LocalProtocolError as exc:   # no node would store it: logged, not retried
            logger.warning("run %s: accusations not published: %s", run_id, exc)
            self._board.published(run_id)
            return
        self._board.published(run_id)
        self._counters["accusations_published"] += len(record.equivocations)
        if not stored:
            logger.info("run %s: no member holds this node's accusations yet", run_id)

    async def read_accusations(self, run_id: str) -> int:
        """Read and check the members' published accusations of ``run_id``
        now; returns how many proofs were new.  A true proof of equivocation
        flags (and bans) the reducer ``equivocation``; a dispute's proof,
        fetched from its publisher, flags what it proves (``reducer_lie``,
        ``report_lie``); a false one flags its publisher
        ``false_accusation``."""
        dht = self._dht
        if dht is None:
            return 0
        found = await dht.get(ACCUSATIONS_PREFIX + run_id, latest=True)
        if found is None or not found.dictionary:
            return 0
        checked = 0
        now = self._clock()
        me = self._host.peer_id
        for subkey, entry in sorted(found.value.items()):
            owner = owner_of(subkey)
            record = entry.value
            if owner is None or owner == me or not isinstance(record, Accusations):
                continue
            upheld, false = self._board.judge(owner.to_bytes(), record)
            for proof in upheld:
                accused = ID(proof.reducer)
                if accused != me and self._board.first_proof(proof):   # one flag per lie
                    self._flags.flag(accused, run_id, EQUIVOCATION_FLAG, now,
                                     f"proven by the two signed results {owner} published "
                                     f"(group {proof.group_id.hex()[:8]}, part {proof.part})")
            for _, problem in false:
                self._flags.flag(owner, run_id, FALSE_ACCUSATION_FLAG, now,
                                 f"it published an accusation that is false: {problem}")
            self._counters["accusations_upheld"] += len(upheld)
            self._counters["accusations_false"] += len(false)
            checked += len(upheld) + len(false)
            for claim in self._board.unfetched(owner.to_bytes(), record):
                try:
                    await self._fetch_proof(run_id, owner, claim)
                except P2PDLError as exc:
                    self._counters["proofs_unfetched"] += 1
                    self._board.fetched(owner.to_bytes(), claim, judged=False)
                    logger.info("run %s: the proof %s published was not fetched: %s", run_id,
                                owner, exc)
                    continue
                self._board.fetched(owner.to_bytes(), claim, judged=True)
                checked += 1
        return checked
