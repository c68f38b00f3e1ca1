"""The relay directory on trio: a relay's announcements and a private node's
lookups (protocols/dht.md, The relay directory).  What to do and when is
decided by the sans-IO :class:`~p2pdl.dht._relays.RelayDirectory`."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import trio

from ..errors import P2PDLError
from ..service import Reachability, ReachabilityView
from ._relays import RELAYS_GROUP, RelayDirectory
from .config import DHTConfig

__all__ = ["RelayFinder", "RELAY_TICK"]

logger = logging.getLogger(__name__)

#: How often the directory looks at what is due (s), besides reachability changes.
RELAY_TICK = 5.0


class RelayFinder:
    """Announces the node in the relay directory while it serves relays and
    is public; looks relays up for its host while the host wants more.
    ``dht``: the node's :class:`DHTService` (its ``routing_table``, ``now``,
    ``announce`` and ``find_peers``)."""

    def __init__(self, dht: Any, host: Any, reachability: ReachabilityView,
                 config: DHTConfig, counters: Counter[str]) -> None:
        self._dht = dht
        self._host = host
        self._reachability = reachability
        self._config = config
        self._counters = counters
        self._directory = RelayDirectory(config.relay_ttl, config.relay_lookup_interval)

    async def serve(self) -> None:
        """Every RELAY_TICK (and when reachability changes), while the routing
        table has contacts: announce, look up, as the directory decides."""
        directory, host_config = self._directory, self._host.config
        while True:
            if len(self._dht.routing_table):
                serving = host_config.relay_service \
                    and self._reachability.reachability is Reachability.PUBLIC
                if directory.announce_due(trio.current_time(), serving):
                    await self._announce()
                wanted = self._host.wants_relays \
                    and len(self._host.relay_reservations()) < host_config.relay_reservations
                if directory.lookup_due(trio.current_time(), wanted):
                    await self._look_up()
            with trio.move_on_after(RELAY_TICK):
                await self._reachability.wait_changed()

    async def _announce(self) -> None:
        try:
            ok = await self._dht.announce(RELAYS_GROUP, self._dht.now() + self._config.relay_ttl)
        except P2PDLError as exc:
            logger.debug("relay directory: the announcement failed: %s", exc)
            ok = False
        self._directory.announced(trio.current_time(), ok)
        self._counters["relay_announcements"] += 1

    async def _look_up(self) -> None:
        try:
            found = await self._dht.find_peers(RELAYS_GROUP)
        except P2PDLError as exc:
            logger.debug("relay directory: the lookup failed: %s", exc)
            found = []
        self._directory.looked_up(trio.current_time())
        self._counters["relay_lookups"] += 1
        fresh = self._directory.candidates(found, self._host.peer_id)
        if fresh:
            logger.debug("relay directory: %d new relay(s) for the host", len(fresh))
            self._counters["relays_found"] += len(fresh)
            self._host.add_relay_candidates(fresh)
