"""A stand-in for the sync ``p2pdl.Node`` with the members of ``TrainingNode``, no network.

The test decides what each averaging round returns (``averaging.futures``),
which peers the tracker sees (``tracker.reports``) and what state sync offers
and downloads (``state_sync.offered``, ``state_sync.payloads``); every call is
recorded.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import time
from types import SimpleNamespace
from typing import Any

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from p2pdl.errors import CallTimeoutError, StateSyncError
from p2pdl.progress import GlobalProgress, PeerReport


def progress(epoch: int = 0, *, num_peers: int = 2, num_auxiliary: int = 0,
             ready: bool = False) -> GlobalProgress:
    return GlobalProgress(epoch=epoch, samples_accumulated=0, estimated_samples=0.0,
                          target_batch_size=8, num_peers=num_peers, num_clients=0,
                          num_auxiliary=num_auxiliary, samples_per_second=0.0,
                          eta_next_epoch=float("inf"), ready_to_step=ready, time=time.time())


def report(peer: bytes, epoch: int, *, client_mode: bool = False,
           auxiliary: bool = False) -> PeerReport:
    return PeerReport(peer_id=peer, epoch=epoch, samples_accumulated=0, samples_per_second=0.0,
                      time=time.time(), client_mode=client_mode, auxiliary=auxiliary)


def group(members: int = 2) -> SimpleNamespace:
    """A group of ``members`` made-up peers, as an all-reduce result holds it."""
    return SimpleNamespace(members=tuple(
        SimpleNamespace(peer_id=ID.from_pubkey(create_new_key_pair().public_key))
        for _ in range(members)))


def averaged(tensors: list[Any], members: int = 2, incomplete: tuple[int, ...] = (),
             excluded: tuple[int, ...] = ()) -> SimpleNamespace:
    """What an all-reduce returns: ``tensors``, with the parts in ``incomplete`` not done
    and the members in ``excluded`` left out by this peer's reducer.  The three
    parts cut the tensors' values (flattened in order) into thirds."""
    numel = sum(t.numel() for t in tensors) if all(hasattr(t, "numel") for t in tensors) \
        else 0
    cuts = [0, numel // 3, 2 * numel // 3, numel]
    parts = [SimpleNamespace(completed=i not in incomplete, start=cuts[i], end=cuts[i + 1])
             for i in range(3)]
    return SimpleNamespace(completed=not incomplete, tensors=tensors, parts=parts,
                           group=group(members), excluded=excluded)


@dataclasses.dataclass
class FakeTracker:
    view: list[GlobalProgress] = dataclasses.field(default_factory=lambda: [progress()])
    reports: list[PeerReport] = dataclasses.field(default_factory=list)
    epochs: list[int | None] = dataclasses.field(default_factory=list)
    reported: list[tuple[int, int | None]] = dataclasses.field(default_factory=list)
    closed: bool = False
    published: int = 0
    losses: list[float] = dataclasses.field(default_factory=list)
    rounds: list[tuple[int, str, int]] = dataclasses.field(default_factory=list)

    def report(self, samples_accumulated: int, epoch: int | None = None, *,
               samples_per_second: float | None = None, loss: float | None = None,
               last_round: tuple[int, str, int] | None = None) -> None:
        self.reported.append((samples_accumulated, epoch))
        if last_round is not None:
            self.rounds.append(last_round)
        if loss is not None:
            self.losses.append(loss)

    def update_epoch(self, epoch: int | None = None, *,
                     last_round: tuple | None = None) -> int:
        self.epochs.append(epoch)
        if last_round is not None:
            self.rounds.append(last_round)
        return epoch or 0

    def publish_now(self) -> None:
        self.published += 1

    def global_progress(self) -> GlobalProgress:
        return self.view[0] if len(self.view) == 1 else self.view.pop(0)

    def peers(self) -> list[PeerReport]:
        return list(self.reports)

    def wait_ready(self, timeout: float) -> GlobalProgress:
        view = self.global_progress()
        if not view.ready_to_step:
            time.sleep(min(timeout, 0.01))
            raise CallTimeoutError("not ready")
        return view

    def close(self) -> None:
        self.closed = True


@dataclasses.dataclass
class FakeProgress:
    tracker: FakeTracker = dataclasses.field(default_factory=FakeTracker)
    tracked: list[tuple[str, int, bool]] = dataclasses.field(default_factory=list)
    names: list[str | None] = dataclasses.field(default_factory=list)

    def track(self, run_id: str, target_batch_size: int, *,
              auxiliary: bool = False, name: str | None = None) -> FakeTracker:
        self.tracked.append((run_id, target_batch_size, auxiliary))
        self.names.append(name)
        return self.tracker


@dataclasses.dataclass
class FakeAllReduce:
    limit: float = 1.0
    futures: list[concurrent.futures.Future[Any]] = dataclasses.field(default_factory=list)
    calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def start_round(self, run_id: str, epoch: int, tensors: Any, *, weight: float,
                    **options: Any) -> concurrent.futures.Future[Any]:
        self.calls.append({"run_id": run_id, "epoch": epoch, "tensors": tensors,
                           "weight": weight, **options})
        return self.futures.pop(0) if self.futures else concurrent.futures.Future()

    def round_limit(self, **options: Any) -> float:
        return self.limit


@dataclasses.dataclass
class FakeStateSync:
    #: what ``offers`` answers: peer -> (epoch, digest)
    offered: dict[ID, tuple[int, bytes]] = dataclasses.field(default_factory=dict)
    #: what successive ``fetch`` calls download (an exception is raised)
    payloads: list[Any] = dataclasses.field(default_factory=list)
    shared: list[tuple[str, int, bytes]] = dataclasses.field(default_factory=list)
    #: a download from one donor says ``confirmed=False`` (state sync's lone donor)
    lone_unconfirmed: bool = False
    fetched: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    unshared: list[str] = dataclasses.field(default_factory=list)
    #: what a ``fetch`` of one digest downloads: digest -> (epoch, payload); before ``payloads``
    by_digest: dict[bytes, tuple[int, bytes]] = dataclasses.field(default_factory=dict)

    def share(self, run_id: str, epoch: int, payload: bytes) -> None:
        self.shared.append((run_id, epoch, payload))

    def unshare(self, run_id: str) -> None:
        self.unshared.append(run_id)

    def fetch(self, run_id: str, donors: Any, *, min_epoch: int = 0,
              max_epoch: int | None = None, timeout: float | None = None,
              digest: bytes | None = None) -> Any:
        self.fetched.append({"donors": list(donors), "min_epoch": min_epoch,
                             "max_epoch": max_epoch, "timeout": timeout, "digest": digest})
        if digest is not None and digest in self.by_digest:
            payload: Any = self.by_digest[digest]
        elif not self.payloads:
            raise StateSyncError("no donor answered")
        else:
            payload = self.payloads.pop(0)
        if isinstance(payload, BaseException):
            raise payload
        epoch, data = payload
        return SimpleNamespace(epoch=epoch, payload=data, digest=hashlib.sha256(data).digest(),
                               donors=tuple(donors), seconds=0.01,
                               confirmed=len(list(donors)) > 1 or not self.lone_unconfirmed)

    def offers(self, run_id: str, donors: Any) -> dict[ID, tuple[int, bytes]]:
        return {p: o for p, o in self.offered.items() if p in list(donors)}


@dataclasses.dataclass
class FakeNode:
    client_mode: bool = False
    progress: FakeProgress = dataclasses.field(default_factory=FakeProgress)
    allreduce: FakeAllReduce = dataclasses.field(default_factory=FakeAllReduce)
    statesync: FakeStateSync = dataclasses.field(default_factory=FakeStateSync)

    @property
    def tracker(self) -> FakeTracker:
        return self.progress.tracker
