"""Limits and defaults of the p2pdl wire (see protocols/wire.md)."""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError

KiB = 1024
MiB = 1024 * KiB

#: Size of a frame header: 1 byte kind + 4 bytes big-endian payload length.
FRAME_HEADER_SIZE = 5

#: Hard protocol limit on a frame's payload.  No peer may send more in one frame.
MAX_FRAME_PAYLOAD = 4 * MiB + 64 * KiB

#: Credit every stream starts with, in each direction, before any CREDIT frame.
INITIAL_CREDIT = 256 * KiB

#: Smallest receive window a receiver may offer: the largest possible frame.
MIN_RECEIVE_WINDOW = MAX_FRAME_PAYLOAD + FRAME_HEADER_SIZE


@dataclasses.dataclass(frozen=True)
class WireConfig:
    """Bounds of one p2pdl stream.  Every field has a documented default.

    Attributes:
        max_message_size: largest MESSAGE payload (msgpack envelope) accepted
            from a peer, in bytes.  Default 1 MiB.  Larger ones are a
            :class:`~p2pdl.errors.RemoteProtocolError`.
        max_tensor_frame_size: largest TENSOR payload accepted, in bytes.
            Default: the protocol maximum, 4 MiB + 64 KiB.
        receive_window: bytes the peer may have in flight towards us (our
            bounded receive buffer).  Default 8 MiB.  At least
            ``MIN_RECEIVE_WINDOW``.
        credit_batch: we return credit to the sender once the consumer has
            taken at least this many bytes.  Default ``receive_window // 4``.
        tensor_chunk_size: payload bytes per TENSOR frame when sending a
            tensor.  Default 1 MiB; at least 256 KiB so bulk data is written in
            large chunks.
        read_size: bytes asked from the muxer per read.  Default 1 MiB.
        send_timeout: longest wait for credit (a receiver that stopped
            consuming) before a send fails.  Default 120 s: much longer than a
            training step, short enough that a dead consumer is noticed.
        max_inflight_requests: requests one RPC stream serves concurrently;
            more wait (backpressure through credit).  Default 32.
        handler_timeout: longest time an RPC handler may take before the
            caller is sent a ``timeout`` error.  Default 60 s.
        rpc_idle_timeout: the caller closes an RPC stream that had no request
            in flight for this long; the server closes one that had no
            request in flight for twice as long (a caller that went quiet,
            or never asked anything).  Default 60 s.
        frame_timeout: a frame whose bytes stop arriving (its header or part
            of its payload came, then nothing) for this long resets the
            stream: a peer that half-sends frames holds no buffer for long.
            Default 30 s.
        call_timeout: default timeout of :meth:`call`.  Default 30 s.
    """

    max_message_size: int = 1 * MiB
    max_tensor_frame_size: int = MAX_FRAME_PAYLOAD
    receive_window: int = 8 * MiB
    credit_batch: int | None = None
    tensor_chunk_size: int = 1 * MiB
    read_size: int = 1 * MiB
    send_timeout: float = 120.0
    max_inflight_requests: int = 32
    handler_timeout: float = 60.0
    rpc_idle_timeout: float = 60.0
    frame_timeout: float = 30.0
    call_timeout: float = 30.0

    def __post_init__(self) -> None:
        def check(ok: bool, what: str) -> None:
            if not ok:
                raise ConfigError(f"WireConfig: {what}")

        check(0 < self.max_message_size <= MAX_FRAME_PAYLOAD,
              f"max_message_size must be in 1..{MAX_FRAME_PAYLOAD}")
        check(0 < self.max_tensor_frame_size <= MAX_FRAME_PAYLOAD,
              f"max_tensor_frame_size must be in 1..{MAX_FRAME_PAYLOAD}")
        check(MIN_RECEIVE_WINDOW <= self.receive_window <= 2**31,
              f"receive_window must be in {MIN_RECEIVE_WINDOW}..2**31")
        check(self.credit_batch is None or 0 < self.credit_batch <= self.receive_window,
              "credit_batch must be in 1..receive_window")
        check(256 * KiB <= self.tensor_chunk_size <= MAX_FRAME_PAYLOAD - 64 * KiB,
              "tensor_chunk_size must be in 256 KiB..4 MiB")
        check(self.read_size >= 64 * KiB, "read_size must be at least 64 KiB")
        for name in ("send_timeout", "handler_timeout", "rpc_idle_timeout", "call_timeout",
                     "frame_timeout"):
            check(getattr(self, name) > 0, f"{name} must be positive")
        check(self.max_inflight_requests >= 1, "max_inflight_requests must be >= 1")

    @property
    def effective_credit_batch(self) -> int:
        return self.credit_batch if self.credit_batch is not None else self.receive_window // 4
