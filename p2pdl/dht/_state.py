"""What one DHT node decides, sans-IO: what it answers, what it accepts, what
it republishes, which run a key belongs to (protocols/dht.md).

:class:`DHTState` holds the node's routing table, record store, validator,
the records it published and its counters; :class:`~p2pdl.dht.DHTService`
sends its queries and calls in here with the times (wall clock for
expirations, a monotonic clock for the table and republishing).  The group
records (``p2pdl/group/<name>``: :class:`GroupMember`, :data:`GROUP_SCHEMA`)
and what a get returns (:class:`ValueWithExpiration`, :class:`GroupPeer`)
are defined here too.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import multihash  # py-libp2p's dependency: checks the structure of peer ids
from libp2p.crypto.keys import PrivateKey
from libp2p.peer.id import ID

from ..errors import LocalProtocolError, RemoteProtocolError, RequestError
from ..wire import Message
from ._keys import distance, key_of
from ._messages import (
    MAX_RESULT_LENGTH,
    TARGET_SIZE,
    Addrs,
    FindNode,
    FindValue,
    Nodes,
    PeerEntry,
    Store,
    Stored,
    Value,
    WireItem,
)
from ._records import Item, Record, RecordStore
from ._routing import Contact, RoutingTable
from ._validation import (
    InvalidRecord,
    Schema,
    Validator,
    encode_value,
    owner_of,
    sign,
)
from .config import (
    MAX_CLOSER_PEERS,
    MAX_PEER_ADDRS,
    MAX_STORE_ITEMS,
    STORE_BATCH_BYTES,
    DHTConfig,
)

__all__ = ["DHTState", "ValueWithExpiration", "GroupPeer", "GroupMember", "GROUP_PREFIX",
           "group_peers",
           "GROUP_SCHEMA", "batches", "to_wire", "check_key", "check_remote_key",
           "valid_peer_id", "StoreTally"]

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: Keys of group-membership records: ``p2pdl/group/<name>``.
GROUP_PREFIX = "p2pdl/group/"


class GroupMember(Message, tag="dht.group_member"):
    """A peer's entry in a group: where to dial it, and whether it accepts connections."""

    addrs: Addrs
    client_mode: bool = False


#: Built into every node: group records hold signed subkeys, one per member.
GROUP_SCHEMA = Schema(GROUP_PREFIX, GroupMember, dictionary=True, signed_subkeys=True)


@dataclasses.dataclass(frozen=True)
class ValueWithExpiration(Generic[T]):
    """A value found in the DHT and the wall-clock time it expires at.

    For a dictionary key (``dictionary`` True), ``value`` maps each subkey to
    its own :class:`ValueWithExpiration` and ``expiration`` is the latest of
    them; a plain value that is a dict has ``dictionary`` False.
    """

    value: T
    expiration: float
    dictionary: bool = False


@dataclasses.dataclass(frozen=True)
class GroupPeer:
    """A member of a group found by :meth:`DHTService.find_peers`."""

    peer_id: ID
    addrs: tuple[str, ...]
    client_mode: bool
    expiration: float


def group_peers(found: ValueWithExpiration[Any] | None) -> list[GroupPeer]:
    """The members of a group as a get of its key found them (by peer id)."""
    if found is None or not found.dictionary:
        return []
    peers = []
    for subkey, entry in found.value.items():
        owner = owner_of(subkey)
        member = entry.value
        if owner is None or not isinstance(member, GroupMember):
            continue  # the schema makes this impossible; defensive
        peers.append(GroupPeer(owner, member.addrs, member.client_mode, entry.expiration))
    return sorted(peers, key=lambda p: p.peer_id.to_bytes())


#: A republish job: the key, its items, and the counter it adds to.
Job = tuple[str, list[Item], str]


class DHTState:
    """One node's DHT, without I/O.

    ``counters`` are :class:`~p2pdl.dht.DHTStatistics`' counters;
    ``table_version`` grows whenever a contact enters the table.  Times:
    ``now`` is the DHT's wall clock (expirations), ``mono`` a monotonic
    clock (the table's refresh, republishing).
    """

    def __init__(self, peer_id: ID, config: DHTConfig, schemas: Iterable[Schema] = ()) -> None:
        self.peer_id = peer_id
        self.config = config
        self.key = key_of(peer_id.to_bytes())
        self.table = RoutingTable(self.key, k=config.k, refresh_interval=config.refresh_interval)
        self.validator = Validator(config, (GROUP_SCHEMA, *schemas))
        self.store = RecordStore(config, self.validator)
        # (key, subkey) -> (item, when it was last stored, monotonic)
        self.published: collections.OrderedDict[tuple[str, str | None], tuple[Item, float]] = (
            collections.OrderedDict())
        self.counters: collections.Counter[str] = collections.Counter()
        self.table_version = 0
        # Run-scoped key prefixes: prefix -> the run of the rest of the key.
        self._run_prefixes: dict[str, Callable[[str], str | None]] = {}
        self._run_guarded: Callable[[str], bool] = lambda run_id: False

    # -- runs --------------------------------------------------------------------------

    def scope_run_keys(self, prefix: str, run_of_rest: Callable[[str], str | None]) -> None:
        """Keys ``prefix + rest`` belong to the run ``run_of_rest(rest)`` (None: to no run)."""
        self._run_prefixes[prefix] = run_of_rest

    def set_run_guard(self, guarded: Callable[[str], bool]) -> None:
        """Only runs for which ``guarded(run_id)`` is true scope their keys."""
        self._run_guarded = guarded

    def run_of_key(self, key: str) -> str | None:
        """The guarded run ``key`` belongs to, or None (longest registered prefix wins)."""
        best = None
        for prefix in self._run_prefixes:
            if key.startswith(prefix) and (best is None or len(prefix) > len(best)):
                best = prefix
        if best is None:
            return None
        run_id = self._run_prefixes[best](key[len(best):])
        return run_id if run_id and self._run_guarded(run_id) else None

    def run_of_request(self, request: Message) -> str | None:
        """The guarded run a request's key belongs to (None: no key, or no such run)."""
        key = getattr(request, "key", None)
        return self.run_of_key(key) if isinstance(key, str) else None

    # -- items -------------------------------------------------------------------------

    def make_item(self, key: str, value: Any, expiration: float, subkey: str | None,
                  now: float, private_key: PrivateKey) -> Item:
        """The item this node stores for ``value``, signed with ``private_key``
        under its own subkey; LocalProtocolError for one no node would accept."""
        check_key(key)
        if subkey is not None and not isinstance(subkey, str):
            raise LocalProtocolError(f"DHT subkeys are strings, not {type(subkey).__name__}")
        if not isinstance(expiration, (int, float)) or isinstance(expiration, bool):
            raise LocalProtocolError("expiration_time must be a number (seconds, wall clock)")
        expiration = float(expiration)
        raw = encode_value(value)
        signature = b""
        try:
            owner = owner_of(subkey)
        except InvalidRecord as exc:
            raise LocalProtocolError(f"subkey {subkey!r}: {exc.detail}") from None
        if owner is not None:
            if owner != self.peer_id:
                raise LocalProtocolError(f"subkey {subkey!r} belongs to peer {owner}; "
                                         f"this node can only write its own (own_subkey())")
            signature = sign(private_key, key, subkey, raw, expiration)
        try:
            self.validator.check(key, subkey, raw, expiration, signature, now)
        except InvalidRecord as exc:
            raise LocalProtocolError(f"no node would store this record: {exc}") from None
        return Item(subkey, raw, expiration, signature)

    def remember_published(self, key: str, item: Item, mono: float) -> None:
        """This node published ``item``: republish it until it expires (the
        oldest forgotten beyond ``max_published``)."""
        slot = (key, item.subkey)
        self.published[slot] = (item, mono)
        self.published.move_to_end(slot)
        while len(self.published) > self.config.max_published:
            self.published.popitem(last=False)

    def accept_items(self, key: str, items: list[WireItem], source: ID, record: Record,
                     now: float) -> bool | None:
        """Merge the valid items of an answer into ``record``; True if there were any
        (else None).  Invalid ones are counted and dropped."""
        valid = False
        for wire in items:
            try:
                self.validator.check(key, wire.subkey, wire.value, wire.expiration,
                                     wire.signature, now)
            except InvalidRecord as exc:
                self.counters["invalid_items_received"] += 1
                logger.info("dropped an invalid item of %r from %s: %s", key, source, exc)
                continue
            record.offer(Item(wire.subkey, wire.value, wire.expiration, wire.signature))
            valid = True
        return True if valid else None

    def result(self, key: str, record: Record, now: float) -> ValueWithExpiration[Any] | None:
        """What a get returns of ``record``: None when nothing in it is live."""
        live = [i for i in record.items() if i.expiration > now]
        if not live:
            return None
        if not record.entries:
            item = live[0]
            return ValueWithExpiration(self.validator.decode(key, item.value), item.expiration)
        entries = {i.subkey: ValueWithExpiration(self.validator.decode(key, i.value),
                                                 i.expiration) for i in live}
        return ValueWithExpiration(entries, max(i.expiration for i in live), dictionary=True)

    def replicas(self, target: int, nearest: list[Contact], server: bool
                 ) -> tuple[list[Contact], bool]:
        """The nodes a store for ``target`` goes to, of the ``nearest`` found, and
        whether this node (a server among the ``replication`` nearest) keeps it too."""
        replication = self.config.replication
        if not server:
            return nearest, False
        mine = distance(self.key, target)
        closer = [c for c in nearest if distance(c.key, target) < mine]
        if len(closer) >= replication:
            return nearest, False
        return closer + nearest[len(closer):replication - 1], True

    def republish_jobs(self, now: float, mono: float, server: bool) -> list[Job]:
        """The stores a republish pass sends: this node's own records not
        stored for ``republish_interval`` (expired ones forgotten), and, on a
        server, the replicas no store refreshed for that long."""
        interval = self.config.republish_interval
        jobs: list[Job] = []
        for slot, (item, stored_at) in list(self.published.items()):
            if item.expiration <= now:
                del self.published[slot]
            elif mono - stored_at >= interval:
                self.published[slot] = (item, mono)
                jobs.append((slot[0], [item], "republished"))
        if server:
            for key in self.store.stale(now, interval):
                self.store.touch(key, now)
                items = self.store.get(key, now)
                if items:
                    jobs.append((key, items, "replicas_resent"))
        return jobs

    # -- the table ---------------------------------------------------------------------

    def saw_peer(self, peer: ID, server: bool, addrs: tuple[str, ...], mono: float) -> bool:
        """A peer answered us or asked us: a server goes in the table, a client
        out.  True when it entered the table (``table_version`` grew)."""
        key = key_of(peer.to_bytes())
        if not server:
            if self.table.get(peer, key) is not None:
                self.table.remove(peer, key)
            return False
        present = self.table.get(peer, key) is not None
        if self.table.seen(peer, key, mono, addrs) and not present:
            self.table_version += 1
            return True
        return False

    def contacts(self, entries: list[PeerEntry]) -> list[Contact]:
        """The contacts an answer names (at most MAX_CLOSER_PEERS; malformed
        peer ids and this node left out)."""
        out = []
        for entry in entries[:MAX_CLOSER_PEERS]:
            try:
                peer = ID(entry.peer)
                if peer == self.peer_id or not valid_peer_id(peer):
                    continue
            except Exception:  # untrusted bytes
                continue
            out.append(Contact(peer, key_of(entry.peer), tuple(entry.addrs)))
        return out

    def closer(self, target: int, asker: ID) -> list[PeerEntry]:
        """The table's nearest contacts to ``target`` with addresses, ``asker`` left out."""
        contacts = self.table.closest(target, exclude=(asker,))
        return [PeerEntry(c.peer.to_bytes(), c.addrs[:MAX_PEER_ADDRS])  # type: ignore[attr-defined]
                for c in contacts if c.addrs]

    # -- serving -----------------------------------------------------------------------

    def answer(self, peer: ID, request: Message, server: bool, now: float,
               mono: float) -> Message:
        """The answer to a peer's request (``server``: whether this node serves
        the DHT); RemoteProtocolError or RequestError for a malformed one."""
        self.counters["requests"] += 1
        if isinstance(request, FindNode):
            if len(request.target) != TARGET_SIZE:
                raise RemoteProtocolError(f"dht.find_node target of {len(request.target)} "
                                          f"bytes; expected {TARGET_SIZE}")
            self.saw_peer(peer, request.server, tuple(request.addrs), mono)
            target = int.from_bytes(request.target, "big")
            return Nodes(self.closer(target, peer), server)
        if isinstance(request, FindValue):
            check_remote_key(request.key)
            self.saw_peer(peer, request.server, tuple(request.addrs), mono)
            items = self.store.get(request.key, now)
            return Value([to_wire(i) for i in items],
                         self.closer(key_of(request.key.encode()), peer), server)
        assert isinstance(request, Store)
        check_remote_key(request.key)
        self.saw_peer(peer, request.server, tuple(request.addrs), mono)
        if not server:
            return Stored(["unavailable: this node is a DHT client"] * len(request.items), False)
        results = []
        for wire in request.items:
            result = self.store.put(request.key, Item(wire.subkey, wire.value,
                                                      wire.expiration, wire.signature), now)
            if result:
                self.counters["items_refused"] += 1
                logger.debug("refused an item of %r from %s: %s", request.key, peer, result)
            else:
                self.counters["items_stored"] += 1
            results.append(result[:MAX_RESULT_LENGTH])
        return Stored(results, True)


def batches(items: list[Item]) -> list[list[Item]]:
    """``items`` in order, cut into store requests of at most ``MAX_STORE_ITEMS``
    items and about ``STORE_BATCH_BYTES`` bytes (so each fits a wire message)."""
    out: list[list[Item]] = []
    size = 0
    for item in items:
        if not out or len(out[-1]) >= MAX_STORE_ITEMS or size + item.size > STORE_BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(item)
        size += item.size
    return out


def to_wire(item: Item) -> WireItem:
    return WireItem(item.subkey, item.value, item.expiration, item.signature)


def check_key(key: Any) -> None:
    """LocalProtocolError unless ``key`` is a key this node may use."""
    if not isinstance(key, str):
        raise LocalProtocolError(f"DHT keys are strings, not {type(key).__name__}")
    try:
        Validator.check_key(key)
    except InvalidRecord as exc:
        raise LocalProtocolError(f"DHT key: {exc.detail}") from None


def check_remote_key(key: str) -> None:
    """RequestError (``bad_request``) unless a peer's ``key`` is a valid key."""
    try:
        Validator.check_key(key)
    except InvalidRecord as exc:
        raise RequestError("bad_request", exc.detail) from None


def valid_peer_id(peer: ID) -> bool:
    """Whether ``peer``'s bytes are a well-formed multihash."""
    try:
        multihash.decode(peer.to_bytes())
    except Exception:  # untrusted bytes
        return False
    return True


class StoreTally:
    """One store's replica sends (sans-IO): how many went out (``sent``),
    answered and hold the items (``accepted``).  :meth:`answer` and
    :meth:`looked_up` return whether the store may return now: once
    ``quorum`` replicas hold the items (at most as many as were sent to, once
    the lookup is done), or every send answered after the lookup is done."""

    def __init__(self, quorum: int) -> None:
        self.quorum = quorum
        self.sent = self.answered = self.accepted = 0
        self.done = False   # the lookup is done: every replica was sent to

    def answer(self, held: bool) -> bool:
        self.answered += 1
        self.accepted += held
        return self.enough

    def looked_up(self) -> bool:
        self.done = True
        self.quorum = min(self.quorum, self.sent)
        return self.enough

    @property
    def enough(self) -> bool:
        return self.accepted >= self.quorum or (self.done and self.answered == self.sent)
