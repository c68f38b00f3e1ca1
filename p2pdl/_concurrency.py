"""Structured-concurrency helpers shared by every layer (imports nothing of p2pdl)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

if sys.version_info >= (3, 11):
    import builtins

    _BaseExceptionGroup = builtins.BaseExceptionGroup
else:  # trio's dependency on Python 3.10
    from exceptiongroup import BaseExceptionGroup as _BaseExceptionGroup


@asynccontextmanager
async def open_service_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery for background services around a ``yield``.

    Trio wraps whatever the body of ``async with trio.open_nursery()`` raises
    in an :class:`ExceptionGroup`.  For context managers that run services
    around user code (a node, a stream), that would turn a user's own
    ``ValueError``, or a :class:`~p2pdl.errors.RemoteProtocolError`, into a
    group.  Here the body's exception cancels the services and then
    propagates unchanged; only a service's own crash is reported as a group.
    Cancellations, alone or grouped by the body's own nurseries, are left to
    trio, which routes each to its cancel scope: kept as the body's error they
    would cancel whatever encloses this nursery (a killed in-memory host
    would end its whole swarm's block, quietly).
    """
    body_error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        try:
            yield nursery
        except trio.Cancelled:
            raise  # belongs to a cancel scope; trio routes it there
        except _BaseExceptionGroup as group:
            if group.split(trio.Cancelled)[1] is None:
                raise  # only cancellations (of the body's own nurseries): routed as above
            body_error = group
            nursery.cancel_scope.cancel()
        except BaseException as exc:
            body_error = exc
            nursery.cancel_scope.cancel()
    if body_error is not None:
        raise body_error
