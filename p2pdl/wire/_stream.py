"""FramedStream: the trio face of one p2pdl stream.

A FramedStream wraps a py-libp2p stream with the p2pdl framing, credit flow
control and size limits.  Two tasks run in a nursery owned by
:func:`open_framed_stream`: a reader that drains the muxer continuously into a
bounded inbox (so a busy consumer never stalls the muxer), and a credit
writer that returns credit as the application consumes frames (so receiving
never blocks on a write and stays cancel-safe).

What a peer sent and the application has not taken yet -- a frame still
arriving, frames in the inbox -- is held against the node's input budget
(:class:`~p2pdl.net.InputBudget`, per peer and per node) as well as the
stream's receive window; a frame whose bytes stop arriving for
``WireConfig.frame_timeout`` resets the stream.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio
from libp2p.network.stream.exceptions import StreamEOF, StreamError

from .._concurrency import open_service_nursery
from ..errors import (
    CallTimeoutError,
    LocalProtocolError,
    RemoteProtocolError,
    StreamClosedError,
)
from ..net import input_budget, read_owned
from ._flow import ReceiveWindow, SendCredit
from ._frames import (
    BufferPool,
    Frame,
    FrameDecoder,
    FrameKind,
    decode_credit,
    encode_credit,
    frame_header,
)
from ._messages import Message, MessageSet, encode_message
from ._tensor import (
    TensorChunk,
    TensorHeader,
    decode_tensor_frame,
    encode_tensor_frame,
    iter_tensor_chunks,
    tensor_bytes,
)
from .config import WireConfig

if TYPE_CHECKING:
    import torch
    from libp2p.abc import INetStream

__all__ = ["FramedStream", "StreamStatistics", "open_framed_stream", "traffic"]

#: Bytes of p2pdl frames written and read in this process, per protocol id.
_TRAFFIC: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])


def traffic() -> dict[str, tuple[int, int]]:
    """Bytes of p2pdl frames ``(sent, received)`` per protocol id, by every node of
    this process since it started (credit frames included; yamux, Noise and TCP
    headers not).  For benchmarks: they compare protocols by what they send."""
    return {protocol: (sent, received) for protocol, (sent, received) in _TRAFFIC.items()}


logger = logging.getLogger(__name__)

#: How long a closing stream waits for the peer to finish sending before reset.
CLOSE_LINGER = 2.0
#: Seconds the reader waits for a large frame to be buffered whole (then no copy).
WHOLE_FRAME_PATIENCE = 0.25
#: A partial frame's deadline moves at most this late (seconds) before it is pushed back.
FRAME_DEADLINE_SLACK = 1.0
#: TENSOR frames per direction whose time a stream keeps (``tensor_log``).
MAX_TENSOR_LOG = 4096
#: Bound on the reset/close calls made while tearing a stream down.
TEARDOWN_TIMEOUT = 2.0


@dataclasses.dataclass(frozen=True)
class StreamStatistics:
    """A stream's counters.  ``tensor_sent`` / ``tensor_received``: the
    bytes of TENSOR frames written (read whole) and the trio times of the
    first write's start and the last one's end (of the first and last frame
    read), None before any: the bulk data's rate, without the messages that
    may come long before or after it (:meth:`FramedStream.tensor_log` has
    each frame's time)."""

    bytes_sent: int
    bytes_received: int
    frames_sent: int
    frames_received: int
    send_credit: int
    buffered_bytes: int
    tensor_sent: tuple[int, float, float] | None = None
    tensor_received: tuple[int, float, float] | None = None


class FramedStream:
    """One p2pdl stream.  Create it with :func:`open_framed_stream`.

    Sending methods wait for credit (at most ``config.send_timeout``); several
    tasks may send concurrently and each frame goes out whole.  Receiving
    methods are cancel-safe: a cancelled receive loses nothing.  Errors:

    * :class:`RemoteProtocolError` -- the peer broke the protocol; the stream
      has been reset.
    * :class:`StreamClosedError` -- the stream was reset or the connection lost,
      or (strict receive methods) the peer closed its side.
    """

    def __init__(self, net_stream: INetStream, config: WireConfig) -> None:
        self._net = net_stream
        self._config = config
        self._decoder = FrameDecoder(
            max_message_size=config.max_message_size,
            max_tensor_frame_size=config.max_tensor_frame_size,
            alloc=BufferPool(max_buffers=config.receive_window // BufferPool.MIN_SIZE // 8 + 4))
        self._credit = SendCredit()
        self._window = ReceiveWindow(config.receive_window, config.effective_credit_batch)
        self._inbox: collections.deque[Frame] = collections.deque()
        self._inbox_lot = trio.lowlevel.ParkingLot()
        self._credit_lot = trio.lowlevel.ParkingLot()
        self._send_lock = trio.Lock()
        self._write_lock = trio.Lock()
        self._credit_owed = 0
        self._credit_wakeup = trio.Event()
        self._peer_done = trio.Event()  # peer closed its side, or the stream failed
        self._error: BaseException | None = None
        self._dispatcher: Callable[[Frame], bool] | None = None
        self._write_closed = False
        self._bytes_sent = self._bytes_received = 0
        self._frames_sent = self._frames_received = 0
        self._tensor_sent: tuple[int, float, float] | None = None
        self._tensor_received: tuple[int, float, float] | None = None
        # (trio time, bytes) of each TENSOR frame written / read, the first
        # MAX_TENSOR_LOG of each
        self._sent_log: list[tuple[float, int]] = []
        self._received_log: list[tuple[float, int]] = []
        self._traffic: list[int] | None = None
        self._budget = input_budget(net_stream)
        self._held = 0  # bytes held against the budget

    # -- identity ---------------------------------------------------------

    @property
    def peer_id(self) -> Any:
        return self._net.muxed_conn.peer_id

    @property
    def protocol(self) -> str | None:
        return self._net.get_protocol()

    def _count(self) -> list[int]:
        if self._traffic is None:
            self._traffic = _TRAFFIC[self.protocol or "?"]
        return self._traffic

    def tensor_log(self) -> tuple[list[tuple[float, int]], list[tuple[float, int]]]:
        """(trio time, bytes) of each TENSOR frame written (when the write
        ended) and read (when it was whole): the first MAX_TENSOR_LOG of each
        direction.  The lists are the stream's own: read, do not change."""
        return self._sent_log, self._received_log

    def statistics(self) -> StreamStatistics:
        return StreamStatistics(self._bytes_sent, self._bytes_received, self._frames_sent,
                                self._frames_received, self._credit.available,
                                self._window.buffered, self._tensor_sent,
                                self._tensor_received)

    # -- sending ----------------------------------------------------------

    async def send_message(self, message: Message, request_id: int = 0) -> None:
        """Send one typed message (at most ``max_message_size`` bytes encoded).

        A larger message is a :class:`LocalProtocolError` here, since a peer
        with the default limit would reset the stream on it.
        """
        payload = encode_message(message, request_id)
        if len(payload) > self._config.max_message_size:
            raise LocalProtocolError(
                f"{message.TAG!r} message of {len(payload)} bytes exceeds max_message_size "
                f"({self._config.max_message_size} bytes); send bulk data as tensor frames")
        await self._send_frame(frame_header(FrameKind.MESSAGE, len(payload)) + payload)

    async def send_tensor_chunk(self, header: TensorHeader, data: bytes | memoryview,
                                request_id: int = 0) -> None:
        """Send one chunk: its header and ``data`` (at most ``max_tensor_frame_size``)."""
        prefix = encode_tensor_frame(header, len(data), request_id)
        # One write per frame: the muxer turns every write into its own frames
        # and encrypted records, which costs more than copying the chunk once.
        await self._send_frame(prefix + data, tensor=True)

    async def send_tensor(self, tensor: torch.Tensor, *, part: int = 0, request_id: int = 0,
                          chunk_size: int | None = None) -> int:
        """Send a CPU tensor as TENSOR frames of ``chunk_size`` bytes; returns the frame count.

        The receiver reassembles it from the headers (shape, offset, count).
        """
        dtype, shape, raw = tensor_bytes(tensor)
        frames = 0
        for header, data in iter_tensor_chunks(part, dtype, shape, raw,
                                               chunk_size or self._config.tensor_chunk_size):
            await self.send_tensor_chunk(header, data, request_id)
            frames += 1
        return frames

    async def _send_frame(self, frame: bytes, *, tensor: bool = False) -> None:
        if self._write_closed:
            raise LocalProtocolError("stream is closed for writing")
        size = len(frame)
        async with _locked(self._send_lock):
            self._raise_if_failed()
            if self._credit.available < size:
                with trio.move_on_after(self._config.send_timeout) as scope:
                    while self._credit.available < size:
                        self._raise_if_failed()
                        await self._credit_lot.park()
                if scope.cancelled_caught:
                    raise CallTimeoutError(
                        f"peer granted no credit for {self._config.send_timeout:.0f} s "
                        f"(its consumer is stuck)"
                    )
            self._credit.consume(size)
            began = trio.current_time()
            await self._write(frame)
            self._bytes_sent += size
            self._frames_sent += 1
            if tensor:
                ended = trio.current_time()
                self._tensor_sent = _spanned(self._tensor_sent, size, began, ended)
                if len(self._sent_log) < MAX_TENSOR_LOG:
                    self._sent_log.append((ended, size))

    async def _write(self, frame: bytes) -> None:
        async with _locked(self._write_lock):
            try:
                await self._finish_write(self._net.write, frame)
                self._count()[0] += len(frame)
            except StreamError as exc:
                self._fail(StreamClosedError(f"stream to {self.peer_id} closed while sending"))
                raise self._error from exc  # type: ignore[misc]
            except StreamClosedError:
                raise
            except BaseException:  # a muxer fault mid-frame: this stream is unusable
                self._fail(StreamClosedError(f"a send to {self.peer_id} failed mid-frame"))
                await self._reset_quietly()
                raise

    async def _finish_write(self, write: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run one write on the libp2p stream to its end, even if cancelled meanwhile.

        A p2pdl frame may span several Yamux frames; cut between them, it would
        leave half a frame in the stream and the stream would have to be
        reset.  So the write is shielded and a cancellation takes effect right
        after it: a timed-out call leaves its stream usable.  (Each Yamux
        frame is also written whole, for the connection's sake: ``net._yamux``.)
        Bounded by ``send_timeout``.
        """
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + self._config.send_timeout
            await write(*args)
        if scope.cancelled_caught:
            self._fail(StreamClosedError(f"stream to {self.peer_id}: a write took over "
                                         f"{self._config.send_timeout:.0f} s"))
            raise self._error  # type: ignore[misc]

    async def close_write(self) -> None:
        """Tell the peer we will send nothing more (half-close).  Idempotent."""
        if self._write_closed:
            return
        async with self._send_lock:
            self._write_closed = True
            async with self._write_lock:
                try:
                    await self._finish_write(self._net.close_write)
                except (StreamError, StreamClosedError):
                    pass

    # -- receiving --------------------------------------------------------

    async def receive(self, messages: MessageSet) -> tuple[int, Message] | TensorChunk | None:
        """Next incoming item: ``(request_id, message)`` or a :class:`TensorChunk`.

        Returns None once the peer has closed its side and everything it sent
        was received.  A message whose type is not in ``messages`` is a
        :class:`RemoteProtocolError`.
        """
        frame = await self._next_frame()
        if frame is None:
            return None
        try:
            return decode_frame(frame, messages)
        except RemoteProtocolError as exc:
            await self._abort(exc)
            raise

    def set_dispatcher(self, dispatcher: Callable[[Frame], bool] | None) -> None:
        """Let ``dispatcher(frame)`` take incoming frames in the reader task.

        For request/response, where a task hop per message is most of the
        latency.  The dispatcher is offered each MESSAGE or TENSOR frame while
        nothing waits in the inbox (so order is kept); it returns True if it
        took the frame, False to queue it for :meth:`receive`.  It must not
        block.  A :class:`RemoteProtocolError` it raises resets the stream.
        """
        self._dispatcher = dispatcher

    async def wait_peer_done(self) -> None:
        """Wait until the peer closed its side or the stream failed."""
        await self._peer_done.wait()

    @property
    def failure(self) -> BaseException | None:
        """The error that ended the stream, if one did."""
        return self._error

    async def receive_message(self, messages: MessageSet) -> tuple[int, Message]:
        """Next item, which must be a message; end of stream is a StreamClosedError."""
        item = await self.receive(messages)
        if item is None:
            raise StreamClosedError(f"{self.peer_id} closed the stream")
        if isinstance(item, TensorChunk):
            exc = RemoteProtocolError("expected a message, got a tensor chunk")
            await self._abort(exc)
            raise exc
        return item

    async def receive_tensor_chunk(self) -> TensorChunk:
        """Next item, which must be a tensor chunk; end of stream is a StreamClosedError."""
        item = await self.receive(_NO_MESSAGES)
        if item is None:
            raise StreamClosedError(f"{self.peer_id} closed the stream")
        assert isinstance(item, TensorChunk)
        return item

    async def iter_messages(self, messages: MessageSet) -> AsyncIterator[tuple[int, Message]]:
        """Yield ``(request_id, message)`` until the peer closes its side."""
        while True:
            item = await self.receive(messages)
            if item is None:
                return
            if isinstance(item, TensorChunk):
                exc = RemoteProtocolError("expected a message, got a tensor chunk")
                await self._abort(exc)
                raise exc
            yield item

    async def _next_frame(self) -> Frame | None:
        if isinstance(self._error, RemoteProtocolError):
            raise self._error  # nothing more from a peer that broke the protocol
        while not self._inbox:
            self._raise_if_failed()
            if self._peer_done.is_set():
                return None
            await self._inbox_lot.park()
        frame = self._inbox.popleft()
        self._consumed(frame.wire_size)
        return frame

    def _consumed(self, nbytes: int) -> None:
        grant = self._window.on_consumed(nbytes)
        if grant:
            self._credit_owed += grant
            self._credit_wakeup.set()
        self._hold(self._decoder.held + self._window.buffered)

    def _hold(self, nbytes: int) -> None:
        """Hold ``nbytes`` in all against the input budget; RemoteProtocolError if it is spent."""
        budget, delta = self._budget, nbytes - self._held
        if budget is None or not delta:
            return
        if delta < 0:
            budget.release(self.peer_id, -delta)
        elif not budget.try_hold(self.peer_id, delta):
            raise RemoteProtocolError(
                f"input budget spent: {self.peer_id} would hold {budget.held(self.peer_id) + delta}"
                f" bytes of unconsumed input (limit {budget.per_peer} per peer), the node "
                f"{budget.total + delta} (limit {budget.per_node})")
        self._held = nbytes

    # -- background tasks -------------------------------------------------

    async def _read_loop(self) -> None:
        net, decoder, read_size = self._net, self._decoder, self._config.read_size
        frame_timeout = self._config.frame_timeout
        # One scope for the whole loop: entering a scope per read cost more
        # than the rest of the loop.  Its deadline is pushed back (at most
        # once per FRAME_DEADLINE_SLACK seconds, each push has a cost) while
        # a partial frame's bytes keep coming, and lifted between frames.
        inf, now = float("inf"), trio.current_time
        try:
            with trio.CancelScope() as scope:
                while True:
                    if not decoder.buffered:
                        if scope.deadline != inf:   # each change of a deadline costs
                            scope.deadline = inf
                    elif scope.deadline == inf \
                            or now() + frame_timeout - scope.deadline > FRAME_DEADLINE_SLACK:
                        scope.deadline = now() + frame_timeout
                    try:
                        data = await read_owned(net, read_size, decoder.wanted,
                                                WHOLE_FRAME_PATIENCE)
                    except StreamEOF:
                        break
                    if not data:
                        break
                    self._on_data(data)
            if scope.cancelled_caught:
                raise RemoteProtocolError(
                    f"a frame was left unfinished: {decoder.buffered} bytes of it, "
                    f"then nothing for {frame_timeout:.0f} s")
            decoder.check_complete()
        except RemoteProtocolError as exc:
            # Whoever owns the stream reports it (the host logs an inbound one once).
            logger.debug("protocol error from %s on %s: %s", self.peer_id, self.protocol, exc)
            await self._abort(exc)
        except StreamError:
            self._fail(StreamClosedError(f"stream with {self.peer_id} was reset"))
        except Exception as exc:  # a muxer fault must not crash the stream's owner
            logger.debug("reading from %s failed", self.peer_id, exc_info=True)
            self._fail(StreamClosedError(f"stream with {self.peer_id} failed: {exc!r}"))
        finally:
            self._peer_done.set()
            self._inbox_lot.unpark_all()
            self._credit_lot.unpark_all()

    def _on_data(self, data: bytes | bytearray) -> None:
        """Take bytes read from the muxer (ours: see ``read_owned``)."""
        self._bytes_received += len(data)
        self._count()[1] += len(data)
        for frame in self._decoder.feed(data, owned=isinstance(data, bytearray)):
            if frame.kind is FrameKind.CREDIT:
                self._credit.grant(decode_credit(frame.payload))
                self._credit_lot.unpark_all()
            else:
                if frame.kind is FrameKind.TENSOR:
                    now = trio.current_time()
                    self._tensor_received = _spanned(self._tensor_received, frame.wire_size,
                                                     now, now)
                    if len(self._received_log) < MAX_TENSOR_LOG:
                        self._received_log.append((now, frame.wire_size))
                self._window.on_frame(frame.wire_size)
                self._frames_received += 1
                dispatcher = self._dispatcher
                if dispatcher is not None and not self._inbox and dispatcher(frame):
                    self._consumed(frame.wire_size)
                else:
                    self._inbox.append(frame)
                    self._inbox_lot.unpark_all()
        self._hold(self._decoder.held + self._window.buffered)

    async def _credit_loop(self) -> None:
        while True:
            await self._credit_wakeup.wait()
            self._credit_wakeup = trio.Event()
            owed, self._credit_owed = self._credit_owed, 0
            if self._error is not None or not owed:
                continue
            try:
                async with _locked(self._write_lock):
                    credit = encode_credit(owed)
                    await self._finish_write(self._net.write, credit)
                    self._count()[0] += len(credit)
            except StreamError:
                self._fail(StreamClosedError(f"stream with {self.peer_id} was reset"))
            except StreamClosedError:
                pass  # recorded by _finish_write

    # -- failure and teardown ---------------------------------------------

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        if isinstance(exc, RemoteProtocolError):
            self._inbox.clear()
            self._release_input()
        self._peer_done.set()
        self._inbox_lot.unpark_all()
        self._credit_lot.unpark_all()

    def _release_input(self) -> None:
        """Drop what a partial frame holds and give everything held back to the
        budget (the stream is broken or over, its inbox emptied)."""
        self._decoder.discard()
        if self._budget is not None and self._held:
            self._budget.release(self.peer_id, self._held)
        self._held = 0
        self._budget = None  # nothing more is held

    async def _abort(self, exc: BaseException) -> None:
        self._fail(exc)
        await self._reset_quietly()

    async def reset(self) -> None:
        """Abort the stream in both directions at once."""
        await self._abort(StreamClosedError("stream was reset locally"))

    async def _reset_quietly(self) -> None:
        # Shielded, so that a reset asked for is a reset sent.
        with trio.CancelScope(shield=True), trio.move_on_after(TEARDOWN_TIMEOUT):
            try:
                await self._net.reset()
            except Exception:  # the stream may already be gone; nothing to add
                logger.debug("reset of a stream with %s failed", self.peer_id, exc_info=True)

    async def _finish(self) -> None:
        """Normal end: half-close, give the peer a moment to finish, then reset."""
        if self._error is not None:
            return
        with trio.move_on_after(TEARDOWN_TIMEOUT):
            await self.close_write()
        with trio.move_on_after(CLOSE_LINGER):
            await self._peer_done.wait()
        if not self._peer_done.is_set() or self._error is not None:
            await self._reset_quietly()


_NO_MESSAGES = MessageSet()


def decode_frame(frame: Frame, messages: MessageSet) -> tuple[int, Message] | TensorChunk:
    """A MESSAGE or TENSOR frame as ``(request_id, message)`` or a chunk."""
    if frame.kind is FrameKind.MESSAGE:
        return messages.decode(frame.payload)
    return decode_tensor_frame(frame.payload)


@asynccontextmanager
async def _locked(lock: trio.Lock) -> AsyncIterator[None]:
    """Hold ``lock``; uncontended, without the scheduler round trip of ``acquire``.

    Every caller awaits the muxer right after, which is the checkpoint.
    """
    try:
        lock.acquire_nowait()
    except trio.WouldBlock:
        await lock.acquire()
    try:
        yield
    finally:
        lock.release()


@asynccontextmanager
async def open_framed_stream(net_stream: INetStream,
                             config: WireConfig | None = None) -> AsyncIterator[FramedStream]:
    """Run a :class:`FramedStream` over ``net_stream`` for the duration of the block.

    On a normal exit the stream is half-closed and, after the peer closes its
    side (at most ``CLOSE_LINGER`` seconds), released; on an exception or
    cancellation it is reset.
    """
    stream = FramedStream(net_stream, config or WireConfig())
    grant = stream._window.initial_grant()
    async with open_service_nursery() as nursery:
        nursery.start_soon(stream._read_loop)
        nursery.start_soon(stream._credit_loop)
        stream._credit_owed = grant
        stream._credit_wakeup.set()
        try:
            yield stream
        except BaseException:
            stream._fail(StreamClosedError("stream was closed after an error"))
            with trio.CancelScope(shield=True):
                await stream._reset_quietly()
            raise
        else:
            try:
                await stream._finish()
            except BaseException:
                with trio.CancelScope(shield=True):
                    await stream._reset_quietly()
                raise
        finally:
            nursery.cancel_scope.cancel()
            stream._inbox.clear()  # nobody will take it now
            stream._release_input()


def _spanned(known: tuple[int, float, float] | None, size: int, began: float, ended: float
             ) -> tuple[int, float, float]:
    """``known`` (bytes, first, last) with ``size`` more bytes moved from ``began`` to ``ended``."""
    if known is None:
        return (size, began, ended)
    return (known[0] + size, known[1], ended)

