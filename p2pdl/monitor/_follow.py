"""Following a run's progress and crediting its contributors (trio).

:func:`follow_run` tracks the run as an auxiliary peer that processes no
samples (it gets the gossip; trainers count only trainers, so it moves no
one's decisions; in a certificate run its ``monitor`` role makes its
reports count for nothing), follows the run's epoch, and every
``interval`` seconds hands every report the tracker accepted since the
last look (each claim, and the rounds they say their parts took) to a
:class:`Ledger` and the
credits due to a :class:`CreditStore`; with ``backups``
(:class:`~p2pdl.monitor.Backups`), it keeps copies of the run's state too.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import trio
from libp2p.peer.id import ID

from ._backup import Backups
from ._ledger import Ledger
from ._store import CreditStore

if TYPE_CHECKING:
    from .. import TrioNode

__all__ = ["follow_run", "Glance", "DEFAULT_INTERVAL", "peer_name"]

logger = logging.getLogger(__name__)

#: Seconds between two looks at the view (default of ``interval``).
DEFAULT_INTERVAL = 1.0
#: Reports accepted between two looks that the ledger sees, at most (the
#: oldest beyond are dropped): 1,000 peers reporting every 10 ms for a second.
MAX_ACCEPTED = 100_000


@dataclasses.dataclass(frozen=True)
class Glance:
    """What one look at the run saw: its progress (``GlobalProgress``), the
    peers in view (``PeerReport``, this monitor left out), the credits it
    added and the ledger's state."""

    progress: Any
    peers: tuple[Any, ...]
    credited: int
    ledger: Ledger


async def follow_run(node: TrioNode, run_id: str, store: CreditStore, *,
                     target_batch_size: int, interval: float = DEFAULT_INTERVAL,
                     on_glance: Callable[[Glance], None] | None = None,
                     backups: Backups | None = None,
                     task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Follow ``run_id`` and credit its contributors into ``store`` until
    cancelled; with ``backups``, copy the run's state when one is due."""
    if not interval > 0:
        raise ValueError("interval must be positive")
    ledger = Ledger(run_id, target_batch_size)
    me = node.peer_id.to_bytes()
    named: dict[str, str] = store.names(run_id)   # what the store holds
    async with node.progress.track(run_id, target_batch_size, auxiliary=True) as tracker, \
            trio.open_nursery() as nursery:
        tracker.gossip.keep_accepted(MAX_ACCEPTED)
        task_status.started()
        while True:
            progress = tracker.global_progress()
            if progress.epoch > tracker.local_epoch:
                tracker.update_epoch(progress.epoch)   # follow the run
            peers = tuple(r for r in tracker.peers() if r.peer_id != me)
            # every report accepted since the last look, not only each peer's latest
            seen = (*tracker.gossip.take_accepted(), *peers)
            credits = ledger.observe(
                ((peer_name(r.peer_id), r.epoch, r.samples_accumulated, r.auxiliary)
                 for r in seen), progress.quorum_epoch, node.dht.now(),
                vouches=((peer_name(r.peer_id), r.round_epoch, r.round_outcome,
                          r.round_contributors) for r in seen))
            added = store.add(credits)
            names = {peer: r.name for r in peers
                     if r.name is not None and named.get(peer := peer_name(r.peer_id)) != r.name}
            if names:
                store.set_names(run_id, names, node.dht.now())
                named.update(names)
            if added:
                logger.info("run %s: %d credit(s) at epoch %d", run_id, added,
                            progress.quorum_epoch)
            if backups is not None:
                backups.consider(nursery, progress.quorum_epoch, peers, trio.current_time())
            if on_glance is not None:
                on_glance(Glance(progress, peers, added, ledger))
            await trio.sleep(interval)


def peer_name(peer_id: bytes) -> str:
    """A report's peer id as shown (base58)."""
    try:
        return ID(peer_id).to_base58()
    except Exception:   # the view holds checked ids; defensive
        return peer_id.hex()
