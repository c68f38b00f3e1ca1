"""Credit-based flow control of one stream direction.  No I/O.

The receiver reads continuously into a bounded buffer and tells the sender,
with CREDIT frames, how many more bytes it may send.  Because the sender never
exceeds its credit, the receiver never has to stop reading the muxer, so a
consumer that is busy for a long time (a training step) only pauses the
sender instead of tripping py-libp2p's Yamux 5-second write timeout.
"""

from __future__ import annotations

from ..errors import RemoteProtocolError
from .config import INITIAL_CREDIT


class SendCredit:
    """How many bytes we may still send to the peer."""

    def __init__(self) -> None:
        self.available = INITIAL_CREDIT

    def grant(self, increment: int) -> None:
        if self.available + increment > 2**32:
            raise RemoteProtocolError("peer granted more than 4 GiB of outstanding credit")
        self.available += increment

    def consume(self, nbytes: int) -> None:
        assert nbytes <= self.available, "sent beyond credit"
        self.available -= nbytes


class ReceiveWindow:
    """Our side of the window: what the peer may send and when to return credit.

    ``allowance`` is how much the peer may still send.  ``on_frame`` checks an
    arriving frame against it; ``on_consumed`` is called when the application
    takes a frame from the buffer and returns a credit increment to send, or 0
    while the amount to return is below ``batch``.
    """

    def __init__(self, window: int, batch: int) -> None:
        self.window = window
        self.batch = batch
        self.allowance = INITIAL_CREDIT
        self.buffered = 0
        self._pending = window - INITIAL_CREDIT  # credit owed to the sender

    def initial_grant(self) -> int:
        """Credit to grant when the stream opens, raising the peer to our full window."""
        grant, self._pending = self._pending, 0
        self.allowance += grant
        return grant

    def on_frame(self, nbytes: int) -> None:
        if nbytes > self.allowance:
            raise RemoteProtocolError(
                f"flow control violated: frame of {nbytes} bytes with only "
                f"{self.allowance} bytes of credit"
            )
        self.allowance -= nbytes
        self.buffered += nbytes

    def on_consumed(self, nbytes: int) -> int:
        self.buffered -= nbytes
        self._pending += nbytes
        if self._pending < self.batch:
            return 0
        grant, self._pending = self._pending, 0
        self.allowance += grant
        return grant
