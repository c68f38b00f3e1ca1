"""The portal: the one bridge between other threads and the node's trio thread.

A sync :class:`~p2pdl.Node` runs trio in one background thread.  Every face
built on it -- the sync methods, ``node.aio`` for asyncio, the faces of the
DHT, progress, matchmaking, averaging and state sync, and the Optimizer's
rounds -- crosses into that thread through one :class:`Portal` (trio's
``from_thread`` idea):

* :meth:`Portal.submit` runs a coroutine function in the node's nursery and
  returns a :class:`concurrent.futures.Future`; cancelling the future cancels
  the operation;
* :meth:`Portal.run` waits for it, at most ``timeout`` seconds
  (:class:`~p2pdl.errors.CallTimeoutError`, and the operation is cancelled);
* :meth:`Portal.run_sync` runs a short plain function on the trio thread and
  returns its result;
* :meth:`Portal.aio` awaits an operation from asyncio without blocking the
  asyncio loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import trio

from .errors import CallTimeoutError, LocalProtocolError, NodeClosedError

__all__ = ["Portal"]

T = TypeVar("T")


class Portal:
    """Runs operations on a trio thread for code in other threads (see the module docstring).

    ``nursery`` is where submitted operations run (the node's); ``thread`` is
    the trio thread, on which blocking calls are refused.  After :meth:`close`
    every call raises :class:`~p2pdl.errors.NodeClosedError`.
    """

    def __init__(self, token: trio.lowlevel.TrioToken, nursery: trio.Nursery,
                 thread: threading.Thread) -> None:
        self._token = token
        self._nursery = nursery
        self._thread = thread
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Refuse every call from now on (idempotent)."""
        self._closed = True

    def check_open(self) -> None:
        """Raise :class:`~p2pdl.errors.NodeClosedError` once the portal is closed."""
        if self._closed:
            raise NodeClosedError("the node is shut down")

    def submit(self, fn: Callable[[], Awaitable[T]]) -> concurrent.futures.Future[T]:
        """Run ``await fn()`` in the node's nursery; cancelling the future cancels it.

        The future stays pending while the operation runs, so that
        ``future.cancel()`` (and asyncio's cancellation of ``wrap_future``)
        always succeeds; the trio side is then cancelled.  If the node stops
        first, the future fails with :class:`~p2pdl.errors.NodeClosedError`.
        """
        self.check_open()
        if threading.current_thread() is self._thread:
            raise LocalProtocolError("a blocking Node method was called on the node's own trio "
                                     "thread (from a handler?); await the TrioNode methods there")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        scope = trio.CancelScope()

        async def runner() -> None:
            with scope:
                if future.cancelled():
                    return
                try:
                    result = await fn()
                except BaseException as exc:
                    _settle(future, exception=exc if isinstance(exc, Exception)
                            else NodeClosedError("the operation was cancelled"))
                    if not isinstance(exc, Exception):
                        raise
                else:
                    _settle(future, result=result)
            if scope.cancelled_caught:
                _settle(future, exception=NodeClosedError("the operation was cancelled"))

        def cancel_in_trio(f: concurrent.futures.Future[T]) -> None:
            if f.cancelled():
                try:
                    trio.from_thread.run_sync(scope.cancel, trio_token=self._token)
                except (trio.RunFinishedError, RuntimeError):
                    pass

        future.add_done_callback(cancel_in_trio)
        try:
            trio.from_thread.run_sync(self._nursery.start_soon, runner, trio_token=self._token)
        except (trio.RunFinishedError, RuntimeError):  # finished, or nursery closing
            raise NodeClosedError("the node is shut down") from None
        return future

    def run(self, fn: Callable[[], Awaitable[T]], timeout: float | None, *,
            return_future: bool = False) -> Any:
        """:meth:`submit`, then wait at most ``timeout`` seconds (None: no limit).

        With ``return_future=True`` the future is returned at once instead.
        After the timeout the operation is cancelled and
        :class:`~p2pdl.errors.CallTimeoutError` is raised.
        """
        future = self.submit(fn)
        if return_future:
            return future
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            if future.done():   # the operation's own timeout (CallTimeoutError is one)
                raise
            future.cancel()
            raise CallTimeoutError(f"operation did not finish within {timeout} s") from None

    def run_sync(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the trio thread, for short calls that do not wait."""
        self.check_open()
        try:
            return trio.from_thread.run_sync(fn, *args, trio_token=self._token)
        except trio.RunFinishedError:
            raise NodeClosedError("the node is shut down") from None

    async def aio(self, fn: Callable[[], Awaitable[T]]) -> T:
        """``await fn()`` on the trio thread, awaited from asyncio (the loop keeps running)."""
        return await asyncio.wrap_future(self.submit(fn))


def _settle(future: concurrent.futures.Future[Any], *, result: Any = None,
            exception: BaseException | None = None) -> None:
    """Complete ``future`` unless it was cancelled (possibly from another thread)."""
    try:
        if exception is not None:
            future.set_exception(exception)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:
        pass
