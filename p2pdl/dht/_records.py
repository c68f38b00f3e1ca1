"""DHT records: items, the merge rule, and a node's bounded local store.  No I/O.

A key holds either one plain value or a dictionary of subkeys, each item
with its own expiration (wall-clock seconds).  The merge rule depends only
on the set of items seen, not on their order, so replicas (and getters)
that saw the same items in any order agree:

* for one subkey, and for the plain value, the later expiration wins; at
  equal expirations the larger value bytes win;
* different subkeys coexist;
* the key shows its dictionary when some subkey expires later than the best
  plain value, and only the subkeys that do; otherwise it shows the plain
  value (a plain value wins a tie).  A plain value hidden by a dictionary
  is kept until it expires, as the threshold later subkeys must beat.

Expired items vanish: they are never returned and are pruned.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Iterator

from ._validation import InvalidRecord, Validator
from .config import DHTConfig

__all__ = ["Item", "Record", "RecordStore", "merge"]


@dataclasses.dataclass(frozen=True)
class Item:
    """One value of a key: the plain value (``subkey is None``) or one subkey's."""

    subkey: str | None
    value: bytes
    expiration: float
    signature: bytes = b""

    @property
    def size(self) -> int:
        return len(self.value) + len(self.signature) + len((self.subkey or "").encode())


def _rank(item: Item) -> tuple[float, bytes]:
    return item.expiration, item.value


class Record:
    """The items of one key, merged by the rule in the module docstring.

    ``plain`` is the best plain item seen (hidden while ``entries`` is not
    empty); every entry expires later than ``plain``.
    """

    __slots__ = ("plain", "entries", "size", "refreshed")

    def __init__(self) -> None:
        self.plain: Item | None = None
        self.entries: dict[str, Item] = {}
        self.size = 0  # bytes of every item held, hidden ones included
        self.refreshed = float("-inf")  # when a store last brought this record (any clock)

    def __bool__(self) -> bool:
        return self.plain is not None or bool(self.entries)

    def items(self) -> list[Item]:
        """What the key shows: its subkeys, or else its plain value."""
        if self.entries:
            return list(self.entries.values())
        return [self.plain] if self.plain is not None else []

    def held(self) -> list[Item]:
        """Every item held, the hidden plain value included."""
        return [*([self.plain] if self.plain is not None else []), *self.entries.values()]

    @property
    def expiration(self) -> float:
        return max((i.expiration for i in self.items()), default=float("-inf"))

    def verdict(self, item: Item) -> str:
        """``"new"``, ``"same"`` or ``"older"``: would ``item`` change this record?"""
        if item.subkey is None:
            current = self.plain
        else:
            if self.plain is not None and item.expiration <= self.plain.expiration:
                return "older"
            current = self.entries.get(item.subkey)
        if current is None or _rank(item) > _rank(current):
            return "new"
        return "same" if item == current else "older"

    def displaced_by(self, item: Item) -> list[Item]:
        """What taking ``item`` in (verdict ``new``) removes."""
        if item.subkey is not None:
            old = self.entries.get(item.subkey)
            return [old] if old is not None else []
        beaten = [i for i in self.entries.values() if i.expiration <= item.expiration]
        return [self.plain, *beaten] if self.plain is not None else beaten

    def apply(self, item: Item) -> list[Item]:
        """Take ``item`` in (its verdict must be ``new``); returns the items it displaced."""
        displaced = self.displaced_by(item)
        if item.subkey is None:
            self.plain = item
            for old in displaced:
                if old.subkey is not None:
                    del self.entries[old.subkey]
        else:
            self.entries[item.subkey] = item
        self.size += item.size - sum(i.size for i in displaced)
        return displaced

    def offer(self, item: Item) -> bool:
        """Merge ``item`` in if it wins; True if the record changed."""
        if self.verdict(item) != "new":
            return False
        self.apply(item)
        return True

    def drop_expired(self, now: float) -> tuple[int, int]:
        """Remove items expired at ``now``; returns (items, bytes) removed."""
        gone = [i for i in self.held() if i.expiration <= now]
        for item in gone:
            if item.subkey is None:
                self.plain = None
            else:
                del self.entries[item.subkey]
        freed = sum(i.size for i in gone)
        self.size -= freed
        return len(gone), freed


class RecordStore:
    """The records a node holds for the DHT, bounded by ``config``.

    :meth:`put` validates an item (``validator``) and merges it; it answers
    ``""`` when the store holds the item afterwards (newly or already), else
    the reason it was refused (``older``, ``full``, or a validation reason).
    Time is passed in; it is the wall clock the expirations refer to.
    """

    def __init__(self, config: DHTConfig, validator: Validator) -> None:
        self._config = config
        self._validator = validator
        self._records: dict[str, Record] = {}
        self._bytes = 0
        self._count = 0  # items held
        self._expiry: list[tuple[float, str]] = []  # heap; stale entries are skipped

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, key: str) -> bool:
        return key in self._records

    @property
    def bytes(self) -> int:
        return self._bytes

    @property
    def item_count(self) -> int:
        return self._count

    def keys(self) -> Iterator[str]:
        return iter(list(self._records))

    def put(self, key: str, item: Item, now: float) -> str:
        try:
            self._validator.check(key, item.subkey, item.value, item.expiration,
                                  item.signature, now)
        except InvalidRecord as exc:
            return f"{exc.reason}: {exc.detail}"
        self.prune(now)
        record = self._records.get(key)
        fresh = record is None
        if record is None:
            record = Record()
        verdict = record.verdict(item)
        if verdict == "older":
            return "older: the key holds a newer item"
        if verdict == "new":
            growth = item.size - sum(i.size for i in record.displaced_by(item))
            if fresh and len(self._records) >= self._config.max_keys:
                return f"full: this node stores {self._config.max_keys} keys already"
            if self._bytes + growth > self._config.max_storage_bytes:
                return "full: this node's storage is full"
            if record.size + growth > self._config.max_record_size:
                return (f"full: the key would exceed {self._config.max_record_size} bytes")
            if item.subkey is not None and item.subkey not in record.entries \
                    and len(record.entries) >= self._config.max_subkeys:
                return f"full: the key holds {self._config.max_subkeys} subkeys already"
            self._count += 1 - len(record.apply(item))
            self._bytes += growth
            if fresh:
                self._records[key] = record
            self._schedule(item.expiration, key)
        record.refreshed = now
        return ""

    def _schedule(self, expiration: float, key: str) -> None:
        heapq.heappush(self._expiry, (expiration, key))
        # Replaced items leave stale entries behind; rebuild before they pile up.
        if len(self._expiry) > 4 * self._count + 64:
            self._expiry = [(i.expiration, k) for k, r in self._records.items()
                            for i in r.held()]
            heapq.heapify(self._expiry)

    def get(self, key: str, now: float) -> list[Item]:
        """The unexpired items of ``key`` (a plain value, or the subkeys)."""
        record = self._records.get(key)
        if record is None:
            return []
        return [i for i in record.items() if i.expiration > now]

    def record(self, key: str) -> Record | None:
        return self._records.get(key)

    def prune(self, now: float) -> int:
        """Drop what expired by ``now``; returns the number of keys removed."""
        removed = 0
        while self._expiry and self._expiry[0][0] <= now:
            _, key = heapq.heappop(self._expiry)
            record = self._records.get(key)
            if record is None:
                continue
            count, freed = record.drop_expired(now)
            self._count -= count
            self._bytes -= freed
            if not record:
                del self._records[key]
                removed += 1
        return removed

    def stale(self, now: float, age: float) -> list[str]:
        """Keys no store has brought for ``age`` seconds (to be re-sent to the nearest nodes)."""
        return [k for k, r in self._records.items() if now - r.refreshed >= age]

    def touch(self, key: str, now: float) -> None:
        record = self._records.get(key)
        if record is not None:
            record.refreshed = now


def merge(items: Iterable[Item], into: Record | None = None) -> Record:
    """A record holding the winners among ``items`` (the getter's side of the rule)."""
    record = into if into is not None else Record()
    for item in items:
        record.offer(item)
    return record

