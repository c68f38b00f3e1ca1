"""Crash-safe checkpoints of training state, and finding the newest valid one.

A checkpoint is whatever dict the caller hands in (the model's and the
optimizer's ``state_dict()``, the scheduler's state, the epoch, the run id,
small metadata), written with :func:`torch.save`.  This module only knows how
to put it on disk so that a crash at any instant leaves either the previous
checkpoint or the new one -- never a half-written file that looks valid -- and
how to find the newest one that is intact.

File layout
-----------
One directory per run (use ``<root>/<run id>``; this module does not look
inside the state, so it cannot tell runs apart)::

    checkpoint-0000000120.pt     the torch.save payload, loadable by plain torch.load
    checkpoint-0000000120.json   its commit record: {"format": 1, "epoch": 120,
                                 "size": <bytes>, "sha256": "<hex>"}
    .checkpoint-0000000130.pt.k2j8d.tmp   a save in progress (or a crash's leftover)

Epochs are zero-padded to 10 digits, so names sort as epochs do.  A checkpoint
exists only when both files do: the ``.json`` record is the commit, written
last.  A ``.pt`` without its record, a record without its ``.pt`` and temp
files are leftovers of a crash; loading ignores them and the next save deletes
them.  One process writes to a directory at a time (several may read).

Why it is crash-safe
--------------------
``save_checkpoint`` writes the payload to a temp file in the same directory,
flushes it and calls ``os.fsync`` on it, and only then ``os.replace`` moves it
to its name. A rename within a filesystem is atomic, so the name points at the
old content or at the complete new content, never at a prefix; the fsync before
it matters because filesystems may otherwise make the rename durable before the
data (ext4 with delayed allocation, XFS, btrfs), leaving a zero-length or
garbage file after a power loss. The directory is then fsynced, because a
rename is a change to the directory and is not durable until the directory is.
The commit record is written the same way (temp, fsync, rename, directory
fsync) *after* the payload's rename is durable, so a durable record implies a
durable payload. Older checkpoints are deleted only after that, record first,
so a crash while rotating leaves at worst an orphan that the next save removes.

The SHA-256 in the record is checked on every load. It catches what the
ordering cannot: storage that lies about fsync, bit rot, a file truncated or
edited by hand, a copy interrupted part way. Loading a directory falls back to
the previous checkpoint (with a logged warning) when the newest one fails the
check.

What a state may hold
---------------------
Loading uses ``torch.load(weights_only=True)``: unpickling with
``weights_only=False`` runs arbitrary code named by the file, and checkpoint
directories get copied between machines and shared with others. So a state is
made of tensors (``torch.Tensor``, ``torch.nn.Parameter``), ``torch.Size``,
``torch.dtype``, ``torch.device``, ``None``, ``bool``, ``int``, ``float``,
``str``, ``bytes``, and ``dict`` / ``OrderedDict`` / ``list`` / ``tuple`` of
these, nested at most :data:`MAX_NESTING` deep. Model, optimizer (AdamW's
included), LR scheduler and ``GradScaler`` state dicts are all of this kind.
``save_checkpoint`` checks this before writing anything and raises
:class:`~p2pdl.errors.ConfigError` naming the first offending entry (a
``pathlib.Path``, a ``defaultdict``, a numpy array, a dataclass...), so a
checkpoint that could not be loaded back is never written.

There is no limit on the size of a checkpoint: the files are written by this
program for itself, their size is set by the model (a billion AdamW-trained
parameters is 12 GB), and any fixed limit would either be too small for a
large model or too large to protect anything.  The commit record, the one
file parsed before its checksum is known, is bounded (:data:`MAX_RECORD_BYTES`).

Usage
-----
::

    policy = CheckpointPolicy(Path("checkpoints") / run_id, every_epochs=10, keep=3)
    info = latest_checkpoint(policy.directory)      # cheap: names, records, sizes
    if info is not None and info.epoch > swarm_epoch:
        state, epoch = load_checkpoint(policy.directory)   # newest *valid* one
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        last_saved = epoch
    ...
    if policy.due(epoch, last_saved):
        save_checkpoint(policy.directory,
                        {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scheduler": scheduler.state_dict(), "epoch": epoch,
                         "run_id": run_id},
                        epoch, keep=policy.keep)
        last_saved = epoch
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from ..errors import CheckpointError, ConfigError
from ..service import is_int

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointPolicy",
    "save_checkpoint",
    "latest_checkpoint",
    "load_checkpoint",
    "FORMAT_VERSION",
    "MAX_KEEP",
    "MAX_EPOCH",
    "MAX_NESTING",
    "MAX_RECORD_BYTES",
]

logger = logging.getLogger(__name__)

#: Version of the commit record's layout; a record with another is not loaded.
FORMAT_VERSION = 1
#: Most checkpoints one directory may keep (``keep``); more is a mistake, not a policy.
MAX_KEEP = 100
#: Largest epoch: the 10 digits of the file name.
MAX_EPOCH = 10**10 - 1
#: Deepest nesting of containers a state may have (state dicts nest 3 or 4 deep).
MAX_NESTING = 32
#: Largest commit record read; real ones are about 150 bytes.
MAX_RECORD_BYTES = 4096

_NAME = re.compile(r"checkpoint-(\d{10})\.(pt|json)")
_TEMP_PREFIX = ".checkpoint-"
_TEMP_SUFFIX = ".tmp"
_HASH_CHUNK = 1 << 20

MapLocation = str | torch.device | dict[str, str] | Callable[..., Any] | None



@dataclass(frozen=True)
class CheckpointInfo:
    """A committed checkpoint, as found by :func:`latest_checkpoint`.

    ``size`` and ``sha256`` come from its commit record and ``size`` matched
    the payload file when it was found; the checksum is verified only when the
    checkpoint is loaded.
    """

    path: Path
    epoch: int
    size: int
    sha256: str


@dataclass(frozen=True)
class CheckpointPolicy:
    """When to write checkpoints, where, and how many to keep.

    * ``directory`` -- where the checkpoints of one run go (created on first save).
    * ``every_epochs`` -- write one whenever the epoch reaches a multiple of
      this (default 10; at least 1).
    * ``keep`` -- how many of the newest to keep (default 3; 1 to :data:`MAX_KEEP`).

    Invalid values raise :class:`~p2pdl.errors.ConfigError`.
    """

    directory: Path
    every_epochs: int = 10
    keep: int = 3

    def __post_init__(self) -> None:
        if not isinstance(self.directory, (str, os.PathLike)):
            raise ConfigError(f"checkpoint directory must be a path, not {self.directory!r}")
        object.__setattr__(self, "directory", Path(self.directory))
        _check_int("every_epochs", self.every_epochs, 1, MAX_EPOCH)
        _check_int("keep", self.keep, 1, MAX_KEEP)

    def due(self, epoch: int, last_saved: int | None = None) -> bool:
        """Whether the state at ``epoch`` should be checkpointed.

        True when a positive multiple of ``every_epochs`` lies in
        ``(last_saved, epoch]``.  ``last_saved`` defaults to ``epoch - 1``, so
        without it this is true exactly at the multiples; pass the epoch last
        saved (or resumed from) so that a peer whose epoch jumps -- it caught up
        by downloading state from the swarm -- does not skip a checkpoint.
        Epoch 0, the untrained start, is never due.
        """
        _check_int("epoch", epoch, 0, MAX_EPOCH)
        if last_saved is None:
            last_saved = epoch - 1
        else:
            _check_int("last_saved", last_saved, 0, MAX_EPOCH)
        return epoch > 0 and epoch // self.every_epochs > last_saved // self.every_epochs


def save_checkpoint(directory: str | os.PathLike[str], state: dict[str, Any], epoch: int,
                    *, keep: int = 3) -> Path:
    """Write ``state`` as the checkpoint of ``epoch`` in ``directory``; return its path.

    The state is written atomically and durably (see the module docstring)
    before anything else is deleted; then only the ``keep`` newest checkpoints
    remain, and crash leftovers are removed.  The checkpoint just written is
    never deleted, even if the directory holds newer epochs (that is logged).
    Saving an epoch that already has a checkpoint replaces it.

    Raises :class:`~p2pdl.errors.ConfigError` for a bad ``epoch`` or ``keep``
    or a state that :func:`load_checkpoint` could not load back (before
    writing anything), and :class:`CheckpointError` when writing fails (disk
    full, permissions...).  On any failure no temp file is left behind, this
    epoch has no checkpoint (an earlier one of the same epoch is gone too) and
    the other epochs' checkpoints are untouched.
    """
    _check_int("epoch", epoch, 0, MAX_EPOCH)
    _check_int("keep", keep, 1, MAX_KEEP)
    if type(state) not in (dict, OrderedDict):
        raise ConfigError(f"a checkpoint state must be a dict, not {type(state).__name__}")
    _check_value(state, "state", 0)
    directory = Path(directory)
    name = f"checkpoint-{epoch:010d}"
    payload, record = directory / f"{name}.pt", directory / f"{name}.json"
    try:
        _make_directory(directory)
        # Un-commit an earlier checkpoint of this epoch before its payload is replaced.
        _unlink(record)
    except OSError as exc:
        raise CheckpointError(f"cannot write checkpoint {payload}: {exc}") from exc
    try:
        size, sha256 = _write_atomically(payload, lambda f: torch.save(state, f))
        _fsync_directory(directory)  # the payload is durable before its record is
        data = json.dumps({"format": FORMAT_VERSION, "epoch": epoch, "size": size,
                           "sha256": sha256}).encode()
        _write_atomically(record, lambda f: f.write(data))
        _fsync_directory(directory)
    except BaseException as exc:
        # Whatever this epoch's files hold now is unfinished or not known durable.
        _unlink_quietly(record)
        _unlink_quietly(payload)
        if isinstance(exc, (OSError, RuntimeError)):  # torch.save reports ENOSPC as RuntimeError
            raise CheckpointError(f"cannot write checkpoint {payload}: {exc}") from exc
        raise
    _remove_old(directory, epoch, keep)
    logger.info("saved checkpoint %s (%d bytes)", payload, size)
    return payload


def latest_checkpoint(directory: str | os.PathLike[str]) -> CheckpointInfo | None:
    """The newest committed checkpoint in ``directory``, or None if there is none.

    Fast: it reads file names, the small commit records and file sizes, so a
    torn (truncated) payload is skipped but a payload with the right size and
    wrong bytes is not -- :func:`load_checkpoint` verifies the checksum and
    may therefore return an older epoch than this reports.  A missing
    directory has no checkpoints; one that cannot be listed is a
    :class:`CheckpointError`.
    """
    for epoch in _committed_epochs(Path(directory)):
        try:
            return _read_info(Path(directory), epoch)
        except CheckpointError as exc:
            logger.warning("skipping checkpoint: %s", exc)
    return None


def load_checkpoint(path_or_directory: str | os.PathLike[str], *,
                    map_location: MapLocation = "cpu") -> tuple[dict[str, Any], int]:
    """Load a checkpoint and verify its checksum; return ``(state, epoch)``.

    Given a directory, this is its newest checkpoint that loads and matches its
    checksum; each newer one that does not is skipped with a logged warning.
    Given a file (``checkpoint-*.pt``), it is that file, whose commit record
    must lie beside it.  ``map_location`` is passed to :func:`torch.load`
    (default: every tensor on the CPU).

    Raises :class:`CheckpointError` when the path does not exist, the
    directory holds no valid checkpoint, or the file is torn, corrupt or not a
    checkpoint.
    """
    path = Path(path_or_directory)
    if not path.is_dir():
        if not path.exists():
            raise CheckpointError(f"no checkpoint at {path}: no such file or directory")
        if path.suffix != ".pt":
            raise CheckpointError(f"{path} is not a checkpoint (a checkpoint-*.pt file)")
        return _load_file(path, _read_record(path.with_suffix(".json")), map_location)
    failures = []
    for epoch in _committed_epochs(path):
        try:
            info = _read_info(path, epoch)
            return _load_file(info.path, info, map_location)
        except CheckpointError as exc:
            logger.warning("skipping checkpoint, trying an older one: %s", exc)
            failures.append(str(exc))
    detail = "; ".join(failures) if failures else "there are none"
    raise CheckpointError(f"no valid checkpoint in {path}: {detail}")


# -- writing ------------------------------------------------------------------------------------

def _write_atomically(target: Path, write: Callable[[IO[bytes]], object]) -> tuple[int, str]:
    """Write a temp file beside ``target``, fsync it, rename it to ``target``.

    Returns the size and SHA-256 of what was written, read back from the file.
    The temp file is removed if anything fails.
    """
    fd, temp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                     suffix=_TEMP_SUFFIX)
    temp = Path(temp_name)
    try:
        with os.fdopen(fd, "w+b") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
            f.seek(0)
            size, sha256 = _digest(f)
        os.replace(temp, target)
    finally:
        _unlink_quietly(temp)  # nothing there after a successful rename
    return size, sha256


def _make_directory(directory: Path) -> None:
    """Create ``directory`` and its missing parents durably."""
    missing = []
    for candidate in (directory, *directory.parents):
        if candidate.exists():
            break
        missing.append(candidate)
    directory.mkdir(parents=True, exist_ok=True)
    for created in reversed(missing):
        _fsync_directory(created.parent)


def _fsync_directory(directory: Path) -> None:
    """Make renames and deletions in ``directory`` durable, where the OS supports it."""
    if os.name == "nt":  # directories cannot be opened, and NTFS journals renames
        return
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        # Some filesystems (and platforms) cannot fsync a directory; there is
        # nothing better to do there.  A real I/O error is not swallowed.
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF, errno.EACCES):
            raise
        logger.debug("cannot fsync directory %s: %s", directory, exc)
    finally:
        os.close(fd)


def _remove_old(directory: Path, just_saved: int, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints, and crash leftovers.

    The checkpoint just written is durable by now, so a failure here is logged
    and not raised: the save succeeded, and the next one tries again.
    """
    try:
        entries = [entry.name for entry in os.scandir(directory)]
    except OSError as exc:
        logger.warning("cannot list %s to delete old checkpoints: %s", directory, exc)
        return
    committed = sorted(_epochs(entries, "json") & _epochs(entries, "pt"), reverse=True)
    if committed and committed[0] > just_saved:
        logger.warning("checkpoint directory %s holds epoch %d, newer than the epoch %d just "
                       "saved; loading will prefer it", directory, committed[0], just_saved)
    kept = set(committed[:keep]) | {just_saved}
    doomed = [f"checkpoint-{e:010d}.{ext}" for e in sorted(set(committed) - kept)
              for ext in ("json", "pt")]  # the record first: un-commit, then delete
    doomed += [name for name in entries
               if name.startswith(_TEMP_PREFIX) and name.endswith(_TEMP_SUFFIX)]
    doomed += [name for name in entries
               if (match := _NAME.fullmatch(name)) and int(match[1]) not in committed]
    for name in doomed:
        try:
            os.unlink(directory / name)
        except FileNotFoundError:
            pass
        except OSError as exc:
            logger.warning("cannot delete old checkpoint file %s: %s", directory / name, exc)


# -- reading ------------------------------------------------------------------------------------

def _committed_epochs(directory: Path) -> list[int]:
    """Epochs with both a payload and a record in ``directory``, newest first."""
    try:
        entries = [entry.name for entry in os.scandir(directory)]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CheckpointError(f"cannot list checkpoint directory {directory}: {exc}") from exc
    return sorted(_epochs(entries, "json") & _epochs(entries, "pt"), reverse=True)


def _epochs(names: list[str], ext: str) -> set[int]:
    return {int(m[1]) for name in names if (m := _NAME.fullmatch(name)) and m[2] == ext}


def _read_info(directory: Path, epoch: int) -> CheckpointInfo:
    """The record of ``epoch``'s checkpoint, checked against the payload's size."""
    name = f"checkpoint-{epoch:010d}"
    info = _read_record(directory / f"{name}.json")
    if info.epoch != epoch:
        raise CheckpointError(f"{info.path.with_suffix('.json')} records epoch {info.epoch}, "
                              f"not the {epoch} of its name")
    try:
        size = info.path.stat().st_size
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {info.path}: {exc}") from exc
    if size != info.size:
        raise CheckpointError(f"checkpoint {info.path} is torn: {size} bytes, "
                              f"its record says {info.size}")
    return info


def _read_record(record: Path) -> CheckpointInfo:
    """Parse a commit record; the payload it describes is beside it."""
    try:
        with open(record, "rb") as f:
            data = f.read(MAX_RECORD_BYTES + 1)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint record {record}: {exc}") from exc
    if len(data) > MAX_RECORD_BYTES:
        raise CheckpointError(f"checkpoint record {record} is over {MAX_RECORD_BYTES} bytes")
    try:
        fields = json.loads(data)
        version, epoch, size, sha256 = (fields["format"], fields["epoch"], fields["size"],
                                        fields["sha256"])
    except (ValueError, TypeError, KeyError):
        raise CheckpointError(f"checkpoint record {record} is corrupt") from None
    if version != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint record {record} has format {version!r}; "
                              f"this p2pdl reads format {FORMAT_VERSION}")
    if (not is_int(epoch) or not 0 <= epoch <= MAX_EPOCH or not is_int(size) or size < 0
            or not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{64}", sha256)):
        raise CheckpointError(f"checkpoint record {record} is corrupt")
    return CheckpointInfo(record.with_suffix(".pt"), epoch, size, sha256)


def _load_file(path: Path, info: CheckpointInfo,
               map_location: MapLocation) -> tuple[dict[str, Any], int]:
    """Verify ``path`` against ``info`` and unpickle it (tensors and plain data only)."""
    try:
        with open(path, "rb") as f:
            size, sha256 = _digest(f)
            if size != info.size:
                raise CheckpointError(f"checkpoint {path} is torn: {size} bytes, "
                                      f"its record says {info.size}")
            if sha256 != info.sha256:
                raise CheckpointError(f"checkpoint {path} is corrupt: its SHA-256 does not "
                                      f"match its record")
            f.seek(0)  # the same open file: what was verified is what is loaded
            try:
                state = torch.load(f, map_location=map_location, weights_only=True)
            except Exception as exc:  # torch raises many kinds for content it rejects
                raise CheckpointError(f"cannot load checkpoint {path}: {exc}") from exc
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} holds a {type(state).__name__}, not a dict")
    return state, info.epoch


def _digest(f: IO[bytes]) -> tuple[int, str]:
    sha256, size = hashlib.sha256(), 0
    while chunk := f.read(_HASH_CHUNK):
        sha256.update(chunk)
        size += len(chunk)
    return size, sha256.hexdigest()


# -- checks and small helpers -------------------------------------------------------------------

_ATOMS = (type(None), bool, int, float, str, bytes, torch.Tensor, torch.nn.Parameter,
          torch.Size, torch.dtype, torch.device)


def _check_value(value: Any, where: str, depth: int) -> None:
    """Raise ConfigError unless ``value`` loads back under ``weights_only=True``.

    Exact types: subclasses (defaultdict, namedtuple, tensor subclasses) pickle
    as their own class, which the loader rejects.
    """
    kind = type(value)
    if kind in _ATOMS:
        return
    if depth >= MAX_NESTING:
        raise ConfigError(f"{where} is nested over {MAX_NESTING} levels deep (a cycle?)")
    if kind in (dict, OrderedDict):
        for key, item in value.items():
            _check_value(key, f"{where} key {key!r}", depth + 1)
            _check_value(item, f"{where}[{key!r}]", depth + 1)
    elif kind in (list, tuple):
        for index, item in enumerate(value):
            _check_value(item, f"{where}[{index}]", depth + 1)
    else:
        raise ConfigError(f"{where} is a {kind.__module__}.{kind.__qualname__}; a checkpoint "
                          f"holds only tensors, numbers, strings, bytes, None and "
                          f"dicts/lists/tuples of them")


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if not is_int(value) or not low <= value <= high:
        raise ConfigError(f"{name} must be an int from {low} to {high}, not {value!r}")



def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _unlink_quietly(path: Path) -> None:
    """Remove ``path`` if it is there, while another error is already on its way."""
    try:
        os.unlink(path)
    except OSError:
        pass
