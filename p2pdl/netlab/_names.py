"""Names and run ids: everything the lab creates carries ``p2nl-<run id>``.

A *run* is one :class:`~p2pdl.netlab.Internet`.  Its id is four hex digits,
claimed atomically through an owner record, so that parallel runs (pytest
workers, two benchmark scripts) never share names and leftovers can be found
and attributed after a crash:

* the internet's own namespace is ``p2nl-<run>`` (it holds the bridge);
* each host or gateway namespace is ``p2nl-<run>-<name>``;
* the owner record ``/run/p2pdl-netlab/<run>`` holds the creating process's
  pid and start time, so :func:`~p2pdl.netlab.cleanup` can tell a live run
  from the leftovers of a process that died without cleaning up.

Interfaces need no prefix: every one of them is created directly inside a
lab namespace (``ip -n NS link add ... peer name ... netns OTHER``), never in
the root namespace, so they cannot clash with anything and they vanish with
their namespace.  Inside a namespace they are called ``eth0`` (a host's
link), ``wan0``/``lan0`` (a gateway's two sides), ``ifb0`` (ingress shaping)
and ``br0``/``portN`` (the internet's switch and its ports).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import re
import secrets

from ..errors import ConfigError
from ._commands import ip
from ._errors import NetlabError

#: The global tag of every lab namespace.  Short, so that a run id and a host
#: name still make a readable ``ip netns list``.
TAG = "p2nl"

#: Where owner records live (tmpfs: like namespaces, they do not survive a reboot).
RECORD_DIR = "/run/p2pdl-netlab"

_RUN_ID = re.compile(r"^[0-9a-f]{4}$")
_LAB_NETNS = re.compile(rf"^{TAG}-([0-9a-f]{{4}})(?:-(.+))?$")
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")

#: How many random ids to try before giving up (65536 exist; collisions are rare).
_CLAIM_ATTEMPTS = 64


def netns_name(run_id: str, host: str | None = None) -> str:
    """The namespace of ``host`` in run ``run_id``; without ``host``, the internet's."""
    return f"{TAG}-{run_id}" if host is None else f"{TAG}-{run_id}-{host}"


def parse_netns(name: str) -> tuple[str, str | None] | None:
    """``(run_id, host or None)`` for a lab namespace name, ``None`` for any other."""
    match = _LAB_NETNS.match(name)
    return (match.group(1), match.group(2)) if match else None


def check_host_name(name: str) -> str:
    """Return ``name`` if it can name a host; raise :class:`ConfigError` if not.

    1 to 32 characters of letters, digits, ``_``, ``.``, ``-``, starting with a
    letter or digit: it becomes part of a namespace name and a file name.
    """
    if not isinstance(name, str) or not _HOST_NAME.match(name):
        raise ConfigError(f"invalid host name {name!r}: use 1-32 letters, digits, '_', '.', "
                          f"'-', starting with a letter or digit")
    return name


def check_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is four lower-case hex digits; raise :class:`ConfigError`."""
    if not isinstance(run_id, str) or not _RUN_ID.match(run_id):
        raise ConfigError(f"invalid run id {run_id!r}: four lower-case hex digits expected")
    return run_id


def list_netns() -> list[str]:
    """The names of all named network namespaces on this machine (``ip netns list``)."""
    out = ip(None, "netns", "list").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


# -- owner records -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Owner:
    """The process that created a run: pid and kernel start time (pids get reused)."""

    pid: int
    start_time: int

    @classmethod
    def current(cls) -> Owner:
        pid = os.getpid()
        return cls(pid, _start_time(pid) or 0)

    def is_alive(self) -> bool:
        """Whether the creating process still runs (same pid *and* start time)."""
        return _start_time(self.pid) == self.start_time


def _start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (clock ticks since boot), ``None`` if no such process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may contain spaces.
    fields = stat.rsplit(")", 1)[-1].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _record_path(run_id: str) -> str:
    return os.path.join(RECORD_DIR, run_id)


def claim_run_id(taken: set[str]) -> str:
    """Choose a fresh run id and write its owner record (atomic: ``O_EXCL``).

    ``taken`` holds ids in use by existing namespaces; ids with a record are
    skipped by the exclusive create.  Raises :class:`NetlabError` after
    ``_CLAIM_ATTEMPTS`` collisions.
    """
    os.makedirs(RECORD_DIR, mode=0o755, exist_ok=True)
    owner = Owner.current()
    for _ in range(_CLAIM_ATTEMPTS):
        run_id = secrets.token_hex(2)
        if run_id in taken:
            continue
        try:
            fd = os.open(_record_path(run_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as f:
            f.write(f"{owner.pid} {owner.start_time}\n")
        return run_id
    raise NetlabError(f"no free run id after {_CLAIM_ATTEMPTS} attempts; "
                      f"remove leftovers with `python -m p2pdl.netlab cleanup`")


def read_owner(run_id: str) -> Owner | None:
    """The owner recorded for ``run_id``, ``None`` if there is no (readable) record."""
    try:
        with open(_record_path(run_id), encoding="ascii") as f:
            pid, start = f.read().split()
        return Owner(int(pid), int(start))
    except (OSError, ValueError):
        return None


def remove_record(run_id: str) -> None:
    """Delete the owner record of ``run_id`` (no error if it is already gone)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_record_path(run_id))


def recorded_run_ids() -> list[str]:
    """Run ids that have an owner record (some may have no namespace left)."""
    try:
        names = os.listdir(RECORD_DIR)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return []
        raise
    return sorted(n for n in names if _RUN_ID.match(n))
