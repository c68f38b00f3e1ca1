"""The DHT service of a node: answers DHT requests, runs lookups, stores and gets.

The logic is in the sans-IO parts (``_state``, ``_routing``, ``_lookup``,
``_records``, ``_validation``); this module sends their queries over the
node's RPC client and keeps the table fresh:

* **bootstrap**: a lookup of the node's own key, seeded with the routing
  table and every connected peer (initial peers among them), then a refresh
  of every bucket; repeated with backoff while the table is empty, and again
  whenever the node becomes a server (so that others learn about it);
* **refresh**: a lookup of a random key in each bucket no lookup went
  through for ``refresh_interval``;
* **republish**: records the node published are stored again every
  ``republish_interval`` until they expire; records it holds for others and
  that no store refreshed for that long are re-sent to the nearest nodes;
* **expiry**: expired items are pruned and never returned.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Iterable
from typing import Any

import trio
from libp2p.peer.id import ID

from ..errors import P2PDLError
from ..net import Backoff
from ..service import ReachabilityView, RpcEndpoint, ServiceContext, Statistics
from ..wire import Message, RequestContext
from ._keys import distance, key_of
from ._lookup import Lookup
from ._messages import DHT_PROTOCOL, TARGET_SIZE, FindNode, FindValue, Nodes, Store, Stored, Value
from ._records import Item, Record, RecordStore
from ._relaying import RelayFinder
from ._routing import Contact, RoutingTable
from ._state import (
    GROUP_PREFIX,
    GROUP_SCHEMA,
    DHTState,
    GroupMember,
    GroupPeer,
    StoreTally,
    ValueWithExpiration,
    batches,
    check_key,
    group_peers,
    to_wire,
)
from ._validation import Schema, owned_subkey
from .config import MAX_PEER_ADDRS, DHTConfig

__all__ = ["DHTService", "DHTStatistics", "ValueWithExpiration", "GroupPeer", "GROUP_PREFIX",
           "GroupMember", "GROUP_SCHEMA"]

logger = logging.getLogger(__name__)

#: How often the maintenance task looks at refresh, republish and expiry (s).
MAINTENANCE_TICK = 5.0
#: Stores a republish pass runs at once.
REPUBLISH_CONCURRENCY = 4
#: Least time between two bootstraps (s).
MIN_BOOTSTRAP_SPACING = 0.5
#: Replica sends that may run in the background at once (beyond the
#: ``store_quorum`` a store waits for; a store counts its lookup as one);
#: past it, a store waits for all its own.
MAX_BACKGROUND_SENDS = 256


@dataclasses.dataclass(frozen=True)
class DHTStatistics(Statistics):
    """What ``DHTService.statistics()`` says: mode, sizes and counters (every
    counter present, from 0).  ``gets_not_found`` counts gets that asked the
    network (local hits are not counted); ``requests``, those answered for
    others; ``invalid_items_received``, items this getter dropped."""

    mode: str
    routing_table: int
    records: int
    record_bytes: int
    published: int
    stores: int = 0
    stores_failed: int = 0
    gets: int = 0
    gets_not_found: int = 0
    queries: int = 0
    queries_failed: int = 0
    requests: int = 0
    items_stored: int = 0
    items_refused: int = 0
    invalid_items_received: int = 0
    republished: int = 0
    replicas_resent: int = 0
    relay_announcements: int = 0
    relay_lookups: int = 0
    relays_found: int = 0


#: The counters of :class:`DHTStatistics`.
COUNTERS = DHTStatistics.counter_names()


class DHTService:
    """One node's part of the DHT.  The node creates it; reach it as ``node.dht``.

    Args:
        context: the node's host (addresses, connections), RPC call function
            and wire limits.
        config: :class:`DHTConfig`.
        reachability: tells whether the node is public (``mode="auto"``).
        schemas: rules for key prefixes, besides the built-in group schema.
        clock: wall-clock time in seconds; expirations refer to it.  Default:
            the context's.
    """

    def __init__(self, context: ServiceContext, config: DHTConfig | None = None, *,
                 reachability: ReachabilityView, schemas: Iterable[Schema] = (),
                 clock: Callable[[], float] | None = None) -> None:
        host = context.host
        self._host = host
        self._call = context.call
        self._members = context.members
        self._introduce = context.introduce
        self._config = config = config or DHTConfig()
        self._reachability = reachability
        self._clock = context.clock if clock is None else clock
        self._peer_id = host.peer_id
        self._state = state = DHTState(self._peer_id, config, schemas)
        self._key = state.key
        self._table = state.table
        self._store = state.store
        self._counters = state.counters
        self._table_changed = trio.Event()
        #: where a store's replica sends go on once it returned (while serve runs)
        self._background: trio.Nursery | None = None
        self._background_sends = 0
        self._relays = RelayFinder(self, host, reachability, config, state.counters)

    # -- what the node and the layers above read --------------------------------

    @property
    def server_mode(self) -> bool:
        """Whether this node serves the DHT to others (and sits in their tables)."""
        if self._config.mode != "auto":
            return self._config.mode == "server"
        return (not self._reachability.client_mode
                and self._reachability.reachability.value == "public")

    @property
    def routing_table(self) -> RoutingTable:
        return self._table

    @property
    def local_store(self) -> RecordStore:
        return self._store

    def now(self) -> float:
        """The DHT's clock (wall-clock seconds): expirations are times of this clock."""
        return self._clock()

    def register_schema(self, schema: Schema) -> None:
        """Validate every key under ``schema.prefix`` by its rules, from now on.

        Every node of a collaboration should register the same schemas: each
        replica validates what it stores, each getter what it receives.
        """
        self._state.validator.register(schema)

    def own_subkey(self, name: str = "") -> str:
        """A subkey only this node can write (signed by its key): ``@<peer id>[/name]``."""
        return owned_subkey(self._peer_id, name)

    def statistics(self) -> DHTStatistics:
        """Mode, sizes and counters: :class:`DHTStatistics`."""
        return DHTStatistics("server" if self.server_mode else "client", len(self._table),
                             len(self._store), self._store.bytes, len(self._state.published),
                             **{name: self._counters[name] for name in COUNTERS})

    def endpoints(self) -> list[RpcEndpoint]:
        """``/p2pdl/dht/1.0.0``: served to everyone, except requests for a key of a
        run this node guards (:meth:`run_of_key`), which the gate sees as of that run."""
        return [RpcEndpoint(DHT_PROTOCOL, self.handle, run_id_of=self._run_of_request)]

    def scope_run_keys(self, prefix: str, run_of_rest: Callable[[str], str | None]) -> None:
        """Keys ``prefix + rest`` belong to the run ``run_of_rest(rest)`` (None: to no run).

        The layers that keep run data in the DHT register their prefixes
        (progress snapshots, matchmaking rendezvous), so that requests for
        those keys pass the admission gate as requests of the run.
        """
        self._state.scope_run_keys(prefix, run_of_rest)

    def set_run_guard(self, guarded: Callable[[str], bool]) -> None:
        """Only runs for which ``guarded(run_id)`` is true scope their keys (the
        runs this node has a membership policy for); other runs' keys are served
        to everyone, as any DHT key."""
        self._state.set_run_guard(guarded)

    def run_of_key(self, key: str) -> str | None:
        """The guarded run ``key`` belongs to, or None (longest registered prefix wins)."""
        return self._state.run_of_key(key)

    def _run_of_request(self, request: Message) -> str | None:
        return self._state.run_of_request(request)

    async def wait_table_changed(self, timeout: float) -> None:
        """Return when a contact enters the routing table, or after ``timeout`` s."""
        with trio.move_on_after(timeout):
            await self._table_changed.wait()

    # -- the public operations ----------------------------------------------------

    async def store(self, key: str, value: Any, expiration_time: float,
                    subkey: str | None = None) -> bool:
        """Store ``value`` under ``key`` (and ``subkey``) until ``expiration_time``.

        ``value`` is anything msgpack can encode, or a :class:`Message` (for
        keys with a schema).  A subkey from :meth:`own_subkey` is signed with
        this node's key.  The record goes to the ``replication`` nodes nearest
        to the key.  Returns True only when at least one of them (another
        node) holds it afterwards.  The node republishes it until it expires.

        Raises :class:`LocalProtocolError` for a record no node would accept
        (too large, expired, too far ahead, against a schema, someone else's
        owned subkey).
        """
        item = self._make_item(key, value, expiration_time, subkey)
        self._state.remember_published(key, item, trio.current_time())
        return await self._store_items(key, [item])

    async def get(self, key: str, latest: bool = False) -> ValueWithExpiration[Any] | None:
        """The value of ``key``, or None if no node holds it.

        With ``latest=False`` the first value found is returned (this node's
        own copy, if it holds one).  With ``latest=True`` the lookup asks the
        k nodes nearest to the key and merges their answers: for each subkey
        the latest expiration wins.  A dictionary key's value is a dict
        ``{subkey: ValueWithExpiration}``.  Items that fail validation (a
        forged signature, a schema mismatch) are dropped.
        """
        check_key(key)
        record = Record()
        now = self._clock()
        for item in self._store.get(key, now):
            record.offer(item)
        if not (record and not latest):
            target = key_of(key.encode())
            run_id = self.run_of_key(key)
            with trio.move_on_after(self._config.operation_timeout):
                lookup = await self._lookup(target, find_value=key, stop_at_value=not latest,
                                            into=record, run_id=run_id)
                found = bool(lookup.values)
                if run_id is not None and (latest or not found):
                    found = await self._ask_members(key, target, run_id, lookup, record) \
                        or found
                self._counters["gets"] += 1
                if not found and not record:
                    self._counters["gets_not_found"] += 1
        return self._state.result(key, record, self._clock())

    async def announce(self, group: str, expiration_time: float) -> bool:
        """Say in the DHT that this node belongs to ``group`` until ``expiration_time``.

        The entry (this node's addresses and client mode) sits under its own
        signed subkey of ``p2pdl/group/<group>``, so nobody else can write or
        remove it.  Returns what :meth:`store` returns.
        """
        member = GroupMember(tuple(self._host.addrs()[:MAX_PEER_ADDRS]),
                             client_mode=self._reachability.client_mode)
        return await self.store(GROUP_PREFIX + group, member, expiration_time,
                                subkey=self.own_subkey())

    async def find_peers(self, group: str) -> list[GroupPeer]:
        """The members of ``group`` whose entries have not expired.

        Their addresses are handed to the host, so that ``node.call`` and
        ``node.open_stream`` reach them by peer id.
        """
        peers = group_peers(await self.get(GROUP_PREFIX + group, latest=True))
        for peer in peers:
            if peer.peer_id != self._peer_id:
                self._host.add_addrs(peer.peer_id, peer.addrs)
        return peers

    # -- building and storing items -----------------------------------------------

    def _make_item(self, key: str, value: Any, expiration: float, subkey: str | None) -> Item:
        return self._state.make_item(key, value, expiration, subkey, self._clock(),
                                     self._host.libp2p.get_private_key())

    async def _store_items(self, key: str, items: list[Item]) -> bool:
        """Store ``items`` at the nodes nearest to ``key``; True if one of them holds them."""
        target = key_of(key.encode())
        run_id = self.run_of_key(key)
        deadline = trio.current_time() + self._config.operation_timeout
        sender = self._sender()
        requests = [Store(key, [to_wire(i) for i in batch], *sender) for batch in batches(items)]
        tally = StoreTally(self._config.store_quorum)
        enough = trio.Event()
        background = self._background
        # Up to replication sends and the lookup's task, past the store's return.
        reserve = self._config.replication + 1
        with trio.move_on_at(deadline):
            if background is not None \
                    and self._background_sends + reserve <= MAX_BACKGROUND_SENDS:
                self._background_sends += reserve
                background.start_soon(functools.partial(
                    self._replicate, key, target, items, requests, tally, enough, deadline,
                    reserve, run_id=run_id))
                await enough.wait()
            else:
                await self._replicate(key, target, items, requests, tally, enough, deadline, 0,
                                      run_id=run_id)
        self._counters["stores"] += 1
        if not tally.accepted:
            self._counters["stores_failed"] += 1
        return tally.accepted > 0

    async def _replicate(self, key: str, target: int, items: list[Item],
                         requests: list[Store], tally: StoreTally, enough: trio.Event,
                         deadline: float, reserved: int, *, run_id: str | None = None) -> None:
        """The lookup of a store and its sends to the replicas, counted in
        ``tally``; ``enough`` is set once the tally says so (or it all ended).
        With no ``run_id``, sends start as the lookup confirms the nearest
        nodes (:meth:`Lookup.confirmed`), so that the store's quorum waits
        for no more than the nearest few answers; the rest follow once the
        lookup is done.  ``reserved``: background slots to give back."""
        sent: set[Any] = set()
        try:
            with trio.move_on_at(deadline):
                async with trio.open_nursery() as sends:

                    def send(contacts: list[Contact]) -> None:
                        for contact in contacts:
                            if contact.peer not in sent:
                                sent.add(contact.peer)
                                tally.sent += 1
                                sends.start_soon(self._store_at, contact, key, requests,
                                                 tally, enough)

                    # Before the lookup is done, no more than the replicas that
                    # this node (a server that may be one) would send to.
                    early = self._config.replication - (1 if self.server_mode else 0)

                    def confirmed(lookup: Lookup) -> None:
                        send(lookup.confirmed()[:early])

                    lookup = await self._lookup(target, run_id=run_id,
                                                on_answer=None if run_id else confirmed)
                    if run_id is None:
                        nearest = lookup.closest()[: self._config.replication]
                    else:  # a guarded run's records go to its members only
                        nearest = await self._member_replicas(target, run_id, lookup.closest())
                    nearest, here = self._state.replicas(target, nearest, self.server_mode)
                    if here:   # this node is one of the replicas: it keeps them too
                        now = self._clock()
                        for item in items:
                            self._store.put(key, item, now)
                    send(nearest)
                    if tally.looked_up():
                        enough.set()
        finally:
            enough.set()
            self._background_sends -= reserved

    async def _store_at(self, contact: Contact, key: str, requests: list[Store],
                        tally: StoreTally, enough: trio.Event) -> None:
        """Send one replica a store's requests, one after the other (a failure,
        or an answer but ``dht.stored`` with one result per item, ends them)."""
        held = False
        try:
            for request in requests:
                response = await self._query(contact, request)
                if not isinstance(response, Stored) \
                        or len(response.results) != len(request.items):
                    break  # no answer, or not one result per item
                if any(r == "" for r in response.results):
                    held = True
                else:
                    logger.debug("%s refused to store %r: %s", contact.peer, key,
                                 "; ".join(response.results))
        finally:
            if tally.answer(held):
                enough.set()

    # -- lookups ----------------------------------------------------------------------

    def _seeds(self, target: int, run_id: str | None = None) -> list[Contact]:
        """The table's nearest contacts; the connected peers while the table is empty
        (and, for a guarded run's key, the connected members of the run)."""
        seeds = self._table.closest(target)
        if len(seeds) < self._config.alpha or run_id is not None:
            known = {c.peer for c in seeds}
            for peer in self._host.connected_peers():
                if peer not in known and (len(seeds) < self._config.alpha
                                          or self._members.is_member(peer, run_id)):
                    seeds.append(Contact(peer, key_of(peer.to_bytes())))
        return seeds

    async def _member(self, peer: Any, run_id: str) -> bool:
        """Whether ``peer`` is a member of the guarded run ``run_id``, after the
        membership handshake a certificate run needs (waited for at most
        ``query_timeout``: a peer that stalls it counts as one failed query)."""
        if not self._members.is_member(peer, run_id):
            with trio.move_on_after(self._config.query_timeout):
                await self._introduce(peer, run_id)
        return self._members.is_member(peer, run_id)

    async def _member_replicas(self, target: int, run_id: str,
                               nearest: list[Contact]) -> list[Contact]:
        """The ``replication`` members of ``run_id`` nearest to ``target`` among the
        lookup's ``nearest`` and the connected peers."""
        candidates = {c.peer: c for c in nearest}
        for peer in self._host.connected_peers():
            if peer not in candidates and peer != self._peer_id \
                    and self._members.is_member(peer, run_id):
                candidates[peer] = Contact(peer, key_of(peer.to_bytes()))
        members: list[Contact] = []

        async def check(contact: Contact) -> None:
            if await self._member(contact.peer, run_id):
                members.append(contact)

        async with trio.open_nursery() as nursery:
            for contact in candidates.values():
                nursery.start_soon(check, contact)
        members.sort(key=lambda c: distance(c.key, target))
        return members[: self._config.replication]

    async def _ask_members(self, key: str, target: int, run_id: str, lookup: Lookup,
                           record: Record) -> bool:
        """A guarded run's key: ask the members that hold its replicas but were not
        among the lookup's nearest.  True if one of them had valid items."""
        asked = set(lookup.asked)
        replicas = await self._member_replicas(target, run_id, lookup.closest())
        request = FindValue(key, *self._sender())
        found = False

        async def ask(contact: Contact) -> None:
            nonlocal found
            response = await self._query(contact, request)
            if isinstance(response, Value) and response.items \
                    and self._state.accept_items(key, response.items, contact.peer, record,
                                                 self._clock()):
                found = True

        async with trio.open_nursery() as nursery:
            for contact in replicas:
                if contact.peer not in asked:
                    nursery.start_soon(ask, contact)
        return found

    async def _lookup(self, target: int, *, find_value: str | None = None,
                      stop_at_value: bool = False, into: Record | None = None,
                      run_id: str | None = None,
                      on_answer: Callable[[Lookup], None] | None = None) -> Lookup:
        """Run one iterative lookup for ``target`` (a find-value lookup with ``find_value``).

        Valid items found are merged into ``into``.  With the ``run_id`` of a
        guarded run the key is asked of the run's members only: every other
        contact gets a ``dht.find_node`` (it learns a position, not the key).
        ``on_answer`` is called with the lookup after each answer it takes in.
        """
        config = self._config
        lookup = Lookup(target, self._seeds(target, run_id), k=config.k, alpha=config.alpha,
                        stop_at_value=stop_at_value, max_queries=config.max_lookup_queries,
                        local=self._peer_id)
        find_node = FindNode(target.to_bytes(TARGET_SIZE, "big"), *self._sender())
        request: Message = find_node if find_value is None \
            else FindValue(find_value, *self._sender())
        record = into if into is not None else Record()
        progress = trio.lowlevel.ParkingLot()

        async def ask(contact: Contact) -> None:
            try:
                asked = request
                if run_id is not None and find_value is not None \
                        and not await self._member(contact.peer, run_id):
                    asked = find_node
                expected = Nodes if asked is find_node else Value
                response = await self._query(contact, asked)
                if not isinstance(response, expected):
                    if response is not None:
                        logger.info("%s answered %s with %s", contact.peer, asked.TAG,
                                    response.TAG)
                    lookup.on_failure(contact.peer)
                    return
                closer = self._state.contacts(response.closer)
                found = None
                if isinstance(response, Value) and response.items:
                    assert find_value is not None
                    found = self._state.accept_items(find_value, response.items,
                                                     contact.peer, record, self._clock())
                # A DHT client answers, but holds nothing and must not count
                # among the nearest (it would take a replica's place).
                lookup.on_response(contact.peer, closer, found, usable=response.server)
                if on_answer is not None:
                    on_answer(lookup)
            finally:
                progress.unpark_all()

        async with trio.open_nursery() as nursery:
            while not lookup.done:
                for contact in lookup.next_queries():
                    nursery.start_soon(ask, contact)
                if not lookup.in_flight:
                    break
                await progress.park()
            nursery.cancel_scope.cancel()  # a get that found its value stops the rest
        self._table.looked_up(target, trio.current_time())
        return lookup

    async def _query(self, contact: Contact, request: Message) -> Message | None:
        """One request to ``contact``; None (and the table told) if it failed."""
        peer = contact.peer
        assert isinstance(peer, ID)
        if contact.addrs and not self._host.is_connected(peer):
            self._host.add_addrs(peer, contact.addrs)
        self._counters["queries"] += 1
        try:
            # A request about a run's key is that run's (the key decides it, as
            # the receiver's gate does): this node introduces itself first.
            response = await self._call(peer, DHT_PROTOCOL, request, self._config.query_timeout,
                                        run_id=self._run_of_request(request))
        except P2PDLError as exc:
            self._counters["queries_failed"] += 1
            logger.debug("DHT query to %s failed: %s", peer, exc)
            self._table.failed(peer, contact.key)
            return None
        self._saw_peer(peer, bool(getattr(response, "server", False)),
                       contact.addrs or self._host.known_addrs(peer))
        return response

    # -- the table ------------------------------------------------------------------

    def _sender(self) -> tuple[bool, tuple[str, ...]]:
        """What requests say about us: server or not, and our addresses if server."""
        if not self.server_mode:
            return False, ()
        return True, tuple(self._host.addrs()[:MAX_PEER_ADDRS])

    def _saw_peer(self, peer: ID, server: bool, addrs: Iterable[str]) -> None:
        """A peer answered us or asked us: a server goes in the table (and its
        addresses to the host), a client out."""
        addrs = tuple(addrs)
        if server and addrs:
            self._host.add_addrs(peer, addrs)
        if self._state.saw_peer(peer, server, addrs, trio.current_time()):
            self._table_grew()

    def _table_grew(self) -> None:
        self._table_changed.set()
        self._table_changed = trio.Event()

    # -- serving requests ----------------------------------------------------------

    async def handle(self, ctx: RequestContext, request: Message) -> Message:
        """The RPC handler of ``/p2pdl/dht/1.0.0``.

        Answers at once, without waiting for anything: the wire bounds the
        requests in flight per stream (``max_inflight_requests``) and the host
        the streams per peer.
        """
        return self._answer(ctx.peer_id, request)

    def _answer(self, peer: ID, request: Message) -> Message:
        version = self._state.table_version
        response = self._state.answer(peer, request, self.server_mode, self._clock(),
                                      trio.current_time())
        if isinstance(request, (FindNode, FindValue, Store)) and request.server \
                and request.addrs:
            self._host.add_addrs(peer, tuple(request.addrs))
        if self._state.table_version != version:
            self._table_grew()
        return response

    # -- maintenance -------------------------------------------------------------------

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Bootstrap, refresh, republish and prune, for the node's lifetime.

        The node bootstraps at start; while its table is empty, after growing
        delays (``bootstrap_backoff``) and at once when a connection opens;
        when it becomes a server; and, while the table holds fewer than k
        contacts (a young or small network), whenever the table has grown
        since the last bootstrap (at most once per ``MIN_BOOTSTRAP_SPACING``)
        and otherwise after growing delays.  While it runs, the replica sends
        a store no longer waits for (past its ``store_quorum``) go on in its
        nursery.
        """
        async with trio.open_nursery() as nursery:
            self._background = nursery
            try:
                if self._config.relay_directory:
                    nursery.start_soon(self._relays.serve)
                await self._maintain(task_status)
            finally:
                self._background = None

    async def _maintain(self, task_status: trio.TaskStatus[None]) -> None:
        """The loop of :meth:`serve`."""
        backoff = Backoff(self._config.bootstrap_backoff)
        announced = False  # whether other nodes have heard from us as a server
        seen_version = -1  # the table's version at the last bootstrap
        next_bootstrap = trio.current_time()
        connected = False  # a connection opened while the table was empty
        task_status.started()
        while True:
            now = trio.current_time()
            server = self.server_mode
            announced = announced and server
            young = len(self._table) < self._config.k
            if not len(self._table) and next_bootstrap == float("inf"):
                next_bootstrap = now  # every contact failed: join again
            if connected or (server and not announced) or now >= next_bootstrap \
                    or (young and len(self._table) and self._state.table_version != seen_version):
                seen_version = self._state.table_version
                if await self._bootstrap():
                    announced = server
                    if len(self._table) >= self._config.k:
                        backoff.reset()
                        next_bootstrap = float("inf")
                    else:
                        next_bootstrap = trio.current_time() + backoff.next_delay()
                else:
                    next_bootstrap = trio.current_time() + backoff.next_delay()
                await trio.sleep(MIN_BOOTSTRAP_SPACING)
            if len(self._table):
                await self._refresh()
                await self._republish()
            self._store.prune(self._clock())
            connected = await self._sleep(
                min(MAINTENANCE_TICK, next_bootstrap - trio.current_time()), seen_version)

    async def _sleep(self, delay: float, table_version: int) -> bool:
        """Wait ``delay`` s; wake early when reachability changes, when a connection
        opens while the table is empty (then return True), or when a young table grew."""
        delay = max(0.0, delay)
        connected = False
        with trio.move_on_after(delay):
            async with trio.open_nursery() as nursery:
                async def reachability_changed() -> None:
                    await self._reachability.wait_changed()
                    nursery.cancel_scope.cancel()

                nursery.start_soon(reachability_changed)
                if not len(self._table):
                    connected = await self._host.wait_connections_changed(delay)
                    nursery.cancel_scope.cancel()
                elif len(self._table) < self._config.k:
                    while self._state.table_version == table_version:
                        await self._table_changed.wait()
                    nursery.cancel_scope.cancel()
        return connected

    async def bootstrap(self) -> bool:
        """Join: look up our own key, then refresh every bucket.  True if the table has contacts."""
        return await self._bootstrap()

    async def _bootstrap(self) -> bool:
        if not self._seeds(self._key):
            return False
        with trio.move_on_after(self._config.operation_timeout):
            await self._lookup(self._key)
            await self._refresh()
        ok = len(self._table) > 0
        if ok:
            logger.debug("DHT bootstrap: %d contacts (%s)", len(self._table),
                         "server" if self.server_mode else "client")
        return ok

    async def _refresh(self) -> None:
        for target in self._table.buckets_to_refresh(trio.current_time()):
            await self._lookup(target)

    async def _republish(self) -> None:
        """Re-store our own records, and re-send replicas no store refreshed,
        ``REPUBLISH_CONCURRENCY`` stores at a time."""
        jobs = self._state.republish_jobs(self._clock(), trio.current_time(), self.server_mode)
        if not jobs:
            return
        limiter = trio.CapacityLimiter(REPUBLISH_CONCURRENCY)

        async def send(key: str, items: list[Item], counter: str) -> None:
            async with limiter:
                await self._store_items(key, items)
                self._counters[counter] += 1

        async with trio.open_nursery() as nursery:
            for job in jobs:
                nursery.start_soon(send, *job)

