"""Time and bytes to a held-out loss, per training mode, in the emulated internet
(p2pdl.netlab), as root.

    python simulations/bench_efficiency.py [--modes dedloc_fp16,diloco,...]
        [--target-loss 2.0] [--max-seconds 300] [--link-scale 0.1]
        [--dedloc-target 256] [--diloco-target 2048] [--no-caps-check]
        [--caps-seconds 120]
        [--timeout 3600] [--keep-logs] [--json-only]

Topology: DeDLOC's volunteer tiers (ALBERT: 4 x 200, 8 x 100, 4 x 50 Mbit/s),
scaled to what two cores compute: four public hosts capped at 200, 100, 100
and 50 Mbit/s times ``--link-scale`` (0.1: 20, 10, 10 and 5 Mbit/s), both
ways (docs/netlab.md).  One peer process per host
(simulations/_efficiency_peer.py), not pinned: the four share the machine's
cores.  The task is the example's (p2pdl/training/_example.py, 446k
parameters, batch 16), the same initial parameters everywhere; every peer
uses the defaults a user gets (robust aggregation, verification, measured
capacities: nobody types a bandwidth in).

One run per mode, each in a fresh swarm (a new run id), one after another:

- ``solo`` (the baseline every volunteer has): one peer alone on one
  host, the plain AdamW loop with no node, batch 16;
- ``dedloc_fp16``: DeDLOC mode (one AdamW step of the swarm's averaged
  gradients every ``--dedloc-target`` samples), fp16 on the wire (the
  default codec policy);
- ``diloco``: DiLoCo mode (AdamW inner steps on each peer's own batches,
  an outer Nesterov step of the averaged deltas every ``--diloco-target``
  samples of the swarm), fp16;
- ``diloco_int4``: as ``diloco`` with ``uint4`` outer deltas (error feedback on);
- ``diloco_topk``: as ``diloco`` with ``qtopk`` (8 of every 256 values, 2
  bits each; error feedback on);
- ``diloco_overlapped``: as ``diloco`` with ``delay_updates=True``: the outer
  round runs while the next inner steps compute;
- ``hivemind``: hivemind 1.1.12's ``hivemind.Optimizer`` (its own virtual
  environment, simulations/_baselines.py; peer
  simulations/_hivemind_efficiency_peer.py) on the same task, batches and
  links: gradients averaged in fp16, one AdamW step of the swarm every
  ``--dedloc-target`` samples (DeDLOC's method, as ``dedloc_fp16``), with
  hivemind's quickstart settings (``matchmaking_time=3.0``,
  ``averaging_timeout=10.0``);
- ``hivemind_local``: the same with ``use_local_updates=True`` (the
  quickstart's mode, the nearest hivemind has to DiLoCo): every peer steps
  on its own gradients, and the swarm averages parameters (fp16) every
  ``--diloco-target`` samples.

Peer 0 measures the held-out loss of its live model (the first
``--eval-batches`` held-out windows) at the start and every ``--eval-every``
seconds; a mode's run ends when it is at most ``--target-loss`` or after
``--max-seconds``.  Each row: ``time_to_loss_s`` (the first measurement at
or below the target, from the start; null if none), ``bytes_per_peer`` (the
mean over peers of the bytes their link carried both ways until the run
ended, everything included), ``final_loss`` (the last measurement), the
epochs, the rounds' outcomes and the optimizers' counters (summed over the
peers: rounds, state syncs...).

``bytes_vs_dedloc_fp16``: ``dedloc_fp16``'s bytes per peer over those of the
swarm mode with the fewest that still reached the loss;
``best_time_vs_dedloc_fp16`` its time over the fastest swarm mode's
(``solo_time_to_loss_s``: the solo row's).  Where ``dedloc_fp16`` did not reach the
loss both are null, and ``bytes_vs_dedloc_fp16_at_least`` and
``best_time_vs_dedloc_fp16_at_least`` give lower bounds from what it moved
and how long it ran until the limit.  ``measured_plan_vs_true_caps``
(unless ``--no-caps-check``): one more ``dedloc_fp16`` run (of at most
``--caps-seconds``), each peer declaring its true cap (``bandwidth``, the
cap's TCP payload rate); the median round time of the measured-capacity run
over that of this one.
``best_vs_hivemind_time``: the fastest hivemind row's time over the fastest
p2pdl swarm mode's (``hivemind_best_mode``); where no hivemind row reached
the loss it is null, and ``best_vs_hivemind_time_at_least`` is the lower
bound from the time of its last measurement.  Without hivemind's
environment (it is built on first use; a failed build is a ``notes`` entry)
the hivemind rows are left out and both are null.

Every wait is bounded (``--timeout`` for the whole run); the lab's namespaces
and processes are removed at the end, on errors, on Ctrl-C and on SIGTERM.
Needs root with ``ip``, ``tc`` and ``nft``: otherwise it prints a JSON object
with ``error`` and exits 2.  Exits 1 when a run failed (``error``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from p2pdl import netlab  # noqa: E402
from simulations._harness import (  # noqa: E402
    RunFailed,
    Supervisor,
    netlab_unavailable,
    sigterm_as_interrupt,
)

BENCHMARK = "efficiency: time and bytes to a held-out loss per mode, DeDLOC tiers, netlab"
#: DeDLOC's ALBERT tiers (Mbit/s), one host each, scaled by --link-scale
TIERS_MBIT = (200.0, 100.0, 100.0, 50.0)
#: TCP payload per Ethernet frame (as in bench_training.py)
TCP_EFFICIENCY = 1448 / 1514
MODES = {
    "solo": {"train_mode": "solo", "codec": "none", "target": "dedloc", "peers": 1},
    "dedloc_fp16": {"train_mode": "dedloc", "codec": "fp16", "target": "dedloc"},
    "diloco": {"train_mode": "diloco", "codec": "fp16", "target": "diloco"},
    "diloco_int4": {"train_mode": "diloco", "codec": "uint4", "target": "diloco"},
    "diloco_topk": {"train_mode": "diloco", "codec": "qtopk", "target": "diloco"},
    "diloco_overlapped": {"train_mode": "diloco", "codec": "fp16", "target": "diloco",
                          "delay_updates": True},
    "hivemind": {"system": "hivemind", "train_mode": "dedloc", "codec": "fp16",
                 "target": "dedloc"},
    "hivemind_local": {"system": "hivemind", "train_mode": "local_updates", "codec": "fp16",
                       "target": "diloco", "local_updates": True},
}
START_TIMEOUT = 120.0
EXIT_GRACE = 20.0   # a node's shutdown takes up to 10 s

_T0 = time.time()


def log(quiet: bool, *parts: object) -> None:
    if not quiet:
        print(f"bench_efficiency [{time.time() - _T0:6.1f} s]:", *parts, file=sys.stderr,
              flush=True)


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def peer_argv(args: argparse.Namespace, spec: dict[str, Any], rank: int, host: Any,
              run_id: str, deadline: float, *, initial_peer: str | None,
              bandwidth: float | None) -> list[str]:
    argv = ["--rank", str(rank), "--ip", host.ip, "--peers", str(len(TIERS_MBIT)),
            "--target", str(args.dedloc_target if spec["target"] == "dedloc"
                            else args.diloco_target),
            "--eval-every", str(args.eval_every), "--eval-batches", str(args.eval_batches),
            "--run-id", run_id, "--timeout", f"{max(1.0, deadline - time.time()):.0f}"]
    if initial_peer:
        argv += ["--initial-peer", initial_peer]
    if spec.get("system") == "hivemind":
        local = ["--local-updates"] if spec.get("local_updates") else []
        return [str(args.hivemind_python), "-m", "simulations._hivemind_efficiency_peer",
                *argv, *local]
    argv = [sys.executable, "-m", "simulations._efficiency_peer", *argv,
            "--train-mode", spec["train_mode"], "--codec", spec["codec"]]
    if spec.get("delay_updates"):
        argv.append("--delay-updates")
    if bandwidth:
        argv += ["--bandwidth", f"{bandwidth:.0f}"]
    return argv


def run_mode(args: argparse.Namespace, hosts: list[Any], log_dir: Path, name: str,
             spec: dict[str, Any], *, true_caps: bool = False,
             max_seconds: float | None = None) -> dict[str, Any]:
    """One swarm of the four peers in mode ``spec`` until the target loss or the
    time limit (``max_seconds``, default ``--max-seconds``); its row."""
    limit = args.max_seconds if max_seconds is None else max_seconds
    deadline = min(args.deadline, time.time() + START_TIMEOUT + limit + 120)
    run_id = f"bench-efficiency-{os.getpid()}-{name}"
    caps = [m * args.link_scale * 1e6 / 8 * TCP_EFFICIENCY for m in TIERS_MBIT]

    def on_event(rank: int, message: dict[str, Any]) -> None:
        if message["event"] == "round":
            log(args.json_only, f"{name}: rank {rank} round of epoch {message['epoch']}: "
                                f"{message['outcome']}, {message['seconds']:.2f} s, group "
                                f"of {message['group_size']}"
                                + (f" ({message['error']})" if message["error"] else ""))
        if message["event"] == "eval":
            log(args.json_only, f"{name}: t {message['t']:.0f} s, epoch {message['epoch']}, "
                                f"held-out loss {message['loss']:.3f}")

    with Supervisor(name=name, log_dir=log_dir, timeout=deadline - time.time(),
                    exit_grace=EXIT_GRACE, on_event=on_event) as peers:
        peers.start(peer_argv(args, spec, 0, hosts[0], run_id, deadline, initial_peer=None,
                              bandwidth=caps[0] if true_caps else None), host=hosts[0])
        count = spec.get("peers", len(hosts))
        first = peers.wait_all("listening", [0], limit=START_TIMEOUT)[0] if count > 1 else {}
        for rank in range(1, count):
            peers.start(peer_argv(args, spec, rank, hosts[rank], run_id, deadline,
                                  initial_peer=first["addr"],
                                  bandwidth=caps[rank] if true_caps else None),
                        host=hosts[rank])
        peers.wait_all("ready", limit=START_TIMEOUT)
        log(args.json_only, f"{name}: {count} peer(s) ready; go")
        peers.send("go")
        evals: list[dict[str, Any]] = []
        reached = None
        while True:
            message = peers.wait_all("eval", [0], limit=args.eval_every + 120)[0]
            evals.append(message)
            if message["loss"] <= args.target_loss:
                reached = message["t"]
                break
            if message["t"] >= limit:
                break
        peers.send("stop")
        results = peers.wait_all("result", limit=120)
    per_peer = [results[r] for r in sorted(results)]
    rounds = [x for r in per_peer for x in r["rounds"]]
    averaged = [x["seconds"] for x in rounds if x["outcome"] == "averaged"]
    outcomes: dict[str, int] = {}
    for x in rounds:
        outcomes[x["outcome"]] = outcomes.get(x["outcome"], 0) + 1
    counters: dict[str, int] = {}   # the peers' optimizer counters since go, summed
    for r in per_peer:
        for key, value in r["counters"].items():
            counters[key] = counters.get(key, 0) + value
    return {
        "mode": name, "system": spec.get("system", "p2pdl"), "time_to_loss_s": _r(reached, 1),
        "bytes_per_peer": round(statistics.mean(r["bytes_sent"] + r["bytes_received"]
                                                for r in per_peer)),
        "final_loss": _r(evals[-1]["loss"], 4), "reached": reached is not None,
        "seconds": _r(max(r["seconds"] for r in per_peer), 1),
        "epochs": max(r["epoch"] for r in per_peer),
        "samples": sum(r["samples"] for r in per_peer),
        "round_outcomes": outcomes, "counters": counters,
        "round_s_median": _r(statistics.median(averaged), 3) if averaged else None,
        "bytes_sent_per_peer": [r["bytes_sent"] for r in per_peer],
        "bytes_received_per_peer": [r["bytes_received"] for r in per_peer],
        "train_mode": spec["train_mode"], "codec": spec["codec"],
        "delay_updates": bool(spec.get("delay_updates")),
        "target_batch_size": args.dedloc_target if spec["target"] == "dedloc"
        else args.diloco_target,
        "true_caps_declared": true_caps,
        "evals": [[_r(e["t"], 1), _r(e["loss"], 4)] for e in evals],
    }


def summarize(out: dict[str, Any]) -> None:
    rows = {r["mode"]: r for r in out["rows"]}
    dedloc = rows.get("dedloc_fp16")
    reached = [r for r in out["rows"]
               if r["reached"] and r["mode"] != "solo" and r["system"] == "p2pdl"]
    if "solo" in rows:
        out["solo_time_to_loss_s"] = rows["solo"]["time_to_loss_s"]
    if dedloc and reached:
        least = min(reached, key=lambda r: r["bytes_per_peer"])
        out["least_bytes_mode"] = least["mode"]
        ratio = _r(dedloc["bytes_per_peer"] / least["bytes_per_peer"], 2)
        if dedloc["reached"]:
            out["bytes_vs_dedloc_fp16"] = ratio
        else:   # DeDLOC would have needed more bytes than it moved until the limit
            out["bytes_vs_dedloc_fp16_at_least"] = ratio
            out["notes"].append("dedloc_fp16 did not reach the loss within --max-seconds: "
                                "bytes_vs_dedloc_fp16 is null, and *_at_least are lower "
                                "bounds from what it moved until then")
    if reached:
        best = min(reached, key=lambda r: r["time_to_loss_s"])
        out["best_time_mode"] = best["mode"]
        out["best_time_to_loss_s"] = best["time_to_loss_s"]
        if dedloc and dedloc["reached"]:
            out["best_time_vs_dedloc_fp16"] = _r(dedloc["time_to_loss_s"]
                                                 / best["time_to_loss_s"], 2)
        elif dedloc:
            out["best_time_vs_dedloc_fp16_at_least"] = _r(dedloc["seconds"]
                                                          / best["time_to_loss_s"], 2)
        hivemind = [r for r in out["rows"] if r["system"] == "hivemind"]
        there = [r for r in hivemind if r["reached"]]
        if there:
            fastest = min(there, key=lambda r: r["time_to_loss_s"])
            out["hivemind_best_mode"] = fastest["mode"]
            out["best_vs_hivemind_time"] = _r(fastest["time_to_loss_s"]
                                              / best["time_to_loss_s"], 2)
        elif hivemind:   # still above the loss at its last measurement
            out["best_vs_hivemind_time_at_least"] = _r(
                min(r["evals"][-1][0] for r in hivemind) / best["time_to_loss_s"], 2)
            out["notes"].append("no hivemind row reached the loss within --max-seconds: "
                                "best_vs_hivemind_time is null, and "
                                "best_vs_hivemind_time_at_least a lower bound from its "
                                "last measurement")
    caps = out.get("true_caps_run")
    if dedloc and caps and dedloc["round_s_median"] and caps["round_s_median"]:
        out["measured_plan_vs_true_caps"] = _r(dedloc["round_s_median"]
                                               / caps["round_s_median"], 3)


def _at_least(out: dict[str, Any], key: str, goal: float) -> bool | None:
    """Whether ``key`` (or its lower bound ``key_at_least``) reaches ``goal``;
    None when neither was measured."""
    value = out.get(key) if out.get(key) is not None else out.get(f"{key}_at_least")
    return None if value is None else value >= goal


def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.time()
    args.deadline = began + args.timeout
    out: dict[str, Any] = {
        "benchmark": BENCHMARK, "rows": [], "best_vs_hivemind_time": None,
        "bytes_vs_dedloc_fp16": None, "measured_plan_vs_true_caps": None,
        "target_loss": args.target_loss, "max_seconds": args.max_seconds,
        "links_mbit": [m * args.link_scale for m in TIERS_MBIT],
        "dedloc_target": args.dedloc_target, "diloco_target": args.diloco_target,
        "notes": []}
    args.hivemind_python = None
    if any(MODES[m].get("system") == "hivemind" for m in args.modes):
        from simulations._baselines import hivemind_python

        args.hivemind_python, why = hivemind_python()
        if args.hivemind_python is None:
            out["notes"].append(f"the hivemind rows are left out: {why}")
    log_dir = Path(tempfile.mkdtemp(prefix="p2pdl-bench-efficiency-"))
    log(args.json_only, f"links {out['links_mbit']} Mbit/s, target loss {args.target_loss}, "
                        f"logs in {log_dir}")
    failure: str | None = None
    try:
        with netlab.Internet(term_timeout=2.0) as net:
            out["netlab_run"] = net.run_id
            hosts = [net.add_public_host(f"peer{i}", rate_mbit=m * args.link_scale)
                     for i, m in enumerate(TIERS_MBIT)]
            for name in args.modes:
                if MODES[name].get("system") == "hivemind" and args.hivemind_python is None:
                    continue
                row = run_mode(args, hosts, log_dir, name, MODES[name])
                out["rows"].append(row)
                log(args.json_only, f"{name}: time to loss {row['time_to_loss_s']} s, "
                                    f"{row['bytes_per_peer'] / 1e6:.1f} MB per peer, final "
                                    f"loss {row['final_loss']}")
            if args.caps_check:
                row = run_mode(args, hosts, log_dir, "dedloc_fp16_true_caps",
                               MODES["dedloc_fp16"], true_caps=True,
                               max_seconds=min(args.max_seconds, args.caps_seconds))
                out["true_caps_run"] = row
                log(args.json_only, f"true caps: round {row['round_s_median']} s")
    except RunFailed as exc:
        failure = str(exc)
    except netlab.NetlabError as exc:
        failure = f"netlab: {exc}"
    except Exception as exc:  # a bug here or a malformed message: still report, and clean up
        import traceback

        traceback.print_exc(file=sys.stderr)
        failure = f"{type(exc).__name__}: {exc}"
    summarize(out)
    out["goal"] = {
        "bytes_vs_dedloc_fp16 >= 50": bool(out["bytes_vs_dedloc_fp16"]
                                           and out["bytes_vs_dedloc_fp16"] >= 50),
        "measured_plan_vs_true_caps <= 1.10": bool(out["measured_plan_vs_true_caps"]
                                                   and out["measured_plan_vs_true_caps"] <= 1.10),
        "best_vs_hivemind_time >= 2": _at_least(out, "best_vs_hivemind_time", 2)}
    out["wall_s"] = round(time.time() - began, 1)
    if failure:
        out["error"] = f"{failure} (logs: {log_dir})"
    elif args.keep_logs:
        out["logs"] = str(log_dir)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated, of {', '.join(MODES)} (default: all)")
    parser.add_argument("--target-loss", type=float, default=2.0,
                        help="held-out loss (nats) each mode trains to (default 2.0)")
    parser.add_argument("--max-seconds", type=float, default=300.0,
                        help="seconds a mode may train before it counts as not reaching "
                             "the loss (default 300)")
    parser.add_argument("--link-scale", type=float, default=0.1,
                        help="multiply the tiers' 200/100/100/50 Mbit/s (default 0.1)")
    parser.add_argument("--dedloc-target", type=int, default=256,
                        help="DeDLOC mode's target batch size (default 256)")
    parser.add_argument("--diloco-target", type=int, default=2048,
                        help="DiLoCo modes' samples per outer step (default 2048)")
    parser.add_argument("--eval-every", type=float, default=5.0)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--no-caps-check", dest="caps_check", action="store_false",
                        help="skip the run with the true caps declared")
    parser.add_argument("--caps-seconds", type=float, default=120.0,
                        help="seconds the run with the true caps trains at most "
                             "(default 120: its rounds are what counts)")
    parser.add_argument("--timeout", type=float, default=3600.0,
                        help="seconds for the whole benchmark (default 3600)")
    parser.add_argument("--keep-logs", action="store_true")
    parser.add_argument("--json-only", action="store_true")
    return parser


def unavailable() -> str | None:
    """Why the lab cannot run here (None: it can)."""
    return netlab_unavailable("bench_efficiency")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in args.modes if m not in MODES]
    if unknown or not args.modes:
        print(f"--modes: unknown {', '.join(unknown) or '(none given)'}; "
              f"known: {', '.join(MODES)}", file=sys.stderr)
        return 2
    if min(args.max_seconds, args.link_scale, args.eval_every, args.timeout,
           args.caps_seconds) <= 0 \
            or min(args.dedloc_target, args.diloco_target, args.eval_batches) < 1:
        print("--max-seconds, --link-scale, --eval-every, --timeout, --caps-seconds, "
              "--dedloc-target, "
              "--diloco-target and --eval-batches must be positive", file=sys.stderr)
        return 2
    reason = unavailable()
    if reason is not None:
        print(json.dumps({"benchmark": BENCHMARK, "error": reason, "rows": []}))
        return 2
    try:
        with sigterm_as_interrupt():
            result = run(args)
    except KeyboardInterrupt:
        print(json.dumps({"benchmark": BENCHMARK, "error": "interrupted"}))
        return 130
    print(json.dumps(result, indent=None if args.json_only else 2))
    return 1 if "error" in result else 0


if __name__ == "__main__":
    sys.exit(main())
