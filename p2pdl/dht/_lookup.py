"""Iterative Kademlia lookups (sans-IO: the caller sends the queries).

A :class:`Lookup` keeps the candidates nearest to a target, says whom to
query next (nearest unqueried first), takes each answer's closer contacts
in, and finishes when the ``k`` nearest candidates that did not fail have
all answered.  While answers bring nearer peers, at most ``alpha`` queries
are in flight; once an answer brings none nearer than the nearest already
known, the lookup has converged and asks every one of the ``k`` nearest not
yet asked at once (the rule of the Kademlia paper), which saves round trips
at the end of every lookup that must reach the k nearest (stores, latest
gets, joins).  A get that stops at the first value stays ``alpha`` wide.
The same object drives real nodes and the scale simulator.
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
        self._converged = False  # the last answer brought no nearer peer
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
        # A plain get stays alpha wide: any replica will do, and the nearest
        # few usually hold the value, so a wide fan-out would mostly waste queries.
        width = self.k if self._converged and not self.stop_at_value else self.alpha
        budget = min(width - self.in_flight, self.max_queries - self._queries)
        for candidate in self._nearest():
            if budget <= 0:
                break
            if candidate.state is _State.NEW:
                candidate.state = _State.IN_FLIGHT
                self._queries += 1
                budget -= 1
                out.append(candidate.contact)
        return out

    def on_response(self, peer: Hashable, closer: Iterable[Contact], value: Any = None, *,
                    usable: bool = True) -> None:
        """``peer`` answered with ``closer`` contacts (and a value, if found).

        ``usable=False``: the peer answered but is no candidate itself (a
        DHT client): its contacts are taken, it is not among the nearest.
        """
        candidate = self._candidates.get(peer)
        if candidate is None or candidate.state is not _State.IN_FLIGHT:
            return  # late or unsolicited: ignore
        before = self._nearest_distance()
        candidate.state = _State.ANSWERED if usable else _State.FAILED
        for contact in closer:
            self._add(contact, hops=candidate.hops + 1)
        self._converged = self._nearest_distance() >= before
        if value is not None:
            self.values.append((candidate.contact, value))
            if self._value_hops is None:
                self._value_hops = candidate.hops

    def _nearest_distance(self) -> float:
        alive = [distance(c.contact.key, self.target) for c in self._candidates.values()
                 if c.state is not _State.FAILED]
        return min(alive, default=float("inf"))

    def on_failure(self, peer: Hashable) -> None:
        candidate = self._candidates.get(peer)
        if candidate is not None and candidate.state is _State.IN_FLIGHT:
            candidate.state = _State.FAILED
            self._failures += 1

    @property
    def asked(self) -> list[Hashable]:
        """The peers this lookup has sent a query to."""
        return [peer for peer, c in self._candidates.items() if c.state is not _State.NEW]

    def closest(self) -> list[Contact]:
        """The nearest peers that answered, nearest first (at most k)."""
        return [c.contact for c in self._nearest() if c.state is _State.ANSWERED]

    def confirmed(self) -> list[Contact]:
        """The nearest candidates that answered, up to the first that has not
        (nearest first): peers a store may go to before the lookup is done,
        since only an answer still to come could bring one nearer."""
        out = []
        for candidate in self._nearest():
            if candidate.state is not _State.ANSWERED:
                break
            out.append(candidate.contact)
        return out

    def stats(self) -> LookupStats:
        answered = [c for c in self._nearest() if c.state is _State.ANSWERED]
        hops = self._value_hops if self._value_hops is not None else (
            answered[0].hops if answered else 0)
        return LookupStats(self._queries, self._failures, hops)
