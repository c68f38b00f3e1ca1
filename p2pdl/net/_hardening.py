"""py-libp2p 0.8.1's input handling, hardened against bad bytes from the network.

Each patch fixes one way in which a remote peer's bytes could stop or bloat
a node; each has a test in ``tests/net/test_hardening.py``, and
``simulations/fuzz_wire.py`` attacks all of them over real connections.
Installed once, when the host layer is imported; the version is pinned.

* **Multistream-select messages are read strictly** (``MultiselectCommunicator
  .read``).  py-libp2p decoded a message with ``bytes.decode()`` outside its
  error handling: three bytes on a fresh stream, ``02 ff 0a`` (a message that
  is not UTF-8), raised :class:`UnicodeDecodeError` out of the stream's task
  and through the host's nursery, and the process exited.  The same reader
  serves outbound negotiation (a hostile peer answering our dial) and the
  connection upgrade (security and muxer selection).  Now every malformed
  message -- not UTF-8, no trailing newline, empty, longer than
  ``MAX_MULTISTREAM_MESSAGE`` bytes, a length prefix over two bytes, the
  stream ending inside it -- is a ``MultiselectCommunicatorError``, which
  py-libp2p turns into a refused negotiation (the stream is reset); and a
  negotiation reads at most ``MAX_MULTISTREAM_MESSAGES`` messages, so one
  stream cannot make the node answer ``na`` forever.
* **A Yamux stream's receive window is enforced** (``Yamux.stream_buffers``).
  py-libp2p logged a warning when a peer sent more than a stream's window
  and buffered the data anyway: a peer could fill the memory of a node
  with one stream that nobody reads (one whose handler only writes, or one
  still negotiating).  Now data beyond the window the stream granted (plus
  ``WINDOW_SLACK`` for py-libp2p's own rounding) is dropped and the
  connection is closed, as go-yamux does (``ErrRecvWindowExceeded``).
* **py-libp2p's records about a remote's bad input are DEBUG records.**
  Its identify-push, relay, hole-punching and Yamux code log an ERROR or a
  WARNING for every malformed message, timed-out or reset stream of a
  remote peer: a peer could flood the node's log.  The host counts such
  streams itself (:class:`~p2pdl.net.HostStatistics`) and logs the first of
  each peer and protocol.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from libp2p.protocol_muxer.exceptions import MultiselectCommunicatorError
from libp2p.protocol_muxer.multiselect_communicator import MultiselectCommunicator
from libp2p.stream_muxer.yamux import yamux

__all__ = ["install", "MAX_MULTISTREAM_MESSAGE", "MAX_MULTISTREAM_MESSAGES", "WINDOW_SLACK",
           "RemoteInputRecords"]

logger = logging.getLogger(__name__)

#: Longest multistream-select message accepted, newline included (protocol ids
#: are short; go-libp2p and rust-libp2p refuse long ones too).
MAX_MULTISTREAM_MESSAGE = 1024
#: Messages one negotiation may read: the header, then protocol proposals.
MAX_MULTISTREAM_MESSAGES = 32
#: Bytes a peer may send beyond a Yamux stream's window before the connection
#: is closed: py-libp2p's window accounting rounds, a conforming sender never
#: exceeds the window by more than one frame.
WINDOW_SLACK = 256 * 1024


# -- multistream-select --------------------------------------------------------------

class _Malformed(Exception):
    pass


async def _read_exactly(reader: Any, n: int) -> bytes:
    """``n`` bytes; bounded: every read returns at least one byte or ends the loop."""
    out = bytearray()
    while len(out) < n:
        chunk = await reader.read(n - len(out))
        if not chunk:
            raise _Malformed(f"the stream ended inside a message ({len(out)} of {n} bytes)")
        out += chunk
    return bytes(out)


async def _strict_read(self: MultiselectCommunicator) -> str:
    """One multistream-select message, or ``MultiselectCommunicatorError``."""
    state = self.__dict__
    state["_p2pdl_reads"] = reads = state.get("_p2pdl_reads", 0) + 1
    try:
        if reads > MAX_MULTISTREAM_MESSAGES:
            raise _Malformed(f"more than {MAX_MULTISTREAM_MESSAGES} messages in one negotiation")
        first = (await _read_exactly(self.read_writer, 1))[0]
        length = first & 0x7F
        if first & 0x80:
            second = (await _read_exactly(self.read_writer, 1))[0]
            if second & 0x80:
                raise _Malformed("a length prefix longer than two bytes")
            length |= second << 7
        if not 0 < length <= MAX_MULTISTREAM_MESSAGE:
            raise _Malformed(f"a message of {length} bytes (1..{MAX_MULTISTREAM_MESSAGE})")
        data = await _read_exactly(self.read_writer, length)
        if data[-1:] != b"\n":
            raise _Malformed("a message without its trailing newline")
        return data[:-1].decode("utf-8")
    except UnicodeDecodeError:
        raise MultiselectCommunicatorError("a multistream-select message that is not "
                                           "UTF-8") from None
    except _Malformed as exc:
        raise MultiselectCommunicatorError(f"malformed multistream-select input: {exc}") \
            from None
    except MultiselectCommunicatorError:
        raise
    except Exception as exc:  # the stream was reset, closed, or its connection failed
        raise MultiselectCommunicatorError("fail to read from multiselect communicator") \
            from exc


# -- Yamux receive windows ---------------------------------------------------------------

class _WindowExceeded(trio.TooSlowError):
    """Raised inside py-libp2p's Yamux reader; its TooSlowError path closes the connection."""


class _WindowedBuffer(bytearray):
    """A Yamux stream's receive buffer that refuses data beyond the stream's window."""

    __slots__ = ("_conn", "_stream_id", "_excess")

    def extend(self, data: Any) -> None:  # type: ignore[override]
        stream = self._conn.streams.get(self._stream_id)
        if stream is not None and len(data) > stream.recv_window:
            # py-libp2p sets the window to 0 after an overrun: add them up here.
            excess = len(data) - max(stream.recv_window, 0)
            self._excess += excess
            RemoteInputRecords.yamux_window_excess += excess
            if self._excess > WINDOW_SLACK:
                logger.info("peer %s sent %d bytes beyond the window of Yamux stream %d; "
                            "closing the connection", self._conn.peer_id, self._excess,
                            self._stream_id)
                RemoteInputRecords.yamux_window_violations += 1
                raise _WindowExceeded("Yamux receive window exceeded")
        super().extend(data)


class _WindowedBuffers(dict):  # type: ignore[type-arg]
    """``Yamux.stream_buffers`` whose buffers check the window (see the module docstring)."""

    def __init__(self, conn: yamux.Yamux) -> None:
        super().__init__()
        self._conn = conn

    def __setitem__(self, stream_id: int, buffer: bytearray) -> None:
        if not isinstance(buffer, _WindowedBuffer):
            windowed = _WindowedBuffer(buffer)
            windowed._conn, windowed._stream_id, windowed._excess = self._conn, stream_id, 0
            buffer = windowed
        super().__setitem__(stream_id, buffer)


_original_yamux_init = yamux.Yamux.__init__


def _yamux_init(self: yamux.Yamux, *args: Any, **kwargs: Any) -> None:
    _original_yamux_init(self, *args, **kwargs)
    buffers = _WindowedBuffers(self)
    for stream_id, buffer in self.stream_buffers.items():
        buffers[stream_id] = buffer
    self.stream_buffers = buffers


# -- py-libp2p's log records about remote input -------------------------------------------

class RemoteInputRecords(logging.Filter):
    """Demote py-libp2p's WARNING and ERROR records about a remote's bad input to DEBUG.

    ``demoted`` counts them (this process, every node); a record that is
    demoted is dropped unless its logger is enabled for DEBUG.
    """

    #: Message prefixes, by logger, of records that report a remote peer's input.
    PREFIXES: dict[str, tuple[str, ...]] = {
        "libp2p.identity.identify_push.identify_push": (
            "Error processing identify/push",),
        "libp2p.identity.identify.identify": (
            "Failed to parse identify response", "Error getting remote address",
            "Error sending identify response"),
        "libp2p.relay.circuit_v2.protocol": (
            "Timeout reading from hop stream", "Invalid message type",
            "Unexpected error handling hop stream", "Failed to send error response",
            "Error handling reservation request", "Failed to send error response",
            "Timeout reading from stop stream", "Error handling stop stream",
            "Unexpected error reading from stream", "Read timed out after",
            "Error establishing relay connection", "Unexpected error in connect handler",
            "Error relaying data", "Timeout writing to destination stream",
            "Error writing to destination stream", "Error sending status message",
            "Error sending stop status message", "Received invalid sender-records",
            "Refusing HOP request"),
        "libp2p.relay.circuit_v2.dcutr": ("",),
        "libp2p.stream_muxer.yamux.yamux": (
            "Incomplete read for data on stream", "Error reading data for stream",
            "Stream ", "Yamux: timed out reading DATA frame body",
            "Incomplete read in handle_incoming", "Error in handle_incoming",
            "RawConnError during connection handling", "Yamux connection closed unexpectedly"),
        "libp2p.network.connection.swarm_connection": ("",),
        "libp2p.host.basic_host": ("ObservedAddrManager",),
        "libp2p.identity.update": ("Error updating", "Public key from", "Peer ",
                                   "SignedPeerRecord peer-id mismatch", "Updating Certified"),
    }
    demoted = 0
    yamux_window_excess = 0
    yamux_window_violations = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not isinstance(record.msg, str):
            return True
        prefixes = self.PREFIXES.get(record.name, ())
        if not record.msg.startswith(prefixes) or not prefixes:
            return True
        RemoteInputRecords.demoted += 1
        if not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_filter = RemoteInputRecords()


def install() -> None:
    """Install the patches and the log filter (idempotent)."""
    if MultiselectCommunicator.read is not _strict_read:
        MultiselectCommunicator.read = _strict_read  # type: ignore[method-assign]
    if yamux.Yamux.__init__ is not _yamux_init:
        yamux.Yamux.__init__ = _yamux_init  # type: ignore[method-assign]
    for name in RemoteInputRecords.PREFIXES:
        log = logging.getLogger(name)
        if _filter not in log.filters:
            log.addFilter(_filter)
