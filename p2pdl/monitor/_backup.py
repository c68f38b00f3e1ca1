"""Keeping copies of a run's model: a monitor downloads the state and checkpoints it.

Every ``every`` epochs the run completes (its quorum epoch), the monitor
downloads the training state the run's serving trainers offer at that epoch
(state sync: the donors vote, every chunk and the whole payload are checked
against the winning SHA-256) and writes it as an atomic checkpoint
(:mod:`p2pdl.training._checkpoint`: temp file, fsync, rename, a commit
record with the payload's SHA-256; the newest ``keep`` kept).  A run then
survives all its trainers leaving: ``p2pdl train --resume-from DIR``
(``OptimizerConfig.resume_from``) starts from the newest copy.

:class:`BackupSchedule` decides when (sans-IO); :class:`Backups` keeps one
run's copies on trio (the payload is parsed and written in a worker thread,
as state sync assembles it).  A state is written only if it loads as a
p2pdl optimizer state (``torch.load(weights_only=True)``: tensors and plain
containers, no code) of the epoch the donors offered.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio
from libp2p.peer.id import ID

from ..errors import ConfigError, P2PDLError

if TYPE_CHECKING:
    from .. import TrioNode

__all__ = ["BackupConfig", "BackupSchedule", "Backups", "write_state"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class BackupConfig:
    """Where and how often a monitor keeps copies of the run's state.

    Attributes:
        directory: the checkpoints' directory (one run's; created on first save).
        every: back up whenever the run's quorum epoch has moved this many
            epochs past the last copy (default 10; the first copy is taken at
            the first completed epoch seen).
        keep: copies kept, the newest (default 3).
        timeout: seconds one download may take (default 300).
        retry: seconds between attempts after one failed (default 30).
    """

    directory: Path
    every: int = 10
    keep: int = 3
    timeout: float = 300.0
    retry: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, Path)):
            raise ConfigError(f"backup directory must be a path, not {self.directory!r}")
        object.__setattr__(self, "directory", Path(self.directory))
        for name, low, high in (("every", 1, 2**31), ("keep", 1, 1000)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
        for name in ("timeout", "retry"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name} must be a positive number, got {value!r}")


class BackupSchedule:
    """When to back up (sans-IO): :meth:`due` gives the epoch to copy now, or None."""

    def __init__(self, config: BackupConfig, last_epoch: int | None = None) -> None:
        self.config = config
        #: the epoch of the newest copy (None: none yet)
        self.last_epoch = last_epoch
        self._not_before = -math.inf

    def due(self, quorum_epoch: int, now: float) -> int | None:
        """The epoch to copy, given the run's quorum epoch ``now`` (None: nothing due)."""
        if quorum_epoch < 1 or now < self._not_before:
            return None
        if self.last_epoch is not None and quorum_epoch < self.last_epoch + self.config.every:
            return None
        return quorum_epoch

    def saved(self, epoch: int) -> None:
        self.last_epoch = epoch if self.last_epoch is None else max(self.last_epoch, epoch)

    def failed(self, now: float) -> None:
        self._not_before = now + self.config.retry


class Backups:
    """One run's copies, kept by ``node`` into ``config.directory``.

    Call :meth:`consider` with each look at the run (the view's quorum epoch
    and peers): when a copy is due it is taken in ``nursery`` (one at a
    time).  ``saved``, ``failures`` and ``last_epoch`` say how it went."""

    def __init__(self, node: TrioNode, run_id: str, config: BackupConfig) -> None:
        from ..training import latest_checkpoint

        self.node = node
        self.run_id = run_id
        self.config = config
        newest = latest_checkpoint(config.directory) if config.directory.exists() else None
        self.schedule = BackupSchedule(config, newest.epoch if newest is not None else None)
        self.saved = 0
        self.failures = 0
        self._busy = False

    @property
    def last_epoch(self) -> int | None:
        return self.schedule.last_epoch

    @property
    def busy(self) -> bool:
        """A copy is being taken now."""
        return self._busy

    def status(self) -> dict[str, Any]:
        """For the views: the directory, the newest copy's epoch, copies and failures."""
        return {"directory": str(self.config.directory), "last_epoch": self.last_epoch,
                "saved": self.saved, "failures": self.failures, "every": self.config.every}

    def consider(self, nursery: trio.Nursery, quorum_epoch: int, peers: Sequence[Any],
                 now: float) -> None:
        """Start a copy if one is due and none runs."""
        if self._busy:
            return
        epoch = self.schedule.due(quorum_epoch, now)
        if epoch is None:
            return
        donors = [r.peer_id for r in peers if r.epoch >= epoch and not r.client_mode
                  and not r.auxiliary]
        if not donors:
            return
        self._busy = True
        nursery.start_soon(self._copy, epoch, donors)

    async def _copy(self, epoch: int, donors: list[bytes]) -> None:
        try:
            saved = await self.copy(epoch, donors)
        except (P2PDLError, OSError, ValueError) as exc:
            self.failures += 1
            self.schedule.failed(trio.current_time())
            logger.warning("run %s: backup of epoch %d failed: %s", self.run_id, epoch, exc)
        else:
            self.saved += 1
            self.schedule.saved(saved)
            logger.info("run %s: backed up the state of epoch %d in %s", self.run_id, saved,
                        self.config.directory)
        finally:
            self._busy = False

    async def copy(self, epoch: int, donors: Sequence[bytes | ID]) -> int:
        """Download the state of ``epoch`` (or ``epoch + 1``) from ``donors`` and
        write it as a checkpoint; the epoch written."""
        download = await self.node.statesync.fetch(
            self.run_id, [d if isinstance(d, ID) else ID(d) for d in donors],
            min_epoch=epoch, max_epoch=epoch + 1, timeout=self.config.timeout)
        if hashlib.sha256(download.payload).digest() != download.digest:
            raise ValueError("the downloaded state does not match its digest")
        await trio.to_thread.run_sync(write_state, self.config, download.payload, download.epoch)
        return download.epoch


def write_state(config: BackupConfig, payload: bytes, epoch: int) -> None:
    """Check that ``payload`` is a p2pdl optimizer state of ``epoch`` and write
    it as a checkpoint (ValueError when it is not)."""
    import torch

    from ..errors import CheckpointError
    from ..training import STATE_FORMAT, save_checkpoint

    try:
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as exc:   # a donor's bytes: anything may be wrong with them
        raise ValueError(f"the state does not load: {exc}") from None
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT \
            or state.get("epoch") != epoch:
        raise ValueError(f"not a p2pdl optimizer state of epoch {epoch}")
    try:
        save_checkpoint(config.directory, state, epoch, keep=config.keep)
    except (CheckpointError, ConfigError) as exc:
        raise ValueError(f"the checkpoint was not written: {exc}") from None
