"""The fetcher side of the state-sync service (``_service``): ask donors for
their manifests, vote on the state, download and verify its chunks.

:class:`_FetcherSide` is a part of :class:`~p2pdl.statesync.StateSyncService`,
which holds the state its methods use (``_partials``, ``_excluded``,
``_fetching``, ``_counters``, ``config``); the sans-IO logic is ``_state``'s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Sequence

import trio
from libp2p.peer.id import ID

from ..errors import (
    CallTimeoutError,
    ConfigError,
    LocalProtocolError,
    NodeClosedError,
    P2PDLError,
    RemoteProtocolError,
    StateSyncError,
)
from ..net import PeerIDLike, parse_peer_id
from ..service import (
    check_run_id,
)
from ._downloads import (
    ChunkPlan,
    Failure,
    PartialDownload,
)
from ._messages import (
    STATESYNC_PROTOCOL,
    ChunkReply,
    GetChunk,
    GetManifest,
    ManifestReply,
    Refused,
)
from ._state import (
    Manifest,
    StateVote,
    choose_manifest,
    vote_on_state,
)
from .config import MAX_EPOCH

__all__ = ["StateDownload", "THREAD_HASH_THRESHOLD", "_FetcherSide"]

logger = logging.getLogger(__name__)

#: Payloads larger than this are joined and hashed in a worker thread: hashing
#: gigabytes on the trio thread would stall every protocol of the node for
#: seconds (hashlib releases the GIL).
THREAD_HASH_THRESHOLD = 8 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class StateDownload:
    """The result of :meth:`StateSyncService.fetch`.

    Attributes:
        epoch: the epoch of the downloaded state.
        payload: the state, verified against ``digest``.
        digest: SHA-256 of ``payload``.
        donors: the donors that delivered chunks of it.
        chunks: chunks of the payload.
        resumed_chunks: chunks kept from an earlier, unfinished fetch.
        seconds: how long the fetch took.
        confirmed: False when the state is the one donor's that there was
            (no other donor offered anything to compare it with): it is
            only as good as that donor.  True when ``min_agreeing_donors``
            donors agreed on it, or when the caller named the ``digest``.
        agreeing: the donors that offered this state when it was chosen.
    """

    epoch: int
    payload: bytes = dataclasses.field(repr=False)
    digest: bytes
    donors: tuple[ID, ...]
    chunks: int
    resumed_chunks: int
    seconds: float
    confirmed: bool = True
    agreeing: int = 1


class _Wakeup:
    """Set when a chunk request of a download ends."""

    def __init__(self) -> None:
        self.event = trio.Event()

    def set(self) -> None:
        self.event.set()


class _FetcherSide:
    """Offers, votes and downloads: a part of :class:`StateSyncService`."""


    async def offers(self, run_id: str, donors: Sequence[PeerIDLike]
                     ) -> dict[ID, tuple[int, bytes]]:
        """What each donor offers now: ``{peer: (epoch, digest)}`` of its newest snapshot.

        Donors that offer nothing, fail or time out (``request_timeout``) are
        left out; this node is skipped.  Lets a peer compare its own state's
        digest with the others' at the same epoch (``p2pdl.Optimizer``'s
        consistency check) before it downloads anything.
        """
        check_run_id(run_id)
        if isinstance(donors, (str, ID)):
            raise ConfigError("donors must be a sequence of peer ids, not one peer id")
        peers = [p for p in dict.fromkeys(parse_peer_id(d) for d in donors)
                 if p != self._host.peer_id][:self.config.max_donors]
        with trio.move_on_after(self.config.request_timeout + 1.0):
            offers, _ = await self._read_manifests(run_id, peers)
            return {peer: (m.epoch, m.digest) for peer, m in offers.items()}
        return {}

    async def fetch(self, run_id: str, donors: Sequence[PeerIDLike], *, min_epoch: int = 0,
                    max_epoch: int | None = None, timeout: float | None = None,
                    digest: bytes | None = None) -> StateDownload:
        """Download the state of ``run_id`` that the donors agree on, at ``min_epoch``
        to ``max_epoch``, from ``donors``.

        Every donor (the first ``max_donors``; this node is skipped) is asked
        for its manifest (``epoch``, ``digest``...).  The donors vote
        (protocols/statesync.md, Choice): at the newest epoch within
        ``min_epoch..max_epoch`` (None: no upper limit) where at least
        ``min_agreeing_donors`` donors offer one digest and they are more
        than half of that epoch's donors, that digest wins.  A lone donor
        wins only when no other donor offers anything (logged;
        ``StateDownload.confirmed`` is False).  The chunks come from the
        donors offering the winner, at once, each verified by SHA-256, a
        failed one asked again elsewhere; the whole payload is verified
        against the winning digest before it is returned.

        The callers' evidence of the run's epoch belongs in ``max_epoch``
        (the training layer passes the progress quorum's epoch + 1): donors
        offering a newer epoch are flagged ``state_lost_vote`` in the node's
        flag book.  Donors whose state lost the vote (once the winner has
        verified) are flagged ``state_lost_vote``, donors whose chunks or
        payload do not match what they offered ``state_digest_mismatch``;
        all of them are not used again at that epoch of the run.

        Resumable: verified chunks of an unfinished download are kept (one
        per run), and a later fetch that picks the same state asks only for
        the rest (``resumed_chunks``).  On cancellation the chunks verified
        so far are kept too.

        Raises :class:`StateSyncError` when no state wins the vote, or the
        chunks cannot all be obtained; :class:`CallTimeoutError` after
        ``timeout`` seconds (default ``fetch_timeout``); :class:`ConfigError`
        for bad arguments; :class:`LocalProtocolError` if a fetch of the run
        is already running.

        ``digest``: download only the state with this SHA-256 digest (as
        :meth:`offers` reported it), whatever the others offer: the caller
        has voted (the training layer's consistency check does).
        """
        check_run_id(run_id)
        if isinstance(min_epoch, bool) or not isinstance(min_epoch, int) or \
                not 0 <= min_epoch <= MAX_EPOCH:
            raise ConfigError(f"min_epoch must be an integer in 0..{MAX_EPOCH}, "
                              f"got {min_epoch!r}")
        if max_epoch is not None and (isinstance(max_epoch, bool) or
                                      not isinstance(max_epoch, int) or
                                      not min_epoch <= max_epoch <= MAX_EPOCH):
            raise ConfigError(f"max_epoch must be None or an integer in min_epoch.."
                              f"{MAX_EPOCH}, got {max_epoch!r}")
        if digest is not None and (not isinstance(digest, bytes) or len(digest) != 32):
            raise ConfigError("digest must be None or 32 bytes (SHA-256)")
        timeout = self.config.fetch_timeout if timeout is None else timeout
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or \
                not timeout > 0 or math.isnan(timeout):
            raise ConfigError(f"timeout must be a number > 0, got {timeout!r}")
        if isinstance(donors, (str, ID)):
            raise ConfigError("donors must be a sequence of peer ids, not one peer id")
        peers = [parse_peer_id(d) for d in donors]
        peers = [p for p in dict.fromkeys(peers) if p != self._host.peer_id]
        peers = peers[:self.config.max_donors]
        if run_id in self._fetching:
            raise LocalProtocolError(f"a fetch of run {run_id!r} is already running")
        self._fetching.add(run_id)
        self._count("fetches")
        try:
            with trio.move_on_after(timeout):
                result = await self._fetch(run_id, peers, min_epoch, max_epoch, digest)
                self._count("fetches_completed")
                self._count("resumed_chunks", result.resumed_chunks)
                return result
            self._count("fetches_failed")
            raise CallTimeoutError(f"the state of run {run_id!r} was not downloaded within "
                                   f"{timeout:.1f} s")
        except StateSyncError:
            self._count("fetches_failed")
            raise
        finally:
            self._fetching.discard(run_id)

    def _flag(self, peer: ID, run_id: str, epoch: int, kind: str, detail: str) -> None:
        """Flag ``peer`` and exclude it at ``epoch`` of the run (once per epoch)."""
        if self._excluded.add(run_id, epoch, peer):
            self._count("donors_flagged")
            self._flags.flag(peer, run_id, kind, self._clock(), detail)

    def _vote(self, run_id: str, manifests: dict[ID, Manifest], min_epoch: int,
              max_epoch: int | None, digest: bytes | None) -> StateVote[ID]:
        """The donors' vote on ``manifests`` (or the caller's ``digest``); flags the
        donors ahead of ``max_epoch``."""
        offers = {p: (m.epoch, m.digest) for p, m in manifests.items()}
        if digest is not None:
            chosen = {p: o for p, o in offers.items() if o[1] == digest and
                      min_epoch <= o[0] <= (MAX_EPOCH if max_epoch is None else max_epoch)}
            if not chosen:
                return StateVote(None, None, reason="no donor offers the digest asked for")
            epoch = max(e for e, _ in chosen.values())
            return StateVote(epoch, digest, tuple(p for p, o in chosen.items() if o[0] == epoch))
        vote = vote_on_state(offers, min_epoch=min_epoch, max_epoch=max_epoch,
                             min_agreeing=self.config.min_agreeing_donors)
        for peer in vote.ahead:
            epoch = offers[peer][0]
            self._flag(peer, run_id, epoch, "state_lost_vote",
                       f"offered epoch {epoch}, past {max_epoch} (the quorum's + 1)")
        return vote

    async def _fetch(self, run_id: str, peers: list[ID], min_epoch: int,
                     max_epoch: int | None, digest: bytes | None) -> StateDownload:
        started = trio.current_time()
        if not peers:
            raise StateSyncError(f"no donor to fetch the state of run {run_id!r} from")
        initial = self._partials.get(run_id)
        initial_manifest = initial.manifest if initial is not None else None
        initial_chunks = len(initial.chunks) if initial is not None else 0
        excluded: set[ID] = set()
        failures: list[str] = []
        for _ in range(self.config.max_manifest_rounds):
            asked = [p for p in peers if p not in excluded]
            manifests, problems = await self._read_manifests(run_id, asked)
            caught = [p for p, m in manifests.items()
                      if self._excluded.excluded(run_id, m.epoch, p)]
            for peer in caught:
                problems[peer] = f"caught lying at epoch {manifests.pop(peer).epoch} before"
            self._count("offers_excluded", len(caught))
            vote = self._vote(run_id, manifests, min_epoch, max_epoch, digest)
            if not vote.won:
                self._count("votes_failed")
                top = MAX_EPOCH if max_epoch is None else max_epoch
                if any(min_epoch <= m.epoch <= top for m in manifests.values()):
                    failures.append(vote.reason)
                else:
                    failures.append(_no_offer(run_id, min_epoch, manifests, problems)
                                    + (f"; {len(vote.ahead)} donor(s) offer an epoch past "
                                       f"{max_epoch}" if vote.ahead else ""))
                break
            assert vote.epoch is not None and vote.digest is not None
            if vote.lone:
                self._count("lone_donor_fetches")
                logger.warning("run %s: only one donor (%s) offers state; taking its epoch %d "
                               "unconfirmed", run_id, vote.holders[0], vote.epoch)
            choice = choose_manifest({p: manifests[p] for p in vote.holders}, vote.epoch)
            assert choice is not None and choice[0].digest == vote.digest
            manifest, donors = choice
            partial = self._partials.open(run_id, manifest)
            plan: ChunkPlan[ID] = ChunkPlan(
                manifest, donors, self.config, partial,
                store=lambda i, data, p=partial: self._partials.add(run_id, p, i, data))
            await self._download(run_id, plan)
            self._count("donors_dropped", len(plan.dropped))
            for peer, index in plan.mismatched.items():
                self._flag(peer, run_id, manifest.epoch, "state_digest_mismatch",
                           f"chunk {index} of epoch {manifest.epoch} fails its SHA-256")
            if plan.done:
                payload = await self._assemble(partial)
                if payload is not None:
                    self._partials.discard(run_id, partial)
                    for peer in vote.losers:
                        self._flag(peer, run_id, vote.epoch, "state_lost_vote",
                                   f"offered another state of epoch {vote.epoch} than "
                                   f"{len(vote.holders)} agreeing donor(s)")
                    resumed = initial_chunks if manifest == initial_manifest else 0
                    return StateDownload(manifest.epoch, payload, manifest.digest,
                                         plan.contributors(), manifest.num_chunks, resumed,
                                         trio.current_time() - started,
                                         confirmed=not vote.lone, agreeing=len(vote.holders))
                # Every chunk matched the manifest but the whole does not match its
                # digest: the manifest itself lies.  Its donors are not asked again.
                self._partials.discard(run_id, partial)
                self._count("bad_manifests", len(donors))
                excluded.update(donors)
                for peer in donors:
                    self._flag(peer, run_id, manifest.epoch, "state_digest_mismatch",
                               f"the chunks of its manifest of epoch {manifest.epoch} do not "
                               f"make the payload of its digest")
                failures.append(f"epoch {manifest.epoch}: the assembled payload does not "
                                f"match the manifest's digest (offered by {len(donors)} "
                                f"donor(s))")
                continue
            excluded.update(plan.bad())
            failures.append(f"epoch {manifest.epoch}: {plan.failed}")
            if not plan.gone() and not plan.mismatched:
                break
            # Donors moved on (the snapshot is no longer kept), or some were caught
            # serving other bytes than they offered: read manifests and vote again.
        raise StateSyncError(f"the state of run {run_id!r} could not be downloaded: "
                             + "; then ".join(failures))

    async def _read_manifests(self, run_id: str, peers: list[ID]
                              ) -> tuple[dict[ID, Manifest], dict[ID, str]]:
        """Every peer's manifest (in ``peers``' order), and why the others gave none."""
        offers: dict[ID, Manifest] = {}
        problems: dict[ID, str] = {}
        limiter = trio.CapacityLimiter(self.config.max_concurrent_requests)

        async def ask(peer: ID) -> None:
            async with limiter:
                self._count("manifest_requests")
                try:
                    reply = await self._call(peer, STATESYNC_PROTOCOL, GetManifest(run_id),
                                             self.config.request_timeout, run_id=run_id)
                except NodeClosedError:
                    raise
                except P2PDLError as exc:
                    problems[peer] = f"{type(exc).__name__}: {exc}"
                    return
            if isinstance(reply, Refused):
                problems[peer] = f"refused {reply.code}"
            elif isinstance(reply, ManifestReply):
                manifest = reply.manifest()
                problem = manifest.problem(self.config.max_state_bytes)
                if problem is None:
                    offers[peer] = manifest
                else:
                    self._count("bad_manifests")
                    problems[peer] = f"bad manifest: {problem}"
            else:  # pragma: no cover - the decoder admits only the protocol's responses
                problems[peer] = f"unexpected {type(reply).__name__}"

        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(ask, peer)
        return {p: offers[p] for p in peers if p in offers}, problems

    async def _download(self, run_id: str, plan: ChunkPlan[ID]) -> None:
        """Drive ``plan`` until it is done or has failed."""
        wakeup = _Wakeup()
        async with trio.open_nursery() as nursery:
            while not plan.over:
                wakeup.event = trio.Event()
                now = trio.current_time()
                for index, donor in plan.next_requests(now):
                    nursery.start_soon(self._get_chunk, run_id, plan, index, donor, wakeup)
                rest = plan.next_wakeup(now)
                if not plan.inflight and rest is None:
                    plan.failed = "no request can be made (internal error)"  # never expected
                    break
                with trio.move_on_at(math.inf if rest is None else rest):
                    await wakeup.event.wait()
            nursery.cancel_scope.cancel()

    async def _get_chunk(self, run_id: str, plan: ChunkPlan[ID], index: int, donor: ID,
                         wakeup: _Wakeup) -> None:
        failure: Failure | None = None
        detail = ""
        try:
            reply = await self._call(donor, STATESYNC_PROTOCOL,
                                     GetChunk(run_id, plan.manifest.digest, index),
                                     self.config.request_timeout, run_id=run_id)
        except NodeClosedError:
            raise
        except RemoteProtocolError as exc:
            failure, detail = Failure.BAD, str(exc)
        except P2PDLError as exc:
            failure, detail = Failure.ERROR, f"{type(exc).__name__}: {exc}"
        else:
            if isinstance(reply, ChunkReply) and reply.index == index:
                if plan.on_chunk(index, donor, reply.data):
                    with self._lock:
                        self._counters["chunks_fetched"] += 1
                        self._counters["bytes_fetched"] += len(reply.data)
                else:
                    self._count("bad_chunks")
                    self._count("chunk_failures")
                    logger.warning("run %s: %s sent chunk %d that fails its SHA-256; dropped "
                                   "from the download", run_id, donor, index)
            elif isinstance(reply, ChunkReply):
                failure, detail = Failure.BAD, f"chunk {reply.index} sent for {index}"
            elif isinstance(reply, Refused):
                failure, detail = _REFUSALS.get(reply.code, Failure.ERROR), f"refused {reply.code}"
                if failure is Failure.BUSY:
                    self._count("busy_answers")
                elif failure is Failure.GONE:
                    self._count("gone_answers")
            else:  # pragma: no cover - the decoder admits only the protocol's responses
                failure, detail = Failure.BAD, f"unexpected {type(reply).__name__}"
        if failure is not None:
            if failure not in (Failure.BUSY, Failure.GONE):
                self._count("chunk_failures")
            if failure is Failure.BAD:
                self._count("bad_chunks")
            logger.debug("run %s: chunk %d from %s failed: %s", run_id, index, donor, detail)
            plan.on_failure(index, donor, failure, trio.current_time(), detail)
        wakeup.set()

    async def _assemble(self, partial: PartialDownload) -> bytes | None:
        """The payload of a complete download if it matches its digest, else None."""
        def assemble() -> bytes | None:
            payload = partial.payload()
            return payload if partial.manifest.verify_payload(payload) else None

        if partial.manifest.size <= THREAD_HASH_THRESHOLD:
            return assemble()
        return await trio.to_thread.run_sync(assemble)


#: What a fetcher does with each refusal code (an unknown code: a failed request).
_REFUSALS = {"busy": Failure.BUSY, "gone": Failure.GONE, "unknown_run": Failure.GONE,
             "bad_index": Failure.BAD}


def _no_offer(run_id: str, min_epoch: int, offers: dict[ID, Manifest],
              problems: dict[ID, str]) -> str:
    """Why no manifest was chosen, for the StateSyncError."""
    text = f"no donor offers state of run {run_id!r} at epoch {min_epoch} or newer"
    if offers:
        epochs = sorted({m.epoch for m in offers.values()}, reverse=True)[:5]
        text += f"; offered epochs: {', '.join(map(str, epochs))}"
    for peer, why in list(problems.items())[:4]:
        text += f"; {str(peer)[-8:]}: {why}"
    if len(problems) > 4:
        text += f"; {len(problems) - 4} more without an offer"
    return text
