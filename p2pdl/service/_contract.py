"""What every protocol service of a node is, and what the node gives it.

Every service (``NatService``, ``DHTService``, ``ProgressService``,
``MatchmakingService``, ``AllReduceService``, ``StateSyncService``) has one shape,
as every rust-libp2p behaviour does:

* built the same way: ``Service(context, config, *, <named dependencies>)``,
  where :class:`ServiceContext` carries the host, the RPC call function and
  the wire's limits, and the dependencies are other services by name
  (``dht=``, ``reachability=``);
* ``endpoints()`` lists what it serves (``_endpoints``); the node installs
  them behind its admission gate, so no handler sees a request the gate
  refused;
* ``async serve(*, task_status)`` runs its background work for the node's
  lifetime and calls ``task_status.started()`` once it is ready;
* ``statistics()`` returns a frozen record (a :class:`Statistics`).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import trio

from ._admission import MembershipView, OpenAdmission
from ._flags import FlagBook

if TYPE_CHECKING:
    from ..net import Host, PeerIDLike
    from ..wire import Message, RpcProtocol, WireConfig
    from ._endpoints import Endpoint

__all__ = ["Call", "Reachability", "ReachabilityView", "ServiceContext", "Service",
           "Statistics", "serve_nothing"]

class Call(Protocol):
    """The node's RPC call for services: ``await call(peer, protocol, request,
    timeout, run_id=...) -> response``.

    ``run_id``: the run the request belongs to, as the calling service knows
    it (None: no run's); the node introduces itself to ``peer`` for that run
    first.  The run is decided once, by the service that makes the request,
    never read back from the message on the way down.
    """

    def __call__(self, peer: PeerIDLike, protocol: RpcProtocol, request: Message,
                 timeout: float | None = None, *, run_id: str | None = None
                 ) -> Awaitable[Message]: ...


class Reachability(enum.Enum):
    """Whether other peers can open connections to this node."""

    PUBLIC = "public"
    PRIVATE = "private"
    UNKNOWN = "unknown"


class ReachabilityView(Protocol):
    """What the layers above the NAT layer read of it (``NatService`` is one)."""

    @property
    def reachability(self) -> Reachability: ...

    @property
    def client_mode(self) -> bool: ...

    async def wait_changed(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class ServiceContext:
    """What the node gives every service: its host, its RPC call function, the wire's limits.

    ``clock``: the wall clock (seconds) that expirations and report times refer to.
    ``members``: the runs' membership as the node's admission gate knows it
    (who is a member, in which role).  ``flags``: the node's book of peers
    caught lying about themselves.  ``introduce``: ``await introduce(peer,
    run_id)`` before a service opens a run-scoped stream to ``peer`` that does
    not go through ``call`` (the all-reduce's, state sync's): it makes sure
    both sides have shown each other their membership on this connection (a
    no-op where the run needs no proof).  ``call`` does it by itself for
    the run its caller names (``run_id=``).
    """

    host: Host
    call: Call
    wire: WireConfig
    clock: Callable[[], float] = time.time
    members: MembershipView = dataclasses.field(default_factory=OpenAdmission)
    flags: FlagBook = dataclasses.field(default_factory=FlagBook)
    introduce: Callable[[Any, str], Awaitable[None]] = dataclasses.field(
        default=lambda peer, run_id: _introduced())


async def _introduced() -> None:
    """``introduce`` where no run needs proof of membership."""


class Statistics(collections.abc.Mapping):  # type: ignore[type-arg]
    """Base of every ``statistics()`` record: a frozen dataclass whose fields also
    read by name (``stats["formed"]``), as a read-only mapping; :meth:`as_dict`
    gives plain data (nested records too) for JSON."""

    def __getitem__(self, name: str) -> Any:
        if name not in self._names():
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())

    def _names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self))  # type: ignore[arg-type]

    def as_dict(self) -> dict[str, Any]:
        return {name: _plain(getattr(self, name)) for name in self._names()}

    @classmethod
    def counter_names(cls) -> tuple[str, ...]:
        """The record's counters: its fields that default to 0."""
        return tuple(f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                     if f.default == 0 and not isinstance(f.default, bool))


def _plain(value: Any) -> Any:
    if isinstance(value, Statistics):
        return value.as_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    return value


class Service(Protocol):
    """The contract every protocol service of a node keeps (see the module docstring)."""

    def endpoints(self) -> Sequence[Endpoint]: ...

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                    ) -> None: ...

    def statistics(self) -> Statistics: ...


async def serve_nothing(task_status: trio.TaskStatus[None]) -> None:
    """``serve`` of a service with no background work: ready at once, then idle."""
    task_status.started()
    await trio.sleep_forever()
