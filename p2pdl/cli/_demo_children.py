"""The child processes of ``p2pdl demo``: started, read, grouped in phases, always stopped.

Each child is ``python -m p2pdl ...`` in a session of its own (so that a
Ctrl-C at the terminal reaches only the demo, which decides when they stop).
Its stderr goes to ``<logs>/<name>.log``; its stdout is read line by line,
copied to ``<logs>/<name>.jsonl`` and parsed: the addresses ``p2pdl node``
prints, and the events of ``p2pdl train --json-lines``.

Stopping is SIGTERM, at most ``grace`` seconds, then SIGKILL; it is shielded
from cancellation, and the output is still read meanwhile, so the children's
last events arrive.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import IO, Any

import trio

from .._concurrency import open_service_nursery
from ..errors import CallTimeoutError

__all__ = ["STOP_GRACE", "Child", "Children", "Phase", "open_children", "wait_for"]

logger = logging.getLogger(__name__)

#: Time between SIGTERM and SIGKILL when the demo stops a child (s).  A
#: trainer stops in about 2 s (most of it the interpreter's exit); a machine
#: shared with other jobs can make that several times longer.
STOP_GRACE = 20.0
#: Longest stdout line read from a child (bytes); longer lines are dropped.
MAX_LINE = 1 << 20


@dataclasses.dataclass
class Child:
    """One child process, what it printed, and where its output goes."""

    name: str
    role: str
    command: list[str]
    log_path: Path
    events_path: Path
    process: trio.Process | None = None
    addrs: list[str] = dataclasses.field(default_factory=list)
    ready: dict[str, Any] | None = None
    started: dict[str, Any] | None = None
    last_step: dict[str, Any] | None = None
    first_step: dict[str, Any] | None = None
    done: dict[str, Any] | None = None
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    evals: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    exited: trio.Event = dataclasses.field(default_factory=trio.Event)
    have_addr: trio.Event = dataclasses.field(default_factory=trio.Event)
    #: where it serves Prometheus metrics (``--metrics``), once it said so
    metrics_url: str | None = None
    have_metrics: trio.Event = dataclasses.field(default_factory=trio.Event)
    #: where it serves its web dashboard (``p2pdl monitor --http``), once it said so
    dashboard_url: str | None = None
    have_dashboard: trio.Event = dataclasses.field(default_factory=trio.Event)
    have_ready: trio.Event = dataclasses.field(default_factory=trio.Event)
    have_started: trio.Event = dataclasses.field(default_factory=trio.Event)

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.returncode

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def on_line(self, line: str) -> None:
        if line.startswith("/"):  # `p2pdl node` prints its addresses first
            self.addrs.append(line)
            self.have_addr.set()
            return
        if line.startswith("metrics: "):   # --metrics: where it serves them
            self.metrics_url = line.split(" ", 1)[1].strip()
            self.have_metrics.set()
            return
        if line.startswith("dashboard: "):   # p2pdl monitor --http
            self.dashboard_url = line.split(" ", 1)[1].strip()
            self.have_dashboard.set()
            return
        if not line.startswith("{"):
            return
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        kind = event.get("event")
        if kind == "ready":
            self.ready = event
            self.have_ready.set()
        elif kind == "started":
            self.started = event
            self.have_started.set()
        elif kind == "step":
            if self.first_step is None:
                self.first_step = event
            self.last_step = event
            if len(self.steps) < 100_000:  # bounded: ~1 event per second per child
                self.steps.append(event)
        elif kind == "eval":
            if len(self.evals) < 10_000:
                self.evals.append(event)
        elif kind == "done":
            self.done = event


@dataclasses.dataclass
class Phase:
    """One phase's children and times (the swarm, or the baseline): its trainers,
    the others that serve it (relay, auxiliary peer), and the uninvited."""

    name: str
    trainers: list[Child] = dataclasses.field(default_factory=list)
    others: list[Child] = dataclasses.field(default_factory=list)
    #: Peers of no certificate that try to join the run (the members must refuse them).
    uninvited: list[Child] = dataclasses.field(default_factory=list)
    wall_start: float | None = None
    wall_end: float | None = None
    #: When the phase began by the wall clock (``time.time()``), to place the
    #: times the children's flag books give.
    clock_start: float | None = None

    @property
    def children(self) -> list[Child]:
        return self.trainers + self.others + self.uninvited

    def elapsed(self) -> float:
        return max([c.last_step["t"] for c in self.trainers
                    if c.last_step and c.last_step.get("t") is not None] or [0.0])


class Children:
    """The demo's child processes: started here, always stopped on the way out."""

    def __init__(self, nursery: trio.Nursery, logs: Path, log_level: str) -> None:
        self._nursery = nursery
        self._logs = logs
        self._log_level = log_level
        self._files: list[IO[bytes]] = []
        self.all: list[Child] = []

    async def start(self, name: str, role: str, args: Sequence[str]) -> Child:
        command = [sys.executable, "-m", "p2pdl", "--log-level", self._log_level, *args]
        child = Child(name, role, command, self._logs / f"{name}.log",
                      self._logs / f"{name}.jsonl")
        stderr, events = self._open_files(child)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        child.process = await trio.lowlevel.open_process(
            command, stdout=subprocess.PIPE, stderr=stderr, stdin=subprocess.DEVNULL, env=env,
            start_new_session=True)
        self.all.append(child)
        self._nursery.start_soon(self._read, child, events)
        return child

    def _open_files(self, child: Child) -> tuple[IO[bytes], IO[bytes]]:
        # Small local files, closed in aclose: opening them does not block for long.
        stderr = open(child.log_path, "wb")  # noqa: SIM115
        self._files.append(stderr)
        events = open(child.events_path, "wb")  # noqa: SIM115
        self._files.append(events)
        return stderr, events

    async def _read(self, child: Child, events: IO[bytes]) -> None:
        assert child.process is not None and child.process.stdout is not None
        buf = b""
        try:
            async for chunk in child.process.stdout:
                buf += chunk
                while b"\n" in buf:
                    raw, buf = buf.split(b"\n", 1)
                    events.write(raw + b"\n")
                    child.on_line(raw.decode(errors="replace").strip())
                if len(buf) > MAX_LINE:
                    buf = b""
            await child.process.wait()
        finally:
            events.flush()
            child.exited.set()

    def kill_all(self) -> None:
        for child in self.all:
            if child.process is not None and child.process.returncode is None:
                child.process.kill()

    async def stop(self, children: Sequence[Child], grace: float = STOP_GRACE) -> None:
        """SIGTERM the living ones, wait at most ``grace`` s, then SIGKILL (shielded)."""
        with trio.CancelScope(shield=True):
            for child in children:
                if child.process is not None and child.process.returncode is None:
                    child.process.send_signal(signal.SIGTERM)
            with trio.move_on_after(grace):
                for child in children:
                    await child.exited.wait()
            for child in children:
                if child.process is not None and child.process.returncode is None:
                    logger.warning("%s did not stop within %.0f s; killing it", child.name,
                                   grace)
                    child.process.kill()
            with trio.move_on_after(grace):
                for child in children:
                    await child.exited.wait()

    async def aclose(self) -> None:
        await self.stop(self.all)
        for f in self._files:
            f.close()


@asynccontextmanager
async def open_children(logs: Path, log_level: str) -> AsyncIterator[Children]:
    """Children for the block; on the way out they are stopped while their
    output is still read (so their last events arrive), then the readers end."""
    async with open_service_nursery() as nursery:
        children = Children(nursery, logs, log_level)
        try:
            yield children
        finally:
            await children.aclose()
            nursery.cancel_scope.cancel()


async def wait_for(event: trio.Event, child: Child, timeout: float, what: str) -> None:
    """Wait for ``event`` at most ``timeout`` s; fail if the child exits first.

    Raises:
        CallTimeoutError: the child exited, or the time ran out; the message
            names the child, ``what`` it was to do, and its log.
    """
    with trio.move_on_after(timeout):
        async with trio.open_nursery() as nursery:
            async def exited() -> None:
                await child.exited.wait()
                nursery.cancel_scope.cancel()

            nursery.start_soon(exited)
            await event.wait()
            nursery.cancel_scope.cancel()
    if not event.is_set():
        state = f"exited with status {child.returncode}" if child.exited.is_set() \
            else f"did not within {timeout:.0f} s"
        raise CallTimeoutError(f"{child.name} was to {what} but {state}; see {child.log_path}")
