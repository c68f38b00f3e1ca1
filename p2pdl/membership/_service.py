"""The membership service of a node: the admission gate of its runs, and the handshake.

The node's gate is this service (wrapped by the node's ``Gatekeeper``, which
counts and logs): it answers from the :class:`MembershipTable` (``_state``)
at once.  The I/O is here:

* **introduce** (``ServiceContext.introduce``, and the node's ``call`` before
  every run-scoped request): before this node opens a run-scoped stream to a
  peer of a certificate run, it sends ``membership.hello`` with its
  certificate once per connection and run, and records the certificate the
  peer answers with.  Concurrent introductions to one peer coalesce; each is
  bounded by ``handshake_timeout``; the result is kept until the connection
  closes.
* **answering hellos**: the asker's certificate is checked against the
  connection's authenticated peer id; a valid one is recorded and answered
  with this node's own; anything else is refused (``not_admitted``), and
  bytes that are no certificate reset the stream.
* **revocations**: every ``revocation_interval`` the node reads each
  certificate run's lists from the DHT (``p2pdl/membership/<run id>``) and
  obeys the newest valid one; during a handshake each side says its list's
  sequence, the answer carries the answerer's list when newer, and an
  answerer whose list is older fetches the asker's.  A member that holds a
  list the DHT lacks stores it again.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Iterable
from typing import Any

import trio
from libp2p.peer.id import ID

from ..dht import DHTService, ValueWithExpiration
from ..errors import (
    ConfigError,
    P2PDLError,
    ProtocolNotSupportedError,
    RemoteError,
    RemoteProtocolError,
    RequestError,
)
from ..service import (
    NOT_ADMITTED,
    Refusal,
    Role,
    RpcEndpoint,
    ServiceContext,
    Statistics,
    run_id_problem,
)
from ..wire import Message, RequestContext
from ._certificates import RevocationList
from ._messages import MEMBERSHIP_PROTOCOL, GetRevocations, Hello, Revocations, Welcome
from ._state import CertificateRun, Member, MembershipTable, RunPolicy
from .config import REVOCATION_PREFIX, MembershipConfig

__all__ = ["MembershipService", "MembershipStatistics", "revocation_key"]

logger = logging.getLogger(__name__)

#: The first DHT read of revocation lists comes this long after the node starts (s).
FIRST_REFRESH_DELAY = 5.0


def revocation_key(run_id: str) -> str:
    """The DHT key of ``run_id``'s revocation lists (one subkey per sequence)."""
    return REVOCATION_PREFIX + run_id


@dataclasses.dataclass(frozen=True)
class MembershipStatistics(Statistics):
    """What ``node.membership.statistics()`` says: runs guarded, members known, counters."""

    runs: int
    certificate_runs: int
    members_known: int
    introductions: int
    handshakes_sent: int = 0
    handshakes_answered: int = 0
    handshakes_failed: int = 0
    handshakes_refused: int = 0
    hellos_refused: int = 0
    certificates_accepted: int = 0
    certificates_refused: int = 0
    bad_messages: int = 0
    revocations_accepted: int = 0
    revocations_refused: int = 0
    revocation_fetches: int = 0
    revocation_refreshes: int = 0
    refused: int = 0
    refused_monitors: int = 0
    handshakes_slow: int = 0


COUNTERS = MembershipStatistics.counter_names()


class MembershipService:
    """One node's run membership.  The node creates it; reach it as ``node.membership``.

    Args:
        context: the node's host, RPC call and clock.
        config: :class:`MembershipConfig`.
        dht: the node's DHT (revocation lists).
        runs: the run policies to start with.
        averaging_protocols: protocol ids a monitor is refused on (the
            matchmaking's and the all-reduce's).
    """

    def __init__(self, context: ServiceContext, config: MembershipConfig | None = None, *,
                 dht: DHTService, runs: Iterable[RunPolicy] = (),
                 averaging_protocols: Iterable[str] = ()) -> None:
        self._host = context.host
        self._call = context.call
        self._clock = context.clock
        self._config = config = config or MembershipConfig()
        self._dht = dht
        self._peer_id = context.host.peer_id
        self._table = MembershipTable(self._peer_id, config, averaging_protocols)
        now = self._clock()
        for policy in runs:
            self._table.add_run(policy, now)
        self._introduced: collections.OrderedDict[tuple[ID, str], None] = (
            collections.OrderedDict())
        self._pending: dict[tuple[ID, str], trio.Event] = {}
        # (peer, run) -> until when its introduction is not tried again (it was slow)
        self._unanswered: collections.OrderedDict[tuple[ID, str], float] = (
            collections.OrderedDict())
        self._fetching: set[str] = set()
        self._nursery: trio.Nursery | None = None
        self._counters = self._table.counters

    @property
    def config(self) -> MembershipConfig:
        return self._config

    # -- the gate (MembershipView + admit): quick, never waits -------------------------

    def admit(self, peer: ID, protocol_id: str, run_id: str | None) -> Refusal | None:
        return self._table.admit(peer, protocol_id, run_id, self._clock())

    def is_member(self, peer: ID, run_id: str) -> bool:
        return self._table.is_member(peer, run_id, self._clock())

    def role_of(self, peer: ID, run_id: str) -> Role | None:
        return self._table.role_of(peer, run_id, self._clock())

    def credential(self, run_id: str) -> bytes | None:
        return self._table.credential(run_id)

    def learn(self, peer: ID, run_id: str, credential: bytes) -> bool:
        """Check a certificate of ``peer`` learnt without a handshake (a gossiped
        report); True when ``peer`` is a member now.  Junk counts and is False."""
        if not self._table.needs_introduction(run_id):
            return self._table.is_member(peer, run_id, self._clock())
        try:
            problem = self._table.offer_certificate(peer, run_id, credential, self._clock())
        except RemoteProtocolError:
            self._counters["bad_messages"] += 1
            return False
        return problem is None

    def has_policy(self, run_id: str) -> bool:
        """Whether this node has a policy for ``run_id`` (the DHT gates its keys then)."""
        return self._table.has_policy(run_id)

    # -- what users call ---------------------------------------------------------------

    def runs(self) -> tuple[RunPolicy, ...]:
        """The policies of the runs this node guards (a run without one is open)."""
        return self._table.policies()

    def members(self, run_id: str) -> dict[str, Member]:
        """Known members of ``run_id`` now: base58 peer id -> :class:`Member` (role, expiry)."""
        return self._table.members(run_id, self._clock())

    def add_run(self, policy: RunPolicy) -> None:
        """Guard a run by ``policy`` from now on (replacing its earlier policy)."""
        self._table.add_run(policy, self._clock())
        run_id = policy.run_id
        for key in [k for k in self._introduced if k[1] == run_id]:
            del self._introduced[key]
        if isinstance(policy, CertificateRun) and self._nursery is not None:
            self._nursery.start_soon(self._refresh, run_id)

    async def publish_revocations(self, revocations: RevocationList) -> bool:
        """Obey ``revocations`` here at once and store it in the DHT, where the
        run's members read it within ``revocation_interval``.

        Raises :class:`~p2pdl.errors.ConfigError` for a list this node has no
        certificate policy for, or that is not the run authority's.  Returns
        whether a DHT node holds it.
        """
        if not isinstance(revocations, RevocationList):
            raise ConfigError("publish_revocations takes a RevocationList")
        problem = self._table.offer_revocations(revocations, self._clock())
        if problem not in (None, "not newer"):
            raise ConfigError(f"revocation list of {revocations.run_id!r} refused: {problem}")
        return await self._store(revocations)

    def statistics(self) -> MembershipStatistics:
        policies = self._table.policies()
        return MembershipStatistics(
            len(policies), sum(isinstance(p, CertificateRun) for p in policies),
            self._table.member_count(), len(self._introduced),
            **{name: self._counters[name] for name in COUNTERS})

    # -- introductions -----------------------------------------------------------------

    def forget_introduction(self, peer: Any, run_id: str) -> bool:
        """Drop the record that ``peer`` saw our certificate of ``run_id`` (it
        refused us all the same: it may have forgotten).  True if there was one."""
        try:
            key = (_as_id(peer), run_id)
        except ValueError:
            return False
        if key not in self._introduced:
            return False
        del self._introduced[key]
        return True

    async def introduce(self, peer: Any, run_id: str) -> None:
        """Make sure ``peer`` and this node have shown each other their certificates
        of ``run_id`` on the current connection (a no-op unless it is a
        certificate run here).  Waits at most ``handshake_timeout``; never
        raises for the peer's failures (a request that follows is refused by
        the peer, or fails, as it would anyway)."""
        if not self._table.needs_introduction(run_id):
            return
        peer = _as_id(peer)
        if peer == self._peer_id:
            return
        key = (peer, run_id)
        if key in self._introduced and self._host.is_connected(peer):
            self._introduced.move_to_end(key)
            return
        if self._unanswering(key):
            return
        pending = self._pending.get(key)
        if pending is not None:
            with trio.move_on_after(self._config.handshake_timeout):
                await pending.wait()
            return
        pending = self._pending[key] = trio.Event()
        started = trio.current_time()
        try:
            with trio.move_on_after(self._config.handshake_timeout):
                await self._handshake(peer, run_id)
        finally:
            del self._pending[key]
            pending.set()
            if key not in self._introduced and \
                    trio.current_time() - started >= self._config.slow_handshake:
                # Timed out, or its caller gave up on it: not asked again for a while.
                self._counters["handshakes_slow"] += 1
                self._unanswered[key] = trio.current_time() + self._config.unanswered_ttl
                self._unanswered.move_to_end(key)
                while len(self._unanswered) > self._config.max_introductions:
                    self._unanswered.popitem(last=False)

    def _unanswering(self, key: tuple[ID, str]) -> bool:
        """Whether ``key``'s peer did not answer a handshake within
        ``slow_handshake`` less than ``unanswered_ttl`` ago."""
        until = self._unanswered.get(key)
        if until is None:
            return False
        if until > trio.current_time():
            return True
        del self._unanswered[key]
        return False

    async def _handshake(self, peer: ID, run_id: str) -> None:
        key = (peer, run_id)
        hello = Hello(run_id, self._table.credential(run_id),
                      self._table.revocation_sequence(run_id))
        self._counters["handshakes_sent"] += 1
        try:
            reply = await self._call(peer, MEMBERSHIP_PROTOCOL, hello,
                                     self._config.handshake_timeout)
        except ProtocolNotSupportedError:
            self._mark(key)  # a node without membership: nothing to show either way
            return
        except RemoteError as exc:
            self._counters["handshakes_refused"] += 1
            logger.debug("membership hello to %s for %s refused: %s", peer, run_id, exc)
            if exc.code == NOT_ADMITTED:
                self._mark(key)  # asking again on this connection would not change it
            return
        except P2PDLError as exc:
            self._counters["handshakes_failed"] += 1
            logger.debug("membership hello to %s for %s failed: %s", peer, run_id, exc)
            return
        if not isinstance(reply, Welcome):
            self._counters["bad_messages"] += 1
            return
        self._mark(key)
        now = self._clock()
        try:
            if reply.revocations:
                self._table.offer_revocations(reply.revocations, now)
            if reply.certificate is not None:
                problem = self._table.offer_certificate(peer, run_id, reply.certificate, now)
                if problem is not None:
                    logger.debug("%s showed a certificate of %s that is %s", peer, run_id,
                                 problem)
        except RemoteProtocolError as exc:
            self._counters["bad_messages"] += 1
            logger.debug("bad membership answer from %s: %s", peer, exc)

    def _mark(self, key: tuple[ID, str]) -> None:
        self._introduced[key] = None
        self._introduced.move_to_end(key)
        while len(self._introduced) > self._config.max_introductions:
            self._introduced.popitem(last=False)

    # -- serving -----------------------------------------------------------------------

    def endpoints(self) -> list[RpcEndpoint]:
        """``/p2pdl/membership/1.0.0``: served to everyone (it is how one becomes a
        member), so the gate sees its requests as of no run."""
        return [RpcEndpoint(MEMBERSHIP_PROTOCOL, self.handle)]

    async def handle(self, ctx: RequestContext, request: Message) -> Message:
        """The RPC handler: answers at once (a list fetch it starts runs apart)."""
        if isinstance(request, GetRevocations):
            self._check_run(ctx.peer_id, request.run_id)
            held = self._table.revocations(request.run_id)
            return Revocations(b"" if held is None else held.to_bytes())
        assert isinstance(request, Hello)
        run_id = request.run_id
        self._check_run(ctx.peer_id, run_id)
        if not self._table.needs_introduction(run_id):
            return Welcome(None)
        self._counters["handshakes_answered"] += 1
        if request.certificate is None:
            self._counters["hellos_refused"] += 1
            raise RequestError(NOT_ADMITTED, "no membership certificate shown")
        try:
            problem = self._table.offer_certificate(ctx.peer_id, run_id, request.certificate,
                                                    self._clock())
        except RemoteProtocolError as exc:
            self._counters["bad_messages"] += 1
            raise RemoteProtocolError(f"membership.hello from {ctx.peer_id}: {exc}") from None
        if problem is not None:
            self._counters["hellos_refused"] += 1
            logger.debug("refused the certificate of %s for %s: %s", ctx.peer_id, run_id,
                         problem)
            raise RequestError(NOT_ADMITTED, f"certificate refused: {problem}")
        self._mark((ctx.peer_id, run_id))
        sequence = self._table.revocation_sequence(run_id)
        if request.revocation_sequence > sequence:
            self._fetch_soon(ctx.peer_id, run_id)
        held = self._table.revocations(run_id)
        newer = held is not None and sequence > request.revocation_sequence
        return Welcome(self._table.credential(run_id), sequence,
                       held.to_bytes() if newer else b"")  # type: ignore[union-attr]

    def _check_run(self, peer: ID, run_id: str) -> None:
        problem = run_id_problem(run_id)
        if problem:
            self._counters["bad_messages"] += 1
            raise RemoteProtocolError(f"membership request from {peer}: {problem}")

    def _fetch_soon(self, peer: ID, run_id: str) -> None:
        if (self._nursery is None or run_id in self._fetching
                or len(self._fetching) >= self._config.max_concurrent_fetches):
            return
        self._fetching.add(run_id)
        self._nursery.start_soon(self._fetch, peer, run_id)

    async def _fetch(self, peer: ID, run_id: str) -> None:
        try:
            self._counters["revocation_fetches"] += 1
            with trio.move_on_after(self._config.handshake_timeout):
                reply = await self._call(peer, MEMBERSHIP_PROTOCOL, GetRevocations(run_id),
                                         self._config.handshake_timeout)
                if isinstance(reply, Revocations) and reply.revocations:
                    self._table.offer_revocations(reply.revocations, self._clock())
        except RemoteProtocolError:
            self._counters["bad_messages"] += 1
        except P2PDLError as exc:
            logger.debug("revocation fetch from %s failed: %s", peer, exc)
        finally:
            self._fetching.discard(run_id)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Refresh revocation lists, forget the introductions of closed connections."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._refresh_loop)
            nursery.start_soon(self._prune_loop)
            task_status.started()

    async def _refresh_loop(self) -> None:
        # The first read waits for the DHT to bootstrap a little.
        await trio.sleep(min(self._config.revocation_interval, FIRST_REFRESH_DELAY))
        while True:
            for policy in self._table.policies():
                if isinstance(policy, CertificateRun):
                    await self._refresh(policy.run_id)
            await trio.sleep(self._config.revocation_interval)

    async def _refresh(self, run_id: str) -> None:
        """Read ``run_id``'s lists from the DHT, obey the newest valid one, and store
        ours again when the DHT lacks it."""
        self._counters["revocation_refreshes"] += 1
        found: ValueWithExpiration[Any] | None = None
        try:  # bounded by the DHT's operation_timeout
            found = await self._dht.get(revocation_key(run_id), latest=True)
        except P2PDLError as exc:
            logger.debug("reading the revocations of %s failed: %s", run_id, exc)
            return
        best = -1
        values = found.value.values() if found is not None and found.dictionary else ()
        now = self._clock()
        for entry in values:
            if not isinstance(entry.value, bytes):
                continue
            try:
                if self._table.offer_revocations(entry.value, now) in (None, "not newer"):
                    best = max(best, RevocationList.from_bytes(entry.value).sequence)
            except RemoteProtocolError:
                self._counters["revocations_refused"] += 1
        held = self._table.revocations(run_id)
        if held is not None and held.sequence > best:
            await self._store(held)

    async def _store(self, revocations: RevocationList) -> bool:
        expiration = self._dht.now() + self._config.revocation_ttl
        try:
            return await self._dht.store(revocation_key(revocations.run_id),
                                         revocations.to_bytes(), expiration,
                                         subkey=str(revocations.sequence))
        except P2PDLError as exc:
            logger.debug("storing the revocations of %s failed: %s", revocations.run_id, exc)
            return False

    async def _prune_loop(self) -> None:
        while True:
            await self._host.wait_connections_changed(60.0)
            for key in [k for k in self._introduced if not self._host.is_connected(k[0])]:
                del self._introduced[key]


def _as_id(peer: Any) -> ID:
    if isinstance(peer, ID):
        return peer
    if isinstance(peer, str):
        return ID.from_base58(peer)
    if isinstance(peer, bytes):
        return ID(peer)
    raise ValueError(f"not a peer id: {peer!r}")
