"""Settings of state sync (protocols/statesync.md), with documented defaults."""

from __future__ import annotations

import dataclasses
import math

from .. import service
from ..errors import ConfigError
from ..service import is_int

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

#: Hard limits of the wire protocol, whatever a node's configuration says.
MAX_RUN_ID_LENGTH = service.MAX_RUN_ID_BYTES  # bytes of a run id (UTF-8), 1 at least
MAX_EPOCH = 2**53              # largest epoch (exact in a float64, like progress reports)
DIGEST_SIZE = 32               # bytes of a SHA-256 digest (payload and chunks)
MIN_CHUNK_SIZE = 4 * KiB       # bytes of one chunk, at least (the last one may be shorter)
MAX_CHUNK_SIZE = 768 * KiB     # bytes of one chunk, at most: a chunk reply fits in 1 MiB
MAX_CHUNKS = 16384             # chunks of one snapshot: the manifest's digests fit in 512 KiB
MAX_CODE_LENGTH = 32           # characters of a refusal code
MAX_DETAIL_LENGTH = 200        # characters of a refusal's explanation
#: Epochs per run a fetcher remembers the donors it caught lying at (its
#: exclusions: ``max_runs`` x this many (run, epoch) pairs, ``max_donors`` each).
EXCLUDED_EPOCHS_PER_RUN = 4

#: Bytes a manifest or chunk reply may take besides its digests or chunk
#: (the envelope, the field names, the run id): the wire's message limit must
#: leave this much room.
MESSAGE_OVERHEAD = 1 * KiB


@dataclasses.dataclass(frozen=True)
class StateSyncConfig:
    """How a node shares its training state and downloads others' (``node.statesync``).

    Attributes:
        chunk_size: bytes of payload per chunk (the unit of transfer, retry,
            verification and resumption).  Default 512 KiB
            (MIN_CHUNK_SIZE..MAX_CHUNK_SIZE).
        max_state_bytes: largest payload this node shares or downloads, and
            the most bytes of unfinished downloads it keeps.  Default 4 GiB.
            ``ceil(max_state_bytes / chunk_size)`` must not exceed MAX_CHUNKS,
            so that a manifest (32 bytes per chunk) fits in one wire message.
        keep_snapshots: snapshots of one run a donor keeps: the newest and
            older ones, so that downloads of the previous epoch can finish.
            Default 2.
        max_runs: runs one node shares at once, and runs it keeps unfinished
            downloads of.  Default 16.
        fetch_timeout: default time limit of one ``fetch``.  Default 300 s.
        request_timeout: longest wait for one manifest or one chunk.
            Default 30 s.
        max_donors: donors one fetch asks at most (the first ones given).
            Default 64.
        max_concurrent_requests: manifest requests one fetch has in flight
            at once.  Default 16.
        max_parallel_chunks: chunk requests one fetch has in flight at once,
            over all donors.  Default 8.
        max_chunks_per_donor: chunk requests one fetch has in flight at one
            donor.  Default 2.
        max_chunk_attempts: times one chunk may fail (a timeout, an error, a
            bad hash) before the fetch gives up.  Default 5.
        max_donor_failures: failed chunk requests in a row after which a
            donor is dropped from the download.  Default 3.
        max_manifest_rounds: times one fetch reads the donors' manifests: at
            the start, and again when every donor of the chosen state no
            longer has it (``gone``).  Default 3.
        max_concurrent_uploads: chunk replies this node has handed to the
            wire and not yet written, over all fetchers; further chunk
            requests are refused ``busy``.  Default 16.
        busy_backoff: a fetcher leaves a donor that refused ``busy`` alone
            this long, doubling with each refusal in a row up to
            MAX_BUSY_BACKOFF.  Default 0.1 s.
        max_busy_refusals: ``busy`` refusals in a row after which a donor is
            dropped from the download.  Default 30.
        min_agreeing_donors: donors at one epoch that must offer the same
            state (digest), and be more than half of that epoch's donors,
            before a fetch accepts it.  A lone donor is accepted only when no
            other donor offers anything (``StateDownload.confirmed`` is then
            False).  Default 2.
    """

    chunk_size: int = 512 * KiB
    max_state_bytes: int = 4 * GiB
    keep_snapshots: int = 2
    max_runs: int = 16
    fetch_timeout: float = 300.0
    request_timeout: float = 30.0
    max_donors: int = 64
    max_concurrent_requests: int = 16
    max_parallel_chunks: int = 8
    max_chunks_per_donor: int = 2
    max_chunk_attempts: int = 5
    max_donor_failures: int = 3
    max_manifest_rounds: int = 3
    max_concurrent_uploads: int = 16
    busy_backoff: float = 0.1
    max_busy_refusals: int = 30
    min_agreeing_donors: int = 2

    def __post_init__(self) -> None:
        def check(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"StateSyncConfig: {what}")

        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.type in ("int", int):
                check(is_int(value) and value >= 1, f"{field.name} must be an integer >= 1, "
                      f"got {value!r}")
            else:
                check(not isinstance(value, bool) and isinstance(value, (int, float))
                      and math.isfinite(value) and value > 0,
                      f"{field.name} must be a finite number > 0, got {value!r}")
        check(MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE,
              f"chunk_size must be in {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}")
        check(self.max_chunks <= MAX_CHUNKS,
              f"max_state_bytes / chunk_size must be at most {MAX_CHUNKS} chunks (the "
              f"manifest must fit in one message); got {self.max_chunks}")
        check(self.request_timeout <= self.fetch_timeout,
              "request_timeout must not exceed fetch_timeout")
        check(self.max_chunks_per_donor <= self.max_parallel_chunks,
              "max_chunks_per_donor must not exceed max_parallel_chunks")
        check(self.min_agreeing_donors <= self.max_donors,
              "min_agreeing_donors must not exceed max_donors")

    @property
    def max_chunks(self) -> int:
        """Chunks of the largest payload this node handles."""
        return -(-self.max_state_bytes // self.chunk_size)

    def manifest_message_bound(self) -> int:
        """Most bytes a manifest of this node's largest payload takes on the wire."""
        return self.max_chunks * DIGEST_SIZE + MESSAGE_OVERHEAD

    def chunk_message_bound(self) -> int:
        """Most bytes a chunk reply takes on the wire."""
        return self.chunk_size + MESSAGE_OVERHEAD

