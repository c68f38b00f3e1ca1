"""Credit accounting (sans-IO)."""

from __future__ import annotations

import pytest

from p2pdl.errors import RemoteProtocolError
from p2pdl.wire import INITIAL_CREDIT, ReceiveWindow, SendCredit


def test_window_grants_in_batches_and_never_exceeds_window():
    window = ReceiveWindow(window=1000 + INITIAL_CREDIT, batch=300)
    assert window.initial_grant() == 1000
    assert window.allowance == 1000 + INITIAL_CREDIT
    window.on_frame(600)
    assert window.on_consumed(200) == 0
    assert window.on_consumed(400) == 600
    # outstanding credit + buffered + pending never exceeds the window
    assert window.allowance + window.buffered <= window.window


def test_frame_beyond_credit_is_a_violation():
    window = ReceiveWindow(window=INITIAL_CREDIT, batch=1)
    window.on_frame(INITIAL_CREDIT)
    with pytest.raises(RemoteProtocolError, match="flow control"):
        window.on_frame(1)


def test_send_credit():
    credit = SendCredit()
    assert credit.available == INITIAL_CREDIT
    credit.consume(INITIAL_CREDIT)
    credit.grant(10)
    assert credit.available == 10
    with pytest.raises(RemoteProtocolError):
        credit.grant(2**32)
