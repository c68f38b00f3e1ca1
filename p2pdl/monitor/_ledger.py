"""Which samples count, and when (sans-IO).

Rules (docs/monitor.md, "Accounting"):

* Evidence: a peer's own reports, as the progress layer accepted them (its
  signature checked, a member of the run, within the role's caps; a
  monitor's or an outsider's never reach here).  Nothing else a peer says
  counts, and no peer is credited for another.
* An epoch counts once the run **stepped past it**: the view's
  ``quorum_epoch`` (the epoch a quorum of live trainers reached) is above
  it, with the reports seen until then.  Reports at later epochs wait (an
  epoch that never completes credits nobody); a report at an epoch that
  already counted is not credited (``late``): a peer behind the run
  accumulates samples no round of the run averaged.
* A peer's credit at an epoch is the **largest** count its reports claimed
  for that epoch (reports are cumulative within an epoch), at most the
  run's ``target_batch_size``: a peer that lies about its samples gains at
  most one target batch per epoch, the same as a peer that alone did all of
  it.  Auxiliary peers and reports of no samples are not credited.
* A ledger credits only epochs it saw complete: those from the quorum
  epoch of its first observation on (a monitor that starts, or restarts,
  mid-run credits nothing it did not watch).
* A credit is final: the store keeps the largest credit per (run, peer,
  epoch), so seeing the same reports again (a restart, a late report)
  never adds twice.
* Bounded: at most ``max_pending`` (peer, epoch) pairs wait at once (the
  oldest epochs are dropped first, counted in ``dropped``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

__all__ = ["Credit", "Ledger", "MAX_PENDING"]

#: The most (peer, epoch) pairs a ledger holds before their epoch counts.
MAX_PENDING = 100_000


@dataclasses.dataclass(frozen=True)
class Credit:
    """``samples`` credited to ``peer_id`` (its id in base58) at ``epoch`` of
    ``run_id``, at ``time`` (the monitor's wall clock)."""

    run_id: str
    peer_id: str
    epoch: int
    samples: int
    time: float


class Ledger:
    """The credits of one run, from the reports a monitor sees.

    Feed it the view's reports and quorum epoch as often as the view
    changes (:meth:`observe`); it returns the credits that became due.
    ``peer_name`` turns a report's peer id bytes into the id shown (base58).
    """

    def __init__(self, run_id: str, target_batch_size: int, *,
                 max_pending: int = MAX_PENDING) -> None:
        if isinstance(target_batch_size, bool) or not isinstance(target_batch_size, int) \
                or target_batch_size < 1:
            raise ValueError("target_batch_size must be a positive int")
        self.run_id = run_id
        self.target_batch_size = target_batch_size
        self.max_pending = max_pending
        #: (peer id, epoch) -> the largest count seen, for epochs not yet counted
        self._pending: dict[tuple[str, int], int] = {}
        #: the epochs below this one have counted
        self.counted_below = 0
        #: (peer id, epoch) pairs dropped for the bound
        self.dropped = 0
        #: reports seen at epochs that had already counted
        self.late = 0
        self._watching = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    def observe(self, reports: Iterable[tuple[str, int, int, bool]], quorum_epoch: int,
                now: float) -> list[Credit]:
        """Take the reports in view, ``(peer id, epoch, samples, auxiliary)``,
        and the view's quorum epoch; return the credits now due."""
        credits: list[Credit] = []
        if not self._watching:   # only epochs this ledger saw complete count
            self._watching = True
            self.counted_below = max(self.counted_below, quorum_epoch)
        for peer, epoch, samples, auxiliary in reports:
            if auxiliary or samples <= 0 or epoch < 0:
                continue
            samples = min(int(samples), self.target_batch_size)
            if epoch < self.counted_below:
                self.late += 1
                continue
            key = (peer, epoch)
            if samples > self._pending.get(key, 0):
                self._pending[key] = samples
        if quorum_epoch > self.counted_below:
            self.counted_below = quorum_epoch
            for (peer, epoch), samples in sorted(self._pending.items(),
                                                 key=lambda item: (item[0][1], item[0][0])):
                if epoch < quorum_epoch:
                    credits.append(Credit(self.run_id, peer, epoch, samples, now))
            self._pending = {key: s for key, s in self._pending.items()
                             if key[1] >= quorum_epoch}
        if len(self._pending) > self.max_pending:
            keep = sorted(self._pending.items(), key=lambda item: item[0][1],
                          reverse=True)[:self.max_pending]
            self.dropped += len(self._pending) - len(keep)
            self._pending = dict(keep)
        return credits
