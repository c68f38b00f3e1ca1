"""The state-sync service of a node (``node.statesync``): share snapshots, fetch them.

A training peer that joins late or falls an epoch behind downloads the
training state (already serialized by the caller into one ``bytes``
payload) from peers at the newest epoch:

* **donor** -- :meth:`StateSyncService.share` keeps the newest
  ``keep_snapshots`` payloads of a run with their manifests (thread safe:
  the sync Node's user thread calls it while the trio thread serves); the
  handler answers ``ss.get_manifest`` and ``ss.get_chunk`` from them and
  refuses ``busy`` while ``max_concurrent_uploads`` chunk replies wait to be
  written.
* **fetcher** -- :meth:`StateSyncService.fetch` asks every donor for its
  manifest (in parallel, bounded), takes the state the donors of one epoch
  agree on (``vote_on_state``: at least ``min_agreeing_donors`` and a
  majority of that epoch's; the newest such epoch up to ``max_epoch``), and
  downloads the chunks from all donors offering it at once, verifying each
  one; failed chunks are asked of another donor.  Verified chunks of an
  unfinished download stay here, so a later fetch of the same state resumes.
  Donors caught lying -- an epoch past ``max_epoch``, a state that lost the
  vote, chunks or a payload that do not match their offer -- are flagged in
  the node's :class:`~p2pdl.service.FlagBook` and not used again at that
  epoch of the run (``Exclusions``).

Every stream this service opens goes through ``context.call``, which
introduces this node to the peer in the run by itself.

The logic is in ``_state`` (sans-IO); the donor side is ``_donor``, the
fetcher side ``_fetcher``; this module composes them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading

import trio
from libp2p.peer.id import ID

from ..errors import (
    ConfigError,
)
from ..service import (
    RpcEndpoint,
    ServiceContext,
    Statistics,
    run_of_request,
    serve_nothing,
)
from ..wire import FramedStream
from ._donor import _DonorSide
from ._downloads import (
    PartialStore,
)
from ._fetcher import StateDownload, _FetcherSide
from ._messages import (
    STATESYNC_PROTOCOL,
)
from ._snapshots import (
    SnapshotTable,
)
from ._state import (
    Exclusions,
)
from .config import EXCLUDED_EPOCHS_PER_RUN, StateSyncConfig

__all__ = ["StateSyncService", "StateSyncStatistics", "StateDownload", "STATESYNC_COUNTERS"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class StateSyncStatistics(Statistics):
    """What ``StateSyncService.statistics()`` says: the runs shared, the unfinished
    downloads kept, the uploads in flight, and counters (every one present, from 0)."""

    runs: list[str]
    partial_downloads: int
    partial_bytes: int
    fetching: list[str]
    uploads_in_flight: int
    # the donor
    shared: int = 0
    unshared: int = 0
    snapshots_dropped: int = 0
    manifests_served: int = 0
    chunks_served: int = 0
    bytes_served: int = 0
    busy_refusals: int = 0
    refusals: int = 0
    # the fetcher
    fetches: int = 0
    fetches_completed: int = 0
    fetches_failed: int = 0
    manifest_requests: int = 0
    bad_manifests: int = 0
    chunks_fetched: int = 0
    bytes_fetched: int = 0
    chunk_failures: int = 0
    bad_chunks: int = 0
    busy_answers: int = 0
    gone_answers: int = 0
    resumed_chunks: int = 0
    donors_dropped: int = 0
    votes_failed: int = 0
    lone_donor_fetches: int = 0
    donors_flagged: int = 0
    offers_excluded: int = 0


#: The counters of :meth:`StateSyncService.statistics`.
STATESYNC_COUNTERS = StateSyncStatistics.counter_names()


class StateSyncService(_DonorSide, _FetcherSide):
    """Shares this node's training state and downloads others' (``node.statesync``)."""

    def __init__(self, context: ServiceContext, config: StateSyncConfig | None = None
                 ) -> None:
        host, call, wire = context.host, context.call, context.wire
        self.config = config or StateSyncConfig()
        need = max(self.config.manifest_message_bound(), self.config.chunk_message_bound())
        if need > wire.max_message_size:
            raise ConfigError(f"StateSyncConfig needs messages of up to {need} bytes, above the "
                              f"wire's max_message_size ({wire.max_message_size}): lower "
                              f"max_state_bytes or chunk_size")
        self._host = host
        self._call = call
        self._wire = wire
        self._flags = context.flags
        self._clock = context.clock
        self._excluded: Exclusions[ID] = Exclusions(
            self.config.max_runs * EXCLUDED_EPOCHS_PER_RUN, self.config.max_donors)
        # share/unshare/statistics may run on any thread; the rest on the trio thread.
        self._lock = threading.Lock()
        self._table = SnapshotTable(self.config.keep_snapshots, self.config.max_runs)
        self._partials = PartialStore(self.config.max_state_bytes, self.config.max_runs)
        self._fetching: set[str] = set()
        # Serving streams -> replies handed to the wire on each: those not yet
        # written (handed minus frames sent) are the uploads in flight.
        self._streams: dict[FramedStream, int] = {}
        self._counters = dict.fromkeys(STATESYNC_COUNTERS, 0)

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counters[name] += n

    def statistics(self) -> StateSyncStatistics:
        """The runs shared, the unfinished downloads kept, the uploads in flight, and
        counters: :class:`StateSyncStatistics`."""
        with self._lock:
            counters = dict(self._counters)
            runs = self._table.runs()
        return StateSyncStatistics(runs, len(self._partials), self._partials.nbytes,
                                   sorted(self._fetching), self.uploads_in_flight(),
                                   **counters)

    def endpoints(self) -> list[RpcEndpoint]:
        """``/p2pdl/statesync/1.0.0``: run-scoped, each request names its run; served
        through this service's own stream loop, which sees the replies each
        stream still has to write (``max_concurrent_uploads``)."""
        return [RpcEndpoint(STATESYNC_PROTOCOL, self._answer_request, run_id_of=run_of_request,
                            serve_stream=self._serve_stream)]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """No background work: fetches run in the caller's task."""
        await serve_nothing(task_status)
