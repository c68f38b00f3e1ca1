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


KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclasses.dataclass(frozen=True)
class RelayLimits:
    """Bounds of a node serving circuit relay v2 (``HostConfig.relay_service``).

    Defaults suit training traffic: an averaging round through a relay moves
    tens to hundreds of megabytes, so circuits get gigabytes and hours rather
    than py-libp2p's 1 GiB default; the counts keep a volunteer relay's
    memory and sockets bounded.

    Attributes:
        max_reservations: peers that may hold a reservation at once.  Default 128.
        max_circuits_per_peer: relayed connections to one reserved peer open at
            once (so at most ``max_reservations * max_circuits_per_peer`` in
            all).  Default 16.
        max_circuit_bytes: bytes one circuit may carry (both directions) before
            it is reset.  Default 16 GiB.
        max_circuit_duration: seconds one circuit may stay open.  Default 6 h.
        reservation_ttl: seconds a reservation lasts unless refreshed.  Default 1 h.
    """

    max_reservations: int = 128
    max_circuits_per_peer: int = 16
    max_circuit_bytes: int = 16 * GiB
    max_circuit_duration: int = 6 * 3600
    reservation_ttl: int = 3600

    def __post_init__(self) -> None:
        for name in ("max_reservations", "max_circuits_per_peer", "max_circuit_bytes",
                     "max_circuit_duration", "reservation_ttl"):
            if getattr(self, name) < 1:
                raise ConfigError(f"RelayLimits.{name} must be positive")


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
        max_inbound_streams_per_peer: streams one peer may have open to us at
            once (any protocol, py-libp2p's own included, still negotiating
            or served); more are reset before they are read.  Default 64.
        inbound_handshake_timeout: a stream a peer opens to one of
            py-libp2p's protocols (identify, ``/ipfs/ping``, circuit relay,
            DCUtR) is reset unless it is answered within this long.
            Default 20 s (a relay's answer to a circuit request waits for
            the target's).
        input_budget_per_peer: bytes of p2pdl frames one peer may have sent
            us that the node still holds (frames still arriving, and frames
            waiting for the application), over all of its streams.  A stream
            whose bytes would pass it is reset
            (:class:`~p2pdl.errors.RemoteProtocolError`).  Default 32 MiB:
            four streams with a full receive window.
        input_budget_per_node: the same, for all peers together.  Default
            256 MiB.
        heap_trim_interval: how often the node checks whether to give memory
            freed after a burst of input back to the operating system
            (glibc's ``malloc_trim``, when the resident set grew by 32 MiB
            since the last time).  Default 10 s; None: never.
        relay_service: serve circuit relay v2 to other peers (for public
            nodes, e.g. a bootstrap node).  Default False.
        relay_limits: bounds of that service.
        use_relays: while the node is not known to be publicly reachable,
            hold reservations on relays among its initial peers and advertise
            ``/p2p-circuit`` addresses through them.  Default True.
        relay_reservations: relays to hold reservations with at once (more
            means faster failover when one dies).  Default 2.
        reservation_retry: delays between attempts to reserve on a relay.
        hole_punching: upgrade relayed connections to direct ones with DCUtR.
            Default True.
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
    inbound_handshake_timeout: float = 20.0
    input_budget_per_peer: int = 32 * MiB
    input_budget_per_node: int = 256 * MiB
    heap_trim_interval: float | None = 10.0
    relay_service: bool = False
    relay_limits: RelayLimits = RelayLimits()
    use_relays: bool = True
    relay_reservations: int = 2
    reservation_retry: BackoffPolicy = BackoffPolicy(initial=1.0, maximum=30.0)
    hole_punching: bool = True

    def __post_init__(self) -> None:
        for name in ("listen", "announce", "initial_peers"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise ConfigError(f"HostConfig.{name} must be a list of multiaddrs, "
                                  f"not a single string")
            object.__setattr__(self, name, tuple(str(v) for v in value))
        if not self.listen:
            raise ConfigError("HostConfig.listen needs at least one address")
        for name in ("dial_timeout", "stream_open_timeout", "reconnect_check_interval",
                     "inbound_handshake_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"HostConfig.{name} must be positive")
        if self.initial_peer_retries is not None and self.initial_peer_retries < 1:
            raise ConfigError("HostConfig.initial_peer_retries must be >= 1 or None")
        if self.max_inbound_streams_per_peer < 1:
            raise ConfigError("HostConfig.max_inbound_streams_per_peer must be >= 1")
        if self.heap_trim_interval is not None and not self.heap_trim_interval > 0:
            raise ConfigError("HostConfig.heap_trim_interval must be positive or None")
        if not 0 < self.input_budget_per_peer <= self.input_budget_per_node:
            raise ConfigError("HostConfig: input_budget_per_peer must be positive and at "
                              "most input_budget_per_node")
        if self.relay_reservations < 1:
            raise ConfigError("HostConfig.relay_reservations must be >= 1")
