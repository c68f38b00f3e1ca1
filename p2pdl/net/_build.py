"""Building and running the host: py-libp2p with TCP, Noise and Yamux only.

This module absorbs py-libp2p's sharp edges once for every layer above it:

* Plaintext, SECIO and TLS are not offered or accepted: Noise only.  Yamux
  only (no Mplex).  TCP only.
* One connection per peer, reused by every stream.  py-libp2p waits 250 ms
  ("happy eyeballs") after each dial unless the per-peer connection quota is
  filled, so the quota is 1: a connect takes milliseconds, not 250 ms.
* py-libp2p retries dials itself and then blocks a peer for 60 s after a
  failure; the host retries on its own schedule instead (``_dialer``), so
  both are switched off for the dials it makes.
* py-libp2p's auto-connector (dial known peers until 150 connections) is off:
  the layers above choose their peers.
* A Yamux frame write cut short by cancellation breaks the connection's
  Noise session; frame writes are made whole (``_yamux``).
* Bulk data costs py-libp2p Python work per frame and per socket call:
  socket reads are buffered, a Noise write is one socket write, and Yamux
  frames carry up to 256 KiB (``_fastpath``): half the CPU per byte.
* py-libp2p's ERROR records for failures the host reports itself (a refused
  dial, an unsupported protocol) are demoted to DEBUG.
* A remote peer's bad input cannot stop or bloat the node: multistream-select
  and Yamux are hardened (``_hardening``), and every inbound stream runs
  bounded and contained (``_inbound``).
* Memory freed after a burst of input goes back to the system (``_memory``).
* A relayed inbound connection gets a correct address, and identify reports
  a relayed observed address other implementations accept (``_interop``).

:func:`open_host` runs the host, its relay protocols (circuit relay v2, and
DCUtR hole punching) and its background services for the duration of a block.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import trio
from libp2p import new_host
from libp2p.abc import IHost, INetConn
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.x25519 import create_new_key_pair as create_x25519_key_pair
from libp2p.network.config import ConnectionConfig, RetryConfig
from libp2p.relay.circuit_v2.config import RelayConfig as LibRelayConfig
from libp2p.relay.circuit_v2.config import RelayRole as LibRelayRole
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits as LibRelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_PROTOCOL_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_PROTOCOL_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from libp2p.tools.anyio_service import background_trio_service

from .._concurrency import open_service_nursery
from ..errors import ConfigError
from ._addrs import parse_multiaddr, parse_peer_addr
from ._dcutr import LabelledDCUtR
from ._fastpath import install as _install_fast_path
from ._hardening import install as _install_input_hardening
from ._host import Host
from ._identity import load_or_create_identity
from ._interop import install as _install_interop_fixes
from ._memory import serve_heap_trim
from ._yamux import install as _install_whole_yamux_writes
from .config import HostConfig, RelayLimits

__all__ = ["open_host", "build_libp2p_host", "SECURITY_PROTOCOLS", "MUXER_PROTOCOLS"]

logger = logging.getLogger(__name__)

# py-libp2p logs with propagate=False and no handler; let records reach the
# application's logging configuration like every other library's.
logging.getLogger("libp2p").propagate = True


class _DemoteReportedFailures(logging.Filter):
    """Turn py-libp2p's ERROR records for failures p2pdl reports itself into DEBUG.

    A refused dial, a refused handshake, an unsupported protocol or a
    refused relay circuit already reaches the caller as PeerUnreachableError
    or ProtocolNotSupportedError, and a relay stream closing normally is no
    error at all;
    py-libp2p also logs each at ERROR, which would flood an application's log
    with duplicates (every retry of an initial peer, every plaintext probe).
    """

    PREFIXES = ("Failed to open TCP stream", "failed to upgrade security",
                "Failed to open stream to peer", "fail to upgrade mux",
                "Error reading from hop stream", "Failed to open stream to relay",
                "Failed to fetch stored addresses", "MultiselectClient handshake",
                "Relay connection failed", "Error handling stop stream", "[ADDCONN_FAIL]")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and isinstance(record.msg, str) \
                and record.msg.startswith(self.PREFIXES):
            if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
                return False
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


for _name in ("libp2p.transport.tcp.tcp", "libp2p.network.swarm", "libp2p.host.basic_host",
              "libp2p.relay.circuit_v2.protocol", "libp2p.relay.circuit_v2.transport",
              "libp2p.protocol_muxer.multiselect_client"):
    logging.getLogger(_name).addFilter(_DemoteReportedFailures())

_install_whole_yamux_writes()
_install_fast_path()
_install_input_hardening()
_install_interop_fixes()

#: The only security and muxer protocols a p2pdl host speaks.
SECURITY_PROTOCOLS = (str(NOISE_PROTOCOL_ID),)
MUXER_PROTOCOLS = (str(YAMUX_PROTOCOL_ID),)


def build_libp2p_host(key_pair: KeyPair, config: HostConfig) -> IHost:
    """The py-libp2p host of ``config``: TCP + Noise + Yamux, p2pdl's settings (not running)."""
    listen = [parse_multiaddr(a, "listen address") for a in config.listen]
    for addr in listen:
        names = [p.name for p in addr.protocols()]
        if names[:1] not in (["ip4"], ["ip6"]) or names[1:] != ["tcp"]:
            raise ConfigError(f"listen address {addr} must be /ip4/<ip>/tcp/<port> or "
                              f"/ip6/<ip>/tcp/<port>")
    announce = [parse_multiaddr(a, "announce address") for a in config.announce]
    noise = NoiseTransport(key_pair, noise_privkey=create_x25519_key_pair().private_key)
    connection_config = ConnectionConfig(
        max_connections_per_peer=1,
        dial_timeout=config.dial_timeout,
        outbound_upgrade_timeout=config.dial_timeout,
        inbound_upgrade_timeout=config.dial_timeout,
        outbound_stream_protocol_negotiation_timeout=config.stream_open_timeout,
        inbound_stream_protocol_negotiation_timeout=config.stream_open_timeout,
    )
    host = new_host(
        key_pair=key_pair,
        sec_opt={NOISE_PROTOCOL_ID: noise},
        muxer_opt={YAMUX_PROTOCOL_ID: Yamux},
        listen_addrs=listen,
        announce_addrs=announce or None,
        connection_config=connection_config,
        negotiate_timeout=max(1, int(config.stream_open_timeout)),
    )
    swarm = host.get_network()
    # Retries are ours (the dialler), on a schedule the caller controls.
    swarm.retry_config = RetryConfig(max_retries=0)  # type: ignore[attr-defined]
    # Whom to connect to is decided above (initial peers, the DHT): switch off
    # the auto-connector, which dials every known peer up to 150 connections.
    swarm.auto_connector.maybe_connect = _no_auto_connect  # type: ignore[attr-defined]
    return host


async def _no_auto_connect() -> None:
    return None


def _libp2p_relay_limits(limits: RelayLimits) -> LibRelayLimits:
    return LibRelayLimits(duration=limits.max_circuit_duration, data=limits.max_circuit_bytes,
                          max_circuit_conns=limits.max_circuits_per_peer,
                          max_reservations=limits.max_reservations,
                          reservation_ttl=limits.reservation_ttl)


async def _close_listeners(libp2p_host: IHost) -> None:
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        for listener in list(libp2p_host.get_network().listeners.values()):  # type: ignore[attr-defined]
            try:
                await listener.close()
            except Exception:  # closing is best effort; the socket may be gone
                logger.debug("closing a listener failed", exc_info=True)


async def _close_connections(libp2p_host: IHost) -> None:
    """Close every connection while py-libp2p's tasks still run.

    ``host.run()`` leaves connections open when it ends: a host stopped in a
    process that goes on would keep its sockets, its peers would see it
    connected, and their requests would hang until they time out.
    """
    async def close(conn: INetConn) -> None:
        try:
            await conn.close()
        except Exception:  # closing is best effort; the peer may be gone
            logger.debug("closing a connection failed", exc_info=True)

    connections = [c for conns in libp2p_host.get_network().connections.values() for c in conns]
    with trio.CancelScope(shield=True), trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            for conn in connections:
                nursery.start_soon(close, conn)


@asynccontextmanager
async def open_host(config: HostConfig | None = None,
                    key_pair: KeyPair | None = None) -> AsyncIterator[Host]:
    """Run a host for the duration of the block.

    The identity comes from ``key_pair``, else from ``config.identity_path``
    (created there on first use), else it is new.  Initial peers are dialled in
    the background, with retries, while the block runs.
    """
    config = config or HostConfig()
    if key_pair is None:
        key_pair = (load_or_create_identity(config.identity_path) if config.identity_path
                    else create_new_key_pair())
    initial = [parse_peer_addr(a, "initial peer") for a in config.initial_peers]
    libp2p_host = build_libp2p_host(key_pair, config)
    listen = [parse_multiaddr(a) for a in config.listen]
    host = Host(libp2p_host, config)
    for info in initial:  # reachable by peer id at once, before the first dial ends
        host._dialer.remember(info)
    # Errors are raised after py-libp2p's nurseries have closed, so that the
    # caller sees them as they are, not wrapped in an ExceptionGroup.
    error: BaseException | None = None
    async with AsyncExitStack() as stack:
        # py-libp2p serves its TCP listeners from a system task that outlives
        # host.run(), and leaves connections open; close them ourselves so
        # that nothing is left running.
        stack.push_async_callback(_close_listeners, libp2p_host)
        try:
            await stack.enter_async_context(libp2p_host.run(listen))
        except OSError as exc:
            raise ConfigError(f"cannot listen on {', '.join(config.listen)}: "
                              f"{exc.strerror or exc}") from None
        stack.push_async_callback(_close_connections, libp2p_host)
        # py-libp2p logs a failed listen (port in use...) and carries on.
        if len(libp2p_host.get_transport_addrs()) < len(listen):
            error = ConfigError(f"cannot listen on {', '.join(config.listen)}: the address is "
                                f"in use or not available on this machine")
        else:
            limits = _libp2p_relay_limits(config.relay_limits)
            circuit = CircuitV2Protocol(libp2p_host, limits=limits,
                                        allow_hop=config.relay_service)
            await stack.enter_async_context(background_trio_service(circuit))
            roles = LibRelayRole.STOP | LibRelayRole.CLIENT
            if config.relay_service:
                roles |= LibRelayRole.HOP
            host.use_circuit_transport(CircuitV2Transport(
                libp2p_host, circuit, LibRelayConfig(roles=roles, limits=limits)))
            if config.hole_punching:
                dcutr = LabelledDCUtR(libp2p_host, host._paths,
                                      dial_timeout=int(config.dial_timeout))
                await stack.enter_async_context(background_trio_service(dcutr))
            host._inbound.guard_libp2p_handlers()
            host.add_relay_candidates(initial)
            try:
                async with open_service_nursery() as nursery:
                    if config.use_relays:
                        nursery.start_soon(host.serve_reservations)
                    if config.heap_trim_interval is not None:
                        nursery.start_soon(serve_heap_trim, config.heap_trim_interval)
                    if config.initial_peers:
                        await nursery.start(host.serve_initial_peers)
                    try:
                        yield host
                    finally:
                        nursery.cancel_scope.cancel()
            except trio.Cancelled:
                raise
            except BaseException as exc:
                error = exc
    if error is not None:
        raise error
