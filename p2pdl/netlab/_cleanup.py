"""Removing runs: the end of every :class:`~p2pdl.netlab.Internet`, and leftovers.

Removing a run stops every process in its namespaces (SIGTERM, then SIGKILL),
deletes the namespaces (hosts first, the internet last; their interfaces,
qdiscs and rulesets go with them) and its owner record.  Nothing of the lab
lives in the root namespace, so there is nothing else to remove.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

from ._commands import ip_batch
from ._errors import NetlabError
from ._names import (
    check_run_id,
    list_netns,
    netns_name,
    parse_netns,
    read_owner,
    recorded_run_ids,
    remove_record,
)
from ._processes import stop_processes

__all__ = ["cleanup", "remove_run", "runs_present", "deferred_signals"]

logger = logging.getLogger("p2pdl.netlab")


def runs_present() -> dict[str, list[str]]:
    """Every run with namespaces or an owner record: run id -> its namespaces."""
    runs: dict[str, list[str]] = {run_id: [] for run_id in recorded_run_ids()}
    for name in list_netns():
        parsed = parse_netns(name)
        if parsed is not None:
            runs.setdefault(parsed[0], []).append(name)
    return runs


def _run_of(netns: str) -> str | None:
    parsed = parse_netns(netns)
    return parsed[0] if parsed is not None else None


def _removal_order(run_id: str, names: list[str]) -> list[str]:
    # The reverse of creation: hosts and gateways, then the internet.  Any
    # order would remove everything; this one never leaves a live machine
    # whose link to the internet has already gone.
    internet = netns_name(run_id)
    return sorted(n for n in names if n != internet) + [n for n in names if n == internet]


def remove_run(run_id: str, *, term_timeout: float = 5.0,
               children: list | None = None) -> list[str]:
    """Remove everything of run ``run_id``; return the namespaces deleted, in order.

    Raises :class:`NetlabError` if some namespace is still there afterwards
    (its owner record is then kept, so that a later :func:`cleanup` retries).
    """
    names = _removal_order(run_id, [n for n in list_netns() if _run_of(n) == run_id])
    if names:
        survivors = stop_processes(names, children=children or (), term_timeout=term_timeout)
        if survivors:
            logger.warning("netlab: processes %s in run %s ignored SIGKILL", sorted(survivors),
                           run_id)
        ip_batch(None, [f"netns delete {n}" for n in names], force=True)
        left = [n for n in list_netns() if n in names]
        if left:
            raise NetlabError(f"could not delete namespaces {left} of run {run_id}")
    remove_record(run_id)
    return names


def cleanup(run_id: str | None = None, *, all_runs: bool = False,
            term_timeout: float = 5.0) -> list[str]:
    """Remove lab leftovers from this machine; return the namespaces deleted.

    Without arguments: every run whose creating process is gone (crashed,
    killed, or ended without closing its lab), and namespaces with the lab's
    tag but no owner record.  Runs of live processes, such as a parallel test
    worker, are left alone.  ``run_id`` removes that run whatever its state;
    ``all_runs`` removes every run, live or not.

    Processes inside removed namespaces get SIGTERM, then SIGKILL after
    ``term_timeout`` seconds.  Raises :class:`NetlabError` if a namespace
    cannot be deleted.  Bounded: one removal per run present.
    """
    if run_id is not None:
        check_run_id(run_id)
    runs = runs_present()
    if run_id is not None:
        selected = [run_id] if run_id in runs else []
    elif all_runs:
        selected = sorted(runs)
    else:
        selected = [r for r in sorted(runs)
                    if (owner := read_owner(r)) is None or not owner.is_alive()]
    removed: list[str] = []
    with deferred_signals():
        for r in selected:
            removed += remove_run(r, term_timeout=term_timeout)
    return removed


#: Signals held back while a lab is being removed.
_DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold back Ctrl-C and SIGTERM until the block ends, so they cannot cut a cleanup short.

    Only possible in the main thread (elsewhere this does nothing).  Signals
    that came meanwhile are raised again at the end, to the handlers
    installed before (Python's KeyboardInterrupt, trio's, or the default
    action: a SIGTERM then still ends the process, after the cleanup).  The
    block itself is bounded by command timeouts.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {}
    try:
        for signum in _DEFERRED:
            previous[signum] = signal.signal(signum, lambda s, frame: received.append(s))
    except ValueError:  # not the main interpreter
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        yield
        return
    try:
        yield
    finally:
        for signum, handler in previous.items():
            # None: a handler installed outside Python; the default is closest.
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        for signum in dict.fromkeys(received):  # each once, in order of arrival
            signal.raise_signal(signum)
