"""A donor's snapshots, sans-IO: the payloads it shares, with their
manifests, the newest ``keep`` of each run (``_donor`` serves them).
"""

from __future__ import annotations

import dataclasses

from ..errors import ConfigError
from ._state import (
    Manifest,
)

__all__ = ["Snapshot", "SnapshotTable"]


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One shared payload and its manifest."""

    run_id: str
    manifest: Manifest
    payload: bytes

    def chunk(self, index: int) -> bytes:
        start, end = self.manifest.chunk_bounds(index)
        return self.payload[start:end]


class SnapshotTable:
    """A donor's snapshots: per run, the newest ``keep`` ones, newest first.

    Not thread safe by itself: the service holds a lock around it.
    """

    def __init__(self, keep: int, max_runs: int) -> None:
        self._keep = keep
        self._max_runs = max_runs
        self._runs: dict[str, list[Snapshot]] = {}

    def __len__(self) -> int:
        return len(self._runs)

    def runs(self) -> list[str]:
        return sorted(self._runs)

    def check_share(self, run_id: str, epoch: int) -> None:
        """Raise :class:`ConfigError` if a snapshot of ``run_id`` at ``epoch`` cannot be added."""
        kept = self._runs.get(run_id)
        if kept is None:
            if len(self._runs) >= self._max_runs:
                raise ConfigError(f"this node already shares {len(self._runs)} runs (max_runs)")
        elif epoch < kept[0].manifest.epoch:
            raise ConfigError(f"epoch {epoch} of run {run_id!r} is behind the shared epoch "
                              f"{kept[0].manifest.epoch}")

    def add(self, snapshot: Snapshot) -> list[Snapshot]:
        """Make ``snapshot`` the newest of its run; returns the snapshots dropped."""
        self.check_share(snapshot.run_id, snapshot.manifest.epoch)
        kept = self._runs.setdefault(snapshot.run_id, [])
        if kept and kept[0].manifest == snapshot.manifest:
            return []  # the same state again: nothing changes
        # The same payload at another epoch is kept once; fetchers of the old
        # epoch's manifest find it by digest.
        kept[:] = [s for s in kept if s.manifest.digest != snapshot.manifest.digest]
        kept.insert(0, snapshot)
        dropped = kept[self._keep:]
        del kept[self._keep:]
        return dropped

    def remove(self, run_id: str) -> int:
        """Drop every snapshot of ``run_id``; returns how many there were."""
        return len(self._runs.pop(run_id, ()))

    def newest(self, run_id: str) -> Snapshot | None:
        kept = self._runs.get(run_id)
        return kept[0] if kept else None

    def find(self, run_id: str, digest: bytes) -> Snapshot | None:
        for snapshot in self._runs.get(run_id, ()):
            if snapshot.manifest.digest == digest:
                return snapshot
        return None


# -- the fetcher's side ----------------------------------------------------------
