"""The sync and asyncio faces of every service (``Node.dht``, ``node.aio.progress``...).

The trio services live on the node's trio thread; each face holds the service
and the node's :class:`~p2pdl._portal.Portal` and calls it there.  Short calls
(``report``, ``global_progress``, ``statistics``) hop to the trio thread and
back at once (``portal.run_sync``); waits (``wait_ready``, ``form_group``,
``fetch``) block the calling thread with a timeout, or are awaited in asyncio
without blocking its loop.  State sync's ``share`` and ``unshare`` are thread
safe and run in the caller's thread (the payload is hashed there).

A service that declares no faces of its own gets :class:`SyncFace` and
:class:`AsyncioFace`, derived from its class: each public method, run on the
trio thread (a coroutine method awaited there, bounded by ``timeout``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from numbers import Real
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .averaging import (
    AllReduceConfig,
    AllReduceResult,
    AllReduceService,
    AllReduceStatistics,
    CapacityEstimate,
    Group,
    MatchmakingConfig,
    MatchmakingService,
    MatchmakingStatistics,
    average_round,
)
from .dht import DHTService, DHTStatistics, GroupPeer, Schema, ValueWithExpiration
from .errors import CallTimeoutError, NodeClosedError
from .membership import Member, MembershipService, MembershipStatistics, RevocationList, RunPolicy
from .net import parse_peer_id
from .progress import (
    GlobalProgress,
    PeerReport,
    ProgressService,
    ProgressStatistics,
    ProgressTracker,
    TrackerStatistics,
)
from .statesync import StateDownload, StateSyncConfig, StateSyncService, StateSyncStatistics

if TYPE_CHECKING:
    import torch
    from libp2p.peer.id import ID

    from ._portal import Portal
    from .dht import DHTConfig
    from .net import PeerIDLike

__all__ = ["SyncDHT", "AsyncioDHT", "SyncProgress", "SyncTracker", "AsyncioProgress",
           "AsyncioTracker", "SyncMatchmaking", "AsyncioMatchmaking", "SyncAllReduce",
           "AsyncioAllReduce", "SyncStateSync", "AsyncioStateSync", "SyncMembership",
           "AsyncioMembership", "SyncFace", "AsyncioFace", "DEFAULT_FACE_TIMEOUT"]

T = TypeVar("T")

#: Longest wait for a tracker to start or stop on the trio thread (s).
TRACKER_START_TIMEOUT = 30.0
#: A form_group call waits matchmaking_time plus this (s).
FORM_GROUP_SLACK = 10.0
#: A state-sync fetch from sync code waits its timeout plus this (s).
FETCH_SLACK = 10.0
#: A DHT operation from sync code waits its timeout plus this (s).
DHT_SLACK = 5.0
#: How long a derived face (:class:`SyncFace`, :class:`AsyncioFace`) waits
#: for a coroutine method unless the call passes ``timeout=`` (s).
DEFAULT_FACE_TIMEOUT = 120.0
#: What a derived face never shows: the node's own hooks into a service.
_LIFECYCLE = frozenset({"serve", "endpoints", "statistics_type"})


# -- derived faces ------------------------------------------------------------------


def _public(service: object, name: str) -> Any:
    """``service``'s public member ``name``, as its class declares it
    (AttributeError for private names, lifecycle hooks and unknown names)."""
    if name.startswith("_") or name in _LIFECYCLE:
        raise AttributeError(f"{type(service).__name__} shows no {name!r} on its face")
    try:
        return inspect.getattr_static(service, name)
    except AttributeError:
        raise AttributeError(f"{type(service).__name__} has no attribute {name!r}") from None


def _face_names(service: object) -> list[str]:
    return sorted(n for n in dir(type(service)) if not n.startswith("_") and n not in _LIFECYCLE)


def _bounded(call: Callable[[], Awaitable[T]], timeout: float | None,
             what: str) -> Callable[[], Awaitable[T]]:
    """``call()`` on the trio side, cancelled after ``timeout`` s (CallTimeoutError)."""
    async def run() -> T:
        if timeout is None:
            return await call()
        with trio.move_on_after(timeout):
            return await call()
        raise CallTimeoutError(f"{what} did not finish within {timeout} s")
    return run


class _DerivedFace:
    """What :class:`SyncFace` and :class:`AsyncioFace` share: the service's
    public members, each shown by kind (a coroutine method, another method,
    a property or attribute)."""

    def __init__(self, portal: Portal, service: object) -> None:
        self._portal = portal
        self._service = service

    def __getattr__(self, name: str) -> Any:
        member = _public(self._service, name)
        if inspect.iscoroutinefunction(member):
            call = self._coroutine(name, f"{type(self._service).__name__}.{name}")
        elif callable(member) and not isinstance(member, (property, type)):
            call = self._method(name)
        else:   # a property or an attribute: read on the trio thread
            return self._value(name)
        call.__name__ = name
        call.__doc__ = getattr(member, "__doc__", None)
        return call

    def _coroutine(self, name: str, what: str) -> Callable[..., Any]:
        raise NotImplementedError

    def _method(self, name: str) -> Callable[..., Any]:
        raise NotImplementedError

    def _value(self, name: str) -> Any:
        raise NotImplementedError

    def __dir__(self) -> list[str]:
        return _face_names(self._service)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {type(self._service).__name__}>"


class SyncFace(_DerivedFace):
    """The face of a service that declares none, for sync code: every public
    method of the service's class, run on the node's trio thread.

    A coroutine method (``async def``) blocks the caller until it returns,
    at most ``timeout`` seconds (a keyword the face takes, default
    DEFAULT_FACE_TIMEOUT; None: no limit), then is cancelled and raises
    :class:`~p2pdl.errors.CallTimeoutError`.  Any other method, and a
    property or attribute, is a short hop to the trio thread and back.
    Private names and the node's hooks (``serve``, ``endpoints``) are not
    shown.
    """

    def _coroutine(self, name: str, what: str) -> Callable[..., Any]:
        service, portal = self._service, self._portal

        def call(*args: Any, timeout: float | None = DEFAULT_FACE_TIMEOUT,
                 **kwargs: Any) -> Any:
            bound = getattr(service, name)
            return portal.run(_bounded(lambda: bound(*args, **kwargs), timeout, what),
                              None if timeout is None else timeout + DHT_SLACK)
        return call

    def _method(self, name: str) -> Callable[..., Any]:
        service, portal = self._service, self._portal

        def call(*args: Any, **kwargs: Any) -> Any:
            return portal.run_sync(lambda: getattr(service, name)(*args, **kwargs))
        return call

    def _value(self, name: str) -> Any:
        return self._portal.run_sync(getattr, self._service, name)


class AsyncioFace(_DerivedFace):
    """:class:`SyncFace` for asyncio: every call is awaited (the asyncio loop
    keeps running; cancelling the awaiting task cancels the call on the trio
    thread), a property or attribute too.  A coroutine method takes the same
    ``timeout`` keyword."""

    def _coroutine(self, name: str, what: str) -> Callable[..., Any]:
        service, portal = self._service, self._portal

        async def call(*args: Any, timeout: float | None = DEFAULT_FACE_TIMEOUT,
                       **kwargs: Any) -> Any:
            bound = getattr(service, name)
            return await portal.aio(_bounded(lambda: bound(*args, **kwargs), timeout, what))
        return call

    def _method(self, name: str) -> Callable[..., Any]:
        service, portal = self._service, self._portal

        async def call(*args: Any, **kwargs: Any) -> Any:
            async def hop() -> Any:
                return getattr(service, name)(*args, **kwargs)
            return await portal.aio(hop)
        return call

    def _value(self, name: str) -> Any:
        service, portal = self._service, self._portal

        async def read() -> Any:
            async def hop() -> Any:
                return getattr(service, name)
            return await portal.aio(hop)
        return read()


# -- membership ----------------------------------------------------------------------


class SyncMembership:
    """``node.membership`` of a sync :class:`~p2pdl.Node`: who may touch which run.

    See :class:`~p2pdl.membership.MembershipService`; reads hop to the trio
    thread and back at once, ``publish_revocations`` waits for the DHT
    (at most ``timeout`` s) or returns a future.
    """

    def __init__(self, portal: Portal, membership: MembershipService,
                 dht_timeout: float) -> None:
        self._portal = portal
        self._membership = membership
        self._dht_timeout = dht_timeout

    def runs(self) -> tuple[RunPolicy, ...]:
        return self._portal.run_sync(self._membership.runs)

    def members(self, run_id: str) -> dict[str, Member]:
        return self._portal.run_sync(self._membership.members, run_id)

    def add_run(self, policy: RunPolicy) -> None:
        self._portal.run_sync(self._membership.add_run, policy)

    def publish_revocations(self, revocations: RevocationList, *, timeout: float | None = None,
                            return_future: bool = False) -> Any:
        limit = self._dht_timeout if timeout is None else timeout
        return self._portal.run(lambda: self._membership.publish_revocations(revocations),
                                limit + DHT_SLACK, return_future=return_future)

    def statistics(self) -> MembershipStatistics:
        return self._portal.run_sync(self._membership.statistics)


class AsyncioMembership:
    """``node.aio.membership``: the same operations, awaitable from asyncio."""

    def __init__(self, portal: Portal, membership: MembershipService) -> None:
        self._portal = portal
        self._membership = membership

    async def _sync(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.to_thread(self._portal.run_sync, fn, *args)

    async def runs(self) -> tuple[RunPolicy, ...]:
        return await self._sync(self._membership.runs)

    async def members(self, run_id: str) -> dict[str, Member]:
        return await self._sync(self._membership.members, run_id)

    async def add_run(self, policy: RunPolicy) -> None:
        await self._sync(self._membership.add_run, policy)

    async def publish_revocations(self, revocations: RevocationList) -> bool:
        return await self._portal.aio(lambda: self._membership.publish_revocations(revocations))

    async def statistics(self) -> MembershipStatistics:
        return await self._sync(self._membership.statistics)


# -- the DHT -----------------------------------------------------------------------


def _dht_op(dht: DHTService, fn: Callable[[DHTService], Awaitable[T]],
            timeout: float | None) -> Callable[[], Awaitable[T]]:
    """``fn(dht)``, bounded by ``timeout`` on the trio side (CallTimeoutError)."""
    async def run() -> T:
        if timeout is None:
            return await fn(dht)
        with trio.move_on_after(timeout):
            return await fn(dht)
        raise CallTimeoutError(f"the DHT operation did not finish within {timeout} s")
    return run


class SyncDHT:
    """``node.dht`` of a sync :class:`~p2pdl.Node`: the DHT operations, blocking.

    Each method waits at most ``timeout`` seconds (default: the DHT's
    ``operation_timeout``) or, with ``return_future=True``, returns a
    :class:`concurrent.futures.Future` at once.  See :class:`DHTService`.
    """

    def __init__(self, portal: Portal, dht: DHTService, config: DHTConfig) -> None:
        self._portal = portal
        self._dht = dht
        self._config = config

    def _do(self, fn: Callable[[DHTService], Awaitable[T]], timeout: float | None,
            return_future: bool) -> Any:
        limit = self._config.operation_timeout if timeout is None else timeout
        return self._portal.run(_dht_op(self._dht, fn, timeout), limit + DHT_SLACK,
                                return_future=return_future)

    def store(self, key: str, value: Any, expiration_time: float, subkey: str | None = None, *,
              timeout: float | None = None, return_future: bool = False) -> Any:
        return self._do(lambda d: d.store(key, value, expiration_time, subkey), timeout,
                        return_future)

    def get(self, key: str, latest: bool = False, *, timeout: float | None = None,
            return_future: bool = False) -> Any:
        return self._do(lambda d: d.get(key, latest), timeout, return_future)

    def announce(self, group: str, expiration_time: float, *, timeout: float | None = None,
                 return_future: bool = False) -> Any:
        return self._do(lambda d: d.announce(group, expiration_time), timeout, return_future)

    def find_peers(self, group: str, *, timeout: float | None = None,
                   return_future: bool = False) -> Any:
        return self._do(lambda d: d.find_peers(group), timeout, return_future)

    def own_subkey(self, name: str = "") -> str:
        """This node's own signed subkey (no waiting: it is derived from the peer id)."""
        self._portal.check_open()
        return self._dht.own_subkey(name)

    def now(self) -> float:
        """The DHT's clock (wall-clock seconds)."""
        self._portal.check_open()
        return self._dht.now()

    def register_schema(self, schema: Schema) -> None:
        self._portal.run_sync(self._dht.register_schema, schema)

    def statistics(self) -> DHTStatistics:
        return self._portal.run_sync(self._dht.statistics)


class AsyncioDHT:
    """``node.aio.dht``: the DHT operations as asyncio coroutines."""

    def __init__(self, portal: Portal, dht: DHTService) -> None:
        self._portal = portal
        self._dht = dht

    async def _do(self, fn: Callable[[DHTService], Awaitable[T]], timeout: float | None) -> T:
        return await self._portal.aio(_dht_op(self._dht, fn, timeout))

    async def store(self, key: str, value: Any, expiration_time: float,
                    subkey: str | None = None, *, timeout: float | None = None) -> bool:
        return await self._do(lambda d: d.store(key, value, expiration_time, subkey), timeout)

    async def get(self, key: str, latest: bool = False, *,
                  timeout: float | None = None) -> ValueWithExpiration[Any] | None:
        return await self._do(lambda d: d.get(key, latest), timeout)

    async def announce(self, group: str, expiration_time: float, *,
                       timeout: float | None = None) -> bool:
        return await self._do(lambda d: d.announce(group, expiration_time), timeout)

    async def find_peers(self, group: str, *, timeout: float | None = None) -> list[GroupPeer]:
        return await self._do(lambda d: d.find_peers(group), timeout)

    def own_subkey(self, name: str = "") -> str:
        """This node's own signed subkey (no waiting: it is derived from the peer id)."""
        self._portal.check_open()
        return self._dht.own_subkey(name)

    def now(self) -> float:
        """The DHT's clock (wall-clock seconds)."""
        self._portal.check_open()
        return self._dht.now()

    async def register_schema(self, schema: Schema) -> None:
        await asyncio.to_thread(self._portal.run_sync, self._dht.register_schema, schema)

    async def statistics(self) -> DHTStatistics:
        return await asyncio.to_thread(self._portal.run_sync, self._dht.statistics)


# -- progress ----------------------------------------------------------------------


class SyncTracker:
    """A :class:`~p2pdl.progress.ProgressTracker` used from sync code.

    Get it from ``with node.progress.track(run_id, target) as tracker``.
    The methods are those of the trio tracker; ``wait_ready`` blocks.
    """

    def __init__(self, portal: Portal, progress: ProgressService, run_id: str,
                 target_batch_size: int, options: dict[str, Any]) -> None:
        self._portal = portal
        self._tracker: ProgressTracker | None = None
        self._stop: trio.Event | None = None
        started = threading.Event()

        async def hold() -> None:
            self._stop = trio.Event()
            async with progress.track(run_id, target_batch_size, **options) as tracker:
                self._tracker = tracker
                started.set()
                await self._stop.wait()

        self._future = portal.submit(hold)
        for _ in range(int(TRACKER_START_TIMEOUT / 0.05)):
            if started.wait(0.05):
                return
            if self._future.done():
                self._future.result()  # raises what track() raised (ConfigError...)
                raise NodeClosedError("the tracker stopped before it started")
        self._future.cancel()
        raise CallTimeoutError(f"the tracker did not start within {TRACKER_START_TIMEOUT:.0f} s")

    def _on_trio(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._tracker is None or self._future.done():
            raise NodeClosedError("the tracker is closed")
        return self._portal.run_sync(lambda: fn(*args, **kwargs))

    def _live_tracker(self) -> ProgressTracker:
        if self._tracker is None:
            raise NodeClosedError("the tracker is closed")
        return self._tracker

    @property
    def run_id(self) -> str:
        return self._live_tracker().run_id

    @property
    def local_epoch(self) -> int:
        return self._on_trio(lambda: self._live_tracker().local_epoch)

    @property
    def samples_accumulated(self) -> int:
        return self._on_trio(lambda: self._live_tracker().samples_accumulated)

    @property
    def ready_to_step(self) -> bool:
        return self.global_progress().ready_to_step

    def report(self, samples_accumulated: int, epoch: int | None = None, *,
               samples_per_second: float | None = None, loss: float | None = None,
               last_round: tuple | None = None) -> None:
        self._on_trio(self._live_tracker().report, samples_accumulated, epoch,
                      samples_per_second=samples_per_second, loss=loss, last_round=last_round)

    def update_epoch(self, epoch: int | None = None, *,
                     last_round: tuple | None = None) -> int:
        return self._on_trio(functools.partial(self._live_tracker().update_epoch,
                                               last_round=last_round), epoch)

    def publish_now(self) -> None:
        """Sign and push a fresh report now (the evidence behind an averaging weight)."""
        self._on_trio(self._live_tracker().publish_now)

    def reported_samples(self, peer: PeerIDLike, epoch: int) -> int:
        """The largest sample count ``peer``'s accepted signed reports gave for ``epoch``."""
        return self._on_trio(self._live_tracker().reported_samples, parse_peer_id(peer), epoch)

    def global_progress(self) -> GlobalProgress:
        return self._on_trio(self._live_tracker().global_progress)

    def peers(self) -> list[PeerReport]:
        return self._on_trio(self._live_tracker().peers)

    def statistics(self) -> TrackerStatistics:
        return self._on_trio(self._live_tracker().statistics)

    def wait_ready(self, timeout: float) -> GlobalProgress:
        """Block until this peer is ready to step (``CallTimeoutError`` after ``timeout`` s)."""
        tracker = self._live_tracker()
        return self._portal.run(lambda: tracker.wait_ready(timeout), timeout + 5.0)

    async def _wait_ready_aio(self, timeout: float) -> GlobalProgress:
        tracker = self._live_tracker()
        return await self._portal.aio(lambda: tracker.wait_ready(timeout))

    def close(self) -> None:
        """Stop tracking (idempotent).  Also done by leaving the ``with`` block."""
        if self._stop is not None and not self._future.done():
            try:
                self._portal.run_sync(self._stop.set)
            except NodeClosedError:
                return
        try:
            self._future.result(TRACKER_START_TIMEOUT)
        except (NodeClosedError, concurrent.futures.CancelledError):
            pass

    def __enter__(self) -> SyncTracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncProgress:
    """``node.progress`` of a sync :class:`~p2pdl.Node`."""

    def __init__(self, portal: Portal, progress: ProgressService) -> None:
        self._portal = portal
        self._progress = progress

    def track(self, run_id: str, target_batch_size: int, **options: Any) -> SyncTracker:
        """Start tracking ``run_id``; use the result in a ``with`` block.

        ``options`` are those of :meth:`ProgressService.track` (``auxiliary``,
        ``client_mode``, ``config``).
        """
        return SyncTracker(self._portal, self._progress, run_id, target_batch_size, options)

    def statistics(self) -> ProgressStatistics:
        return self._portal.run_sync(self._progress.statistics)


class AsyncioTracker:
    """A progress tracker for asyncio code (``async with node.aio.progress.track(...)``).

    The short calls are those of :class:`SyncTracker`; ``wait_ready`` is awaited.
    """

    def __init__(self, sync: SyncTracker) -> None:
        self._sync = sync
        self.report = sync.report
        self.update_epoch = sync.update_epoch
        self.publish_now = sync.publish_now
        self.reported_samples = sync.reported_samples
        self.global_progress = sync.global_progress
        self.peers = sync.peers
        self.statistics = sync.statistics

    @property
    def ready_to_step(self) -> bool:
        return self._sync.ready_to_step

    @property
    def local_epoch(self) -> int:
        return self._sync.local_epoch

    @property
    def samples_accumulated(self) -> int:
        return self._sync.samples_accumulated

    async def wait_ready(self, timeout: float) -> GlobalProgress:
        return await self._sync._wait_ready_aio(timeout)


class AsyncioProgress:
    """``node.aio.progress``."""

    def __init__(self, portal: Portal, progress: ProgressService) -> None:
        self._portal = portal
        self._progress = progress

    @asynccontextmanager
    async def track(self, run_id: str, target_batch_size: int,
                    **options: Any) -> AsyncIterator[AsyncioTracker]:
        sync = await asyncio.to_thread(SyncTracker, self._portal, self._progress, run_id,
                                       target_batch_size, options)
        try:
            yield AsyncioTracker(sync)
        finally:
            await asyncio.to_thread(sync.close)

    async def statistics(self) -> ProgressStatistics:
        return await asyncio.to_thread(self._portal.run_sync, self._progress.statistics)


# -- matchmaking and averaging -----------------------------------------------------------


def _round_limit(matchmaking: MatchmakingConfig, allreduce: AllReduceConfig,
                 options: dict[str, Any]) -> float:
    """How long one form_group + all_reduce may take, from sync code."""
    mm_time = options.get("matchmaking_time") or matchmaking.matchmaking_time
    config = options.get("config") or allreduce
    return mm_time + config.averaging_timeout + 2 * FORM_GROUP_SLACK


class SyncMatchmaking:
    """``node.matchmaking`` of a sync :class:`~p2pdl.Node`."""

    def __init__(self, portal: Portal, matchmaking: MatchmakingService) -> None:
        self._portal = portal
        self._matchmaking = matchmaking

    def form_group(self, run_id: str, epoch: int, **options: Any) -> Group:
        """Block until this peer is in a group (see :meth:`MatchmakingService.form_group`).

        Raises :class:`~p2pdl.MatchmakingFailedError` as the trio call does.
        """
        limit = options.get("matchmaking_time") or self._matchmaking.config.matchmaking_time
        return self._portal.run(lambda: self._matchmaking.form_group(run_id, epoch, **options),
                                limit + FORM_GROUP_SLACK)

    def statistics(self) -> MatchmakingStatistics:
        return self._portal.run_sync(self._matchmaking.statistics)


class AsyncioMatchmaking:
    """``node.aio.matchmaking``."""

    def __init__(self, portal: Portal, matchmaking: MatchmakingService) -> None:
        self._portal = portal
        self._matchmaking = matchmaking

    async def form_group(self, run_id: str, epoch: int, **options: Any) -> Group:
        return await self._portal.aio(lambda: self._matchmaking.form_group(run_id, epoch,
                                                                           **options))


class SyncAllReduce:
    """``node.allreduce`` of a sync :class:`~p2pdl.Node`.

    ``all_reduce`` averages with a group from matchmaking; ``start_round``
    does both steps of a round (form a group, average) in the node's thread
    and returns a :class:`concurrent.futures.Future` at once -- what
    :class:`~p2pdl.Optimizer` runs every epoch.
    """

    def __init__(self, portal: Portal, allreduce: AllReduceService,
                 matchmaking: MatchmakingService) -> None:
        self._portal = portal
        self._allreduce = allreduce
        self._matchmaking = matchmaking

    @property
    def config(self) -> AllReduceConfig:
        """The node's all-reduce settings (those a call without ``config`` uses)."""
        return self._allreduce.config

    def all_reduce(self, group: Group, tensors: Sequence[torch.Tensor], **options: Any
                   ) -> AllReduceResult:
        """Block until the all-reduce ends (see :meth:`AllReduceService.all_reduce`).

        It lasts at most the config's ``averaging_timeout`` (plus a margin);
        the tensors are read and, with ``inplace=True``, written in the
        node's thread, so leave them alone until it returns.
        """
        config = options.get("config") or self._allreduce.config
        return self._portal.run(lambda: self._allreduce.all_reduce(group, tensors, **options),
                                config.averaging_timeout + FORM_GROUP_SLACK)

    def start_round(self, run_id: str, epoch: int, tensors: Sequence[torch.Tensor], *,
                    weight: float, **options: Any
                    ) -> concurrent.futures.Future[AllReduceResult]:
        """Start one round -- form a group for ``epoch`` of ``run_id``, then all-reduce
        ``tensors`` with it -- and return its future at once.

        ``options`` are those of :func:`~p2pdl.averaging.average_round`
        (``config``, ``inplace``, ``on_group`` and the ``form_group`` options).
        The tensors are read (and, with ``inplace=True``, written) in the
        node's thread until the future is done.  The future fails with
        :class:`~p2pdl.MatchmakingFailedError` when no group formed; cancelling
        it cancels the round.
        """
        return self._portal.submit(lambda: average_round(
            self._matchmaking, self._allreduce, run_id, epoch, tensors, weight=weight,
            **options))

    def round_limit(self, **options: Any) -> float:
        """The longest a round started with these ``options`` can take (s), margins included."""
        return _round_limit(self._matchmaking.config, self._allreduce.config, options)

    def statistics(self) -> AllReduceStatistics:
        return self._portal.run_sync(self._allreduce.statistics)

    def capacity(self) -> CapacityEstimate:
        """This node's rates as its rounds measured them (docs/allreduce.md)."""
        return self._portal.run_sync(self._allreduce.capacity)


class AsyncioAllReduce:
    """``node.aio.allreduce``."""

    def __init__(self, portal: Portal, allreduce: AllReduceService,
                 matchmaking: MatchmakingService) -> None:
        self._portal = portal
        self._allreduce = allreduce
        self._matchmaking = matchmaking

    async def all_reduce(self, group: Group, tensors: Sequence[torch.Tensor],
                         **options: Any) -> AllReduceResult:
        return await self._portal.aio(lambda: self._allreduce.all_reduce(group, tensors,
                                                                         **options))

    async def round(self, run_id: str, epoch: int, tensors: Sequence[torch.Tensor], *,
                    weight: float, **options: Any) -> AllReduceResult:
        """One round (form a group, then average): see :meth:`SyncAllReduce.start_round`."""
        return await self._portal.aio(lambda: average_round(
            self._matchmaking, self._allreduce, run_id, epoch, tensors, weight=weight,
            **options))


# -- state sync --------------------------------------------------------------------


class SyncStateSync:
    """``node.statesync`` of a sync :class:`~p2pdl.Node`.

    ``share`` and ``unshare`` call the trio service's thread-safe methods in
    the calling thread (the manifest is hashed there); ``fetch`` blocks until
    the download ends (see :meth:`StateSyncService.fetch`).
    """

    def __init__(self, portal: Portal, state_sync: StateSyncService) -> None:
        self._portal = portal
        self._state_sync = state_sync

    @property
    def config(self) -> StateSyncConfig:
        return self._state_sync.config

    def share(self, run_id: str, epoch: int, payload: bytes) -> None:
        self._portal.check_open()
        self._state_sync.share(run_id, epoch, payload)

    def unshare(self, run_id: str) -> None:
        self._portal.check_open()
        self._state_sync.unshare(run_id)

    def fetch(self, run_id: str, donors: Sequence[PeerIDLike], *, min_epoch: int = 0,
              max_epoch: int | None = None, timeout: float | None = None,
              digest: bytes | None = None) -> StateDownload:
        """Block until the state is downloaded (at most ``timeout`` s, default
        ``fetch_timeout``).  Raises what the trio call raises."""
        donors = _listed(donors)
        limit = timeout if isinstance(timeout, Real) and not isinstance(timeout, bool) \
            else self._state_sync.config.fetch_timeout
        wait = float(limit) + FETCH_SLACK if math.isfinite(limit) else None
        return self._portal.run(lambda: self._state_sync.fetch(
            run_id, donors, min_epoch=min_epoch, max_epoch=max_epoch, timeout=timeout,
            digest=digest), wait)

    def offers(self, run_id: str, donors: Sequence[PeerIDLike]) -> dict[ID, tuple[int, bytes]]:
        """Block until every donor said what it offers (see :meth:`StateSyncService.offers`)."""
        donors = _listed(donors)
        wait = self._state_sync.config.request_timeout + FETCH_SLACK
        return self._portal.run(lambda: self._state_sync.offers(run_id, donors), wait)

    def statistics(self) -> StateSyncStatistics:
        return self._portal.run_sync(self._state_sync.statistics)


class AsyncioStateSync:
    """``node.aio.statesync``: ``fetch`` awaited; ``share`` and ``unshare`` as in sync code
    (they hash in the calling thread: share large payloads with ``asyncio.to_thread``)."""

    def __init__(self, portal: Portal, state_sync: StateSyncService) -> None:
        self._portal = portal
        self._state_sync = state_sync

    def share(self, run_id: str, epoch: int, payload: bytes) -> None:
        self._portal.check_open()
        self._state_sync.share(run_id, epoch, payload)

    def unshare(self, run_id: str) -> None:
        self._portal.check_open()
        self._state_sync.unshare(run_id)

    async def fetch(self, run_id: str, donors: Sequence[PeerIDLike], *, min_epoch: int = 0,
                    max_epoch: int | None = None, timeout: float | None = None,
                    digest: bytes | None = None) -> StateDownload:
        donors = _listed(donors)
        return await self._portal.aio(lambda: self._state_sync.fetch(
            run_id, donors, min_epoch=min_epoch, max_epoch=max_epoch, timeout=timeout,
            digest=digest))

    async def offers(self, run_id: str, donors: Sequence[PeerIDLike]
                     ) -> dict[ID, tuple[int, bytes]]:
        donors = _listed(donors)
        return await self._portal.aio(lambda: self._state_sync.offers(run_id, donors))

    async def statistics(self) -> StateSyncStatistics:
        return await asyncio.to_thread(self._portal.run_sync, self._state_sync.statistics)


def _listed(donors: Any) -> Any:
    """``donors`` as a list, read in the caller's thread (a non-sequence is left for
    the service to refuse with a clear ConfigError)."""
    if isinstance(donors, str):
        return donors
    try:
        return list(donors)
    except TypeError:
        return donors
