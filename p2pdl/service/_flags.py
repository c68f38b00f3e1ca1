"""The node's record of peers caught lying about themselves in a run.  Sans-IO.

Services that check a member's claims against evidence (a report far ahead of
the quorum's epoch, a weight beyond what its signed reports support, a state
that lost the donors' vote) write what they caught here.  The book is bounded:
it keeps at most ``max_peers`` peers (the least recently flagged dropped) and
the last ``max_reasons`` reasons of each, with a count per reason kind.
Flags are local knowledge: nothing here is sent to other peers, and a flag
alone bans nobody.
"""

from __future__ import annotations

import collections
import dataclasses
import logging

from libp2p.peer.id import ID

__all__ = ["Flag", "FlagBook", "MAX_FLAGGED_PEERS", "MAX_REASONS_PER_PEER"]

logger = logging.getLogger(__name__)

#: Peers the book remembers (least recently flagged dropped first).
MAX_FLAGGED_PEERS = 4096
#: Reasons remembered per peer (the oldest dropped first; counts stay exact).
MAX_REASONS_PER_PEER = 16


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
                 max_reasons: int = MAX_REASONS_PER_PEER) -> None:
        self.max_peers = max_peers
        self.max_reasons = max_reasons
        self._flags: collections.OrderedDict[bytes, collections.deque[Flag]] = \
            collections.OrderedDict()
        self._counts: collections.OrderedDict[bytes, collections.Counter[str]] = \
            collections.OrderedDict()

    def flag(self, peer: ID | bytes, run_id: str, kind: str, now: float, detail: str = "") -> None:
        """Record that ``peer`` was caught at ``kind`` in ``run_id``."""
        key = peer.to_bytes() if isinstance(peer, ID) else bytes(peer)
        counts = self._counts.setdefault(key, collections.Counter())
        if counts[kind] == 0:
            logger.info("run %s: flagged %s: %s%s", run_id, ID(key), kind,
                        f" ({detail})" if detail else "")
        counts[kind] += 1
        self._counts.move_to_end(key)
        flags = self._flags.setdefault(key, collections.deque(maxlen=self.max_reasons))
        flags.append(Flag(run_id, kind, now, detail[:200]))
        self._flags.move_to_end(key)
        while len(self._flags) > self.max_peers:
            old, _ = self._flags.popitem(last=False)
            self._counts.pop(old, None)

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
