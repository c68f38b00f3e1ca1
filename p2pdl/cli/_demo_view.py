"""The live view of ``p2pdl demo``: one phase's progress, redrawn while it trains.

On a terminal, a rich ``Live`` frame: the elapsed time and the global batch
as bars, and a table of the peers (state, epoch, samples, losses, the last
round).  Elsewhere (a log file, a pipe) the frame is printed once at the end,
and a plain progress line every :data:`PLAIN_INTERVAL` seconds.  rich is
imported only when a view is drawn.
"""

from __future__ import annotations

import time
from typing import Any

import trio

from ._demo_children import Phase
from ._format import cell

__all__ = ["PLAIN_INTERVAL", "plain_line", "view", "watch"]

#: Seconds between plain progress lines when stdout is not a terminal.
PLAIN_INTERVAL = 10.0
#: Seconds between redraws.
_REFRESH = 0.25


async def watch(phase: Phase, console: Any, *, duration: float, target_batch_size: int,
                limit: float) -> None:
    """Show ``phase`` live until its trainers have exited, or ``limit`` s have passed.

    Sets the phase's wall times and says which trainers sent no final report.
    The trainers are not stopped here.
    """
    from rich.live import Live

    phase.wall_start = time.monotonic()
    phase.clock_start = time.time()
    deadline = trio.current_time() + limit
    started = False
    last_plain = time.monotonic()
    with Live(view(phase, duration, target_batch_size), console=console, auto_refresh=False,
              transient=False) as live:
        while True:
            if not started and all(c.have_started.is_set() for c in phase.trainers):
                started = True
                console.print(f"{phase.name}: training "
                              f"({phase.trainers[0].started.get('peers')} peers)"
                              if phase.trainers[0].started else
                              f"{phase.name}: training")
            if all(c.exited.is_set() for c in phase.trainers):
                break
            if trio.current_time() >= deadline:
                console.print(f"[yellow]{phase.name}: trainers still running "
                              f"{limit:.0f} s after the start; stopping them[/]")
                break
            live.update(view(phase, duration, target_batch_size), refresh=True)
            if not console.is_terminal and time.monotonic() - last_plain >= PLAIN_INTERVAL:
                last_plain = time.monotonic()
                console.print(plain_line(phase, duration))
            await trio.sleep(_REFRESH)
        live.update(view(phase, duration, target_batch_size), refresh=True)
    if not console.is_terminal:
        console.print()  # Live leaves the last frame without a newline there
    phase.wall_end = time.monotonic()
    failed = [c for c in phase.trainers if c.done is None]
    if failed:
        names = ", ".join(f"{c.name} (status {c.returncode}, see {c.log_path})"
                          for c in failed)
        console.print(f"[yellow]{phase.name}: no final report from {names}[/]")


def plain_line(phase: Phase, duration: float) -> str:
    """One line of progress: the time, and each trainer's epoch and loss."""
    parts = []
    for c in phase.trainers:
        s = c.last_step or {}
        parts.append(f"{c.name} epoch {s.get('epoch', '-')} loss {cell(s.get('loss'))}")
    return f"{phase.name} {phase.elapsed():.0f}/{duration:g} s: " + "; ".join(parts)


def view(phase: Phase, duration: float, target_batch_size: int) -> Any:
    """The frame: time and global-batch bars over a table of the phase's peers."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    lead = max(phase.trainers, key=lambda c: (c.last_step or {}).get("epoch", -1),
               default=None)
    step = (lead.last_step if lead else None) or {}
    target = step.get("target") or target_batch_size
    glob = min(step.get("global_samples") or 0, target)
    elapsed = phase.elapsed()
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_column()
    head.add_row("elapsed", ProgressBar(total=duration, completed=min(elapsed, duration),
                                        width=40),
                 f"{elapsed:.0f} / {duration:g} s")
    head.add_row("global batch", ProgressBar(total=target, completed=glob, width=40),
                 f"{glob} / {target} samples, epoch {step.get('epoch', 0)}, "
                 f"{step.get('peers', '-')} peer(s), "
                 f"{cell(step.get('swarm_samples_per_second'), 0)} samples/s")
    table = Table(title=f"{phase.name}", title_justify="left", expand=False)
    for column in ("peer", "role", "state", "epoch", "samples", "loss", "held-out",
                   "last round"):
        table.add_column(column, justify="right" if column in ("epoch", "samples", "loss",
                                                               "held-out") else "left")
    for c in phase.trainers + [c for c in phase.others if c.role == "auxiliary"]:
        s = c.last_step or {}
        running = "averaging" if c.role == "auxiliary" else "training"
        state = ("done" if c.done else f"exited {c.returncode}") if c.exited.is_set() \
            else running if c.have_started.is_set() else \
            "waiting for peers" if c.have_ready.is_set() else "starting"
        last = "-" if not s.get("outcome") else \
            f"{s['outcome']} ({s.get('group_size')}, {cell(s.get('round_seconds'), 1)} s)"
        held = (c.done or {}).get("val_loss") or (c.evals[-1]["val_loss"] if c.evals
                                                   else None)
        table.add_row(c.name, c.role, state, str(s.get("epoch", "-")),
                      str(s.get("samples", "-")) if c.role != "auxiliary" else "-",
                      cell(s.get("loss")), cell(held), last)
    return Group(head, table)
