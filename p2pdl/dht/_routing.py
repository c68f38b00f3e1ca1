"""The Kademlia routing table (sans-IO: time is passed in).

A bucket per distance prefix, each with at most ``k`` contacts kept in
least-recently-seen order.  A full bucket does not drop a live contact for a
new one (old contacts are the likeliest to stay, the Kademlia observation);
the newcomer waits in a small replacement cache and takes the place of a
contact that fails.  Buckets nobody looked into for ``refresh_interval``
are reported for refreshing.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Hashable, Iterable

from ._keys import KEY_BITS, bucket_index, distance, random_key_in_bucket

__all__ = ["Contact", "RoutingTable"]


@dataclasses.dataclass(eq=False)
class Contact:
    """A peer in the routing table.  ``peer`` is any hashable id (a libp2p ID in nodes)."""

    peer: Hashable
    key: int
    addrs: tuple[str, ...] = ()
    last_seen: float = 0.0
    failures: int = 0


class RoutingTable:
    """Contacts by distance from ``local_key``.

    Args:
        local_key: this node's key.
        k: contacts per bucket (Kademlia's k).  Default 20.
        replacement_cache: candidates remembered per full bucket.  Default 8.
        max_failures: consecutive failed requests after which a contact is
            dropped (replaced from the cache).  Default 2.
        refresh_interval: a bucket untouched by lookups for this long needs a
            refresh lookup.  Default 600 s.
    """

    def __init__(self, local_key: int, *, k: int = 20, replacement_cache: int = 8,
                 max_failures: int = 2, refresh_interval: float = 600.0) -> None:
        self.local_key = local_key
        self.k = k
        self._replacements_max = replacement_cache
        self._max_failures = max_failures
        self._refresh_interval = refresh_interval
        self._buckets: list[collections.OrderedDict[Hashable, Contact]] = [
            collections.OrderedDict() for _ in range(KEY_BITS)]
        self._replacements: list[collections.OrderedDict[Hashable, Contact]] = [
            collections.OrderedDict() for _ in range(KEY_BITS)]
        self._touched = [float("-inf")] * KEY_BITS  # never looked into

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets)

    def __contains__(self, peer: Hashable) -> bool:
        return any(peer in b for b in self._buckets)

    def contacts(self) -> list[Contact]:
        return [c for b in self._buckets for c in b.values()]

    def get(self, peer: Hashable, key: int) -> Contact | None:
        index = bucket_index(self.local_key, key)
        return self._buckets[index].get(peer) if index >= 0 else None

    # -- what happened -------------------------------------------------------------

    def seen(self, peer: Hashable, key: int, now: float, addrs: Iterable[str] = ()) -> bool:
        """``peer`` answered us or sent us a request: add or refresh it.

        Returns True if it is in the table afterwards (False if it waits in
        the replacement cache of a full bucket, or is ourselves).
        """
        index = bucket_index(self.local_key, key)
        if index < 0:
            return False
        bucket = self._buckets[index]
        contact = bucket.get(peer)
        if contact is not None:
            contact.last_seen, contact.failures = now, 0
            if addrs:
                contact.addrs = tuple(addrs)
            bucket.move_to_end(peer)
            return True
        contact = Contact(peer, key, tuple(addrs), now)
        if len(bucket) < self.k:
            bucket[peer] = contact
            self._replacements[index].pop(peer, None)
            return True
        cache = self._replacements[index]
        cache[peer] = contact
        cache.move_to_end(peer)
        while len(cache) > self._replacements_max:
            cache.popitem(last=False)
        return False

    def failed(self, peer: Hashable, key: int) -> None:
        """A request to ``peer`` failed or timed out."""
        index = bucket_index(self.local_key, key)
        if index < 0:
            return
        bucket = self._buckets[index]
        contact = bucket.get(peer)
        if contact is None:
            self._replacements[index].pop(peer, None)
            return
        contact.failures += 1
        if contact.failures >= self._max_failures:
            self.remove(peer, key)

    def remove(self, peer: Hashable, key: int) -> None:
        """Drop ``peer`` (it left); the freshest replacement takes its place."""
        index = bucket_index(self.local_key, key)
        if index < 0:
            return
        bucket = self._buckets[index]
        if bucket.pop(peer, None) is not None and self._replacements[index]:
            _, newcomer = self._replacements[index].popitem(last=True)
            bucket[newcomer.peer] = newcomer

    def looked_up(self, key: int, now: float) -> None:
        """A lookup for ``key`` ran: its bucket does not need a refresh."""
        index = bucket_index(self.local_key, key)
        if index >= 0:
            self._touched[index] = now

    # -- questions -------------------------------------------------------------------

    def closest(self, key: int, count: int | None = None,
                exclude: Iterable[Hashable] = ()) -> list[Contact]:
        """Up to ``count`` (default k) contacts nearest to ``key``, nearest first."""
        skip = set(exclude)
        candidates = [c for b in self._buckets for c in b.values() if c.peer not in skip]
        candidates.sort(key=lambda c: distance(c.key, key))
        return candidates[: self.k if count is None else count]

    def buckets_to_refresh(self, now: float, rng_bytes: bytes | None = None) -> list[int]:
        """Random keys, one per non-empty-range bucket not looked into for a while.

        Only buckets up to the farthest non-empty one are considered (the
        nearer ones may be empty because few peers are that close).
        """
        occupied = [i for i, b in enumerate(self._buckets) if b]
        if not occupied:
            return []
        top = max(occupied)
        low = max(0, min(occupied) - 1)
        return [random_key_in_bucket(self.local_key, i, rng_bytes)
                for i in range(low, top + 1)
                if now - self._touched[i] >= self._refresh_interval]
