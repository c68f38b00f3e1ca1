"""The input budget of a node: bytes its peers sent that it still holds (sans-IO).

A stream's receiver holds what a peer sent until the application takes it:
frames still arriving and complete frames waiting in the stream's inbox.
Flow control bounds that per stream; :class:`InputBudget` bounds it per peer
(``HostConfig.input_budget_per_peer``) and for the whole node
(``HostConfig.input_budget_per_node``), so that many streams, or many
identities, cannot add up to more.  The wire layer asks the budget before
it keeps bytes (:meth:`InputBudget.try_hold`) and gives them back when the
application took them or the stream ended (:meth:`InputBudget.release`).

:func:`input_budget` finds the budget of the node a py-libp2p stream belongs
to (the host registers one per py-libp2p network).
"""

from __future__ import annotations

import collections
import weakref
from typing import Any

__all__ = ["InputBudget", "input_budget", "register_input_budget"]


class InputBudget:
    """Bytes held per peer and in all, each under its limit."""

    def __init__(self, per_peer: int, per_node: int) -> None:
        self.per_peer = per_peer
        self.per_node = per_node
        self._held: collections.Counter[Any] = collections.Counter()
        self.total = 0
        self.peak = 0
        self.refusals = 0

    def held(self, peer: Any) -> int:
        return self._held.get(peer, 0)

    def try_hold(self, peer: Any, nbytes: int) -> bool:
        """Hold ``nbytes`` more for ``peer``; False (nothing held) if a limit would be passed."""
        if nbytes <= 0:
            return True
        if self._held[peer] + nbytes > self.per_peer or self.total + nbytes > self.per_node:
            self.refusals += 1
            return False
        self._held[peer] += nbytes
        self.total += nbytes
        self.peak = max(self.peak, self.total)
        return True

    def release(self, peer: Any, nbytes: int) -> None:
        if nbytes <= 0:
            return
        left = self._held[peer] - nbytes
        assert left >= 0, "released more than was held"
        self.total -= nbytes
        if left:
            self._held[peer] = left
        else:
            del self._held[peer]


_BUDGETS: weakref.WeakKeyDictionary[Any, InputBudget] = weakref.WeakKeyDictionary()


def register_input_budget(network: Any, budget: InputBudget) -> None:
    """Make ``budget`` the input budget of the streams of py-libp2p ``network``."""
    _BUDGETS[network] = budget


def input_budget(net_stream: Any) -> InputBudget | None:
    """The input budget of the node ``net_stream`` belongs to (None: not a host's stream)."""
    network = getattr(getattr(net_stream, "swarm_conn", None), "swarm", None)
    return _BUDGETS.get(network) if network is not None else None
