"""Iterative Kademlia lookups (sans-IO: the caller sends the queries).

A :class:`Lookup` keeps the candidates nearest to a target, says whom to
query next (at most ``alpha`` at once, nearest unqueried first), takes each
answer's closer contacts in, and finishes when the ``k`` nearest candidates
that did not fail have all answered.  The same object drives real nodes and
the scale simulator.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Hashable, Iterable
from typing import Any

from ._keys import distance
from ._routing import Contact

__all__ = ["Lookup", "LookupStats"]


class _State(enum.Enum):
    NEW = 0
    IN_FLIGHT = 1
    ANSWERED = 2
    FAILED = 3


@dataclasses.dataclass
class _Candidate:
    contact: Contact
    state: _State = _State.NEW
    hops: int = 1  # the query to a seed is the first hop


@dataclasses.dataclass(frozen=True)
class LookupStats:
    queries: int
    failures: int
    hops: int  # depth of the nearest answering peer (or of the first value found)


class Lookup:
    """One iterative lookup for ``target``.

    Args:
        target: the key looked up.
        seeds: contacts to start from (usually the local table's nearest).
        k: how many nearest peers the lookup must confirm.  Default 20.
        alpha: queries in flight at once.  Default 3.
        stop_at_value: finish as soon as one peer returned a value (a plain
            get); otherwise keep going to the k nearest (merging gets, stores).
        max_queries: hard bound on queries.  Default ``8 * k``.
    """

    def __init__(self, target: int, seeds: Iterable[Contact], *, k: int = 20, alpha: int = 3,
                 stop_at_value: bool = False, max_queries: int | None = None,
                 local: Hashable | None = None) -> None:
        self.target = target
        self.k = k
        self.alpha = alpha
        self.stop_at_value = stop_at_value
        self.max_queries = max_queries if max_queries is not None else 8 * k
        self._local = local
        self._candidates: dict[Hashable, _Candidate] = {}
        self._queries = 0
        self._failures = 0
        self.values: list[tuple[Contact, Any]] = []
        self._value_hops: int | None = None
        for contact in seeds:
            self._add(contact, hops=1)

    def _add(self, contact: Contact, hops: int) -> None:
        if contact.peer == self._local or contact.peer in self._candidates:
            return
        self._candidates[contact.peer] = _Candidate(contact, hops=hops)

    def _nearest(self) -> list[_Candidate]:
        """The ``k`` nearest candidates that have not failed, nearest first."""
        alive = [c for c in self._candidates.values() if c.state is not _State.FAILED]
        alive.sort(key=lambda c: distance(c.contact.key, self.target))
        return alive[: self.k]

    @property
    def in_flight(self) -> int:
        return sum(1 for c in self._candidates.values() if c.state is _State.IN_FLIGHT)

    @property
    def done(self) -> bool:
        if self.stop_at_value and self.values:
            return True
        if self.in_flight:
            return False
        if self._queries >= self.max_queries:
            return True
        return all(c.state is _State.ANSWERED for c in self._nearest())

    def next_queries(self) -> list[Contact]:
        """Contacts to query now (marked in flight); empty when nothing is to be sent."""
        if self.stop_at_value and self.values:
            return []
        out = []
        budget = min(self.alpha - self.in_flight, self.max_queries - self._queries)
        for candidate in self._nearest():
            if budget <= 0:
                break
            if candidate.state is _State.NEW:
                candidate.state = _State.IN_FLIGHT
                self._queries += 1
                budget -= 1
                out.append(candidate.contact)
        return out

    def on_response(self, peer: Hashable, closer: Iterable[Contact], value: Any = None) -> None:
        candidate = self._candidates.get(peer)
        if candidate is None or candidate.state is not _State.IN_FLIGHT:
            return  # late or unsolicited: ignore
        candidate.state = _State.ANSWERED
        for contact in closer:
            self._add(contact, hops=candidate.hops + 1)
        if value is not None:
            self.values.append((candidate.contact, value))
            if self._value_hops is None:
                self._value_hops = candidate.hops

    def on_failure(self, peer: Hashable) -> None:
        candidate = self._candidates.get(peer)
        if candidate is not None and candidate.state is _State.IN_FLIGHT:
            candidate.state = _State.FAILED
            self._failures += 1

    def closest(self) -> list[Contact]:
        """The nearest peers that answered, nearest first (at most k)."""
        return [c.contact for c in self._nearest() if c.state is _State.ANSWERED]

    def stats(self) -> LookupStats:
        answered = [c for c in self._nearest() if c.state is _State.ANSWERED]
        hops = self._value_hops if self._value_hops is not None else (
            answered[0].hops if answered else 0)
        return LookupStats(self._queries, self._failures, hops)
