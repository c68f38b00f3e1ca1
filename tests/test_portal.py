"""The portal between other threads and a trio thread (p2pdl._portal)."""

from __future__ import annotations

import concurrent.futures
import threading
import time

import pytest
import trio
import trio.lowlevel

from p2pdl import Portal
from p2pdl.errors import CallTimeoutError, LocalProtocolError, NodeClosedError

pytestmark = pytest.mark.timeout(30)


class TrioThread:
    """A trio run in a thread with a portal, as a sync Node has."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.portal: Portal | None = None
        self.stop: trio.Event | None = None
        self.thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    async def _main(self) -> None:
        self.stop = trio.Event()
        async with trio.open_nursery() as nursery:
            self.portal = Portal(trio.lowlevel.current_trio_token(), nursery, self.thread)
            self.ready.set()
            await self.stop.wait()
            self.portal.close()
            nursery.cancel_scope.cancel()

    def close(self) -> None:
        assert self.portal is not None and self.stop is not None
        try:
            self.portal.run_sync(self.stop.set)
        except NodeClosedError:
            pass
        self.thread.join(10)


@pytest.fixture
def loop():
    thread = TrioThread()
    yield thread
    thread.close()


def test_run_returns_results_and_raises_errors(loop):
    portal = loop.portal

    async def add(a, b):
        await trio.sleep(0.01)
        return a + b

    assert portal.run(lambda: add(2, 3), 5) == 5
    assert portal.run_sync(lambda: threading.current_thread() is loop.thread)

    async def fail():
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        portal.run(fail, 5)


def test_a_timeout_cancels_the_operation(loop):
    cancelled = threading.Event()

    async def forever():
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    start = time.monotonic()
    with pytest.raises(CallTimeoutError):
        loop.portal.run(forever, 0.2)
    assert time.monotonic() - start < 5
    assert cancelled.wait(5)


def test_cancelling_the_future_cancels_the_trio_side(loop):
    started, cancelled = threading.Event(), threading.Event()

    async def forever():
        started.set()
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    future = loop.portal.submit(forever)
    assert started.wait(5)
    assert future.cancel()
    assert cancelled.wait(5)
    with pytest.raises(concurrent.futures.CancelledError):
        future.result(1)


def test_blocking_calls_from_the_trio_thread_are_refused(loop):
    async def noop():
        return None

    async def nested():
        return loop.portal.run(noop, 1)

    with pytest.raises(LocalProtocolError, match="own trio thread"):
        loop.portal.run(nested, 5)


def test_a_closed_portal_refuses_everything():
    thread = TrioThread()
    portal = thread.portal
    started = threading.Event()

    async def forever():
        started.set()
        await trio.sleep_forever()

    future = portal.submit(forever)
    assert started.wait(5)
    thread.close()
    assert portal.closed
    with pytest.raises(NodeClosedError):
        future.result(5)
    with pytest.raises(NodeClosedError):
        portal.submit(forever)
    with pytest.raises(NodeClosedError):
        portal.run_sync(lambda: None)
