"""Training throughput of a 2-peer DeDLOC (or DiLoCo) swarm against the same peers
training alone, in the emulated internet (p2pdl.netlab), as root.

    python simulations/bench_training.py [--duration 10] [--epochs 3] [--scale 1]
        [--model bench|tiny] [--link-mbit 100] [--train-mode dedloc|diloco]
        [--fragments 1] [--no-delayed] [--delayed-epochs 2]
        [--no-bracket] [--nice -10] [--timeout 420] [--keep-logs] [--json-only]

Topology: two public hosts, ``peer0`` and ``peer1``, on the lab's internet, each
capped at ``--link-mbit`` (100) Mbit/s both ways (egress tbf on eth0, ingress
through an IFB: docs/netlab.md), as in ``bench_allreduce.py --netlab``.  One
peer process per host (simulations/_training_netlab_peer.py), each pinned to
its own core (``os.sched_setaffinity``: peer i on core i; the p2pdl node's trio
thread shares it) with one torch thread, at niceness ``--nice`` (-10), each in a
scheduling autogroup of its own: with autogroups on (as here) the kernel
shares a core between sessions first, and a plain ``nice`` counts only inside
a session, so other sessions' work would take half of a peer's core whatever
its niceness.  ``warnings`` says when a peer's compute thread still got less
than 90 % of its core (CPU-starved numbers: rerun when the machine is quieter).

The task is the example TinyTransformerLM (p2pdl/training/_example.py) sized
so that compute dominates, as in DeDLOC: ``--model bench`` is d_model 256,
4 layers, 4 heads, context 128, batch 8 per step (3,257,856 parameters,
~0.3 s a step, 25-28 samples/s a core here), with a target batch of 1152 x
``--scale`` samples: 20-23 s of compute per epoch for the two peers, against
one averaging round of ~0.55 s of transfer (the 6.6 MB vector, fp16 for
tensors of 2**16 values or more as the default codec policy says, sent and
received once over 100 Mbit/s) plus ~0.5 s of matchmaking (its gather_time);
``plan`` in the output has the numbers.  ``--model tiny`` is the example's
default model (446k parameters, batch 16), for smoke tests.

Method.

1. **solo**: both peers at once, each alone in its host with a plain torch
   loop (``loss.backward(); AdamW.step(); zero_grad()``, no p2pdl), the same
   model and batch; after two untimed steps, ``--duration`` seconds of
   training.  They run at the same time so that they share the machine
   (memory bandwidth, the kernel, other work) as the swarm's peers do.
2. **swarm**: a ``p2pdl.Node`` in each host listening on the host's address
   (peer1 with peer0's address as its initial peer) and a
   ``p2pdl.Optimizer`` (DeDLOC mode, AdamW, ``target_batch_size``), the same
   loop with ``opt.step()``.  Once connected, each tracks the run and both
   wait until their progress views hold each other, then start together.
   Epoch 0 is a warm-up; the measured window of a peer runs from the return
   of the ``step`` that took it to epoch 1 to the return of the one that took
   it to epoch 1 + ``--epochs``, averaging rounds included.
   ``swarm_samples_s`` = the samples both peers passed to ``step`` in their
   windows / (latest window end - earliest window start).
3. **solo-after** (unless ``--no-bracket``): the solo run again.  The baseline
   ``solo_samples_s_sum`` is the mean of the two solo runs' sums, which
   bracket the swarm run (other work on a shared machine drifts;
   ``solo_drift`` = after / before).
4. **swarm, delay_updates=True** (unless ``--no-delayed``): as 2, for
   ``--delayed-epochs`` epochs, with the averaging in the node's thread while
   the next batches compute; ``efficiency_delayed``.

``--train-mode diloco`` runs both swarms in DiLoCo mode (an epoch's batches
are AdamW inner steps, the round averages the outer delta); with delayed
updates the inner steps go on while the outer round runs; ``--fragments N``
averages one of N fragments of the parameters per epoch (DiLoCo only).
``train_mode`` and ``fragments`` in the output say which.

``efficiency`` = swarm_samples_s / solo_samples_s_sum (goal: >= 0.9);
``efficiency_vs_fwd_bwd`` divides by the solo rate of forward + backward
alone (no optimizer step, no loop).  ``all_rounds_averaged`` says whether
every round of the window averaged both peers (else ``note``: the samples
were processed, but it was not DeDLOC training).  Where the rest goes, per
peer (``swarm.per_peer[i]``): ``breakdown`` splits the window into forward +
backward, ``step`` calls that ran or finished a round (matchmaking,
all-reduce, the optimizer step, sharing the state), calls that downloaded
the state, other ``step`` calls (accumulating, progress) and the rest of the
loop; ``fwd_bwd_vs_solo`` is its forward + backward time per batch over its
solo one (the node's thread and other work on the machine slow the compute
itself); ``network_calls`` times each matchmaking and all-reduce call (a
timing wrapper around the node's two services; observation only), with the
all-reduce's bytes and phase times; ``ready_skew_s`` is, per epoch, how much
earlier one peer entered the round than the other.  CPU: each peer's CPU
seconds over its window by thread (``MainThread`` computes, ``p2pdl-node``
runs trio), ``compute_share_of_core`` (the compute thread's CPU time over the
wall time of its forward and backward passes), and the machine's busy
fraction over all cores.

Measured here (2 cores shared with other sessions' tests, every core busy,
each peer's compute thread getting 80-92 % of its core), six full runs:
``efficiency`` 0.86-1.03 (0.92, 0.995, 1.03 with the bracketing solo runs),
every round averaged; a round blocked each peer 1.26-1.46 s a 26-31 s
epoch (5.2-5.7 % of the wall time): matchmaking 0.61-0.75 s (its 0.5 s
gather_time the most of it), the all-reduce 0.65-0.71 s against 0.55 s of
transfer at the cap (75-82 % of the link), then the optimizer step and the
state snapshot ~0.1 s; other ``step`` calls (accumulating, progress) 0.85 %.
The solo loop spends ~3 % of a batch in AdamW and the loop (the swarm steps
once an epoch), so the structural loss is ~3.5 %; the spread between runs is the
machine (the forward + backward time moves by +-6 % between phases).  With
``delay_updates=True`` a round blocks each peer ~0.6 % of the wall time
(efficiency_delayed 0.89-1.07) when it averages; in 2 of 6 runs no round
did (the Optimizer's background round races with the other peer's catch-up:
``all_rounds_averaged`` false, ``note``).

Every wait is bounded (``--timeout`` for the whole run, each phase its own
share); the lab's namespaces and processes are removed at the end, on errors,
on Ctrl-C and on SIGTERM.  Needs root with ``ip``, ``tc`` and ``nft``
(iproute2, nftables): otherwise it prints a JSON object with ``error`` and
exits 2.  Prints one JSON object (``--json-only``: compact, and nothing on
stderr but errors); exits 1 when a phase failed (``error`` says which, and
where the peers' logs are).  Takes about 4 minutes with the defaults.
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
    CpuMeter,
    RunFailed,
    Supervisor,
    cores,
    netlab_unavailable,
    sigterm_as_interrupt,
)

BENCHMARK = "training: 2-peer DeDLOC swarm vs solo, netlab"
PEERS = 2
#: TCP payload per Ethernet frame (MSS 1448 with timestamps / 1514-byte frame):
#: the share of a netlab cap TCP can carry (as in _allreduce_netlab.py).
TCP_EFFICIENCY = 1448 / 1514
MODELS = {
    # d_model, n_layers, n_heads, context, batch per step, target batch at scale 1
    "bench": {"d_model": 256, "layers": 4, "heads": 4, "context": 128, "batch": 8,
              "target": 1152},
    "tiny": {"d_model": 128, "layers": 2, "heads": 4, "context": 128, "batch": 16,
             "target": 1024},
}
#: seconds a worker may take to start (imports, model, node) before a phase gives up
START_TIMEOUT = 90.0
EXIT_GRACE = 5.0


_T0 = time.time()


def log(quiet: bool, *parts: object) -> None:
    if not quiet:
        print(f"bench_training [{time.time() - _T0:6.1f} s]:", *parts, file=sys.stderr,
              flush=True)


# ---------------------------------------------------------------- the plan

def plan(args: argparse.Namespace) -> dict[str, Any]:
    """The model's size, the vector on the wire and the predicted round against the
    compute of an epoch (before any measurement)."""
    from p2pdl.averaging import CodecPolicy, PeerCapacity, choose_codec, equal_shares
    from p2pdl.training import ExampleConfig, TinyTransformerLM

    m = args.model_config
    model = TinyTransformerLM(ExampleConfig(d_model=m["d_model"], n_layers=m["layers"],
                                            n_heads=m["heads"], context_length=m["context"],
                                            batch_size=m["batch"]))
    sizes = [p.numel() for p in model.parameters()]
    policy = CodecPolicy()
    vector_bytes = sum(choose_codec(n, policy).encoded_size(n) for n in sizes)
    bandwidth = args.link_mbit * 1e6 / 8 * TCP_EFFICIENCY
    capacities = [PeerCapacity(bandwidth) for _ in range(PEERS)]
    transfer_s = equal_shares(capacities, vector_bytes).predicted_s
    return {"model": args.model, "d_model": m["d_model"], "n_layers": m["layers"],
            "n_heads": m["heads"], "context_length": m["context"],
            "batch_size_per_step": m["batch"], "parameters": sum(sizes),
            "tensors": len(sizes), "target_batch_size": args.target,
            "codecs": f"{policy.small} below {policy.threshold} values, {policy.large} above",
            "vector_bytes": vector_bytes, "fp32_bytes": 4 * sum(sizes),
            "link_payload_bytes_s": round(bandwidth),
            "allreduce_transfer_predicted_s": round(transfer_s, 4),
            "what": "allreduce_transfer_predicted_s: each peer sends and receives its "
                    "vector once (half to reduce, half of the averages) at the link's TCP "
                    "payload rate, both directions at once; matchmaking (gather_time 0.5 s, "
                    "DHT reads and a join) comes on top"}


# ---------------------------------------------------------------- the workers

def workers(log_dir: Path, phase: str, deadline: float, quiet: bool) -> Supervisor:
    """A supervisor for one phase's peer processes (stderr in ``<phase>-rank-<i>.log``),
    which logs each ``epoch`` event as it comes."""
    def on_event(rank: int, message: dict[str, Any]) -> None:
        if message["event"] == "epoch":
            log(quiet, f"{phase}: rank {rank} epoch {message['epoch']} "
                       f"(step {message['step_s']:.2f} s, last round {message['outcome']})")

    # a node's shutdown takes up to 10 s
    return Supervisor(name=phase, log_dir=log_dir, timeout=deadline - time.time(),
                      exit_grace=EXIT_GRACE + 10.0, on_event=on_event)


def worker_argv(args: argparse.Namespace, mode: str, rank: int, host: Any,
                deadline: float, *, initial_peer: str | None = None,
                delay_updates: bool = False, epochs: int | None = None) -> list[str]:
    m = args.model_config
    argv = [sys.executable, "-m", "simulations._training_netlab_peer",
            "--mode", mode, "--rank", str(rank), "--core", str(args.cores[rank]),
            "--ip", host.ip, "--d-model", str(m["d_model"]), "--layers", str(m["layers"]),
            "--heads", str(m["heads"]), "--context", str(m["context"]),
            "--batch", str(m["batch"]), "--duration", str(args.duration),
            "--target", str(args.target), "--epochs", str(epochs or args.epochs),
            "--nice", str(args.nice), "--train-mode", args.train_mode,
            "--fragments", str(args.fragments),
            "--run-id", f"bench-training-{os.getpid()}-{mode}-{int(delay_updates)}",
            "--timeout", f"{max(1.0, deadline - time.time()):.0f}"]
    if initial_peer:
        argv += ["--initial-peer", initial_peer]
    if delay_updates:
        argv.append("--delay-updates")
    return argv


# ---------------------------------------------------------------- the phases

def phase_deadline(args: argparse.Namespace, seconds: float) -> float:
    return min(args.deadline, time.time() + seconds)


def run_solo(args: argparse.Namespace, hosts: list[Any], log_dir: Path,
             monitor: CpuMeter, name: str = "solo") -> dict[str, Any]:
    deadline = phase_deadline(args, START_TIMEOUT + args.duration + 60)
    with workers(log_dir, name, deadline, args.json_only) as peers:
        for rank, host in enumerate(hosts):
            peers.start(worker_argv(args, "solo", rank, host, deadline), host=host)
        ready = peers.wait_all("ready", limit=START_TIMEOUT)
        log(args.json_only, f"{name}: peers ready; {args.duration:g} s of training")
        go = peers.send("go")
        results = peers.wait_all("result", limit=args.duration + 60)
        end = time.time()
    per_peer = []
    for rank in range(PEERS):
        r = results[rank]
        per_peer.append({
            "rank": rank, "core": args.cores[rank], "affinity": ready[rank]["affinity"],
            "priority": ready[rank].get("priority"),
            "samples": r["samples"], "steps": r["steps"], "seconds": _r(r["seconds"], 3),
            "samples_s": _r(r["samples_s"], 3), "step_s": _r(r["step_s"], 4),
            "fwd_bwd_s": _r(r["compute_s"] / max(1, r["steps"]), 4),
            "optimizer_and_loop_s": _r((r["seconds"] - r["compute_s"]) / max(1, r["steps"]), 4),
            "fwd_bwd_samples_s": _r(r["samples"] / r["compute_s"], 3) if r["compute_s"] else None,
            "compute_share_of_core": _r(r["compute_cpu_s"] / r["compute_s"], 3)
            if r["compute_s"] else None,
            "cpu_fraction_of_core": _r(r["cpu_s"] / r["seconds"], 3),
            "cpu_threads_s": r["cpu_threads_s"],
            "loss_first": _r(r["loss_first"], 3), "loss_last": _r(r["loss_last"], 3)})
    return {"per_peer": per_peer,
            "samples_s_sum": sum(r["samples_s"] for r in results.values()),
            "fwd_bwd_samples_s_sum": sum(r["samples"] / r["compute_s"]
                                         for r in results.values() if r["compute_s"]),
            "machine_busy_fraction": _r(busy_fraction(monitor, go, end), 3)}


OUTCOMES = ("averaged", "partial", "alone", "failed")


def run_swarm(args: argparse.Namespace, hosts: list[Any], log_dir: Path,
              monitor: CpuMeter, delay_updates: bool,
              solo: dict[str, Any]) -> dict[str, Any]:
    name = "swarm-delayed" if delay_updates else "swarm"
    epochs = args.delayed_epochs if delay_updates else args.epochs
    expected_epoch_s = args.target / max(1e-9, solo["samples_s_sum"])
    budget = START_TIMEOUT + (epochs + 1) * (2.5 * expected_epoch_s + 40) + 30
    deadline = phase_deadline(args, budget)
    ranks = list(range(PEERS))
    with workers(log_dir, name, deadline, args.json_only) as peers:
        try:
            peers.start(worker_argv(args, "swarm", 0, hosts[0], deadline,
                                    delay_updates=delay_updates, epochs=epochs), host=hosts[0])
            first = peers.wait_all("listening", [0], limit=START_TIMEOUT)[0]
            for rank in ranks[1:]:
                peers.start(worker_argv(args, "swarm", rank, hosts[rank], deadline,
                                        initial_peer=first["addr"],
                                        delay_updates=delay_updates, epochs=epochs),
                            host=hosts[rank])
            ready = peers.wait_all("ready", limit=START_TIMEOUT)
            log(args.json_only, f"{name}: peers up and in each other's progress view; "
                                f"~{expected_epoch_s:.0f} s per epoch expected")
            go = peers.send("go")
            results = peers.wait_all("result", limit=max(1.0, deadline - time.time()))
        finally:
            log(args.json_only, f"{name}: stopping the peers")
    t_start = min(r["t_start"] for r in results.values())
    t_end = max(r["t_end"] for r in results.values())
    wall = t_end - t_start
    samples = sum(r["samples"] for r in results.values())
    per_peer = []
    totals = {k: 0 for k in (*OUTCOMES, "state_syncs", "state_sync_failures")}
    round_s: list[float] = []
    for rank in ranks:
        r = results[rank]
        window_calls = [c for c in r["round_calls"] if c["in_window"]]
        delta = {k: r["statistics"][k] - r["statistics_at_start"][k] for k in totals}
        for k, v in delta.items():
            totals[k] += v
        rounds_seen: dict[int, float] = {}
        for c in window_calls:
            if c["round_epoch"] is not None and c["round_s"] is not None \
                    and c["round_epoch"] >= 1:
                rounds_seen[c["round_epoch"]] = c["round_s"]
        round_s += rounds_seen.values()
        other = r["step_calls_s"] - r["round_calls_s"] - r["sync_calls_s"]
        rest = r["seconds"] - r["compute_s"] - r["step_calls_s"]
        per_peer.append({
            "rank": rank, "core": args.cores[rank], "affinity": ready[rank]["affinity"],
            "priority": ready[rank].get("priority"), "client_mode": ready[rank]["client_mode"],
            "samples": r["samples"], "steps": r["steps"], "seconds": _r(r["seconds"], 3),
            "samples_s": _r(r["samples_s"], 3),
            "vs_solo": None, "fwd_bwd_s": _r(r["compute_s"] / max(1, r["steps"]), 4),
            "fwd_bwd_vs_solo": None,
            "breakdown": {
                "fwd_bwd": _r(r["compute_s"] / r["seconds"], 4),
                "round_calls": _r(r["round_calls_s"] / r["seconds"], 4),
                "state_sync_calls": _r(r["sync_calls_s"] / r["seconds"], 4),
                "other_step_calls": _r(other / r["seconds"], 4),
                "loop_rest": _r(rest / r["seconds"], 4)},
            "outcomes_in_window": {k: v for k, v in delta.items() if v},
            "calls": [{"epoch": f"{c['epoch_before']}->{c['epoch_after']}",
                       "kinds": c["kinds"], "step_s": _r(c["step_s"], 3),
                       "last_round": None if c["outcome"] is None else {
                           "epoch": c["round_epoch"], "outcome": c["outcome"],
                           "seconds": _r(c["round_s"], 3), "group_size": c["group_size"],
                           "error": c["error"]}} for c in window_calls],
            "network_calls": [{k: (_r(v, 3) if isinstance(v, float) else v)
                               for k, v in c.items() if k not in ("in_window", "t_start")}
                              for c in r.get("network_calls", []) if c["in_window"]],
            "close_s": _r(r["close_s"], 3),
            "compute_share_of_core": _r(r["compute_cpu_s"] / r["compute_s"], 3)
            if r["compute_s"] else None,
            "cpu_fraction_of_core": _r(r["cpu_s"] / r["seconds"], 3),
            "cpu_threads_s": r["cpu_threads_s"],
            "loss_first": _r(r["loss_first"], 3), "loss_last": _r(r["loss_last"], 3)})
    # per epoch: how much earlier one peer entered the round that ended it than the other
    skews = []
    for epoch in range(2, epochs + 2):
        calls = [next((c for c in r["round_calls"] if c["epoch_after"] == epoch
                       and c["epoch_before"] == epoch - 1), None) for r in results.values()]
        if all(c is not None for c in calls):
            skews.append(max(c["t_call"] for c in calls) - min(c["t_call"] for c in calls))
    network = [c for r in results.values() for c in r.get("network_calls", [])
               if c["in_window"]]
    mm_s = [c["seconds"] for c in network if c["call"] == "form_group" and "error" not in c]
    ar = [c for c in network if c["call"] == "all_reduce" and "error" not in c]
    valid = totals["averaged"] >= PEERS * epochs and not totals["state_syncs"] \
        and not totals["state_sync_failures"] \
        and not any(totals[k] for k in ("partial", "alone", "failed"))
    out = {
        "delay_updates": delay_updates,
        "samples_s": samples / wall, "samples": samples, "window_s": _r(wall, 3),
        "epochs": epochs, "warmup_epochs": 1,
        "epoch_s_mean": _r(wall / epochs, 3),
        "rounds_by_outcome": {k: totals[k] for k in OUTCOMES if totals[k]},
        "state_syncs": totals["state_syncs"],
        "state_sync_failures": totals["state_sync_failures"],
        "all_rounds_averaged": valid,
        "round_s_mean": _r(statistics.mean(round_s), 3) if round_s else None,
        "round_s_max": _r(max(round_s), 3) if round_s else None,
        "averaging_fraction_of_wall": _r(statistics.mean(
            r["round_calls_s"] / r["seconds"] for r in results.values()), 4),
        "ready_skew_s": [_r(x, 3) for x in skews],
        "matchmaking_s_mean": _r(statistics.mean(mm_s), 3) if mm_s else None,
        "allreduce_s_mean": _r(statistics.mean(c["seconds"] for c in ar), 3) if ar else None,
        "allreduce_bytes_sent_mean": round(statistics.mean(c["bytes_sent"] for c in ar))
        if ar else None,
        "allreduce_link_use": _r(statistics.mean(
            max(c["bytes_sent"], c["bytes_received"]) * 8 / 1e6 / c["seconds"] / args.link_mbit
            for c in ar if c["seconds"] > 0), 3) if ar else None,
        "per_peer": per_peer,
        "machine_busy_fraction": _r(busy_fraction(monitor, t_start, t_end), 3),
        "go_to_first_window_s": _r(t_start - go, 2),
    }
    if not valid:
        out["note"] = ("not every round averaged both peers' gradients (rounds failed, or a "
                       "peer downloaded the state or adopted the epoch): the samples were "
                       "processed, but this is not DeDLOC training; see per_peer[].calls")
    return out


# ---------------------------------------------------------------- the run

def baseline(solos: list[dict[str, Any]]) -> dict[str, Any]:
    """The solo baseline: the mean of the solo runs (one before the swarm runs, one
    between them: other work on a shared machine drifts), per peer and summed."""
    per_peer = []
    for rank in range(PEERS):
        runs = [solo["per_peer"][rank] for solo in solos]
        per_peer.append({k: statistics.mean(run[k] for run in runs)
                         for k in ("samples_s", "fwd_bwd_s", "fwd_bwd_samples_s")})
    return {"per_peer": per_peer,
            "samples_s_sum": statistics.mean(solo["samples_s_sum"] for solo in solos),
            "fwd_bwd_samples_s_sum": statistics.mean(solo["fwd_bwd_samples_s_sum"]
                                                     for solo in solos),
            "runs": len(solos),
            "drift": _r(solos[-1]["samples_s_sum"] / solos[0]["samples_s_sum"], 4)
            if len(solos) > 1 else None}


def compare(swarm: dict[str, Any], base: dict[str, Any]) -> None:
    """Fill each swarm peer's rates relative to its solo baseline."""
    for peer, solo in zip(swarm["per_peer"], base["per_peer"], strict=True):
        peer["vs_solo"] = _r(peer["samples_s"] / solo["samples_s"], 4)
        peer["fwd_bwd_vs_solo"] = _r(peer["fwd_bwd_s"] / solo["fwd_bwd_s"], 4) \
            if solo["fwd_bwd_s"] else None


def headline(swarm: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A swarm run's main figures, for the top of the report."""
    return {f"{prefix}{k}": swarm[k] for k in (
        "rounds_by_outcome", "all_rounds_averaged", "state_syncs", "round_s_mean",
        "matchmaking_s_mean", "allreduce_s_mean", "averaging_fraction_of_wall",
        "epoch_s_mean")}


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def busy_fraction(monitor: CpuMeter, t0: float, t1: float) -> float | None:
    """The machine's busy share of all CPUs between t0 and t1 (time.time())."""
    usage = monitor.usage_between(t0, t1)
    return None if usage is None else usage.machine_busy_fraction


def run(args: argparse.Namespace) -> dict[str, Any]:
    began = time.time()
    args.deadline = began + args.timeout
    out: dict[str, Any] = {"benchmark": BENCHMARK, "peers": PEERS, "link_mbit_s": args.link_mbit,
                           "swarm_samples_s": None, "solo_samples_s_sum": None,
                           "efficiency": None}
    out["plan"] = plan(args)
    out["train_mode"] = args.train_mode
    out["fragments"] = args.fragments
    log_dir = Path(tempfile.mkdtemp(prefix="p2pdl-bench-training-"))
    log(args.json_only, f"{out['plan']['parameters']} parameters, vector "
                        f"{out['plan']['vector_bytes']} B, target {args.target}, logs in {log_dir}")
    monitor = CpuMeter(pids=()).start(interval=0.5)  # the machine only
    failure: str | None = None
    try:
        with netlab.Internet(term_timeout=2.0) as net:
            out["netlab_run"] = net.run_id
            hosts = [net.add_public_host(f"peer{i}", rate_mbit=args.link_mbit)
                     for i in range(PEERS)]
            solos = [run_solo(args, hosts, log_dir, monitor, "solo")]
            out["solo"] = solos[0]
            log(args.json_only, f"solo: {solos[0]['samples_s_sum']:.2f} samples/s")
            swarm = run_swarm(args, hosts, log_dir, monitor, False, solos[0])
            out["swarm"] = swarm
            if args.bracket:
                solos.append(run_solo(args, hosts, log_dir, monitor, "solo-after"))
                out["solo_after"] = solos[1]
                log(args.json_only, f"solo-after: {solos[1]['samples_s_sum']:.2f} samples/s")
            base = baseline(solos)
            out["solo_samples_s_sum"] = _r(base["samples_s_sum"], 3)
            out["solo_runs"] = base["runs"]
            out["solo_drift"] = base["drift"]
            out["compute_s_per_epoch"] = _r(args.target / base["samples_s_sum"], 2)
            compare(swarm, base)
            out["swarm_samples_s"] = _r(swarm["samples_s"], 3)
            out["efficiency"] = _r(swarm["samples_s"] / base["samples_s_sum"], 4)
            out["efficiency_vs_fwd_bwd"] = _r(swarm["samples_s"]
                                              / base["fwd_bwd_samples_s_sum"], 4)
            out.update(headline(swarm, ""))
            log(args.json_only, f"swarm: {swarm['samples_s']:.2f} samples/s, efficiency "
                                f"{out['efficiency']}")
            if args.delayed:
                delayed = run_swarm(args, hosts, log_dir, monitor, True, solos[-1])
                compare(delayed, base)
                out["swarm_delayed_samples_s"] = _r(delayed["samples_s"], 3)
                out["efficiency_delayed"] = _r(delayed["samples_s"] / base["samples_s_sum"], 4)
                out.update(headline(delayed, "delayed_"))
                out["swarm_delayed"] = delayed
                log(args.json_only, f"swarm, delay_updates: {delayed['samples_s']:.2f} "
                                    f"samples/s, efficiency {out['efficiency_delayed']}")
    except RunFailed as exc:
        failure = str(exc)
    except netlab.NetlabError as exc:
        failure = f"netlab: {exc}"
    except Exception as exc:  # a bug here or a malformed message: still report, and clean up
        import traceback

        traceback.print_exc(file=sys.stderr)
        failure = f"{type(exc).__name__}: {exc}"
    finally:
        monitor.stop()
    out.update({
        "goal": {"efficiency >= 0.9": bool(out["efficiency"] and out["efficiency"] >= 0.9)},
        "epochs": args.epochs, "target_batch_size": args.target,
        "model_parameters": out["plan"]["parameters"], "scale": args.scale,
        "solo_duration_s": args.duration,
        "cores": {"machine": cores(), "pinned": args.cores[:PEERS]}, "nice": args.nice,
        "load_average": _loadavg(), "wall_s": round(time.time() - began, 1)})
    out["warnings"] = starvation_warnings(out)
    if failure:
        out["error"] = f"{failure} (logs: {log_dir})"
    elif args.keep_logs:
        out["logs"] = str(log_dir)
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return out


#: A peer that got less of its core than this over a measurement was CPU-starved.
STARVED_BELOW = 0.9


def starvation_warnings(out: dict[str, Any]) -> list[str]:
    """Where a peer's compute thread got less than STARVED_BELOW of its core while it
    computed (``compute_share_of_core``: its CPU time over the wall time of its
    forward and backward passes)."""
    warnings = []
    for phase in ("solo", "swarm", "solo_after", "swarm_delayed"):
        for peer in (out.get(phase) or {}).get("per_peer", []):
            fraction = peer.get("compute_share_of_core")
            if fraction is not None and fraction < STARVED_BELOW:
                warnings.append(f"{phase}: peer {peer['rank']} computed with {fraction:.0%} of "
                                f"its core "
                                f"(other work on the machine: "
                                f"{(out.get(phase) or {}).get('machine_busy_fraction')} of all "
                                f"cores busy); CPU-starved numbers, rerun when quieter")
    return warnings


def _loadavg() -> list[float] | None:
    try:
        return [float(v) for v in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=10.0,
                        help="seconds of each solo run (default 10)")
    parser.add_argument("--no-bracket", dest="bracket", action="store_false",
                        help="one solo run only (default: a second one after the swarm run, "
                             "and the baseline is their mean)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="measured epochs per swarm run, after one warm-up (default 3)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiply the model's target batch size (default 1: 1152 for "
                             "--model bench)")
    parser.add_argument("--model", choices=sorted(MODELS), default="bench",
                        help="bench: d_model 256, 4 layers, batch 8 (3.26M parameters); "
                             "tiny: the example's default model, batch 16 (446k)")
    parser.add_argument("--link-mbit", type=float, default=100.0,
                        help="each host's cap, both ways (default 100 Mbit/s)")
    parser.add_argument("--train-mode", choices=("dedloc", "diloco"), default="dedloc",
                        help="the optimizer's mode in both swarm runs (default dedloc)")
    parser.add_argument("--fragments", type=int, default=1,
                        help="DiLoCo: average one of N fragments per epoch (default 1)")
    parser.add_argument("--no-delayed", dest="delayed", action="store_false",
                        help="skip the delay_updates=True run")
    parser.add_argument("--delayed-epochs", type=int, default=2,
                        help="measured epochs of the delay_updates=True run (default 2)")
    parser.add_argument("--nice", type=int, default=-10,
                        help="niceness of the peers, each in a scheduling autogroup of its "
                             "own (default -10; 0: as is)")
    parser.add_argument("--timeout", type=float, default=420.0,
                        help="seconds for the whole run (default 420)")
    parser.add_argument("--keep-logs", action="store_true",
                        help="keep the peers' logs after a successful run")
    parser.add_argument("--json-only", action="store_true",
                        help="print only the JSON object (no progress on stderr)")
    return parser


def unavailable() -> str | None:
    """Why the lab cannot run here (None: it can)."""
    return netlab_unavailable("bench_training")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.duration <= 0 or args.epochs < 1 or args.delayed_epochs < 1 or args.scale <= 0 \
            or args.timeout <= 0 or args.link_mbit <= 0 or args.fragments < 1:
        print("--duration, --epochs, --delayed-epochs, --scale, --timeout, --link-mbit and "
              "--fragments must be positive", file=sys.stderr)
        return 2
    if args.fragments > 1 and args.train_mode != "diloco":
        print("--fragments needs --train-mode diloco", file=sys.stderr)
        return 2
    args.model_config = MODELS[args.model]
    args.target = max(2 * args.model_config["batch"],
                      int(round(args.model_config["target"] * args.scale)))
    n = cores()
    args.cores = sorted(os.sched_getaffinity(0))[:PEERS] if n >= PEERS else [0] * PEERS
    reason = unavailable()
    if reason is not None:
        print(json.dumps({"benchmark": BENCHMARK, "error": reason, "swarm_samples_s": None,
                          "solo_samples_s_sum": None, "efficiency": None, "peers": PEERS,
                          "link_mbit_s": args.link_mbit}))
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
