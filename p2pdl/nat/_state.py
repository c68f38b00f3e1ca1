"""Reachability from dial-back results (sans-IO: time is passed in)."""

from __future__ import annotations

import dataclasses

from ..service import Reachability
from .config import NatConfig

__all__ = ["Reachability", "ReachabilityTracker"]


@dataclasses.dataclass
class _Result:
    ok: bool
    at: float


class ReachabilityTracker:
    """Turns dial-back results into :class:`Reachability`.

    * **public**: some announced address was dialled back successfully by a
      peer, recently (``result_ttl``).  Only a real dial to an address can
      make it public, so a dead announced address never does.
    * **private**: no success, and every address failed for at least
      ``min_failures`` distinct probers (or all the probers there are, when
      fewer are connected).
    * **unknown**: otherwise (no probes yet, or not enough).

    A new set of addresses starts over.
    """

    def __init__(self, config: NatConfig) -> None:
        self._config = config
        self._addrs: tuple[str, ...] = ()
        # address -> prober -> latest result
        self._results: dict[str, dict[str, _Result]] = {}
        self._last_probe: dict[str, float] = {}
        self._asked: set[str] = set()  # probers asked about the current addresses

    @property
    def addresses(self) -> tuple[str, ...]:
        return self._addrs

    def set_addresses(self, addrs: list[str]) -> bool:
        """Announce the direct addresses to check.  True if they changed."""
        new = tuple(sorted(set(addrs)))
        if new == self._addrs:
            return False
        self._addrs = new
        self._results = {a: self._results.get(a, {}) for a in new}
        self._asked.clear()
        return True

    def record(self, prober: str, addr: str, ok: bool, now: float) -> None:
        if addr in self._results:
            self._results[addr][prober] = _Result(ok, now)
        self._last_probe[prober] = now
        self._asked.add(prober)

    def has_unasked(self, candidates: list[str]) -> bool:
        """Whether some candidate has not been asked about the current addresses."""
        return any(c not in self._asked for c in candidates)

    def status(self, now: float, probers_available: int) -> Reachability:
        fresh = {a: {p: r for p, r in res.items() if now - r.at <= self._config.result_ttl}
                 for a, res in self._results.items()}
        if any(r.ok for res in fresh.values() for r in res.values()):
            return Reachability.PUBLIC
        if not self._addrs:  # no direct address: nobody can dial us
            return Reachability.PRIVATE
        needed = max(1, min(self._config.min_failures, probers_available))
        if all(sum(1 for r in res.values() if not r.ok) >= needed for res in fresh.values()):
            return Reachability.PRIVATE
        return Reachability.UNKNOWN

    def choose_prober(self, candidates: list[str], now: float) -> str | None:
        """The connected peer asked least recently (None if there is none)."""
        if not candidates:
            return None
        return min(candidates, key=lambda p: (self._last_probe.get(p, float("-inf")), p))

    def interval(self, status: Reachability) -> float:
        if status is Reachability.PUBLIC:
            return self._config.public_interval
        if status is Reachability.PRIVATE:
            return self._config.private_interval
        return self._config.unknown_interval
