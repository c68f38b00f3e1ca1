"""Settings of NAT detection (reachability) and client mode (protocols/transport.md)."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError


@dataclasses.dataclass(frozen=True)
class NatConfig:
    """How a node learns whether it is publicly reachable.  Documented defaults.

    Attributes:
        enabled: ask peers to dial us back.  Default True.  When False the
            node stays ``unknown`` (and, with relays configured, keeps its
            reservations).
        probe_timeout: how long a prober spends on one dial-back.  Default 5 s.
        min_failures: distinct probers whose dial-backs must all fail before
            the node calls itself private (fewer if fewer peers are connected).
            Default 2.
        unknown_interval: pause between probes while unknown.  Default 5 s.
        public_interval: re-check period once public.  Default 15 min.
        private_interval: re-check period once private.  Default 5 min.
        result_ttl: a probe result older than this no longer counts.  Default 30 min.
        max_addrs: addresses a node may ask to have dialled per request.  Default 8.
        server_concurrency: dial-backs a node performs for others at once;
            more requests are answered ``unavailable``.  Default 4.
        server_min_interval: a peer may ask us at most once per this many
            seconds.  Default 5 s.
        client_mode: force client mode on (True) or off (False); None (default)
            derives it: a node that is private is a client.
    """

    enabled: bool = True
    probe_timeout: float = 5.0
    min_failures: int = 2
    unknown_interval: float = 5.0
    public_interval: float = 900.0
    private_interval: float = 300.0
    result_ttl: float = 1800.0
    max_addrs: int = 8
    server_concurrency: int = 4
    server_min_interval: float = 5.0
    client_mode: bool | None = None

    def __post_init__(self) -> None:
        for name in ("probe_timeout", "unknown_interval", "public_interval", "private_interval",
                     "result_ttl", "server_min_interval"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"NatConfig.{name} must be positive")
        for name in ("min_failures", "max_addrs", "server_concurrency"):
            if getattr(self, name) < 1:
                raise ConfigError(f"NatConfig.{name} must be >= 1")
