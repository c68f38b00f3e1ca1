"""Settings of run membership (protocols/membership.md), with documented defaults."""

from __future__ import annotations

import dataclasses
import math

from .. import service
from ..errors import ConfigError

#: Hard limits of the wire protocol and the files, whatever a node's configuration says.
MAX_RUN_ID_LENGTH = service.MAX_RUN_ID_BYTES  # bytes of a run id (UTF-8), 1 at least
MAX_PEER_ID_LENGTH = 128        # characters of a base58 peer id (an ed25519 one has 52)
MAX_SIGNATURE_SIZE = 128        # bytes of a signature (ed25519 uses 64)
MAX_CERTIFICATE_SIZE = 1024     # bytes of an encoded certificate
MAX_REVOKED_SERIALS = 4096      # serials one revocation list names
MAX_REVOCATION_LIST_SIZE = 48 * 1024  # bytes of an encoded revocation list
MAX_SERIAL = 2**63 - 1          # certificate serials are in [0, MAX_SERIAL]
MAX_SEQUENCE = 2**63 - 1        # revocation list sequences are in [0, MAX_SEQUENCE]
MAX_FILE_SIZE = 256 * 1024      # bytes of a certificate, revocation or allowlist file
MAX_ALLOWLIST_PEERS = 10000     # peers one allowlist names

#: Lifetime of a certificate issued with neither ``expires_at`` nor ``expires_in`` (s).
DEFAULT_CERTIFICATE_LIFETIME = 30 * 86400.0

#: DHT key prefix of a run's revocation lists: ``p2pdl/membership/<run id>``.
REVOCATION_PREFIX = "p2pdl/membership/"


@dataclasses.dataclass(frozen=True)
class MembershipConfig:
    """How a node checks and shows run membership.

    Attributes:
        revocation_interval: a node holding a certificate run reads the run's
            revocation lists from the DHT this often, and obeys the newest
            valid one at once: a revoked member is refused at most this long
            (plus the DHT's lookup time) after the authority published the
            list.  Default 60 s.
        handshake_timeout: longest wait for one membership handshake (both
            certificates and the revocation sequences).  Default 10 s.
        allowed_clock_skew: a certificate counts from ``issued_at`` minus this
            and until ``expires_at`` plus this, so nodes whose clocks differ by
            up to this much agree; an expired member is refused at most this
            long after its expiry.  Default 30 s.
        max_members: members one certificate run remembers (the least recently
            admitted forgotten first; a forgotten member shows its certificate
            again on its next connection).  Default 4096.
        max_runs: runs with a policy on one node.  Default 64.
        max_introductions: (peer, run) handshakes remembered as done on the
            current connections.  Default 4096.
        max_concurrent_fetches: revocation list fetches from peers in flight
            at once.  Default 4.
        revocation_ttl: lifetime of a revocation list stored in the DHT; members
            that hold the newest list store it again when the DHT lacks it.
            Default 86400 s (the DHT's ``max_ttl``).
        slow_handshake: a handshake that has not ended this long after it
            started (it timed out, or its caller gave up) marks the peer as
            unanswering for the run.  Default 2 s.
        unanswered_ttl: an unanswering peer is not introduced to again for
            this long: ``introduce`` returns at once and the peer stays no
            member, so a peer that answers handshakes slowly (an outsider
            announced under a closed run's keys) costs one wait, not one per
            request.  Default 60 s.
    """

    revocation_interval: float = 60.0
    handshake_timeout: float = 10.0
    allowed_clock_skew: float = 30.0
    max_members: int = 4096
    max_runs: int = 64
    max_introductions: int = 4096
    max_concurrent_fetches: int = 4
    revocation_ttl: float = 86400.0
    slow_handshake: float = 2.0
    unanswered_ttl: float = 60.0

    def __post_init__(self) -> None:
        for name in ("revocation_interval", "handshake_timeout", "revocation_ttl",
                     "slow_handshake", "unanswered_ttl"):
            value = getattr(self, name)
            if not service.is_positive(value):
                raise ConfigError(f"MembershipConfig.{name} must be a positive number of "
                                  f"seconds, not {value!r}")
        skew = self.allowed_clock_skew
        if not service.is_number(skew) or not math.isfinite(skew) or skew < 0:
            raise ConfigError(f"MembershipConfig.allowed_clock_skew must be >= 0 s, not {skew!r}")
        for name in ("max_members", "max_runs", "max_introductions", "max_concurrent_fetches"):
            value = getattr(self, name)
            if not service.is_int(value) or value < 1:
                raise ConfigError(f"MembershipConfig.{name} must be a positive integer, "
                                  f"not {value!r}")
