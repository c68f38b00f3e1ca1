"""The terminal view of ``p2pdl monitor``: the run now, drawn with rich.

:func:`monitor_view` turns the views' document (:func:`p2pdl.monitor.run_state`)
into one rich renderable: the run's epoch, progress towards the next one,
throughput and ETA, peers by role and by path, the trainers' mean loss, the
last epochs completed, the top contributors and the peers in view.  On a
terminal ``p2pdl monitor`` redraws it live; elsewhere it prints status
lines.  Peer names are the peers' word: rich markup in them is shown as
text (``Text``, never markup), and the progress layer refuses control
characters in them.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["monitor_view", "TOP_PEERS", "LAST_EPOCHS"]

#: Peers in view listed at most.
TOP_PEERS = 12
#: Completed epochs listed at most.
LAST_EPOCHS = 5


def _number(value: float | None, digits: int = 1) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.{digits}f}"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 90:
        return f"{value:.0f} s"
    return f"{value / 60:.1f} min" if value < 5400 else f"{value / 3600:.1f} h"


def _short(peer_id: str) -> str:
    return peer_id[-8:]


def monitor_view(state: dict[str, Any], top: int = 5) -> Any:
    """The rich renderable of ``state`` (``top``: leaderboard rows)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    status = state.get("status")
    head = Text.assemble(("p2pdl monitor", "bold"), f" | run {state['run_id']}")
    if status is None:
        return Group(head, Text("waiting for the run's progress...", style="dim"))
    paths = status["paths"]
    summary = Table.grid(padding=(0, 3))
    for _ in range(4):
        summary.add_column()
    target = status["target_batch_size"]
    done = status["samples_accumulated"]
    summary.add_row(
        Text.assemble(("epoch ", "dim"), (str(status["epoch"]), "bold"),
                      (f" (quorum {status['quorum_epoch']})", "dim")),
        Text.assemble(("next epoch ", "dim"), f"{done:,} / {target:,} samples ",
                      (f"{min(1.0, done / target):.0%}" if target else "", "bold")),
        Text.assemble(("throughput ", "dim"), f"{_number(status['samples_per_second'])} "
                      "samples/s"),
        Text.assemble(("ETA ", "dim"), _seconds(status["eta_seconds"])))
    summary.add_row(
        Text.assemble(("peers ", "dim"), f"{status['trainers']} trainer(s), "
                      f"{status['auxiliary']} auxiliary, {status['clients']} client(s)"),
        Text.assemble(("paths ", "dim"), f"{paths['direct']} direct, "
                      f"{paths['hole-punched']} hole-punched, {paths['relayed']} relayed, "
                      f"{paths['unknown']} unsaid"),
        Text.assemble(("loss ", "dim"), _number(status["loss"], 3)),
        Text(""))

    epochs = Table(title="last epochs", title_justify="left", expand=False)
    for name in ("epoch", "took", "trainers", "rounds", "group"):
        epochs.add_column(name, justify="right")
    for end in state["epochs"][:LAST_EPOCHS]:
        rounds = ", ".join(f"{n} {kind}" for kind, n in end["outcomes"].items()) or "-"
        epochs.add_row(str(end["epoch"]), _seconds(end["seconds"]), str(end["trainers"]),
                       rounds, _number(end["group"]))

    board = Table(title="top contributors", title_justify="left", expand=False)
    for name, justify in (("#", "right"), ("name", "left"), ("samples", "right"),
                          ("epochs", "right"), ("peer", "left")):
        board.add_column(name, justify=justify)
    for rank, standing in enumerate(state["leaderboard"][:top], 1):
        board.add_row(str(rank), Text(standing["name"] or "-"), f"{standing['samples']:,}",
                      str(standing["epochs"]), _short(standing["peer_id"]))

    peers = Table(title="peers in view", title_justify="left", expand=False)
    for name, justify in (("name", "left"), ("role", "left"), ("epoch", "right"),
                          ("samples", "right"), ("samples/s", "right"), ("loss", "right"),
                          ("path", "left"), ("peer", "left")):
        peers.add_column(name, justify=justify)
    for peer in state["peers"][:TOP_PEERS]:
        peers.add_row(Text(peer["name"] or "-"), peer["role"], str(peer["epoch"]),
                      f"{peer['samples']:,}", _number(peer["samples_per_second"]),
                      _number(peer["loss"], 3), peer["path"] or "-", _short(peer["peer_id"]))
    more = len(state["peers"]) - TOP_PEERS
    tables = Table.grid(padding=(0, 4))
    tables.add_row(epochs, board)
    parts = [head, summary, tables, peers]
    backup = state.get("backup")
    if backup:
        newest = backup["last_epoch"]
        parts.insert(2, Text.assemble(
            ("backups ", "dim"), f"newest: epoch {newest}" if newest is not None else "none yet",
            f", {backup['saved']} saved, {backup['failures']} failed, every "
            f"{backup['every']} epoch(s) in ", Text(backup["directory"])))
    if more > 0:
        parts.append(Text(f"... and {more} more peer(s)", style="dim"))
    return Group(*parts)
