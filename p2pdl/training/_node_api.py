"""What the training layer uses of a node: :class:`TrainingNode`, a ``typing.Protocol``.

The :class:`~p2pdl.Optimizer` runs on the sync :class:`p2pdl.Node`, which
lives in the node layer above this one.  Rather than reach up to it, the
training layer names here exactly the members it calls -- the progress
tracker, averaging rounds and state sync -- with their types; ``p2pdl.Node``
provides them all (a test compares the signatures), and a test double that
provides them can stand in for it.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, cast

from ..errors import ConfigError

if TYPE_CHECKING:
    import torch
    from libp2p.peer.id import ID

    from ..averaging import AllReduceConfig, AllReduceResult, Group
    from ..net import PeerIDLike
    from ..progress import GlobalProgress, PeerReport
    from ..statesync import StateDownload

__all__ = ["TrainingNode", "TrainingTracker", "TrainingProgress", "TrainingAllReduce",
           "TrainingStateSync", "REQUIRED_MEMBERS", "check_training_node"]


class TrainingTracker(Protocol):
    """A progress tracker of one run, as ``node.progress.track(...)`` returns it."""

    def report(self, samples_accumulated: int, epoch: int | None = None, *,
               samples_per_second: float | None = None, loss: float | None = None,
               last_round: tuple | None = None) -> None: ...

    def update_epoch(self, epoch: int | None = None, *,
                     last_round: tuple | None = None) -> int: ...

    def publish_now(self) -> None:
        """Sign and push a fresh report now: the evidence behind this round's weight."""
        ...

    def global_progress(self) -> GlobalProgress: ...

    def peers(self) -> list[PeerReport]: ...

    def wait_ready(self, timeout: float) -> GlobalProgress:
        """Block until this peer is ready to step (CallTimeoutError after ``timeout`` s)."""
        ...

    def close(self) -> None: ...


class TrainingProgress(Protocol):
    """``node.progress``: start tracking a run."""

    def track(self, run_id: str, target_batch_size: int, *,
              auxiliary: bool = ..., name: str | None = ...) -> TrainingTracker: ...


class TrainingAllReduce(Protocol):
    """``node.allreduce``: one round (form a group, all-reduce) in the node's thread."""

    def start_round(self, run_id: str, epoch: int, tensors: Sequence[torch.Tensor], *,
                    weight: float, config: AllReduceConfig | None = ...,
                    inplace: bool = ..., on_group: Callable[[Group], None] | None = ...,
                    auxiliary: bool = ..., matchmaking_time: float | None = ...,
                    target_group_size: int | None = ..., bandwidth: float | None = ...,
                    reduce_rate: float | None = ..., sent_error: bool = ...
                    ) -> concurrent.futures.Future[AllReduceResult]:
        """Start the round and return its future at once (None options: the node's)."""
        ...

    def round_limit(self, *, matchmaking_time: float | None = ...,
                    config: AllReduceConfig | None = ...) -> float:
        """The longest such a round can take (s), margins included."""
        ...


class TrainingStateSync(Protocol):
    """``node.statesync``: offer this peer's state, download the swarm's."""

    def share(self, run_id: str, epoch: int, payload: bytes) -> None: ...

    def unshare(self, run_id: str) -> None: ...

    def fetch(self, run_id: str, donors: Sequence[PeerIDLike], *, min_epoch: int = ...,
              max_epoch: int | None = ..., timeout: float | None = ...,
              digest: bytes | None = ...) -> StateDownload: ...

    def offers(self, run_id: str, donors: Sequence[PeerIDLike]
               ) -> dict[ID, tuple[int, bytes]]: ...


class TrainingNode(Protocol):
    """The part of a sync :class:`p2pdl.Node` that the :class:`~p2pdl.Optimizer` uses.

    ``client_mode``: whether the node only dials out (then it never offers
    its state: nobody could fetch it).
    """

    @property
    def client_mode(self) -> bool: ...

    @property
    def progress(self) -> TrainingProgress: ...

    @property
    def allreduce(self) -> TrainingAllReduce: ...

    @property
    def statesync(self) -> TrainingStateSync: ...


#: Every member of :class:`TrainingNode` that the optimizer calls, as dotted paths.
REQUIRED_MEMBERS = ("client_mode", "progress.track", "allreduce.start_round",
                    "allreduce.round_limit", "statesync.share", "statesync.unshare",
                    "statesync.fetch", "statesync.offers")


def check_training_node(node: object) -> TrainingNode:
    """``node``, if it has every member of :class:`TrainingNode`; else a ConfigError.

    Members are looked up by name, without calling properties (``client_mode``
    asks the node's thread).  A :class:`~p2pdl.TrioNode` fails here: its
    ``allreduce`` is the trio service, which has no ``start_round``.
    """
    for path in REQUIRED_MEMBERS:
        owner: object = node
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent, None)
        if owner is None or name not in dir(owner):
            raise ConfigError(f"node must be a running p2pdl.Node (the sync node; it has no "
                              f"{path}); trio programs run the training loop in a thread "
                              f"with a p2pdl.Node")
    return cast(TrainingNode, node)
