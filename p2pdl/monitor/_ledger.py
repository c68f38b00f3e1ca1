"""Which samples count, and when (sans-IO).

Rules (docs/monitor.md, "Accounting"):

* Evidence: a peer's own reports, as the progress layer accepted them (its
  signature checked, a member of the run, within the role's caps; a
  monitor's or an outsider's never reach here).  Nothing else a peer says
  counts, and no peer is credited for another.
* Vouched: a peer's samples at an epoch count only where **another**
  member's signed report says that its own part of that epoch's round
  (averaged or partial) took the peer's values (``round_contributors``):
  samples that no round averaged, or that nobody else saw, earn nothing
  (``unvouched``).  Two colluding members can still vouch for each other.
* An epoch counts once the run **stepped past it and the next one**: the
  view's ``quorum_epoch`` (the epoch a quorum of live trainers reached) is
  at least two above it (VOUCH_EPOCHS), with the reports seen until then
  -- the reports that name a round's contributors come after the round,
  and a member that stepped late still has an epoch to say it.  Reports at
  later epochs wait (an epoch that never completes, and the run's last
  completed one, credit nobody); a report at an epoch that already
  counted is not credited (``late``): a peer behind the run accumulates
  samples no round of the run averaged.
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
* Bounded: at most ``max_pending`` (peer, epoch) pairs, and as many
  vouches, wait at once (the oldest epochs are dropped first, counted in
  ``dropped``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from libp2p.peer.id import ID

from ..progress import round_tag

__all__ = ["Credit", "Ledger", "MAX_PENDING", "VOUCH_EPOCHS", "VOUCHING_OUTCOMES", "tag_of"]

#: The most (peer, epoch) pairs a ledger holds before their epoch counts.
MAX_PENDING = 100_000
#: Epochs the run steps past an epoch before it counts: the vouches for its
#: round come after it.
VOUCH_EPOCHS = 1
#: The round outcomes whose contributors a report vouches for.
VOUCHING_OUTCOMES = frozenset({"averaged", "partial"})


def tag_of(peer: str) -> bytes:
    """A peer's round tag (``p2pdl.progress.round_tag``) from its base58 id
    (empty, which no tag matches, for anything else)."""
    try:
        return round_tag(ID.from_base58(peer).to_bytes())
    except ValueError:
        return b""


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

    Feed it the reports seen since the last call (every one the monitor's
    tracker accepted, and the view's latest), the rounds they name and the
    quorum epoch, as often as the view changes (:meth:`observe`); it returns
    the credits that became due.  ``tag`` turns a peer's id as shown into its round tag
    (default :func:`tag_of`, from base58).
    """

    def __init__(self, run_id: str, target_batch_size: int, *,
                 max_pending: int = MAX_PENDING,
                 tag: Callable[[str], bytes] = tag_of) -> None:
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
        #: (peer, epoch) claims no other member vouched for when their epoch counted
        self.unvouched = 0
        self._tag = tag
        #: (tag, epoch) pairs another member vouched for, for epochs not yet counted
        self._vouched: set[tuple[bytes, int]] = set()
        self._watching = False

    @property
    def pending(self) -> int:
        return len(self._pending)

    def observe(self, reports: Iterable[tuple[str, int, int, bool]], quorum_epoch: int,
                now: float,
                vouches: Iterable[tuple[str, int | None, str | None, Iterable[bytes] | None]]
                = ()) -> list[Credit]:
        """Take the reports in view, ``(peer id, epoch, samples, auxiliary)``,
        the rounds they name, ``(peer id, round epoch, round outcome, round
        contributors' tags)``, and the view's quorum epoch; return the
        credits now due."""
        credits: list[Credit] = []
        if not self._watching:   # only epochs this ledger saw complete count
            self._watching = True
            self.counted_below = max(self.counted_below, quorum_epoch - VOUCH_EPOCHS)
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
        for voucher, epoch, outcome, tags in vouches:
            if epoch is None or epoch < self.counted_below or outcome not in VOUCHING_OUTCOMES:
                continue
            mine = self._tag(voucher)
            self._vouched.update((t, epoch) for t in tags or () if t != mine)
        due = quorum_epoch - VOUCH_EPOCHS
        if due > self.counted_below:
            self.counted_below = due
            for (peer, epoch), samples in sorted(self._pending.items(),
                                                 key=lambda item: (item[0][1], item[0][0])):
                if epoch >= due:
                    continue
                if (self._tag(peer), epoch) in self._vouched:
                    credits.append(Credit(self.run_id, peer, epoch, samples, now))
                else:
                    self.unvouched += 1
            self._pending = {key: s for key, s in self._pending.items() if key[1] >= due}
            self._vouched = {v for v in self._vouched if v[1] >= due}
        if len(self._pending) > self.max_pending:
            keep = self._newest(self._pending)
            self._pending = {key: self._pending[key] for key in keep}
        if len(self._vouched) > self.max_pending:
            self._vouched = set(self._newest(self._vouched))
        return credits

    def _newest(self, keys: Iterable[tuple[str | bytes, int]]) -> list[tuple[str | bytes, int]]:
        """The ``max_pending`` keys of the latest epochs; the others count as dropped."""
        ranked = sorted(keys, key=lambda key: key[1], reverse=True)
        self.dropped += max(0, len(ranked) - self.max_pending)
        return ranked[:self.max_pending]
