"""DCUtR that tells :class:`~p2pdl.net._paths.Paths` which direct connections it punched.

py-libp2p's :class:`DCUtRProtocol` upgrades a relayed connection in two ways:
a plain direct dial to the peer's public addresses first (spec step 0, the
"unilateral upgrade"), then, if that fails, the CONNECT/SYNC exchange and
simultaneous dials through both NATs.  Only the second is a hole punch.
Without this wrapper a direct connection that merely followed a relayed one
(a public peer first reached through a circuit, then dialled) was labelled
``hole-punched``.

:class:`LabelledDCUtR` opens a *punch window* on :class:`Paths` for a peer
while its exchange runs, on both sides (initiator and responder), and
confirms the peer when the exchange reports a verified direct connection.
"""

from __future__ import annotations

from typing import Any

from libp2p.peer.id import ID
from libp2p.relay.circuit_v2.dcutr import DCUtRProtocol
from multiaddr import Multiaddr

from ._paths import Paths

__all__ = ["LabelledDCUtR"]


class LabelledDCUtR(DCUtRProtocol):
    """:class:`DCUtRProtocol` that reports its hole punches to ``paths``."""

    def __init__(self, host: Any, paths: Paths, **kwargs: Any) -> None:
        super().__init__(host, **kwargs)
        self._paths = paths

    async def _initiate_hole_punch_locked(self, peer_id: ID) -> bool:
        # The unilateral dial runs first inside this call and is no punch:
        # the window opens only once it failed (see _try_unilateral_upgrade).
        try:
            return await super()._initiate_hole_punch_locked(peer_id)
        finally:
            self._paths.punch_ended(peer_id)

    async def _try_unilateral_upgrade(self, peer_id: ID) -> bool:
        upgraded = await super()._try_unilateral_upgrade(peer_id)
        if not upgraded:
            self._paths.punch_started(peer_id)
        return upgraded

    async def _handle_dcutr_stream(self, stream: Any) -> None:
        try:
            peer_id = stream.muxed_conn.peer_id
        except AttributeError:  # not a muxed stream: let the library refuse it
            await super()._handle_dcutr_stream(stream)
            return
        self._paths.punch_started(peer_id)
        try:
            await super()._handle_dcutr_stream(stream)
        finally:
            self._paths.punch_ended(peer_id)

    async def _perform_hole_punch(self, peer_id: ID, addrs: list[Multiaddr],
                                  as_responder: bool = False) -> bool:
        punched = await super()._perform_hole_punch(peer_id, addrs, as_responder=as_responder)
        if punched:
            self._paths.punch_succeeded(peer_id)
        return punched
