"""Configuration of the host layer (see protocols/transport.md once it exists)."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError


@dataclasses.dataclass(frozen=True)
class BackoffPolicy:
    """Exponential backoff with jitter between retries.

    Attributes:
        initial: first delay in seconds.  Default 0.5 s.
        maximum: delays never exceed this.  Default 30 s.
        multiplier: growth per failure.  Default 2.
        jitter: each delay is multiplied by a random factor in
            ``[1 - jitter, 1 + jitter]`` so that peers do not retry in lockstep.
            Default 0.2.
    """

    initial: float = 0.5
    maximum: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.maximum and self.multiplier >= 1
                and 0 <= self.jitter < 1):
            raise ConfigError(f"invalid backoff policy {self}")


@dataclasses.dataclass(frozen=True)
class HostConfig:
    """Settings of the libp2p host.  Every field has a documented default.

    Attributes:
        listen: multiaddrs to listen on.  Default ``/ip4/0.0.0.0/tcp/0`` (all
            interfaces, a free port).  TCP only.
        announce: multiaddrs to advertise instead of the listen addresses (for
            a node behind port forwarding, say).  Default: none, advertise the
            listen addresses, with ``0.0.0.0`` expanded to each interface.
        initial_peers: full multiaddrs (with ``/p2p/<id>``) of peers to connect
            to at start and to reconnect to whenever the connection drops.
        identity_path: file holding the node's ed25519 private key, created on
            first use with mode 0600.  Default None: a new identity each run.
        dial_timeout: longest time one connection attempt may take.  Default 10 s.
        stream_open_timeout: longest time to open a stream and agree on its
            protocol.  Default 10 s.
        initial_peer_backoff: delays between attempts to reach an initial peer.
        initial_peer_retries: failed attempts in a row after which the node
            stops trying an initial peer (until restarted).  Default 30, about
            14 minutes with the default backoff.  None: never stop.
        reconnect_check_interval: how often the node checks that it is still
            connected to its initial peers.  Default 2 s.
        max_inbound_streams_per_peer: streams one peer may have open to our
            handlers at once; more are reset.  Default 64.
    """

    listen: tuple[str, ...] = ("/ip4/0.0.0.0/tcp/0",)
    announce: tuple[str, ...] = ()
    initial_peers: tuple[str, ...] = ()
    identity_path: str | None = None
    dial_timeout: float = 10.0
    stream_open_timeout: float = 10.0
    initial_peer_backoff: BackoffPolicy = BackoffPolicy()
    initial_peer_retries: int | None = 30
    reconnect_check_interval: float = 2.0
    max_inbound_streams_per_peer: int = 64

    def __post_init__(self) -> None:
        for name in ("listen", "announce", "initial_peers"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(f"HostConfig.{name} must be a list of multiaddrs, "
                                  f"not a single string")
            object.__setattr__(self, name, tuple(str(v) for v in value))
        if not self.listen:
            raise ConfigError("HostConfig.listen needs at least one address")
        for name in ("dial_timeout", "stream_open_timeout", "reconnect_check_interval"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"HostConfig.{name} must be positive")
        if self.initial_peer_retries is not None and self.initial_peer_retries < 1:
            raise ConfigError("HostConfig.initial_peer_retries must be >= 1 or None")
        if self.max_inbound_streams_per_peer < 1:
            raise ConfigError("HostConfig.max_inbound_streams_per_peer must be >= 1")
