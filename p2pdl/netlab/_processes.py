"""Finding and stopping every process inside a set of lab namespaces.

A namespace is not gone while a process still lives in it, and a process
left in a half-removed lab would hang on a dead link; so processes are
stopped before namespaces are deleted.  They are found by scanning ``/proc``
(``/proc/PID/ns/net`` is the same inode as ``/run/netns/NAME``), which also
finds grandchildren and processes that someone started by hand with ``ip
netns exec``; the caller's own process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable

NETNS_DIRS = ("/run/netns", "/var/run/netns")

#: Seconds between two scans while waiting for processes to exit.
_POLL_INTERVAL = 0.02

#: Seconds our own children get to finish exiting once out of the namespace.
_EXIT_GRACE = 1.0


def _netns_inode(name: str) -> tuple[int, int] | None:
    for directory in NETNS_DIRS:
        try:
            st = os.stat(os.path.join(directory, name))
        except OSError:
            continue
        return st.st_dev, st.st_ino
    return None


def pids_in(netns_names: Iterable[str]) -> set[int]:
    """Pids of live (non-zombie) processes whose network namespace is one of these."""
    wanted = {ino for ino in map(_netns_inode, netns_names) if ino is not None}
    if not wanted:
        return set()
    me = os.getpid()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            st = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:
            continue  # exited, a zombie, or a kernel thread
        if (st.st_dev, st.st_ino) in wanted:
            found.add(int(entry.name))
    return found


def _signal_all(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _reap(children: Iterable[subprocess.Popen], timeout: float = 0.0) -> None:
    """Collect exit statuses of our own children, so they do not linger as zombies.

    With ``timeout``, wait up to that long in all for children still running.
    """
    deadline = time.monotonic() + timeout
    for child in children:
        if child.poll() is None and timeout > 0:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(max(0.0, deadline - time.monotonic()))


def stop_processes(netns_names: Iterable[str], *, children: Iterable[subprocess.Popen] = (),
                   term_timeout: float = 5.0, kill_timeout: float = 2.0) -> set[int]:
    """Stop every process in these namespaces: SIGTERM, then SIGKILL after ``term_timeout``.

    ``children`` are :class:`subprocess.Popen` objects of this process among
    them; they are reaped.  Waits at most ``term_timeout + kill_timeout + 1``
    seconds in all and returns the pids still alive then (normally none:
    SIGKILL only fails on processes stuck in the kernel).
    """
    names = list(netns_names)
    children = list(children)
    pids = pids_in(names)
    if not pids:
        _reap(children, timeout=_EXIT_GRACE)
        return set()
    for signum, timeout in ((signal.SIGTERM, term_timeout), (signal.SIGKILL, kill_timeout)):
        _signal_all(pids, signum)
        deadline = time.monotonic() + timeout
        while True:
            _reap(children)
            # Re-scan: new processes forked meanwhile are caught by the next signal.
            pids = pids_in(names)
            if not pids or time.monotonic() >= deadline:
                break
            time.sleep(_POLL_INTERVAL)
        if not pids:
            break
    # A killed process leaves its namespace before it becomes a zombie that
    # can be reaped: give our own children a moment to finish exiting.
    _reap(children, timeout=_EXIT_GRACE)
    return pids
