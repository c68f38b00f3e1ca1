"""Settings of the progress protocol (protocols/progress.md), with documented defaults."""

from __future__ import annotations

import dataclasses
import math

from .. import service
from ..errors import ConfigError

#: Hard limits of the wire protocol, whatever a node's configuration says.
MAX_RUN_ID_LENGTH = service.MAX_RUN_ID_BYTES  # bytes of a run id (UTF-8), 1 at least
MAX_PEER_ID_SIZE = 64          # bytes of a peer id in a report
MAX_SIGNATURE_SIZE = 128       # bytes of a report's signature (ed25519 uses 64)
MAX_REPORTS = 64               # reports in one message
MAX_DIGEST = 1024              # entries of a digest in one message
MAX_ADDRS = 8                  # addresses of a peer in a snapshot entry
MAX_ADDR_LENGTH = 256          # characters of one address
#: Largest sample count or epoch a report may carry (exact in a float64).
MAX_COUNT = 2**53
#: Largest membership credential (certificate bytes) a report may carry.
MAX_CREDENTIAL_SIZE = 2048
#: Characters of a report's display name (``ReportInfo.name``).
MAX_NAME_LENGTH = 64
#: Largest group size a report's info may give (``ReportInfo.round_group``).
MAX_GROUP = 65536
#: Contributors a report's info may name for its last round
#: (``ReportInfo.round_contributors``): 8 bytes each, 512 bytes at most.
MAX_ROUND_CONTRIBUTORS = 64
#: Bytes of a contributor's tag: the first bytes of SHA-256 of its peer id.
ROUND_TAG_SIZE = 8

#: DHT key prefix of the snapshots: ``p2pdl/progress/<run id>``, one signed
#: subkey per peer.
SNAPSHOT_PREFIX = "p2pdl/progress/"


@dataclasses.dataclass(frozen=True)
class ProgressConfig:
    """How a node publishes and aggregates training progress.

    Attributes:
        heartbeat_interval: a tracking peer publishes its report at least this
            often, even when others' extrapolation of it is still right.
            Default 5 s.
        min_publish_interval: least time between two reports of one peer (its
            rate bound: at most 1 / this reports per second).  Default 0.05 s.
        drift_fraction: a peer publishes when others' extrapolation of its
            sample count (``samples + (now - time) * samples_per_second`` of its
            last report) is off by more than ``drift_fraction *
            target_batch_size / num_peers`` samples, or by more than
            ``drift_batches`` of its own typical batches, whichever is larger.
            Default 0.01.
        drift_batches: see ``drift_fraction``.  Counts move in whole batches
            while the extrapolation moves smoothly, so an error below a batch
            or two is no news.  Default 3.
        endgame_time: once the next epoch is this close (by the estimate), a
            peer publishes every change of its count, so that the moment the
            global count reaches the target is known from reports, not guessed.
            Default 1.5 s.
        endgame_fraction: the endgame also starts once the estimate is within
            this fraction of the target, whatever the ETA says (the rates may
            be wrong).  Default 0.05.
        eta_grace: ``ready_to_step`` on the ETA alone (no report has yet shown
            the target reached) only this long after the ETA.  The ETA is an
            extrapolation and runs early by about half a batch per peer; reports
            in the endgame are facts.  Default 0.5 s.
        report_ttl: a peer whose latest report is older than this is left out
            of the global view (it is silent, or gone).  Default 15 s.
        max_clock_skew: a report stamped more than this ahead of the receiver's
            clock is dropped as absurd.  Default 10 s.
        max_samples_per_second: reports claiming a higher rate are dropped as
            absurd.  Default 1e6.
        snapshot_interval: a peer re-stores its signed report in the DHT this
            often (a DHT store costs a lookup: tens of pushes' bytes), for late
            joiners and as the fallback when gossip is partitioned.  Default 30 s.
        snapshot_ttl: the DHT snapshot's lifetime.  Default 90 s.
        sync_interval: how often a peer exchanges a digest of its view with
            one random member (anti-entropy: it repairs lost pushes).
            Default 5 s.
        partition_timeout: a peer that has members but heard no live report
            for this long reads the DHT snapshot.  Default 7.5 s.
        push_timeout: longest wait for one push's answer.  Default 3 s.
        max_push_failures: a member whose pushes failed this many times in a
            row gets no pushes for ``sync_interval``, doubling with each further
            failure up to 60 s, or until it is heard from.  Default 3.
        max_peers: peers one run's view holds at most.  Default 1024.
        max_runs: runs one node tracks or accepts reports for at once.
            Default 16.
        max_concurrent_pushes: pushes one run has in flight at once.  Default 64.
        rate_half_life: half-life of the samples-per-second EMA.  Default 5 s.
        quorum_fraction: the quorum epoch is the highest epoch that more than
            this fraction of the live trainers (non-client, non-auxiliary
            peers) report or exceed; a report more than one epoch ahead of it
            moves nobody.  In ``[0, 1)``; 0 gives the highest epoch of any
            trainer.  Default 0.5 (a strict majority).
        max_trainer_samples_per_second: the rate cap of a trainer's reports
            (and the rate its count may grow at within an epoch).
            Default 1e6.
        max_client_samples_per_second: the same for client-mode peers.
            Default 1e6.  (Auxiliary peers report no samples and no rate.)
        burst_seconds: within one epoch, a peer's count may grow between two
            of its reports by at most ``cap * (elapsed + burst_seconds)``
            samples (``elapsed`` on this node's clock): counts move in
            batches and reports arrive with jitter.  Default 2 s.
        first_report_factor: the first report of a peer at an epoch that this
            node takes may carry at most ``first_report_factor *
            target_batch_size + cap * burst_seconds`` samples (an honest peer
            steps once the collaboration has the target).  Default 2.
        join_wait: a peer still at the epoch it started with (it abstains from
            the quorum) follows no epoch more than one beyond its own, and does
            not step while one is in view (nor before it holds a trainer's
            report placed after its start), until it has tracked the run this
            long, so that it hears the swarm before it believes a lone voice.
            At most ``report_ttl``.  Default 5 s (a heartbeat: every connected
            peer has reported by then).
    """

    heartbeat_interval: float = 5.0
    min_publish_interval: float = 0.05
    drift_fraction: float = 0.01
    drift_batches: float = 3.0
    endgame_time: float = 1.5
    endgame_fraction: float = 0.05
    eta_grace: float = 0.5
    report_ttl: float = 15.0
    max_clock_skew: float = 10.0
    max_samples_per_second: float = 1e6
    snapshot_interval: float = 30.0
    snapshot_ttl: float = 90.0
    sync_interval: float = 5.0
    partition_timeout: float = 7.5
    push_timeout: float = 3.0
    max_push_failures: int = 3
    max_peers: int = 1024
    max_runs: int = 16
    max_concurrent_pushes: int = 64
    rate_half_life: float = 5.0
    quorum_fraction: float = 0.5
    max_trainer_samples_per_second: float = 1e6
    max_client_samples_per_second: float = 1e6
    burst_seconds: float = 2.0
    first_report_factor: float = 2.0
    join_wait: float = 5.0

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"ProgressConfig.{field.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"ProgressConfig.{field.name} must be finite and >= 0, "
                                  f"got {value!r}")
        for name in ("heartbeat_interval", "report_ttl", "snapshot_interval", "snapshot_ttl",
                     "sync_interval", "push_timeout", "rate_half_life"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"ProgressConfig.{name} must be > 0")
        for name in ("max_peers", "max_runs", "max_concurrent_pushes", "max_push_failures"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"ProgressConfig.{name} must be an integer >= 1")
        if self.heartbeat_interval >= self.report_ttl:
            raise ConfigError("ProgressConfig.heartbeat_interval must be below report_ttl, "
                              "or live peers would expire between their reports")
        if self.join_wait > self.report_ttl:
            raise ConfigError("ProgressConfig.join_wait must be at most report_ttl")
        if self.quorum_fraction >= 1:
            raise ConfigError("ProgressConfig.quorum_fraction must be below 1 "
                              "(more than all trainers can never agree)")
        if self.snapshot_interval >= self.snapshot_ttl:
            raise ConfigError("ProgressConfig.snapshot_interval must be below snapshot_ttl")
