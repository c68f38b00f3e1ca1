"""The results of ``p2pdl demo``: ``report.json``, ``loss.png`` and the summary table.

Everything is computed from what the children printed (their ``step``,
``eval`` and ``done`` events), so an interrupted demo still gets a partial
report.  Whether the uninvited peer was refused comes from the members' own
``done`` events (their admission gate's refused requests, by protocol) and
the uninvited peer's (the rounds it averaged): nothing is assumed.
matplotlib and rich are imported only when the plot or the table is made.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._demo_children import Child, Phase
from ._format import cell, finite

__all__ = ["build_report", "refusal_lines", "summary", "write_plot", "write_report"]


def build_report(*, settings: dict[str, Any], interrupted: bool, error: str | None,
                 swarm: Phase, solo: Phase, children: Sequence[Child],
                 out: Path, member_ids: dict[str, str] | None = None) -> dict[str, Any]:
    """The content of ``report.json`` (``settings`` is the demo's, as given;
    ``member_ids``: the peer id of each member, by child name)."""
    swarm_report, solo_report = _phase_report(swarm), _phase_report(solo)
    return {
        "settings": settings,
        "interrupted": interrupted,
        "error": error,
        "swarm": swarm_report,
        "solo": solo_report,
        "membership": _membership_report(swarm, member_ids or {}),
        "attack": _attack_report(swarm, member_ids or {}, swarm_report, solo_report),
        "comparison": _comparison(swarm_report, solo_report),
        "contributions": _contributions(out / "credits.json", member_ids or {}),
        "processes": [{"name": c.name, "role": c.role, "pid": c.pid,
                       "returncode": c.returncode, "command": c.command}
                      for c in children],
        "paths": {"out": str(out), "report": str(out / "report.json"),
                  "plot": str(out / "loss.png"),
                  "logs": {c.name: str(c.log_path) for c in children},
                  "events": {c.name: str(c.events_path) for c in children}},
    }


def _contributions(path: Path, member_ids: dict[str, str]) -> dict[str, Any] | None:
    """The monitor's credits (its ``--export``): each peer's samples credited
    from its own signed reports, by member name (the display name its
    reports gave where the peer is no member the demo made; None: no export)."""
    try:
        credits = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    names = {peer: name for name, peer in member_ids.items()}
    return {"source": str(path), "run_id": credits.get("run_id"),
            "peers": [{**s, "name": names.get(s["peer_id"], s.get("name"))}
                      for s in credits.get("leaderboard", [])]}


#: How the demo's summary names the monitor's credits.
CONTRIBUTIONS = "contributions (the monitor's credits: samples another member's round took)"


def contribution_lines(report: dict[str, Any]) -> list[str]:
    """One line: the samples the monitor credited to each member."""
    contributions = report.get("contributions")
    if not contributions:
        return []
    peers = contributions["peers"]
    if not peers:
        return [f"{CONTRIBUTIONS}: none counted"]
    listed = ", ".join(f"{p['name'] or p['peer_id'][:8]} {p['samples']} samples in "
                       f"{p['epochs']} epochs" for p in peers)
    return [f"{CONTRIBUTIONS}: {listed}"]


def _phase_report(phase: Phase) -> dict[str, Any]:
    trainers = [_peer_report(c) for c in phase.trainers]
    peers = trainers + [_peer_report(c) for c in phase.others]
    wall = (phase.wall_end - phase.wall_start) if phase.wall_start and phase.wall_end \
        else None
    train_seconds = max([p["seconds"] or 0.0 for p in trainers] or [0.0])
    samples = sum(p["samples"] or 0 for p in trainers)
    evaluator = next((c for c in phase.trainers if c.evals), None)
    val_end = None
    if evaluator is not None:
        val_end = (evaluator.done or {}).get("val_loss") or evaluator.evals[-1]["val_loss"]
    round_seconds = [s["round_seconds"] for c in phase.trainers[:1] for s in c.steps
                     if s.get("stepped") and s.get("round_seconds") is not None
                     and s.get("outcome") != "alone"]
    firsts = [p["first_loss"] for p in trainers if p["first_loss"] is not None]
    lasts = [p["last_loss"] for p in trainers if p["last_loss"] is not None]
    return {
        "trainers": len(phase.trainers),
        "wall_seconds": finite(wall, 1),
        "training_seconds": finite(train_seconds, 1),
        "epochs": max([p["epoch"] or 0 for p in trainers] or [0]),
        "samples": samples,
        "samples_per_second": finite(samples / train_seconds, 1) if train_seconds else None,
        "first_loss": finite(_mean(firsts), 4),
        "last_loss": finite(_mean(lasts), 4),
        "mean_round_seconds": finite(_mean(round_seconds), 3),
        # Share of the training time the first trainer spent blocked in rounds.
        "round_time_share": finite(sum(round_seconds) / train_seconds, 3)
        if train_seconds and round_seconds else None,
        "val_loss_start": evaluator.evals[0]["val_loss"] if evaluator else None,
        "val_loss_end": val_end,
        "val_loss_curve": [{"t": e["t"], "epoch": e["epoch"], "val_loss": e["val_loss"]}
                           for e in evaluator.evals] if evaluator else [],
        "peers": peers,
    }


def _peer_report(c: Child) -> dict[str, Any]:
    done = c.done or {}
    last = c.last_step or {}
    return {
        "name": c.name, "role": c.role,
        "peer_id": (c.ready or {}).get("peer_id"),
        "addrs": (c.ready or {}).get("addrs", c.addrs),
        "client_mode": (c.ready or {}).get("client_mode"),
        "finished": c.done is not None, "reason": done.get("reason"),
        "returncode": c.returncode,
        "epoch": done.get("epoch", last.get("epoch")),
        "samples": done.get("samples", last.get("samples")),
        "seconds": done.get("t", last.get("t")),
        "samples_per_second": done.get("samples_per_second"),
        "first_loss": (c.first_step or {}).get("loss"),
        "last_loss": done.get("loss", last.get("loss")),
        "val_loss_start": c.evals[0]["val_loss"] if c.evals else None,
        "val_loss_end": done.get("val_loss"),
        "statistics": done.get("statistics"),
        "log": str(c.log_path),
    }


def _membership_report(phase: Phase, member_ids: dict[str, str]) -> dict[str, Any]:
    """Who the run's members are, and what each said of the requests it refused."""
    # Members that report statistics at the end: the ``p2pdl train`` children
    # (the relay, a ``p2pdl node``, prints none).
    members = [c for c in phase.trainers + phase.others if c.name in member_ids
               and "train" in c.command]
    evidence = []
    for c in members:
        done = c.done or {}
        admission = done.get("admission") or {}
        membership = done.get("membership_statistics") or {}
        evidence.append({
            "member": c.name, "peer_id": member_ids.get(c.name),
            "reported": "admission" in done,
            # Requests of non-members (the membership's count; the gate's also
            # holds monitors asking to average).
            "refused": membership.get("refused", admission.get("refused")),
            "refused_by_protocol": admission.get("refused_by_protocol") or {},
            "membership_statistics": done.get("membership_statistics"),
        })
    uninvited = []
    for c in phase.uninvited:
        done = c.done or {}
        stats = done.get("statistics") or {}
        uninvited.append({
            "name": c.name, "peer_id": (c.ready or {}).get("peer_id"),
            "membership": (c.ready or {}).get("membership"),
            "members": len(members),
            "members_reporting": sum(1 for e in evidence if e["reported"]),
            # The uninvited peer is the swarm's only non-member, so every refusal
            # a member's gate counted was one of its requests.
            "refused_by": sum(1 for e in evidence if (e["refused"] or 0) > 0),
            "refused_requests": sum(e["refused"] or 0 for e in evidence),
            "averaged": stats.get("averaged"),
            "finished": c.done is not None, "returncode": c.returncode,
        })
    return {"mode": "certificate" if member_ids else "open",
            "members": dict(member_ids), "evidence": evidence, "uninvited": uninvited}


def _attack_report(phase: Phase, member_ids: dict[str, str], swarm: dict[str, Any],
                   solo: dict[str, Any]) -> dict[str, Any] | None:
    """The attacker of ``--attacker`` (None: none): what it did (its own
    statistics), which members flagged and banned it and how soon (from
    their flag books, in seconds since the phase began), and the honest
    trainers' held-out loss against one peer alone."""
    attacker = next((c for c in phase.others if c.role.startswith("attacker")), None)
    if attacker is None:
        return None
    peer = member_ids.get(attacker.name)
    members = []
    for c in phase.trainers + phase.others:
        if c is attacker or c.name not in member_ids or "train" not in c.command:
            continue
        done = c.done or {}
        firsts = (done.get("first_flagged") or {}).get(peer) or {}
        first = min(firsts.values()) if firsts else None
        members.append({
            "member": c.name, "reported": "flags" in done,
            "flags": (done.get("flags") or {}).get(peer) or {},
            "banned": peer in (done.get("bans") or {}),
            "first_flag_s": finite(first - phase.clock_start, 1)
            if first is not None and phase.clock_start is not None else None,
        })
    ratio = None
    if swarm.get("val_loss_end") is not None and solo.get("val_loss_end"):
        ratio = finite(swarm["val_loss_end"] / solo["val_loss_end"], 4)
    return {
        "kind": (attacker.ready or {}).get("attack"), "name": attacker.name, "peer_id": peer,
        "statistics": (attacker.done or {}).get("statistics"),
        "members": members,
        "flagged_by": sum(1 for m in members if m["flags"]),
        "banned_by": sum(1 for m in members if m["banned"]),
        "reporting": sum(1 for m in members if m["reported"]),
        "honest_val_loss_end": swarm.get("val_loss_end"),
        "alone_val_loss_end": solo.get("val_loss_end"),
        "honest_over_alone": ratio,
    }


def attack_lines(report: dict[str, Any]) -> list[str]:
    """What the summary says of the attacker: who caught it, how, when; the losses."""
    attack = report.get("attack")
    if not attack:
        return []
    peer = attack.get("peer_id") or ""
    name = f"{peer[:8]}…{peer[-6:]}" if peer else "(did not start)"
    kinds: dict[str, int] = {}
    for m in attack["members"]:
        for kind, count in m["flags"].items():
            kinds[kind] = kinds.get(kind, 0) + count
    firsts = [m["first_flag_s"] for m in attack["members"] if m["first_flag_s"] is not None]
    line = (f"attacker {name} ({attack['kind']}): flagged by {attack['flagged_by']}/"
            f"{attack['reporting']} members")
    if kinds:
        line += " (" + ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items())) + ")"
    if firsts:
        line += f", first after {min(firsts):.0f} s"
    line += f"; banned by {attack['banned_by']}/{attack['reporting']}"
    lines = [line]
    honest, alone = attack.get("honest_val_loss_end"), attack.get("alone_val_loss_end")
    if honest is not None and alone is not None:
        lines.append(f"honest held-out loss {honest:.3f} with the attacker, {alone:.3f} for "
                     f"one honest peer alone (ratio {attack['honest_over_alone']:.3f})")
    return lines


def refusal_lines(report: dict[str, Any]) -> list[str]:
    """One line per uninvited peer: how many members refused it, from their statistics."""
    lines = []
    membership = report.get("membership") or {}
    for u in membership.get("uninvited", []):
        peer = u.get("peer_id")
        name = f"{peer[:8]}…{peer[-6:]}" if peer else "(did not start)"
        if not u["members_reporting"]:
            lines.append(f"uninvited peer {name}: no member sent its final statistics; "
                         f"no evidence either way")
            continue
        protocols = sorted({p.rsplit("/", 2)[-2] if p.count("/") >= 2 else p
                            for e in membership["evidence"]
                            for p in e["refused_by_protocol"]})
        line = (f"uninvited peer {name}: refused by {u['refused_by']}/{u['members']} members "
                f"(not_admitted; {u['refused_requests']} requests")
        line += f": {', '.join(protocols)})" if protocols else ")"
        if u.get("averaged") == 0:
            line += "; it averaged in no round"
        elif u.get("averaged"):
            line += f"; yet it averaged in {u['averaged']} round(s)"
        lines.append(line)
    return lines


def _comparison(swarm: dict[str, Any], solo: dict[str, Any]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if swarm["samples_per_second"] and solo["samples_per_second"]:
        result["samples_per_second_ratio"] = finite(
            swarm["samples_per_second"] / solo["samples_per_second"], 2)
    if swarm["epochs"] and solo["epochs"]:
        result["epochs_ratio"] = finite(swarm["epochs"] / solo["epochs"], 2)
    if swarm["val_loss_end"] is not None and solo["val_loss_end"] is not None:
        result["val_loss_end_difference"] = finite(
            solo["val_loss_end"] - swarm["val_loss_end"], 4)
    return result


def write_report(out: Path, report: dict[str, Any]) -> Path:
    """Write ``out/report.json`` atomically (a temp file, then a rename); return its path."""
    path = out / "report.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)
    return path


def write_plot(out: Path, swarm: Phase, solo: Phase, settings: dict[str, Any]) -> Path | None:
    """Write ``out/loss.png``: the losses of both phases against time (None: no data)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    series = [(c, "swarm") for c in swarm.trainers] + [(c, "alone") for c in solo.trainers]
    if not any(c.steps for c, _ in series):
        return None
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=100)
    blues = ["#1f4e9c", "#3d7bd9", "#86b0ee"]
    for i, c in enumerate(swarm.trainers):
        pts = [(s["t"], s["loss"]) for s in c.steps if s.get("loss") is not None]
        if pts:
            ax.plot(*_columns(pts), color=blues[i % len(blues)], linewidth=1.2,
                    label=f"swarm {c.name}{' (client mode)' if 'client' in c.role else ''}"
                          f": training loss")
    for c in solo.trainers:
        pts = [(s["t"], s["loss"]) for s in c.steps if s.get("loss") is not None]
        if pts:
            ax.plot(*_columns(pts), color="#d1495b", linewidth=1.6,
                    label="one peer alone: training loss")
    for phase, color, label in ((swarm, "#0b2a5c", "swarm"),
                                (solo, "#8c1c2b", "one peer alone")):
        # One evaluating trainer per phase: the swarm's peers hold the same parameters.
        for c in [c for c in phase.trainers if c.evals][:1]:
            pts = [(e["t"], e["val_loss"]) for e in c.evals if e.get("val_loss") is not None]
            if c.done and c.done.get("reason") in ("duration", "max-epochs") \
                    and c.done.get("val_loss") is not None and c.done.get("t") is not None:
                pts.append((c.done["t"], c.done["val_loss"]))
            if pts:
                ax.plot(*_columns(pts), color=color, linestyle="--", marker="o", markersize=4,
                        label=f"{label}: held-out loss")
    s = settings
    ax.set_xlabel("seconds of training")
    ax.set_ylabel("loss (nats per byte)")
    ax.set_title(f"p2pdl demo: {s['trainers']} trainers ({s['client_mode_trainers']} client "
                 f"mode) + {s['auxiliary_peers']} auxiliary vs one peer alone ({s['mode']})\n"
                 f"global batch {s['target_batch_size']}, batch {s['batch_size']} per step, "
                 f"{s['optimizer']} lr {s['lr']:g}, {s['torch_threads_per_peer']} torch thread "
                 f"per peer, {s['cpu_count']} cores", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "loss.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def summary(report: dict[str, Any]) -> Any:
    """The summary table (a rich renderable): both phases side by side, then
    the line of each uninvited peer (:func:`refusal_lines`)."""
    from rich.table import Table

    swarm, solo = report["swarm"], report["solo"]
    table = Table(title="p2pdl demo: summary" + (" (interrupted)" if report["interrupted"]
                                                 else ""), title_justify="left")
    table.add_column("")
    table.add_column(f"swarm ({swarm['trainers']} trainers + aux)", justify="right")
    table.add_column("one peer alone", justify="right")

    def row(label: str, key: str, digits: int = 3) -> None:
        table.add_row(label, cell(swarm.get(key), digits), cell(solo.get(key), digits))

    row("training time (s)", "training_seconds", 0)
    row("global steps (epochs)", "epochs", 0)
    row("samples processed", "samples", 0)
    row("samples / s", "samples_per_second", 1)
    row("training loss, first", "first_loss")
    row("training loss, last", "last_loss")
    row("held-out loss, start", "val_loss_start")
    row("held-out loss, end", "val_loss_end")
    rounds = [p["statistics"] for p in swarm["peers"] if p.get("statistics")]
    if rounds:
        averaged = sum(s.get("averaged", 0) for s in rounds)
        failed = sum(s.get("failed", 0) + s.get("partial", 0) for s in rounds)
        table.add_row("rounds averaged / failed (all peers)", f"{averaged} / {failed}", "-")
    if swarm.get("mean_round_seconds") is not None:
        table.add_row("mean round time (s)", f"{swarm['mean_round_seconds']:.2f}", "-")
    if swarm.get("round_time_share") is not None:
        table.add_row("share of time in rounds", f"{swarm['round_time_share']:.0%}", "-")
    lines = refusal_lines(report) + attack_lines(report) + contribution_lines(report)
    if not lines:
        return table
    from rich.console import Group
    from rich.text import Text

    return Group(table, *(Text(line) for line in lines))


def _columns(points: Sequence[tuple[float, float]]) -> tuple[list[float], list[float]]:
    return [x for x, _ in points], [y for _, y in points]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None
