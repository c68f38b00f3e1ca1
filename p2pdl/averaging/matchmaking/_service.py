"""The matchmaking service of a node: ``node.matchmaking.form_group(run_id, epoch)``.

The rules are in ``_state`` (sans-IO); this module does the I/O:

1. **announce**: the peer says in the DHT that it is ready for the round
   (``dht.announce("<run id>/mm/<epoch>")``: a signed entry with its
   addresses and client mode);
2. **gather**: after ``gather_time`` it reads who else did (the view);
3. **plan**: every peer computes the same plan from the same view;
4. **lead or join**: a leader holds the join requests of its followers
   until its group is final, then answers them all; a follower asks its
   leader and checks the answer.  Failures (an unreachable leader, a
   refusal, a bad answer) make it try the next leader (bounded), and the
   DHT is read again when no known leader is left.

A follower's ``mm.join`` carries its role and capacity (auxiliary,
bandwidth, reduce rate); the leader solves the load plan once when it
finalizes and sends the fractions with the group.

No background task: a round runs in the caller's task; held join requests
wait in their RPC handler tasks, bounded by the wire's ``handler_timeout``.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from typing import Any

import trio
from libp2p.peer.id import ID

from ...dht import GROUP_PREFIX, DHTService, GroupPeer
from ...errors import (
    ConfigError,
    LocalProtocolError,
    MatchmakingFailedError,
    P2PDLError,
    RemoteProtocolError,
)
from ...service import (
    ReachabilityView,
    Role,
    RpcEndpoint,
    ServiceContext,
    Statistics,
    is_int,
    run_of_request,
    serve_nothing,
)
from ...wire import Message, RequestContext
from ._messages import MATCHMAKING_PROTOCOL, REJECT_CODES, Formed, Join, MemberEntry, Rejected
from ._plan import Group, GroupMemberInfo, check_capacity, check_run, late_members
from ._state import (
    ACCEPTED,
    HOLD,
    LeaderSearch,
    MatchmakingRound,
    Refusal,
    UnresponsivePeers,
    group_from_formed,
)
from .config import (
    AGGREGATION_DIGEST_SIZE,
    MAX_DETAIL_LENGTH,
    MAX_GROUP_SIZE,
    MAX_MATCHMAKING_TIME,
    MAX_REFUSED,
    MatchmakingConfig,
)

__all__ = ["MatchmakingService", "MatchmakingStatistics", "round_key", "run_of_round_key",
           "REPLY_MARGIN", "JOIN_SLACK",
           "MAX_RECENT_ROUNDS", "GATHER_FRACTION", "JOIN_WINDOW_FRACTION", "INTRODUCE_WAIT",
           "UNRESPONSIVE_TTL", "MAX_UNRESPONSIVE"]

logger = logging.getLogger(__name__)

#: A leader stops holding a join request this long before the joiner stops
#: waiting, so that its answer arrives in time (s).
REPLY_MARGIN = 0.25
#: A follower waits for a leader's answer at most join_window + gather_time
#: + this much (s): the leader may have started leading a little later.
JOIN_SLACK = 1.0
#: A join request is held at most the wire's handler_timeout minus this (s).
HOLD_MARGIN = 1.0
#: Finished rounds a node remembers, to answer late join requests at once.
MAX_RECENT_ROUNDS = 64
#: At most this fraction of matchmaking_time is spent gathering.
GATHER_FRACTION = 0.1
#: At most this fraction of matchmaking_time is one leader's join window.
JOIN_WINDOW_FRACTION = 1 / 3
#: In a run that checks membership, the entries of peers not yet known as
#: averaging members are introduced to at once, all together, for at most
#: this long (s); those still unknown then are left out of the view.
INTRODUCE_WAIT = 1.0
#: A peer left out so because it did not answer in time is left out of the
#: run's views without a new wait for this long (s)...
UNRESPONSIVE_TTL = 60.0
#: ...and at most this many such peers are remembered (the oldest go first).
MAX_UNRESPONSIVE = 256



@dataclasses.dataclass(frozen=True)
class MatchmakingStatistics(Statistics):
    """What ``MatchmakingService.statistics()`` says: rounds in progress, held join
    requests, and counters (every one present, from 0).  ``led`` counts groups
    formed as leader; ``joins_failed``, join requests with no answer (the leader
    unreachable, gone or silent); ``bad_answers``, answers that failed the checks
    (a group with a member that may not average among them);
    ``non_members_skipped``, leaders not joined because they are no averaging
    members of the run; ``non_members_ignored``, entries of a round's view
    left out because their peer is no averaging member of the run (or did not
    show it within INTRODUCE_WAIT); ``late_members_awaited``, groups whose leader, about to
    finalize early, saw peers that announced since it planned and waited for them;
    ``refusals_resolved``, groups this peer led that left out a joiner, or
    the members it refused (``mm.join``'s ``refuses``); ``disputed_pairs_refused``,
    groups of two contributors this peer turned down because the other was
    refused by a joiner it left out earlier in the round (robust rules)."""

    active_rounds: int
    held_joins: int
    rounds: int = 0
    formed: int = 0
    failed: int = 0
    led: int = 0
    joins_sent: int = 0
    joins_failed: int = 0
    bad_answers: int = 0
    joins_received: int = 0
    joins_accepted: int = 0
    joins_refused: int = 0
    non_members_skipped: int = 0
    non_members_ignored: int = 0
    view_fetches: int = 0
    late_members_awaited: int = 0
    refusals_resolved: int = 0
    disputed_pairs_refused: int = 0


#: The counters of :meth:`MatchmakingService.statistics`.
COUNTERS = MatchmakingStatistics.counter_names()


def round_key(run_id: str, epoch: int) -> str:
    """The DHT group name of a round: ``<run id>/mm/<epoch>`` (key
    ``p2pdl/group/<run id>/mm/<epoch>``)."""
    return f"{run_id}/mm/{epoch}"


def run_of_round_key(name: str) -> str | None:
    """The run of a round's DHT group name (:func:`round_key`), or None."""
    run_id, mark, epoch = name.rpartition("/mm/")
    return run_id if mark and run_id and epoch.isdigit() else None


class _Session:
    """A round in progress and the event that wakes its held join requests."""

    def __init__(self, round_: MatchmakingRound) -> None:
        self.round = round_
        self._changed = trio.Event()

    def notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()


class _Params:
    """One round's effective settings.  A follower waits for an answer at most
    ``join_wait``, which never exceeds ``max_hold``: a leader (with the same
    wire settings) can hold the request as long as the follower waits."""

    def __init__(self, config: MatchmakingConfig, target: int, min_size: int,
                 time_: float, max_hold: float) -> None:
        self.target_group_size = target
        self.min_group_size = min_size
        self.matchmaking_time = time_
        self.gather_time = min(config.gather_time, time_ * GATHER_FRACTION)
        self.join_window = max(REPLY_MARGIN, min(config.join_window, time_ * JOIN_WINDOW_FRACTION,
                                                 max_hold - self.gather_time - JOIN_SLACK))
        self.join_wait = min(self.join_window + self.gather_time + JOIN_SLACK, max_hold)


class MatchmakingService:
    """One node's matchmaking.  The node creates it; reach it as ``node.matchmaking``.

    Args:
        context: the node's host (peer id, connections), RPC call function and
            wire limits.  A join request is held at most the wire's
            ``handler_timeout`` minus HOLD_MARGIN, so that a held request is
            answered by this service, not cut off by the wire.
        config: :class:`MatchmakingConfig`.
        dht: the node's DHT service (announce, find_peers).
        reachability: tells whether this node is a client-mode peer.
    """

    def __init__(self, context: ServiceContext, config: MatchmakingConfig | None = None, *,
                 dht: DHTService, reachability: ReachabilityView) -> None:
        self._host = context.host
        self._call = context.call
        self._dht = dht
        self._reachability = reachability
        self._members = context.members
        self._flags = context.flags
        self._clock = context.clock
        self._introduce = context.introduce
        # The rendezvous keys of a guarded run are that run's: members only.
        dht.scope_run_keys(GROUP_PREFIX, run_of_round_key)
        self._config = config or MatchmakingConfig()
        self._max_hold = max(0.5, context.wire.handler_timeout - HOLD_MARGIN)
        self._sessions: dict[tuple[str, int], _Session] = {}
        self._recent: collections.OrderedDict[tuple[str, int], str] = collections.OrderedDict()
        self._held = 0
        self._counters: collections.Counter[str] = collections.Counter()
        self._unresponsive = UnresponsivePeers(UNRESPONSIVE_TTL, MAX_UNRESPONSIVE)

    @property
    def config(self) -> MatchmakingConfig:
        return self._config

    def statistics(self) -> MatchmakingStatistics:
        """Rounds in progress, held join requests, and counters: :class:`MatchmakingStatistics`."""
        return MatchmakingStatistics(len(self._sessions), self._held,
                                     **{name: self._counters[name] for name in COUNTERS})

    def endpoints(self) -> list[RpcEndpoint]:
        """``/p2pdl/matchmaking/1.0.0``: run-scoped, each join names its run."""
        return [RpcEndpoint(MATCHMAKING_PROTOCOL, self.handle, run_id_of=run_of_request)]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """No background work: a round runs in the caller's task."""
        await serve_nothing(task_status)

    # -- the public operation ------------------------------------------------------

    async def form_group(self, run_id: str, epoch: int, *, target_group_size: int | None = None,
                         matchmaking_time: float | None = None,
                         min_group_size: int | None = None, auxiliary: bool = False,
                         bandwidth: float | None = None,
                         reduce_rate: float | None = None,
                         aggregation: bytes | None = None) -> Group:
        """Form an averaging group with the other peers ready for ``epoch`` of ``run_id``.

        Every peer of the round calls it at about the same time (when the
        progress layer says the collaboration is ready).  Returns the
        :class:`Group` this peer is in: every member that returns it has the
        same members in the same order, the same ``fractions`` and the same
        ``group_id``.  Arguments left None take their
        :class:`MatchmakingConfig` value.

        ``auxiliary``: this peer reduces parts but contributes no vector (a
        client-mode node cannot be auxiliary).  ``bandwidth``: bytes per
        second it can send and receive at once; ``reduce_rate``: bytes of
        input it can reduce per second (each None: unknown, or in
        ``MIN_RATE..MAX_RATE``).  They feed the leader's load plan,
        ``group.fractions`` (protocols/matchmaking.md).  ``aggregation``:
        the digest of the aggregation rule this peer averages with
        (:meth:`~p2pdl.averaging.Aggregator.digest`; None: the plain mean):
        a leader refuses joiners with another (``mismatch``).

        Raises :class:`~p2pdl.errors.MatchmakingFailedError` when no group
        with this peer formed within ``matchmaking_time`` (or only one
        smaller than ``min_group_size``); :class:`~p2pdl.errors.ConfigError`
        for invalid arguments; :class:`~p2pdl.errors.LocalProtocolError` if
        this node already runs a round for the same run and epoch, or
        ``max_rounds`` rounds.

        Cancellation ends the round at once; a leader's held joiners are
        refused (``disbanded``).  A follower cancelled while its request is
        held may still be listed in the group its leader forms (the
        all-reduce then treats it as a member that does not answer).
        """
        params = self._params(run_id, epoch, target_group_size, matchmaking_time,
                              min_group_size)
        client_mode = bool(self._reachability.client_mode)
        problem = check_capacity(client_mode, auxiliary, bandwidth, reduce_rate)
        if problem:
            if client_mode and auxiliary is True:
                problem = "auxiliary=True needs a node that accepts connections; " \
                          "this node is in client mode"
            raise ConfigError(f"form_group: {problem}")
        key = (run_id, epoch)
        if key in self._sessions:
            raise LocalProtocolError(f"this node already forms a group for run {run_id!r} "
                                     f"epoch {epoch}")
        if len(self._sessions) >= self._config.max_rounds:
            raise LocalProtocolError(f"this node already runs {len(self._sessions)} rounds "
                                     f"(max_rounds)")
        me = GroupMemberInfo(self._host.peer_id, client_mode, auxiliary,
                             None if bandwidth is None else float(bandwidth),
                             None if reduce_rate is None else float(reduce_rate))
        if aggregation is not None and (not isinstance(aggregation, bytes)
                                        or len(aggregation) > AGGREGATION_DIGEST_SIZE):
            raise ConfigError(f"form_group: aggregation must be at most "
                              f"{AGGREGATION_DIGEST_SIZE} bytes")
        session = _Session(MatchmakingRound(run_id, epoch, me, params.target_group_size,
                                            params.min_group_size, aggregation=aggregation))
        self._sessions[key] = session
        self._counters["rounds"] += 1
        self._recent.pop(key, None)
        group: Group | None = None
        notes: list[str] = []
        try:
            deadline = trio.current_time() + params.matchmaking_time
            with trio.move_on_at(deadline):
                group = await self._run(session, params, deadline, notes)
            if group is None:
                if trio.current_time() >= deadline:
                    notes.append(f"no group within {params.matchmaking_time:g} s")
                raise MatchmakingFailedError(
                    f"run {run_id!r} epoch {epoch}: {'; '.join(notes[-6:]) or 'no group'}")
            self._counters["formed"] += 1
            if group.leader == me.peer_id:
                self._counters["led"] += 1
            return group
        except BaseException:
            self._counters["failed"] += 1
            raise
        finally:
            session.round.finish(group, "the leader's round ended")
            session.notify()
            del self._sessions[key]
            self._recent[key] = session.round.closed_code()
            while len(self._recent) > MAX_RECENT_ROUNDS:
                self._recent.popitem(last=False)

    def _params(self, run_id: Any, epoch: Any, target: Any, time_: Any,
                min_size: Any) -> _Params:
        problem = check_run(run_id, epoch)
        if problem:
            raise ConfigError(f"form_group: {problem}")
        config = self._config
        target = config.target_group_size if target is None else target
        time_ = config.matchmaking_time if time_ is None else time_
        min_size = config.min_group_size if min_size is None else min_size
        if not is_int(target) or not 1 <= target <= MAX_GROUP_SIZE:
            raise ConfigError(f"form_group: target_group_size must be an integer in "
                              f"1..{MAX_GROUP_SIZE}, not {target!r}")
        if not is_int(min_size) or not 1 <= min_size <= target:
            raise ConfigError(f"form_group: min_group_size must be an integer in "
                              f"1..target_group_size ({target}), not {min_size!r}")
        if not isinstance(time_, (int, float)) or isinstance(time_, bool) \
                or not math.isfinite(time_) or not 0 < time_ <= MAX_MATCHMAKING_TIME:
            raise ConfigError(f"form_group: matchmaking_time must be in "
                              f"(0, {MAX_MATCHMAKING_TIME}] seconds, not {time_!r}")
        return _Params(config, target, min_size, float(time_), self._max_hold)

    # -- one round -----------------------------------------------------------------------

    async def _run(self, session: _Session, params: _Params, deadline: float,
                   notes: list[str]) -> Group | None:
        round_ = session.round
        me = round_.me
        name = round_key(round_.run_id, round_.epoch)
        if not self._averages(me.peer_id, round_.run_id):
            notes.append("this node is no averaging member of the run (no valid certificate, "
                         "or a monitor's)")
            return None
        expiration = self._dht.now() + params.matchmaking_time + self._config.expiration_margin
        if not await self._dht.announce(name, expiration):
            logger.debug("matchmaking %s: no DHT node holds our announcement", name)
        await trio.sleep(params.gather_time)
        view = await self._fetch_view(name, me, round_.run_id)
        logger.debug("matchmaking %s: view of %d peers", name, len(view))
        search = LeaderSearch(round_.run_id, round_.epoch, me, params.target_group_size, view,
                              max_join_attempts=self._config.max_join_attempts,
                              max_view_fetches=self._config.max_view_fetches)
        while True:
            step = search.next()
            if step.action == "give_up":
                notes.append(step.note)
                return None
            if step.action == "fetch":
                # Nobody left to ask: perhaps peers announced since we looked.
                await trio.sleep(params.gather_time)
                search.fetched(await self._fetch_view(name, me, round_.run_id))
                continue
            if step.action == "lead":
                group = await self._lead(session, step.expected, params, deadline, notes,
                                         recheck=(name, set(search.view)))
                if group is not None:
                    return group
                search.led_nothing()
                continue
            assert step.leader is not None
            round_.follow()
            session.notify()
            result = await self._join(round_, step.leader, params, deadline, notes)
            if isinstance(result, Group):
                round_.finish(result)
                session.notify()
                return result
            search.join_failed(step.leader, result)

    async def _fetch_view(self, name: str, me: GroupMemberInfo, run_id: str
                          ) -> dict[ID, GroupMemberInfo]:
        """The peers announced under ``name``, less those that are no averaging
        members of ``run_id`` (:meth:`_members_only`)."""
        self._counters["view_fetches"] += 1
        peers: list[GroupPeer] = await self._dht.find_peers(name)
        view = {p.peer_id: GroupMemberInfo(p.peer_id, p.client_mode) for p in peers}
        view[me.peer_id] = me  # our own entry may not have reached the DHT (yet)
        return await self._members_only(view, me.peer_id, run_id)

    async def _members_only(self, view: dict[ID, GroupMemberInfo], me: ID, run_id: str
                            ) -> dict[ID, GroupMemberInfo]:
        """Leave out of ``view`` the peers that may not average in ``run_id``,
        before anyone plans with them or waits on them: the peers not yet known
        are introduced to all at once, for at most INTRODUCE_WAIT; a peer that
        did not answer by then is left out of the run's views for
        UNRESPONSIVE_TTL without a new wait (an outsider announced under the
        run's key that answers slowly delays one fetch, not every round)."""
        now = trio.current_time()
        unknown = [p for p in view if p != me and not self._averages(p, run_id)]
        asked = self._unresponsive.to_ask(unknown, run_id, now)
        if asked:
            with trio.move_on_after(INTRODUCE_WAIT):
                async with trio.open_nursery() as nursery:
                    for peer in asked:
                        nursery.start_soon(self._introduce, peer, run_id)
        for peer in unknown:
            if self._averages(peer, run_id):
                continue
            del view[peer]
            self._counters["non_members_ignored"] += 1
            if peer in asked:
                self._unresponsive.left_out(peer, run_id, now)
        return view

    async def _lead(self, session: _Session, expected: frozenset[ID] | None, params: _Params,
                    deadline: float, notes: list[str],
                    recheck: tuple[str, set[ID]] | None = None) -> Group | None:
        """Lead a group.  ``recheck``: the round's DHT key and the peers the plan was
        made from; once every expected member joined, the view is read once more
        (:func:`late_members`) before finalizing early."""
        round_ = session.round
        _load_planner()  # before the join window starts: the first import takes ~0.5 s
        now = trio.current_time()
        finalize_at = min(now + params.join_window, deadline - REPLY_MARGIN)
        state = round_.lead(expected, finalize_at)
        session.notify()
        logger.debug("matchmaking %s/%d: leading, expecting %s", round_.run_id, round_.epoch,
                     "leftovers" if expected is None else len(expected))
        while True:
            while not state.ready(trio.current_time()):
                with trio.move_on_at(finalize_at):
                    await session.wait_changed()
            if recheck is None or expected is None \
                    or not state.waits_only_for_expected(trio.current_time()):
                break
            name, seen = recheck
            recheck = None
            with trio.move_on_at(finalize_at):
                fresh = await self._fetch_view(name, round_.me, round_.run_id)
                late = late_members(round_.run_id, round_.epoch, round_.me.peer_id, seen,
                                    fresh.values(), params.target_group_size)
                late = frozenset(p for p in late if self._averages(p, round_.run_id))
                if late:
                    self._counters["late_members_awaited"] += 1
                    logger.debug("matchmaking %s/%d: waiting for %d late member(s)",
                                 round_.run_id, round_.epoch, len(late))
                    state.expect(late)
        run_id = round_.run_id
        now = self._clock()
        group = state.finalize(trio.current_time(),
                               lambda p: self._host.is_connected(p) and self._averages(p, run_id),
                               lambda p: self._flags.suspects(p, run_id, now))
        if state.excluded:
            self._counters["refusals_resolved"] += 1
            logger.info("matchmaking %s/%d: left out %s (refused by a member)", run_id,
                        round_.epoch, ", ".join(_short(p) for p in state.excluded))
        logger.debug("matchmaking %s/%d: finalized with %s members", round_.run_id,
                     round_.epoch, group and len(group))
        if group is not None:
            round_.finish(group)
            session.notify()
            return group
        notes.append(f"led, but {state.disband_detail}")
        round_.give_up_leading(state.disband_detail)
        session.notify()
        return None

    async def _join(self, round_: MatchmakingRound, leader: ID, params: _Params,
                    deadline: float, notes: list[str]) -> Group | str:
        """Ask ``leader`` to join: the group, or why not (a refusal code, or
        ``failed``/``bad_answer``)."""
        wait = min(deadline - trio.current_time(), params.join_wait)
        if wait <= 2 * REPLY_MARGIN:
            notes.append("no time left to join")
            return "failed"
        me = round_.me
        # Never join a leader that is not a member: it would learn our gradients.
        await self._introduce(leader, round_.run_id)
        if not self._averages(leader, round_.run_id):
            self._counters["non_members_skipped"] += 1
            notes.append(f"{_short(leader)}: not an averaging member")
            return "not_member"
        refused = self._flags.banned_peers(round_.run_id, self._clock(), MAX_REFUSED)
        request = Join(round_.run_id, round_.epoch, params.target_group_size, me.client_mode,
                       wait, me.auxiliary, me.bandwidth, me.reduce_rate, round_.aggregation,
                       refused or None)
        self._counters["joins_sent"] += 1
        logger.debug("matchmaking %s/%d: asking %s to join", round_.run_id, round_.epoch, leader)
        try:
            reply = await self._call(leader, MATCHMAKING_PROTOCOL, request, wait,
                                     run_id=round_.run_id)
        except P2PDLError as exc:
            self._counters["joins_failed"] += 1
            notes.append(f"{_short(leader)}: {type(exc).__name__}")
            logger.debug("join %s: %s", leader, exc)
            return "failed"
        if isinstance(reply, Rejected):
            notes.append(f"{_short(leader)}: {reply.code}")
            return reply.code
        assert isinstance(reply, Formed)
        try:
            group = group_from_formed(round_.run_id, round_.epoch, leader, me,
                                      params.target_group_size, reply.group_id,
                                      [(m.peer, m.client_mode, m.auxiliary, m.bandwidth,
                                        m.reduce_rate) for m in reply.members],
                                      reply.fractions)
        except RemoteProtocolError as exc:
            self._counters["bad_answers"] += 1
            notes.append(f"{_short(leader)}: bad answer")
            logger.warning("%s", exc)
            return "bad_answer"
        outsiders = await self._outsiders(group, me.peer_id)
        if outsiders:
            self._counters["bad_answers"] += 1
            notes.append(f"{_short(leader)}: a group with {len(outsiders)} non-member(s)")
            logger.warning("matchmaking %s/%d: %s formed a group with non-members %s",
                           round_.run_id, round_.epoch, leader,
                           ", ".join(_short(p) for p in outsiders))
            return "bad_answer"
        disputed = round_.pairs_with_disputed(group)
        if disputed is not None:
            self._counters["disputed_pairs_refused"] += 1
            notes.append(f"{_short(leader)}: a group of two with {_short(disputed)}, "
                         f"whom a member refused")
            logger.info("matchmaking %s/%d: turned down %s's group: its other contributor "
                        "%s was refused by a member this round", round_.run_id,
                        round_.epoch, leader, _short(disputed))
            return "disputed"
        return group

    def _averages(self, peer: ID, run_id: str) -> bool:
        """Whether ``peer`` may average in ``run_id``: a member, and not a monitor."""
        return (self._members.is_member(peer, run_id)
                and self._members.role_of(peer, run_id) is not Role.MONITOR)

    async def _outsiders(self, group: Group, me: ID) -> list[ID]:
        """The members of ``group`` that may not average; every other member is
        introduced to (both sides show their certificates before the all-reduce)."""
        others = [p for p in group.peer_ids if p != me]
        async with trio.open_nursery() as nursery:
            for peer in others:
                nursery.start_soon(self._introduce, peer, group.run_id)
        return [p for p in others if not self._averages(p, group.run_id)]

    # -- serving join requests ----------------------------------------------------------------

    async def handle(self, ctx: RequestContext, request: Message) -> Message:
        """The RPC handler of ``/p2pdl/matchmaking/1.0.0``.

        A join request is held while this peer's role in the round is
        undecided and, once accepted, until its group is final: at most the
        request's ``wait`` (less REPLY_MARGIN), and at most ``max_hold``.
        Raises :class:`RemoteProtocolError` (the stream is reset) for a
        request that breaks the spec.
        """
        assert isinstance(request, Join)
        problem = check_run(request.run_id, request.epoch)
        problem = problem or check_capacity(request.client_mode, request.auxiliary,
                                            request.bandwidth, request.reduce_rate)
        if problem:
            raise RemoteProtocolError(f"mm.join from {ctx.peer_id}: {problem}")
        self._counters["joins_received"] += 1
        reply = await self._answer(ctx.peer_id, request)
        if isinstance(reply, Rejected):
            self._counters["joins_refused"] += 1
        return reply

    async def _answer(self, peer: ID, request: Join) -> Message:
        key = (request.run_id, request.epoch)
        session = self._sessions.get(key)
        if session is None:
            return self._absent(key)
        if self._held >= self._config.max_held_joins:
            return _rejected(Refusal("busy", f"{self._held} join requests held"))
        wait_until = trio.current_time() + min(request.wait, self._max_hold) - REPLY_MARGIN
        round_ = session.round
        accepted = False
        self._held += 1
        try:
            with trio.move_on_at(wait_until):
                while True:
                    if not accepted:
                        verdict = round_.on_join(peer, request.client_mode,
                                                 request.target_group_size, wait_until,
                                                 trio.current_time(),
                                                 auxiliary=request.auxiliary,
                                                 bandwidth=request.bandwidth,
                                                 reduce_rate=request.reduce_rate,
                                                 aggregation=request.aggregation,
                                                 refuses=[ID(p) for p in request.refuses or ()])
                        if isinstance(verdict, Refusal):
                            return _rejected(verdict)
                        if verdict is ACCEPTED:
                            accepted = True
                            self._counters["joins_accepted"] += 1
                            session.notify()  # the leader may be complete now
                        else:
                            assert verdict is HOLD
                    if accepted:
                        outcome = round_.outcome(peer)
                        if outcome is not None:
                            return _reply(outcome)
                    await session.wait_changed()
        finally:
            self._held -= 1
        # The joiner stops waiting now; a group formed at this very moment
        # may still list it (the leader drops only joiners whose wait ended).
        outcome = round_.outcome(peer) if accepted else None
        if outcome is not None:
            return _reply(outcome)
        return _rejected(Refusal("expired", "the request's wait ended before a group formed"))

    def _absent(self, key: tuple[str, int]) -> Rejected:
        """The answer for a round this node does not run (now)."""
        run_id, epoch = key
        code = self._recent.get(key)
        if code is not None:
            return _rejected(Refusal(code, "this peer's round is over"))
        if any(r == run_id for r, _ in self._sessions):
            return _rejected(Refusal("wrong_epoch", f"not matchmaking for epoch {epoch}"))
        return _rejected(Refusal("unknown_run", "not matchmaking for this run"))


def _rejected(refusal: Refusal) -> Rejected:
    assert refusal.code in REJECT_CODES, refusal.code
    return Rejected(refusal.code, refusal.detail[:MAX_DETAIL_LENGTH])


def _reply(outcome: Group | Refusal) -> Message:
    if isinstance(outcome, Refusal):
        return _rejected(outcome)
    members = [MemberEntry(m.peer_id.to_bytes(), m.client_mode, m.auxiliary, m.bandwidth,
                           m.reduce_rate) for m in outcome.members]
    fractions = None if outcome.fractions is None else list(outcome.fractions)
    return Formed(outcome.group_id, members, fractions)


_planner_loaded = False


def _load_planner() -> None:
    """Import the load plan's solver (scipy) once, so that a leader's first
    finalization does not pay for it (it blocks for ~0.5 s, once per process).
    A missing scipy is fine: the plan falls back to equal shares."""
    global _planner_loaded
    if not _planner_loaded:
        _planner_loaded = True
        try:
            import scipy.optimize  # noqa: F401, PLC0415
        except ImportError:
            logger.warning("scipy is not installed: groups' load plans are equal shares")


def _short(peer: ID) -> str:
    text = str(peer)
    return text[-8:]

