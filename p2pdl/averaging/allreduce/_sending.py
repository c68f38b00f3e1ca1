"""The sender side of the all-reduce service (``_service``): one stream per
reducer, the commitment to its chunks, the values out and the results in.

:class:`_SenderSide` is a part of :class:`AllReduceService`, which holds the
state its methods use.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from ..._concurrency import open_service_nursery
from ...errors import (
    P2PDLError,
    RemoteProtocolError,
    StreamClosedError,
)
from ...wire import FramedStream, TensorChunk, open_framed_stream
from ._evidence import (
    MAX_COMMITTED_CHUNKS,
    chunk_digest,
    commitment_payload,
    result_payload,
    signed_by,
)
from ._messages import (
    ALLREDUCE_PROTOCOL_ID,
    REDUCER_MESSAGES,
    Begin,
    Done,
    Reject,
)
from ._parts import PartReceiver
from ._session import (
    _Rejected,
    _Session,
)
from ._verify import verifiable

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["_SenderSide"]

logger = logging.getLogger(__name__)


class _SenderSide:
    """The sender side of :class:`AllReduceService`."""

    async def _exchange(self, session: _Session, r: int, receiver: PartReceiver,
                        sent: list[int], pending: int) -> None:
        """Send our values of part ``r`` to its reducer; receive its averages."""
        config = session.config
        peer = session.group.members[r].peer_id
        remaining = max(0.1, session.deadline - trio.current_time())
        with trio.fail_after(min(remaining, config.reducer_timeout)):
            # Both sides show each other their membership of the run first.
            await self._introduce(peer, session.group.run_id)
        remaining = max(0.1, session.deadline - trio.current_time())
        net_stream = await self._host.new_stream(peer, ALLREDUCE_PROTOCOL_ID,
                                                 timeout=min(remaining, config.reducer_timeout))
        async with open_framed_stream(net_stream, self._wire) as stream:
            try:
                chunks, commitment = self._commit(session, r)
                await stream.send_message(Begin(session.group.group_id, session.me, r,
                                                session.layout.digest, session.weight,
                                                want_result=not session.auxiliary,
                                                report=session.report, chunks=chunks,
                                                commitment=commitment))
                async with open_service_nursery() as nursery:
                    nursery.start_soon(self._send_values, stream, session, r, sent, pending)
                    await self._receive_results(stream, session, r, receiver)
                    nursery.cancel_scope.cancel()  # done: anything unsent is not wanted
            except RemoteProtocolError:
                await stream.reset()
                raise
            finally:
                session.count_stream(stream)

    async def _send_values(self, stream: FramedStream, session: _Session, r: int,
                           sent: list[int], pending: int) -> None:
        flat = session.flat
        try:
            if session.weight > 0:
                encoded = session.encoded.get(r)
                for k, chunk in enumerate(session.layout.chunks[r]):
                    payload = encoded[k] if encoded is not None \
                        else chunk.codec.encode(flat[chunk.start:chunk.end])
                    await stream.send_tensor_chunk(chunk.header(), payload)
            # No half-close: the reducer knows the chunk count, and py-libp2p's
            # Yamux breaks a stream whose peer half-closes while it still writes.
        except P2PDLError as exc:  # the stream broke: receiving the results fails too
            logger.debug("all-reduce: sending part %d failed: %s", r, exc)
            return
        sent[0] += 1
        if sent[0] == pending:
            session.mark("scatter")

    def _commit(self, session: _Session, r: int) -> tuple[list[bytes] | None, bytes | None]:
        """This sender's commitment to its chunks of part ``r`` (Disputes): it
        encodes them now (kept to send and to verify with) and signs their
        digests.  (None, None): nothing to commit to (no values, no chunks,
        too many, or a rule without a check)."""
        layout = session.layout
        chunks = layout.chunks[r]
        if session.weight <= 0 or not verifiable(layout.aggregator) or not chunks \
                or len(chunks) > MAX_COMMITTED_CHUNKS:
            return None, None
        # The none codec's payload is a view of the values, which the results
        # overwrite: copied; the others' are fresh memory of their own.
        payloads = [_own(c.codec.name, c.codec.encode(session.flat[c.start:c.end]))
                    for c in chunks]
        session.encoded[r] = payloads
        digests = [chunk_digest(p) for p in payloads]
        signature = self._key.sign(commitment_payload(session.group.group_id, r, session.me,
                                                      layout.digest, digests))
        self._counters["verification_bytes_sent"] += sum(map(len, digests)) + len(signature)
        session.commitments[r] = (digests, signature)
        return digests, signature

    async def _receive_results(self, stream: FramedStream, session: _Session, r: int,
                               receiver: PartReceiver) -> None:
        timeout = session.config.reducer_timeout
        while not receiver.complete:
            with trio.move_on_after(timeout) as scope:
                item = await stream.receive(REDUCER_MESSAGES)
            if scope.cancelled_caught:
                raise trio.TooSlowError(f"the reducer sent nothing for {timeout:.1f} s "
                                        f"(reducer_timeout)")
            if item is None:
                raise StreamClosedError("the reducer ended the stream before ar.done")
            if isinstance(item, TensorChunk):
                receiver.add_chunk(item.header, item.data)
                continue
            _, message = item
            if isinstance(message, Reject):
                raise _Rejected(f"the reducer refused: {message.code}"
                                + (f" ({message.detail})" if message.detail else ""))
            assert isinstance(message, Done)
            receiver.done(message.segments, message.taus, message.signature,
                          self._result_signed(session, r))

    def _result_signed(self, session: _Session, r: int
                       ) -> Callable[[bytes, bytes | None], bool] | None:
        """How a receiver checks part ``r``'s ``ar.done`` signature (None: a
        rule without a check, where reducers sign nothing)."""
        if not verifiable(session.layout.aggregator):
            return None
        group = session.group
        peer = group.members[r].peer_id

        def signed(digest: bytes, signature: bytes | None) -> bool:
            return signed_by(peer, result_payload(group.group_id, r, digest), signature)

        return signed


def _own(codec: str, payload: memoryview) -> bytes | memoryview:
    """``payload`` in memory of its own (the none codec's is a view of the
    values it encodes: copied)."""
    return bytes(payload) if codec == "none" else payload
