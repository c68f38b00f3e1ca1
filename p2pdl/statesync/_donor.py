"""The donor side of the state-sync service (``_service``): share snapshots
and answer fetchers' ``ss.get_manifest`` and ``ss.get_chunk`` from them.

:class:`_DonorSide` is a part of :class:`~p2pdl.statesync.StateSyncService`,
which holds the state its methods use (``_lock``, ``_table``, ``_streams``,
``_counters``, ``config``); the sans-IO logic is ``_state``'s.
"""

from __future__ import annotations

import logging

from ..errors import (
    ConfigError,
    RemoteProtocolError,
)
from ..service import (
    check_run_id,
)
from ..wire import FramedStream, Message, RequestContext, RpcHandler, serve_rpc_stream
from ._messages import (
    STATESYNC_PROTOCOL,
    ChunkReply,
    GetChunk,
    GetManifest,
    ManifestReply,
    Refused,
)
from ._snapshots import (
    Snapshot,
)
from ._state import (
    Manifest,
)
from .config import DIGEST_SIZE, MAX_EPOCH

__all__ = ["_DonorSide"]

logger = logging.getLogger(__name__)


class _DonorSide:
    """Sharing and serving snapshots: a part of :class:`StateSyncService`."""


    def share(self, run_id: str, epoch: int, payload: bytes) -> None:
        """Offer ``payload``, the state of ``run_id`` at ``epoch``, to fetchers.

        Safe to call from any thread; the manifest is hashed in the caller's
        thread.  The newest ``keep_snapshots`` snapshots of the run are kept
        (downloads of the previous one can finish); sharing the same epoch
        again replaces the newest.  The payload is kept as given, not copied
        (a ``bytearray`` or ``memoryview`` is copied once); do not change it.

        Raises :class:`ConfigError` for a bad run id or epoch, an empty
        payload or one over ``max_state_bytes``, an epoch behind the one
        shared, or a new run beyond ``max_runs``.
        """
        check_run_id(run_id)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch <= MAX_EPOCH:
            raise ConfigError(f"epoch must be an integer in 0..{MAX_EPOCH}, got {epoch!r}")
        if isinstance(payload, (bytearray, memoryview)):
            payload = bytes(payload)
        if not isinstance(payload, bytes):
            raise ConfigError(f"payload must be bytes, got {type(payload).__name__}")
        if not 1 <= len(payload) <= self.config.max_state_bytes:
            raise ConfigError(f"payload of {len(payload)} bytes: it must have 1 to "
                              f"{self.config.max_state_bytes} bytes (max_state_bytes)")
        with self._lock:
            self._table.check_share(run_id, epoch)  # before hashing: fail fast
        manifest = Manifest.build(epoch, payload, self.config.chunk_size)
        with self._lock:
            dropped = self._table.add(Snapshot(run_id, manifest, payload))
            self._counters["shared"] += 1
            self._counters["snapshots_dropped"] += len(dropped)

    def unshare(self, run_id: str) -> None:
        """Stop offering any state of ``run_id`` (thread safe, idempotent).

        Fetchers then get ``gone`` for chunks and ``unknown_run`` for manifests.
        """
        with self._lock:
            if self._table.remove(run_id):
                self._counters["unshared"] += 1

    def shared_epoch(self, run_id: str) -> int | None:
        """The epoch of the newest shared snapshot of ``run_id`` (None: none)."""
        with self._lock:
            snapshot = self._table.newest(run_id)
        return None if snapshot is None else snapshot.manifest.epoch

    async def _answer_request(self, ctx: RequestContext, request: Message) -> Message:
        return self._answer(ctx, request)

    async def _serve_stream(self, stream: FramedStream, handler: RpcHandler) -> None:
        """Answer state-sync requests arriving on ``stream`` (one per fetcher's
        channel) with ``handler`` (the node's gated one), counting the replies
        handed to the wire."""
        self._streams[stream] = 0

        async def handle(ctx: RequestContext, request: Message) -> Message:
            replied = True
            try:
                return await handler(ctx, request)
            except RemoteProtocolError:
                replied = False  # the stream is reset: no reply is written
                raise
            finally:
                if replied and stream in self._streams:
                    self._streams[stream] += 1

        try:
            await serve_rpc_stream(stream, STATESYNC_PROTOCOL, handle, self._wire)
        finally:
            del self._streams[stream]

    def uploads_in_flight(self) -> int:
        """Replies handed to the wire and not yet written, over every serving stream."""
        return sum(max(0, handed - stream.statistics().frames_sent)
                   for stream, handed in self._streams.items())

    def _answer(self, ctx: RequestContext, request: Message) -> Message:
        if isinstance(request, GetManifest):
            if not request.run_id:
                raise RemoteProtocolError("ss.get_manifest with an empty run id")
            with self._lock:
                snapshot = self._table.newest(request.run_id)
            if snapshot is None:
                return self._refuse("unknown_run", "no state of this run is shared here")
            self._count("manifests_served")
            return ManifestReply.of(snapshot.manifest)
        assert isinstance(request, GetChunk)
        if not request.run_id or len(request.digest) != DIGEST_SIZE:
            raise RemoteProtocolError(f"ss.get_chunk with an empty run id or a digest of "
                                      f"{len(request.digest)} bytes")
        if self.uploads_in_flight() >= self.config.max_concurrent_uploads:
            self._count("busy_refusals")
            return self._refuse("busy", f"{self.config.max_concurrent_uploads} uploads "
                                        f"in flight")
        with self._lock:
            snapshot = self._table.find(request.run_id, request.digest)
            known = self._table.newest(request.run_id) is not None
        if snapshot is None:
            return self._refuse("gone" if known else "unknown_run",
                                "no snapshot with this digest is kept")
        if request.index >= snapshot.manifest.num_chunks:
            return self._refuse("bad_index", f"the snapshot has "
                                             f"{snapshot.manifest.num_chunks} chunks")
        data = snapshot.chunk(request.index)
        with self._lock:
            self._counters["chunks_served"] += 1
            self._counters["bytes_served"] += len(data)
        return ChunkReply(request.index, data)

    def _refuse(self, code: str, detail: str) -> Refused:
        self._count("refusals")
        return Refused(code, detail)
