"""What the monitor's views show: the run over time, sans-IO.

:class:`History` takes each :class:`~p2pdl.monitor.Glance` (one look at the
run's progress view) and keeps

* **points**: the run's epoch, throughput, peers by role and path and the
  trainers' mean reported loss over time -- at most MAX_POINTS of them: when
  full, every other point is dropped and the spacing doubles, so a run of
  any length keeps its whole shape in bounded memory;
* **epochs**: the last MAX_EPOCHS epochs the run completed (the quorum
  epoch passed them), with when, how long each took and how many trainers
  were in view;
* **rounds**: how each trainer's averaging round at those epochs ended
  (``averaged``, ``partial``, ``alone``, ``failed``) and its group's size,
  as the trainers' reports say (their word: a trainer that does not say
  is not counted).

:func:`run_state` turns a glance, the history and the leaderboard into the
JSON document the dashboard reads (``/api/state``) and the terminal view
prints.  Names and losses are the peers' word (signed, checked for bounds
by the progress layer); every view escapes what it shows.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
from typing import TYPE_CHECKING, Any

from ..progress import ROUND_OUTCOMES
from ._follow import peer_name

if TYPE_CHECKING:
    from ._follow import Glance
    from ._store import Standing

__all__ = ["History", "Point", "EpochEnd", "run_state", "MAX_POINTS", "MAX_EPOCHS",
           "MIN_SPACING", "PATHS"]

#: Points kept at most (then thinned to half, their spacing doubled).
MAX_POINTS = 720
#: Completed epochs kept at most (the newest).
MAX_EPOCHS = 50
#: Least seconds between two points at first.
MIN_SPACING = 2.0
#: How peers are reached, as the views count them (None: not said).
PATHS = ("direct", "hole-punched", "relayed", "unknown")


@dataclasses.dataclass(frozen=True)
class Point:
    """The run at one time (wall clock, s)."""

    time: float
    epoch: int
    samples_per_second: float
    trainers: int
    auxiliary: int
    clients: int
    #: the trainers' mean reported loss (None: none reported one)
    loss: float | None
    #: peers by path: direct, hole-punched, relayed, unknown
    paths: tuple[int, int, int, int]


@dataclasses.dataclass(frozen=True)
class EpochEnd:
    """An epoch the run completed: when the monitor saw the quorum pass it,
    the seconds since the previous one ended (None for the first seen), and
    the trainers in view then."""

    epoch: int
    time: float
    seconds: float | None
    trainers: int


class History:
    """The run over time, from the glances given to :meth:`observe`."""

    def __init__(self, *, max_points: int = MAX_POINTS, max_epochs: int = MAX_EPOCHS,
                 spacing: float = MIN_SPACING) -> None:
        if max_points < 2 or max_epochs < 1 or not spacing > 0:
            raise ValueError("max_points >= 2, max_epochs >= 1 and spacing > 0")
        self.max_points = max_points
        self.spacing = spacing
        self.points: list[Point] = []
        self.epochs: deque[EpochEnd] = deque(maxlen=max_epochs)
        self._quorum: int | None = None
        self._last_end: float | None = None
        #: round epoch -> peer -> (outcome, group size), the last MAX_EPOCHS epochs
        self.rounds: dict[int, dict[bytes, tuple[str, int | None]]] = {}

    def round_summary(self, epoch: int) -> dict[str, Any]:
        """How the trainers said their rounds at ``epoch`` ended: a count per
        outcome and the mean group size (None: no group size said)."""
        said = list(self.rounds.get(epoch, {}).values())
        groups = [g for _, g in said if g is not None]
        return {"outcomes": {kind: n for kind in ROUND_OUTCOMES
                             if (n := sum(1 for o, _ in said if o == kind))},
                "group": math.fsum(groups) / len(groups) if groups else None}

    def observe(self, glance: Glance, now: float) -> None:
        """Take one look at the run."""
        view = glance.progress
        trainers = [r for r in glance.peers if not r.auxiliary]
        for r in trainers:
            if r.round_epoch is not None and r.round_outcome is not None:
                self.rounds.setdefault(r.round_epoch, {})[r.peer_id] = (r.round_outcome,
                                                                        r.round_group)
        if len(self.rounds) > self.epochs.maxlen:
            for epoch in sorted(self.rounds)[:len(self.rounds) - self.epochs.maxlen]:
                del self.rounds[epoch]
        if self._quorum is not None and view.quorum_epoch > self._quorum:
            for epoch in range(max(self._quorum, view.quorum_epoch - self.epochs.maxlen),
                               view.quorum_epoch):
                seconds = None if self._last_end is None else now - self._last_end
                self.epochs.append(EpochEnd(epoch, now, seconds, len(trainers)))
                self._last_end = now
        if self._quorum is None or view.quorum_epoch > self._quorum:
            self._quorum = view.quorum_epoch
        if self.points and now - self.points[-1].time < self.spacing:
            return
        losses = [r.loss for r in trainers if r.loss is not None]
        paths = [r.path if r.path in PATHS else "unknown" for r in glance.peers]
        self.points.append(Point(
            now, view.epoch, view.samples_per_second, len(trainers),
            len(glance.peers) - len(trainers), sum(1 for r in glance.peers if r.client_mode),
            math.fsum(losses) / len(losses) if losses else None,
            tuple(paths.count(kind) for kind in PATHS)))   # type: ignore[arg-type]
        if len(self.points) >= self.max_points:
            self.points = self.points[::2]
            self.spacing *= 2


def run_state(run_id: str, glance: Glance | None, history: History,
              board: list[Standing], now: float, *, peers_shown: int = 256) -> dict[str, Any]:
    """The JSON document of the views: the run now, its peers (at most
    ``peers_shown``, trainers first by samples), its history and leaderboard."""
    state: dict[str, Any] = {"run_id": run_id, "time": now, "status": None, "peers": [],
                             "points": [dataclasses.asdict(p) for p in history.points],
                             "epochs": [{**dataclasses.asdict(e), **history.round_summary(e.epoch)}
                                        for e in reversed(history.epochs)],
                             "leaderboard": [dataclasses.asdict(s) for s in board],
                             "paths": list(PATHS)}
    if glance is None:
        return state
    view = glance.progress
    eta = view.eta_next_epoch - view.time
    trainers = [r for r in glance.peers if not r.auxiliary]
    losses = [r.loss for r in trainers if r.loss is not None]
    state["status"] = {
        "epoch": view.epoch, "quorum_epoch": view.quorum_epoch,
        "samples_accumulated": view.samples_accumulated,
        "target_batch_size": view.target_batch_size,
        "samples_per_second": view.samples_per_second,
        "eta_seconds": eta if math.isfinite(eta) and eta >= 0 else None,
        "trainers": len(trainers), "auxiliary": len(glance.peers) - len(trainers),
        "clients": sum(1 for r in glance.peers if r.client_mode),
        "loss": math.fsum(losses) / len(losses) if losses else None,
        "paths": {kind: sum(1 for r in glance.peers
                            if (r.path if r.path in PATHS else "unknown") == kind)
                  for kind in PATHS}}
    ordered = sorted(glance.peers, key=lambda r: (r.auxiliary, -r.samples_accumulated,
                                                  r.peer_id))
    state["peers"] = [{"peer_id": peer_name(r.peer_id), "name": r.name,
                       "role": "auxiliary" if r.auxiliary else "trainer",
                       "epoch": r.epoch, "samples": r.samples_accumulated,
                       "samples_per_second": r.samples_per_second, "loss": r.loss,
                       "path": r.path, "client_mode": r.client_mode,
                       "age": max(0.0, now - r.time)}
                      for r in ordered[:peers_shown]]
    return state
