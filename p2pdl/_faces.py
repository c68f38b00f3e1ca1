"""Progress, matchmaking, averaging and state sync for sync and asyncio code
(``Node.progress``, ``node.aio.progress``, ``Node.state_sync``...).

The trio objects live on the node's trio thread; these faces call them
there.  A tracker's short calls (``report``, ``global_progress``) hop to the
trio thread and back at once; waits (``wait_ready``, ``form_group``) block
the calling thread, or await in asyncio, with a timeout.  State sync's
``share`` and ``unshare`` are thread safe and run in the caller's thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from numbers import Real
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from .averaging import AllReduceResult, Group
from .errors import CallTimeoutError, NodeClosedError
from .progress import GlobalProgress, PeerReport, ProgressTracker

if TYPE_CHECKING:
    import torch
    from libp2p.peer.id import ID

    from ._node import AsyncioNode, Node
    from .net._addrs import PeerIDLike
    from .statesync import StateDownload

__all__ = ["SyncProgress", "SyncTracker", "SyncMatchmaking", "AsyncioProgress",
           "AsyncioTracker", "AsyncioMatchmaking", "SyncAveraging", "AsyncioAveraging",
           "SyncStateSync", "AsyncioStateSync"]

T = TypeVar("T")

#: Longest wait for a tracker to start or stop on the trio thread (s).
TRACKER_START_TIMEOUT = 30.0
#: A form_group call waits matchmaking_time plus this (s).
FORM_GROUP_SLACK = 10.0
#: A state-sync fetch from sync code waits its timeout plus this (s).
FETCH_SLACK = 10.0


class SyncTracker:
    """A :class:`~p2pdl.progress.ProgressTracker` used from sync code.

    Get it from ``with node.progress.track(run_id, target) as tracker``.
    The methods are those of the trio tracker; ``wait_ready`` blocks.
    """

    def __init__(self, node: Node, run_id: str, target_batch_size: int,
                 options: dict[str, Any]) -> None:
        self._node = node
        self._tracker: ProgressTracker | None = None
        self._stop: trio.Event | None = None
        started = threading.Event()

        async def hold(trio_node: Any) -> None:
            self._stop = trio.Event()
            async with trio_node.progress.track(run_id, target_batch_size, **options) as tracker:
                self._tracker = tracker
                started.set()
                await self._stop.wait()

        self._future = node._submit(hold)
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
        try:
            return trio.from_thread.run_sync(lambda: fn(*args, **kwargs),
                                             trio_token=self._node._token)
        except trio.RunFinishedError:
            raise NodeClosedError("the node is shut down") from None

    @property
    def run_id(self) -> str:
        assert self._tracker is not None
        return self._tracker.run_id

    @property
    def local_epoch(self) -> int:
        return self._on_trio(lambda: self._tracker.local_epoch)  # type: ignore[union-attr]

    @property
    def samples_accumulated(self) -> int:
        return self._on_trio(lambda: self._tracker.samples_accumulated)  # type: ignore[union-attr]

    @property
    def ready_to_step(self) -> bool:
        return self.global_progress().ready_to_step

    def report(self, samples_accumulated: int, epoch: int | None = None, *,
               samples_per_second: float | None = None) -> None:
        assert self._tracker is not None
        self._on_trio(self._tracker.report, samples_accumulated, epoch,
                      samples_per_second=samples_per_second)

    def update_epoch(self, epoch: int | None = None) -> int:
        assert self._tracker is not None
        return self._on_trio(self._tracker.update_epoch, epoch)

    def global_progress(self) -> GlobalProgress:
        assert self._tracker is not None
        return self._on_trio(self._tracker.global_progress)

    def peers(self) -> list[PeerReport]:
        assert self._tracker is not None
        return self._on_trio(self._tracker.peers)

    def statistics(self) -> dict[str, Any]:
        assert self._tracker is not None
        return self._on_trio(self._tracker.statistics)

    def wait_ready(self, timeout: float) -> GlobalProgress:
        """Block until this peer is ready to step (``CallTimeoutError`` after ``timeout`` s)."""
        tracker = self._tracker
        assert tracker is not None
        return self._node._run(lambda n: tracker.wait_ready(timeout), timeout + 5.0, False)

    def close(self) -> None:
        """Stop tracking (idempotent).  Also done by leaving the ``with`` block."""
        if self._stop is not None and not self._future.done():
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._node._token)
            except trio.RunFinishedError:
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

    def __init__(self, node: Node) -> None:
        self._node = node

    def track(self, run_id: str, target_batch_size: int, **options: Any) -> SyncTracker:
        """Start tracking ``run_id``; use the result in a ``with`` block.

        ``options`` are those of :meth:`ProgressService.track` (``auxiliary``,
        ``client_mode``, ``config``).
        """
        return SyncTracker(self._node, run_id, target_batch_size, options)

    def statistics(self) -> dict[str, Any]:
        return self._node._run(_async(lambda n: n.progress.statistics()), 10.0, False)


class SyncMatchmaking:
    """``node.matchmaking`` of a sync :class:`~p2pdl.Node`."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def form_group(self, run_id: str, epoch: int, **options: Any) -> Group:
        """Block until this peer is in a group (see :meth:`MatchmakingService.form_group`).

        Raises :class:`~p2pdl.MatchmakingFailedError` as the trio call does.
        """
        limit = options.get("matchmaking_time") or self._node.config.matchmaking.matchmaking_time
        return self._node._run(lambda n: n.matchmaking.form_group(run_id, epoch, **options),
                               limit + FORM_GROUP_SLACK, False)

    def statistics(self) -> dict[str, Any]:
        return self._node._run(_async(lambda n: n.matchmaking.statistics()), 10.0, False)


class SyncAveraging:
    """``node.averaging`` of a sync :class:`~p2pdl.Node`."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def all_reduce(self, group: Group, tensors: Sequence[torch.Tensor], **options: Any
                   ) -> AllReduceResult:
        """Block until the all-reduce ends (see :meth:`AllReduceService.all_reduce`).

        It lasts at most the config's ``averaging_timeout`` (plus a margin);
        the tensors are read and, with ``inplace=True``, written in the
        node's thread, so leave them alone until it returns.
        """
        config = options.get("config") or self._node.config.allreduce
        return self._node._run(lambda n: n.averaging.all_reduce(group, tensors, **options),
                               config.averaging_timeout + FORM_GROUP_SLACK, False)

    def statistics(self) -> dict[str, Any]:
        return self._node._run(_async(lambda n: n.averaging.statistics()), 10.0, False)


class SyncStateSync:
    """``node.state_sync`` of a sync :class:`~p2pdl.Node`.

    ``share`` and ``unshare`` call the trio service's thread-safe methods in
    the calling thread (the manifest is hashed there); ``fetch`` blocks until
    the download ends (see :meth:`StateSyncService.fetch`).
    """

    def __init__(self, node: Node) -> None:
        self._node = node

    def share(self, run_id: str, epoch: int, payload: bytes) -> None:
        self._node._live().state_sync.share(run_id, epoch, payload)

    def unshare(self, run_id: str) -> None:
        self._node._live().state_sync.unshare(run_id)

    def fetch(self, run_id: str, donors: Sequence[PeerIDLike], *, min_epoch: int = 0,
              timeout: float | None = None, digest: bytes | None = None) -> StateDownload:
        """Block until the state is downloaded (at most ``timeout`` s, default
        ``fetch_timeout``).  Raises what the trio call raises."""
        donors = _listed(donors)
        limit = timeout if isinstance(timeout, Real) and not isinstance(timeout, bool) \
            else self._node.config.state_sync.fetch_timeout
        wait = float(limit) + FETCH_SLACK if math.isfinite(limit) else None
        return self._node._run(lambda n: n.state_sync.fetch(run_id, donors, min_epoch=min_epoch,
                                                            timeout=timeout, digest=digest),
                               wait, False)

    def offers(self, run_id: str, donors: Sequence[PeerIDLike]) -> dict[ID, tuple[int, bytes]]:
        """Block until every donor said what it offers (see :meth:`StateSyncService.offers`)."""
        donors = _listed(donors)
        wait = self._node.config.state_sync.request_timeout + FETCH_SLACK
        return self._node._run(lambda n: n.state_sync.offers(run_id, donors), wait, False)

    def statistics(self) -> dict[str, Any]:
        return self._node._run(_async(lambda n: n.state_sync.statistics()), 10.0, False)


class AsyncioTracker:
    """A progress tracker for asyncio code (``async with node.aio.progress.track(...)``).

    The short calls are those of :class:`SyncTracker`; ``wait_ready`` is awaited.
    """

    def __init__(self, sync: SyncTracker) -> None:
        self._sync = sync
        self.report = sync.report
        self.update_epoch = sync.update_epoch
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
        tracker = self._sync._tracker
        assert tracker is not None
        return await asyncio.wrap_future(
            self._sync._node._submit(lambda n: tracker.wait_ready(timeout)))


class AsyncioProgress:
    """``node.aio.progress``."""

    def __init__(self, aio: AsyncioNode) -> None:
        self._aio = aio

    @asynccontextmanager
    async def track(self, run_id: str, target_batch_size: int,
                    **options: Any) -> AsyncIterator[AsyncioTracker]:
        sync = await asyncio.to_thread(SyncTracker, self._aio._node, run_id, target_batch_size,
                                       options)
        try:
            yield AsyncioTracker(sync)
        finally:
            await asyncio.to_thread(sync.close)


class AsyncioMatchmaking:
    """``node.aio.matchmaking``."""

    def __init__(self, aio: AsyncioNode) -> None:
        self._aio = aio

    async def form_group(self, run_id: str, epoch: int, **options: Any) -> Group:
        return await self._aio._await(lambda n: n.matchmaking.form_group(run_id, epoch,
                                                                         **options))


class AsyncioAveraging:
    """``node.aio.averaging``."""

    def __init__(self, aio: AsyncioNode) -> None:
        self._aio = aio

    async def all_reduce(self, group: Group, tensors: Sequence[torch.Tensor],
                         **options: Any) -> AllReduceResult:
        return await self._aio._await(lambda n: n.averaging.all_reduce(group, tensors,
                                                                       **options))


def _async(fn: Callable[[Any], T]) -> Callable[[Any], Any]:
    async def run(node: Any) -> T:
        return fn(node)
    return run


class AsyncioStateSync:
    """``node.aio.state_sync``: ``fetch`` awaited; ``share`` and ``unshare`` as in sync code
    (they hash in the calling thread: share large payloads with ``asyncio.to_thread``)."""

    def __init__(self, aio: AsyncioNode) -> None:
        self._aio = aio

    def share(self, run_id: str, epoch: int, payload: bytes) -> None:
        self._aio._node._live().state_sync.share(run_id, epoch, payload)

    def unshare(self, run_id: str) -> None:
        self._aio._node._live().state_sync.unshare(run_id)

    async def fetch(self, run_id: str, donors: Sequence[PeerIDLike], *, min_epoch: int = 0,
                    timeout: float | None = None, digest: bytes | None = None
                    ) -> StateDownload:
        donors = _listed(donors)
        return await self._aio._await(lambda n: n.state_sync.fetch(run_id, donors,
                                                                   min_epoch=min_epoch,
                                                                   timeout=timeout,
                                                                   digest=digest))

    async def offers(self, run_id: str, donors: Sequence[PeerIDLike]
                     ) -> dict[ID, tuple[int, bytes]]:
        donors = _listed(donors)
        return await self._aio._await(lambda n: n.state_sync.offers(run_id, donors))

    async def statistics(self) -> dict[str, Any]:
        return await self._aio._await(_async(lambda n: n.state_sync.statistics()))


def _listed(donors: Any) -> Any:
    """``donors`` as a list, read in the caller's thread (a non-sequence is left for
    the service to refuse with a clear ConfigError)."""
    if isinstance(donors, str):
        return donors
    try:
        return list(donors)
    except TypeError:
        return donors
