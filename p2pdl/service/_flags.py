"""The node's record of peers caught lying about themselves in a run.  Sans-IO.

Services that check a member's claims against evidence (a report far ahead of
the quorum's epoch, a weight beyond what its signed reports support, a state
that lost the donors' vote, values far from a robust aggregate) write what
they caught here.  The book is bounded: it keeps at most ``max_peers`` peers
(the least recently flagged dropped) and the last ``max_reasons`` reasons of
each, with a count per reason kind.

Bans: a peer flagged ``ban_after[kind]`` times for one kind in one run is
banned from that run for ``ban_seconds`` (by default, for an hour:
``outlier_values`` three times; ``report_lie``, ``reducer_lie`` or
``equivocation``, the all-reduce's proven lies, once; ``false_accusation``,
a published accusation that does not check out, once;
``reducer_check_failed``, a failed check whose reducer did not answer the
dispute, three times).  The node's
admission gate then refuses it on every run-scoped protocol of that run,
and the node treats it as no member (it joins no group it leads, sends it
no values).  Other kinds never ban on
their own: an honest report may lag, an honest donor may be behind.  Flags
and bans are local knowledge: nothing here is sent to other peers (the
all-reduce publishes its proofs of equivocation itself, in certificate runs).
"""

from __future__ import annotations

import collections
import dataclasses
import logging

from libp2p.peer.id import ID

__all__ = ["Flag", "FlagBook", "MAX_FLAGGED_PEERS", "MAX_REASONS_PER_PEER", "BAN_AFTER",
           "BAN_SECONDS"]

logger = logging.getLogger(__name__)

#: Peers the book remembers (least recently flagged dropped first).
MAX_FLAGGED_PEERS = 4096
#: Reasons remembered per peer (the oldest dropped first; counts stay exact).
MAX_REASONS_PER_PEER = 16
#: Flags of one kind in one run that ban a peer from the run.
BAN_AFTER = {"outlier_values": 3, "report_lie": 1, "reducer_lie": 1,
             "reducer_check_failed": 3, "equivocation": 1, "false_accusation": 1}
#: How long a ban lasts (s).
BAN_SECONDS = 3600.0


@dataclasses.dataclass(frozen=True)
class Flag:
    """One thing a peer was caught at: ``kind`` (a short word such as
    ``epoch_ahead``), the run, when (the node's wall clock) and a detail."""

    run_id: str
    kind: str
    time: float
    detail: str


class FlagBook:
    """Flags per peer; the first flag of each peer and kind is logged at INFO."""

    def __init__(self, max_peers: int = MAX_FLAGGED_PEERS,
                 max_reasons: int = MAX_REASONS_PER_PEER, *,
                 ban_after: dict[str, int] | None = None,
                 ban_seconds: float = BAN_SECONDS) -> None:
        self.max_peers = max_peers
        self.max_reasons = max_reasons
        self.ban_after = dict(BAN_AFTER if ban_after is None else ban_after)
        self.ban_seconds = float(ban_seconds)
        # (peer, run, kind) -> flags of a banning kind; (peer, run) -> (until, why)
        self._strikes: collections.OrderedDict[tuple[bytes, str, str], int] = \
            collections.OrderedDict()
        self._bans: collections.OrderedDict[tuple[bytes, str], tuple[float, str]] = \
            collections.OrderedDict()
        self._flags: collections.OrderedDict[bytes, collections.deque[Flag]] = \
            collections.OrderedDict()
        self._counts: collections.OrderedDict[bytes, collections.Counter[str]] = \
            collections.OrderedDict()
        # peer -> (run, kind) -> when it was first flagged so
        self._first: dict[bytes, dict[tuple[str, str], float]] = {}

    def flag(self, peer: ID | bytes, run_id: str, kind: str, now: float, detail: str = "") -> None:
        """Record that ``peer`` was caught at ``kind`` in ``run_id``."""
        key = peer.to_bytes() if isinstance(peer, ID) else bytes(peer)
        counts = self._counts.setdefault(key, collections.Counter())
        if counts[kind] == 0:
            logger.info("run %s: flagged %s: %s%s", run_id, ID(key), kind,
                        f" ({detail})" if detail else "")
        counts[kind] += 1
        self._counts.move_to_end(key)
        self._first.setdefault(key, {}).setdefault((run_id, kind), now)
        flags = self._flags.setdefault(key, collections.deque(maxlen=self.max_reasons))
        flags.append(Flag(run_id, kind, now, detail[:200]))
        self._flags.move_to_end(key)
        while len(self._flags) > self.max_peers:
            old, _ = self._flags.popitem(last=False)
            self._counts.pop(old, None)
            self._first.pop(old, None)
        threshold = self.ban_after.get(kind)
        if threshold is not None:
            strike = (key, run_id, kind)
            self._strikes[strike] = self._strikes.get(strike, 0) + 1
            self._strikes.move_to_end(strike)
            while len(self._strikes) > self.max_peers:
                self._strikes.popitem(last=False)
            if self._strikes[strike] >= threshold:
                self._strikes.pop(strike)
                self.ban(key, run_id, now, f"{kind} {threshold} times ({detail[:120]})")

    def ban(self, peer: ID | bytes, run_id: str, now: float, reason: str,
            seconds: float | None = None) -> None:
        """Ban ``peer`` from ``run_id`` for ``seconds`` (default ``ban_seconds``)."""
        key = peer.to_bytes() if isinstance(peer, ID) else bytes(peer)
        until = now + (self.ban_seconds if seconds is None else float(seconds))
        logger.warning("run %s: banned %s for %.0f s: %s", run_id, ID(key), until - now, reason)
        self._bans[key, run_id] = (until, reason[:200])
        self._bans.move_to_end((key, run_id))
        while len(self._bans) > self.max_peers:
            self._bans.popitem(last=False)

    def is_banned(self, peer: ID | bytes, run_id: str | None, now: float) -> bool:
        """Whether ``peer`` is banned from ``run_id`` at ``now``."""
        if run_id is None or not self._bans:
            return False
        key = peer.to_bytes() if isinstance(peer, ID) else bytes(peer)
        ban = self._bans.get((key, run_id))
        if ban is None:
            return False
        if ban[0] <= now:
            del self._bans[key, run_id]
            return False
        return True

    def banned_peers(self, run_id: str, now: float, limit: int) -> list[bytes]:
        """The peers banned from ``run_id`` at ``now`` (their ids' bytes), the
        most recently banned first, at most ``limit``."""
        out = []
        for (key, run), (until, _) in reversed(self._bans.items()):
            if len(out) >= limit:
                break
            if run == run_id and until > now:
                out.append(key)
        return out

    def suspects(self, peer: ID | bytes, run_id: str, now: float) -> bool:
        """Whether this node holds evidence against ``peer`` in ``run_id``: it
        is banned from the run, or flagged there for a kind that bans (a
        strike towards a ban)."""
        if self.is_banned(peer, run_id, now):
            return True
        key = peer.to_bytes() if isinstance(peer, ID) else bytes(peer)
        return any((key, run_id, kind) in self._strikes for kind in self.ban_after)

    def banned(self, run_id: str | None = None, now: float | None = None
               ) -> dict[str, dict[str, object]]:
        """The bans in force (of ``run_id``, or all): base58 id -> run, until, reason."""
        out: dict[str, dict[str, object]] = {}
        for (key, run), (until, reason) in self._bans.items():
            if (run_id is None or run == run_id) and (now is None or until > now):
                out[ID(key).to_base58()] = {"run_id": run, "until": until, "reason": reason}
        return out

    def first_flagged(self, run_id: str) -> dict[str, dict[str, float]]:
        """When each peer (base58 id) was first flagged for each kind in ``run_id``
        (the ``now`` given to :meth:`flag`)."""
        out: dict[str, dict[str, float]] = {}
        for key, firsts in self._first.items():
            kinds = {kind: t for (run, kind), t in firsts.items() if run == run_id}
            if kinds:
                out[ID(key).to_base58()] = kinds
        return out

    def flags_of(self, peer: ID | bytes) -> list[Flag]:
        key = peer.to_bytes() if isinstance(peer, ID) else bytes(peer)
        return list(self._flags.get(key, ()))

    def count(self, peer: ID | bytes, kind: str | None = None) -> int:
        """How often ``peer`` was flagged (for ``kind``, or in all)."""
        key = peer.to_bytes() if isinstance(peer, ID) else bytes(peer)
        counts = self._counts.get(key)
        if counts is None:
            return 0
        return counts[kind] if kind is not None else sum(counts.values())

    def flagged(self, run_id: str | None = None) -> dict[str, dict[str, int]]:
        """Flag counts by kind of every flagged peer (base58 id), in ``run_id`` or all runs."""
        out: dict[str, dict[str, int]] = {}
        for key, flags in self._flags.items():
            if run_id is not None and not any(f.run_id == run_id for f in flags):
                continue
            out[ID(key).to_base58()] = dict(self._counts[key])
        return out
