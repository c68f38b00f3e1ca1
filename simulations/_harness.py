"""What every benchmark in simulations/ uses to run child processes: one supervisor,
one parent <-> child protocol, one failure type and one CPU meter.

Standard library only, and nothing of p2pdl: children that run in another
environment (hivemind's, simulations/_baselines.py) import it too.  Children
run from the repository root (the supervisor's default ``cwd``) and import it
as ``simulations._harness``.

The protocol
------------

Child -> parent: stdout, one JSON object a line, each with a string
``"event"`` key; :func:`emit` writes them.  Every other line on stdout (a
library's print) is ignored, and stderr goes to the child's log file.  Events
every child may send:

* ``{"event": "fatal", "error": "Type: why", ...}`` -- the child failed and
  will exit (:func:`fatal`, or :func:`reporting` around the child's main);
  the parent's waits raise :class:`RunFailed` with the error and the end of
  the child's log.
* ``{"event": "address", "info": {...}}`` -- this child's half of an address
  exchange (:func:`exchange`).

Everything else (``ready``, ``done``, ``result``, ``listening``, ...) is the
benchmark's own, documented where it is used.

Parent -> child: stdin, one JSON object a line, each with a string
``"command"`` key (:meth:`Supervisor.send`); a child reads them only through
:func:`read_command` / :func:`wait_command`.  ``{"command": "stop"}`` or the
end of stdin means stop: the supervisor closes every child's stdin when it
closes, so a child that waits for a command ends when its parent is done or
gone.  ``{"command": "peers", "peers": [info_0, ..., info_n-1]}`` answers an
address exchange: every child's ``info`` in rank order.

The supervisor
--------------

:class:`Supervisor` starts children (plain :class:`subprocess.Popen`, or
through a netlab host's ``popen`` to run inside its network namespace),
numbers them 0, 1, ... in start order (their ranks), reads their events in
one reader thread each, sends them commands and waits for events with a
bound on every wait (its own ``timeout`` for the whole run, and a ``limit``
per wait).  A wait raises :class:`RunFailed` when a child sends ``fatal``,
when a child it waits for exits without the awaited event, and at the
deadline.  ``close()`` (also at the end of its ``with`` block: on success,
on errors and on Ctrl-C) closes the children's stdin, gives them
``exit_grace`` seconds to exit by themselves, then SIGTERM, two more seconds,
SIGKILL, and reaps them.  A plain child runs in a session (and process
group) of its own and the signals go to the whole group, so whatever it
started (hivemind's daemons and DHT processes) goes with it; a netlab host's
children stay in the parent's session, so their scheduling is what the
benchmark set up, and the lab stops whatever is left in its namespaces.

The CPU meter
-------------

:class:`CpuMeter` samples, at moments the benchmark chooses (``sample()``)
or in the background (``start()``), the user + system CPU seconds of some
processes (/proc/PID/stat; this process: :func:`time.process_time`) and the
machine's busy and total jiffies over all CPUs (/proc/stat; busy is all but
idle and iowait).  Two samples give a :class:`CpuUsage`: the wall time
between them, each process's CPU seconds, their share of one core
(``core_fraction``) or of all cores (``cores_fraction``), and the machine's
busy fraction (other work on the machine included).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TERM_GRACE = 2.0  # seconds between SIGTERM and SIGKILL
REAP_TIMEOUT = 5.0  # seconds to wait for a killed child
READER_JOIN = 2.0  # seconds to wait for a reader thread after its child is gone
FATAL_EXIT_WAIT = 1.0  # seconds a child that sent fatal gets to exit before its log is read
EXCHANGE_EVENT = "address"
EXCHANGE_COMMAND = "peers"


def netlab_unavailable(what: str) -> str | None:
    """Why ``what`` cannot run the emulated internet here (None: it can): it
    needs root with ``ip``, ``tc`` and ``nft``."""
    import shutil

    from p2pdl import netlab

    if os.geteuid() != 0:
        return f"{what} needs root (network namespaces, tc, nft)"
    missing = [p for p in ("ip", "tc", "nft") if shutil.which(p) is None]
    if missing:
        return f"missing programs: {', '.join(missing)} (Debian packages iproute2, nftables)"
    ok, reason = netlab.available()
    return None if ok else f"netlab unavailable: {reason}"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises KeyboardInterrupt, so that a benchmark
    killed by ``timeout`` cleans up (its lab, its children) as on Ctrl-C."""
    def on_sigterm(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class RunFailed(Exception):
    """A benchmark's run failed: a child said ``fatal``, exited early, or a wait
    timed out.  The message says which child, why, and the end of its log."""


def cores() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


# ---------------------------------------------------------------- the child's side

class _StdinLines:
    """Lines of fd 0 with a timeout (select + os.read, no thread); keeps what it
    read ahead for the next call."""

    def __init__(self, fd: int = 0) -> None:
        self._fd = fd
        self._buffer = b""
        self._eof = False
        self._lock = threading.Lock()

    def readline(self, timeout: float | None) -> str | None:
        """The next line without its newline; None at the end of input."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while b"\n" not in self._buffer:
                if self._eof:
                    line, self._buffer = self._buffer, b""
                    return line.decode() if line else None
                left = None if end is None else max(0.0, end - time.monotonic())
                ready, _, _ = select.select([self._fd], [], [], left)
                if ready:   # (looked at least once, even with a timeout of 0)
                    chunk = os.read(self._fd, 1 << 16)
                    if chunk:
                        self._buffer += chunk
                    else:
                        self._eof = True
                elif end is not None and time.monotonic() >= end:
                    raise TimeoutError(f"nothing from the parent within {timeout:g} s")
            line, _, self._buffer = self._buffer.partition(b"\n")
            return line.decode()


_stdin = _StdinLines()
_stdout_lock = threading.Lock()


def peer_process(rank: int) -> None:
    """A training peer process's setup, before its work starts: torch on one
    thread (intra- and inter-op: peers share the machine's cores), and the
    logs of WARNING and above on stderr (the child's log), each line with
    ``rank``."""
    import logging

    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:   # some torch call already started the inter-op pool
        pass
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"rank {rank} %(asctime)s %(name)s %(levelname)s %(message)s")


def emit(event: str, **fields: Any) -> None:
    """Send the parent ``{"event": event, **fields}`` (one line on stdout)."""
    line = json.dumps({"event": event, **fields})
    with _stdout_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def read_command(timeout: float | None = None) -> dict[str, Any] | None:
    """The parent's next command, or None at the end of stdin; TimeoutError when none
    came within ``timeout`` seconds (None: wait as long as it takes)."""
    while True:
        line = _stdin.readline(timeout)
        if line is None:
            return None
        if not line.strip():
            continue
        try:
            command = json.loads(line)
        except ValueError:
            command = None
        if not isinstance(command, dict) or not isinstance(command.get("command"), str):
            raise ValueError(f"not a command from the parent: {line[:200]!r}")
        return command


def wait_command(expected: str, timeout: float | None = None) -> dict[str, Any]:
    """Wait for the command ``expected`` and return it (with its fields).

    ``stop`` or the end of stdin: returns ``{"command": "stop"}`` when ``expected``
    is ``"stop"``, else exits (SystemExit, status 1).  Another command: RuntimeError.
    No command within ``timeout`` seconds: TimeoutError.
    """
    command = read_command(timeout)
    if command is None or command["command"] == "stop":
        if expected == "stop":
            return {"command": "stop"}
        raise SystemExit(f"the parent said stop (or closed stdin) while this child waited "
                         f"for {expected!r}")
    if command["command"] != expected:
        raise RuntimeError(f"expected {expected!r} from the parent, got "
                           f"{command['command']!r}")
    return command


def exchange(info: Mapping[str, Any], timeout: float | None = None) -> list[dict[str, Any]]:
    """Tell the parent ``info`` (an address, a port) and return every child's, in rank
    order, once the parent has them all (:meth:`Supervisor.exchange`)."""
    emit(EXCHANGE_EVENT, info=dict(info))
    return list(wait_command(EXCHANGE_COMMAND, timeout)[EXCHANGE_COMMAND])


def describe(exc: BaseException) -> str:
    """``Type: first line of the message`` (of an exception group: of its first leaf),
    at most 300 characters."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    text = str(exc)
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def fatal(exc: BaseException, **fields: Any) -> None:
    """Tell the parent this child failed (``fatal`` with :func:`describe` of ``exc``)."""
    emit("fatal", error=describe(exc), **fields)


@contextlib.contextmanager
def reporting(**fields: Any) -> Iterator[None]:
    """Around a child's main: any exception but SystemExit is sent as ``fatal`` (with
    ``fields``, e.g. ``rank``) and raised again (its traceback goes to the log)."""
    try:
        yield
    except SystemExit:
        raise
    except BaseException as exc:
        fatal(exc, **fields)
        raise


# ---------------------------------------------------------------- the parent's side

@dataclass
class _Child:
    rank: int
    proc: subprocess.Popen[str]
    log: Path
    group: bool  # in a session of its own: signal its process group
    inbox: list[dict[str, Any]] = field(default_factory=list)
    ended: bool = False  # its stdout reached EOF: it sent everything it will send
    reader: threading.Thread | None = None


class Supervisor:
    """Child processes, their events and commands (see the module docstring).

    ``timeout``: seconds for the whole run, from now; every wait ends by then.
    ``log_dir``: where each child's stderr goes (``<name>-rank-<i>.log``; None: a
    temporary directory removed at close).  ``exit_grace``: seconds the children
    get at close to exit by themselves once their stdin is closed.  ``on_event``:
    called with (rank, message) for each event as a wait takes it in.
    """

    def __init__(self, *, name: str = "", log_dir: Path | None = None,
                 timeout: float | None = None, exit_grace: float = 10.0,
                 on_event: Callable[[int, dict[str, Any]], None] | None = None) -> None:
        self.name = name
        self._own_log_dir = log_dir is None
        self.log_dir = Path(tempfile.mkdtemp(prefix="p2pdl-harness-")) if log_dir is None \
            else Path(log_dir)
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.exit_grace = exit_grace
        self.on_event = on_event
        self._children: list[_Child] = []
        self._events: queue.Queue[tuple[int, dict[str, Any] | None]] = queue.Queue()
        self._closed = False

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- starting

    def start(self, argv: Sequence[str], *, host: Any = None,
              env: Mapping[str, str] | None = None, cwd: Path | str = ROOT,
              new_session: bool | None = None) -> int:
        """Start ``argv`` (inside netlab ``host``'s namespace if given); its rank.

        ``env`` is added to this process's environment (and PYTHONUNBUFFERED=1).
        ``new_session`` (default: True for a plain child, False for a host's) runs
        it in a session and process group of its own, signalled as a whole.
        RunFailed if it cannot be started.
        """
        if self._closed:
            raise RuntimeError("the supervisor is closed")
        rank = len(self._children)
        group = host is None if new_session is None else new_session
        prefix = f"{self.name.replace(' ', '-')}-" if self.name else ""
        log = self.log_dir / f"{prefix}rank-{rank}.log"
        full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        popen = subprocess.Popen if host is None else host.popen
        try:
            with log.open("w") as stderr:
                proc = popen([str(a) for a in argv], cwd=cwd, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=stderr, text=True,
                             errors="replace", bufsize=1, env=full_env,
                             start_new_session=group)
        except OSError as exc:
            raise RunFailed(f"{self._prefix()}cannot start rank {rank} ({argv[0]}): "
                            f"{exc}") from exc
        child = _Child(rank, proc, log, group)
        child.reader = threading.Thread(target=self._read, args=(child,), daemon=True,
                                        name=f"harness-reader-{rank}")
        self._children.append(child)
        child.reader.start()
        return rank

    def _read(self, child: _Child) -> None:
        assert child.proc.stdout is not None
        try:
            for line in child.proc.stdout:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    message = json.loads(line)
                except ValueError:
                    continue
                if isinstance(message, dict) and isinstance(message.get("event"), str):
                    self._events.put((child.rank, message))
        except (OSError, ValueError):  # the pipe closed under us at close
            pass
        self._events.put((child.rank, None))

    # -- what they say

    @property
    def ranks(self) -> list[int]:
        return [c.rank for c in self._children]

    @property
    def pids(self) -> list[int]:
        """The children's process ids, in rank order."""
        return [c.proc.pid for c in self._children]

    def returncode(self, rank: int) -> int | None:
        return self._children[rank].proc.poll()

    def tail(self, rank: int, lines: int = 3) -> str:
        """The last ``lines`` lines of the child's log, on one line."""
        try:
            text = self._children[rank].log.read_text(errors="replace").strip().splitlines()
        except (OSError, IndexError):
            return ""
        return " | ".join(line[:300] for line in text[-lines:])

    def _prefix(self) -> str:
        return f"{self.name}: " if self.name else ""

    def _end(self, limit: float | None) -> float:
        ends = [e for e in (self.deadline, None if limit is None
                            else time.monotonic() + limit) if e is not None]
        if not ends:
            raise ValueError("an unbounded wait: give the supervisor a timeout or the wait "
                             "a limit")
        return min(ends)

    def _take(self, end: float, *, raise_fatal: bool) -> bool:
        """Move the next event (waiting until ``end``) into its child's inbox; False
        if none came."""
        left = end - time.monotonic()
        if left <= 0:
            return False
        try:
            rank, message = self._events.get(timeout=min(left, 1.0))
        except queue.Empty:
            return True  # not yet: the caller checks its condition and the time again
        child = self._children[rank]
        if message is None:
            child.ended = True
            try:  # EOF: it exited or is about to; reap it so that its status is known
                child.proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                pass
            return True
        if self.on_event is not None:
            self.on_event(rank, message)
        if raise_fatal and message["event"] == "fatal":
            with contextlib.suppress(subprocess.TimeoutExpired):  # its traceback, for the tail
                child.proc.wait(timeout=FATAL_EXIT_WAIT)
            raise RunFailed(f"{self._prefix()}rank {rank}: {message.get('error')} "
                            f"({self.tail(rank)})")
        child.inbox.append(message)
        return True

    @staticmethod
    def _match(message: dict[str, Any], event: str, match: Mapping[str, Any]) -> bool:
        return message["event"] == event and all(message.get(k) == v for k, v in match.items())

    def find(self, rank: int, event: str, **match: Any) -> dict[str, Any] | None:
        """The first event ``event`` (with fields equal to ``match``) that rank
        ``rank`` sent and no wait took yet, taken now; None if there is none."""
        child = self._children[rank]
        for i, message in enumerate(child.inbox):
            if self._match(message, event, match):
                return child.inbox.pop(i)
        return None

    def wait_all(self, event: str, ranks: Sequence[int] | None = None, *,
                 limit: float | None = None, **match: Any) -> dict[int, dict[str, Any]]:
        """Each of ``ranks``' (default: all) next ``event`` whose fields equal
        ``match`` (e.g. ``round=3``), by rank; waits at most ``limit`` seconds and
        never past the deadline.

        RunFailed when any child sends ``fatal``, when one of ``ranks`` exits
        without the event, or at the end of the wait.
        """
        ranks = self.ranks if ranks is None else list(ranks)
        end = self._end(limit)
        found: dict[int, dict[str, Any]] = {}
        while True:
            for rank in ranks:
                if rank not in found:
                    message = self.find(rank, event, **match)
                    if message is not None:
                        found[rank] = message
            if len(found) == len(ranks):
                return found
            for rank in ranks:
                child = self._children[rank]
                if rank not in found and child.ended:
                    raise RunFailed(f"{self._prefix()}rank {rank} exited (status "
                                    f"{child.proc.poll()}) before {self._what(event, match)}: "
                                    f"{self.tail(rank)}")
            if not self._take(end, raise_fatal=True):
                missing = [r for r in ranks if r not in found]
                raise RunFailed(f"{self._prefix()}timed out waiting for "
                                f"{self._what(event, match)} (from ranks {sorted(found)} of "
                                f"{ranks}); " + "; ".join(f"rank {r}: {self.tail(r)}"
                                                          for r in missing))

    @staticmethod
    def _what(event: str, match: Mapping[str, Any]) -> str:
        fields = ", ".join(f"{k} {v}" for k, v in match.items())
        return f"'{event}'" + (f" ({fields})" if fields else "")

    def wait_exit(self, ranks: Sequence[int] | None = None, *,
                  limit: float | None = None) -> dict[int, int]:
        """Wait until ``ranks`` (default: all) have exited by themselves; their exit
        statuses.  Their events (``fatal`` too) stay for :meth:`find`.  RunFailed at
        the end of the wait."""
        ranks = self.ranks if ranks is None else list(ranks)
        end = self._end(limit)
        while not all(self._children[r].ended for r in ranks):
            if not self._take(end, raise_fatal=False):
                left = [r for r in ranks if not self._children[r].ended]
                raise RunFailed(f"{self._prefix()}timed out waiting for ranks {left} to exit")
        codes: dict[int, int] = {}
        for rank in ranks:
            proc = self._children[rank].proc
            try:
                codes[rank] = proc.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise RunFailed(f"{self._prefix()}rank {rank} closed its stdout but did "
                                f"not exit") from None
        return codes

    # -- what we tell them

    def send(self, command: str, ranks: Sequence[int] | None = None, **fields: Any) -> float:
        """Write ``{"command": command, **fields}`` to ``ranks`` (default: all); returns
        ``time.time()`` just before the first write.  A child that is gone is skipped
        (the next wait reports it)."""
        line = json.dumps({"command": command, **fields}) + "\n"
        targets = [self._children[r] for r in (self.ranks if ranks is None else ranks)]
        now = time.time()
        for child in targets:
            try:
                assert child.proc.stdin is not None
                child.proc.stdin.write(line)
                child.proc.stdin.flush()
            except (OSError, ValueError):
                pass
        return now

    def exchange(self, ranks: Sequence[int] | None = None, *,
                 limit: float | None = None) -> list[dict[str, Any]]:
        """The parent's side of :func:`exchange`: every child's ``info`` once all of
        ``ranks`` sent theirs, sent back to them (``peers``) and returned, in rank
        order."""
        ranks = self.ranks if ranks is None else list(ranks)
        infos = self.wait_all(EXCHANGE_EVENT, ranks, limit=limit)
        peers = [infos[r].get("info", {}) for r in ranks]
        self.send(EXCHANGE_COMMAND, ranks, peers=peers)
        return peers

    # -- the end

    def close(self) -> None:
        """Close the children's stdin, wait ``exit_grace`` seconds for them to exit,
        then SIGTERM, SIGKILL and reap whoever (and whatever group) is left.
        Bounded; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for child in self._children:
            with contextlib.suppress(OSError, ValueError):
                if child.proc.stdin is not None:
                    child.proc.stdin.close()
        end = time.monotonic() + self.exit_grace
        for child in self._children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.proc.wait(timeout=max(0.05, end - time.monotonic()))
        for sig in (signal.SIGTERM, signal.SIGKILL):
            signalled = [c for c in self._children if self._signal(c, sig)]
            if signalled and sig == signal.SIGTERM:
                self._wait_gone(signalled, time.monotonic() + TERM_GRACE)
        self._wait_gone(self._children, time.monotonic() + REAP_TIMEOUT)
        for child in self._children:
            if child.reader is not None:
                child.reader.join(READER_JOIN)
                if child.reader.is_alive():  # a grandchild holds the pipe: leave it be
                    continue
            with contextlib.suppress(OSError, ValueError):
                if child.proc.stdout is not None:
                    child.proc.stdout.close()
        if self._own_log_dir:
            for child in self._children:
                with contextlib.suppress(OSError):
                    child.log.unlink()
            with contextlib.suppress(OSError):
                self.log_dir.rmdir()

    @staticmethod
    def _signal(child: _Child, sig: int) -> bool:
        """Send ``sig`` to the child (to its process group: what it started too, even
        after it exited itself); whether anything was there to get it."""
        try:
            if child.group:
                os.killpg(child.proc.pid, sig)
            elif child.proc.poll() is None:
                child.proc.send_signal(sig)
            else:
                return False
            return True
        except (ProcessLookupError, PermissionError):
            return False

    @staticmethod
    def _gone(child: _Child) -> bool:
        if child.proc.poll() is None:
            return False
        if not child.group:
            return True
        try:
            os.killpg(child.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        return _group_is_zombies(child.proc.pid)

    def _wait_gone(self, children: Sequence[_Child], end: float) -> None:
        while not all(self._gone(c) for c in children) and time.monotonic() < end:
            time.sleep(0.05)


def _group_is_zombies(pgid: int) -> bool:
    """Whether every process left in group ``pgid`` is a zombie (dead, waiting to be
    reaped by its parent or init)."""
    try:
        entries = os.listdir("/proc")
    except OSError:  # pragma: no cover - no /proc
        return False
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # state, ppid, pgrp
            return False
    return True


# ---------------------------------------------------------------- CPU

CLK_TCK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int | None = None) -> float | None:
    """User + system CPU seconds of process ``pid`` (None: this process, all its
    threads), or None if it is gone.  Its children's time is not included."""
    if pid is None:
        return time.process_time()
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def thread_cpu_s() -> dict[str, float]:
    """User + system CPU seconds of each thread of this process, summed by thread name
    (threads not started by :mod:`threading` count as ``other``)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        name = names.get(int(tid), "other")
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs since boot (busy: all but idle and iowait)."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    total = sum(values[:8])  # user nice system idle iowait irq softirq steal
    return total - values[3] - values[4], total


@dataclass(frozen=True)
class CpuUsage:
    """What happened between two :class:`CpuSample`."""

    wall_s: float
    #: CPU seconds of each watched process (0.0 where it was gone at either end)
    cpu_s: tuple[float, ...]
    #: all CPUs' busy share (other work on the machine and the kernel included)
    machine_busy_fraction: float

    @property
    def total_cpu_s(self) -> float:
        return sum(self.cpu_s)

    @property
    def core_fraction(self) -> float:
        """The watched processes' CPU over the wall time: 1.0 = one core busy."""
        return self.total_cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def cores_fraction(self, n: int | None = None) -> float:
        """The watched processes' CPU over (wall time x ``n`` cores; default all
        this process may use)."""
        n = cores() if n is None else n
        return self.total_cpu_s / (self.wall_s * n) if self.wall_s > 0 else 0.0


@dataclass(frozen=True)
class CpuSample:
    """One reading: ``time`` (time.time()), ``clock`` (time.perf_counter()), each
    watched process's CPU seconds (None: gone), the machine's busy and total
    jiffies."""

    time: float
    clock: float
    cpu_s: tuple[float | None, ...]
    busy_jiffies: int
    total_jiffies: int

    def usage_since(self, earlier: CpuSample) -> CpuUsage:
        cpu = tuple((b - a) if a is not None and b is not None else 0.0
                    for a, b in zip(earlier.cpu_s, self.cpu_s, strict=True))
        busy = (self.busy_jiffies - earlier.busy_jiffies) \
            / max(1, self.total_jiffies - earlier.total_jiffies)
        return CpuUsage(self.clock - earlier.clock, cpu, busy)


class CpuMeter:
    """CPU seconds of ``pids`` (None in it: this process; the default is this
    process alone; empty: the machine only) and of the machine, read when asked
    (:meth:`sample`) or every ``interval`` seconds in a thread between
    :meth:`start` and :meth:`stop` (then :meth:`usage_between` any window)."""

    def __init__(self, pids: Sequence[int | None] = (None,)) -> None:
        self.pids = tuple(pids)
        self.samples: list[CpuSample] = []
        self._interval = 0.5
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> CpuSample:
        cpu = tuple(process_cpu_s(pid) for pid in self.pids)
        busy, total = machine_jiffies()
        return CpuSample(time.time(), time.perf_counter(), cpu, busy, total)

    def start(self, interval: float = 0.5) -> CpuMeter:
        """Sample every ``interval`` seconds in a background thread until :meth:`stop`."""
        if self._thread is not None:
            raise RuntimeError("the meter is already sampling")
        self._interval = interval
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True, name="harness-cpu")
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self._interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2 * self._interval + 1.0)
            self._thread = None

    def __enter__(self) -> CpuMeter:
        return self.start(self._interval)

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def usage_between(self, t0: float, t1: float) -> CpuUsage | None:
        """The usage between the background samples nearest ``t0`` and ``t1``
        (time.time(); one interval of slack each side); None without two samples."""
        inside = [s for s in list(self.samples)
                  if t0 - self._interval <= s.time <= t1 + self._interval]
        if len(inside) < 2:
            return None
        return inside[-1].usage_since(inside[0])
