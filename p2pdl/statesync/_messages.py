"""Messages of the state-sync protocol ``/p2pdl/statesync/1.0.0`` (protocols/statesync.md).

A fetcher asks a donor for the manifest of its newest snapshot of a run
(``ss.get_manifest``, answered ``ss.manifest``), then for chunks of it by
the payload's digest and the chunk's index (``ss.get_chunk``, answered
``ss.chunk``).  A donor that cannot serve a request answers ``ss.refused``
with a code (REFUSAL_CODES).  Types and sizes are checked by the decoder
(a violation resets the stream); the values of a manifest by the fetcher
(``Manifest.problem``).
"""

from __future__ import annotations

from typing import Annotated

from ..service import RunId
from ..wire import MaxLen, Message, Range, RpcProtocol
from ._state import Manifest
from .config import (
    DIGEST_SIZE,
    MAX_CHUNK_SIZE,
    MAX_CHUNKS,
    MAX_CODE_LENGTH,
    MAX_DETAIL_LENGTH,
    MAX_EPOCH,
)

__all__ = ["STATESYNC_PROTOCOL_ID", "STATESYNC_PROTOCOL", "REFUSAL_CODES", "GetManifest",
           "ManifestReply", "GetChunk", "ChunkReply", "Refused"]

STATESYNC_PROTOCOL_ID = "/p2pdl/statesync/1.0.0"

#: Why a donor did not serve a request (protocols/statesync.md, Errors).
REFUSAL_CODES = {
    "unknown_run": "the donor shares no state of this run",
    "gone": "the donor no longer keeps the snapshot with this digest",
    "bad_index": "the snapshot has no chunk with this index",
    "busy": "the donor serves max_concurrent_uploads chunks already; ask later or elsewhere",
}

Digest = Annotated[bytes, MaxLen(DIGEST_SIZE)]


class GetManifest(Message, tag="ss.get_manifest"):
    """What is your newest snapshot of ``run_id``?"""

    run_id: RunId


class ManifestReply(Message, tag="ss.manifest"):
    """The donor's newest snapshot of the run: see :class:`Manifest`."""

    epoch: Annotated[int, Range(0, MAX_EPOCH)]
    size: Annotated[int, Range(1, MAX_CHUNKS * MAX_CHUNK_SIZE)]
    chunk_size: Annotated[int, Range(1, MAX_CHUNK_SIZE)]
    digest: Digest
    chunk_digests: Annotated[bytes, MaxLen(MAX_CHUNKS * DIGEST_SIZE)]

    @classmethod
    def of(cls, manifest: Manifest) -> ManifestReply:
        return cls(manifest.epoch, manifest.size, manifest.chunk_size, manifest.digest,
                   manifest.chunk_digests)

    def manifest(self) -> Manifest:
        return Manifest(self.epoch, self.size, self.chunk_size, self.digest, self.chunk_digests)


class GetChunk(Message, tag="ss.get_chunk"):
    """Send me chunk ``index`` of your snapshot of ``run_id`` whose payload has ``digest``."""

    run_id: RunId
    digest: Digest
    index: Annotated[int, Range(0, MAX_CHUNKS - 1)]


class ChunkReply(Message, tag="ss.chunk"):
    """Chunk ``index`` of the asked snapshot: the payload's bytes ``[index × chunk_size, …)``."""

    index: Annotated[int, Range(0, MAX_CHUNKS - 1)]
    data: Annotated[bytes, MaxLen(MAX_CHUNK_SIZE)]


class Refused(Message, tag="ss.refused"):
    """Not served: ``code`` says why (REFUSAL_CODES), ``detail`` for people."""

    code: Annotated[str, MaxLen(MAX_CODE_LENGTH)]
    detail: Annotated[str, MaxLen(MAX_DETAIL_LENGTH)] = ""


STATESYNC_PROTOCOL = RpcProtocol.define(STATESYNC_PROTOCOL_ID, [GetManifest, GetChunk],
                                        [ManifestReply, ChunkReply, Refused])
