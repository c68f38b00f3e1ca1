"""``bench_allreduce.py --netlab``: the LP load plan against equal shares, under bandwidth
caps of the emulated internet (p2pdl.netlab), as root.

    python simulations/_allreduce_netlab.py [--scale 8] [--numel 2500000] [--rounds 3]
        [--codec fp16] [--chunk-values 65536] [--nice -10] [--timeout 240] [--no-raw-tcp]

Topology: five public hosts on the lab's internet, the DeDLOC tiers divided by
``--scale``: four contributors capped at 200, 100, 100 and 50 Mbit/s and one
auxiliary peer (reduces, contributes nothing) at 500 Mbit/s.  A public host's
``rate_mbit`` caps both directions of its link (egress tbf on eth0, ingress
through an IFB with its own tbf: docs/netlab.md), so every cap is symmetric.
One p2pdl peer process per host (simulations/_p2pdl_netlab_peer.py), listening
on its host's address.

Each peer declares ``bandwidth`` = cap x 1448/1514 bytes/s (the TCP payload a
cap counted in whole Ethernet frames can carry, 95.6 %: docs/netlab.md), and
all average one group of all five twice per pair: with the fractions a
matchmaking leader computes from those bandwidths (``lp``:
``p2pdl.averaging.plan_fractions``; here the whole vector goes to the auxiliary
peer) and with 1/5 each (``equal``).  Contributor i averages the inputs of
simulations/_allreduce_common.py with weight 1 + i; the auxiliary peer passes
weight 0 and zeros.  One untimed warm-up pair, then ``--rounds`` timed pairs,
lp and equal interleaved (lp, equal, lp, equal, ...) so that drift hits both
alike.  A round's time: from the parent's go (a barrier: every peer has its
inputs ready) to the latest *contributor* holding its averaged tensors (the
auxiliary peer gets no result; the latest end of all five is ``*_span_all_s``).
``lp_s`` and ``equal_shares_s`` are the medians.  A round is correct when every
contributor's result is within the fp16 bound of the true weighted mean and
the auxiliary peer averaged its part.

A third plan, ``measured``, is what peers get with no capacities typed in:
before its round every peer says the bandwidth its own rounds measured so
far (``node.allreduce.capacity()``: the lp and equal rounds before it, the
warm-up pair's included) and ``plan_fractions`` of those gives the shares.
``measured_s`` is its median round, ``measured_plan_vs_true_caps`` =
measured_s / lp_s (goal <= 1.10), and ``capacity_estimates`` each host's
last estimates (up and down, Mbit/s and over its cap; TCP payload reaches
at most 0.956 of a cap).  A direction that no round fills is estimated low:
the estimate is what the rounds showed, not the link.

Predictions (``_balancing.round_time`` of those capacities): ``lp_predicted_s``
and ``equal_predicted_s`` for ``vector_bytes``, the whole vector on the wire
with the codec (fp16: 2 bytes a value for tensors of at least 65536 values, 4
below).  ``bandwidth_bound_s``: every contributor must send its vector once and
receive the average once, so the slowest contributor's link needs at least
vector_bytes / its bandwidth, whatever the plan.  ``raw_tcp_slowest_link``:
plain TCP over the slowest link, one way and both ways at once (~5 s).

Scaled to 2 cores.  py-libp2p's cost per byte grows on slow links (small
reads, many window updates): an lp round at scale 8 moves 40 MB and costs the
peers ~4 CPU-s (~100 CPU-s per GiB, idle costs included), not the 13 of
loopback.  ``--scale`` divides every cap (default 8: 25, 12.5, 12.5, 6.25 and
62.5 Mbit/s) and ``--numel`` sets the vector (default 2.5M values, 5 MB in
fp16: 6.7 s predicted for lp, 9.4 s for equal); the peers then use about 20 %
of the two cores (``cpu.cpu_fraction``; the busiest under a quarter of one).
The peers run at ``--nice`` -10: the caps are only as good as the wake-ups of
the processes and the kernel's shaping, and other work on a shared machine
delays both (``cpu.machine_busy_fraction`` says how busy the machine was).
The whole run takes about two minutes.

Measured here (2 cores shared with other work), 3 timed rounds each: at the
default scale 8, lp 7.52 s (1.12 x predicted), equal 11.6 s (1.23 x), equal /
lp 1.54; at scale 4 with 5M values, lp 1.12-1.31 x predicted and equal / lp
1.20-1.37, the worse figures with the machine 98 % busy.  In lp the slowest
contributor's upload runs at ~97 % of the model's rate, and the averages of its
last chunks reach it ~0.5 s after its upload ends (what was queued on its
download path): most of the gap to the prediction.

Prints one JSON object; ``run_netlab(args)`` returns it (for bench_allreduce.py).
``args`` may be None or any object: its attributes scale, numel, rounds, codec,
chunk_values, timeout, raw_tcp and nice are used where present and not None
(note that bench_allreduce.py's own --numel and --rounds defaults are 10M and 5,
which would make this run several minutes).  Where the lab cannot run (not
root, no nft/tc), the times are null and ``note`` says why.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from p2pdl import netlab  # noqa: E402
from p2pdl.averaging import (  # noqa: E402
    CodecPolicy,
    PeerCapacity,
    choose_codec,
    equal_shares,
    plan_load,
    round_time,
)
from simulations._harness import (  # noqa: E402
    CpuMeter,
    CpuUsage,
    RunFailed,
    Supervisor,
    cores,
)

#: The DeDLOC tiers (Mbit/s): four contributors, then the auxiliary peer.
FULL_CAPS_MBIT = (200.0, 100.0, 100.0, 50.0, 500.0)
AUXILIARY = (4,)
HOST_NAMES = ("peer200", "peer100a", "peer100b", "peer50", "aux500")
#: TCP payload per Ethernet frame (MSS 1448 with timestamps / 1514-byte frame): the
#: fraction of a netlab cap TCP can carry (docs/netlab.md measured 96.1 % for ~1 s
#: transfers, the first bucketful included).
TCP_EFFICIENCY = 1448 / 1514
MODES = ("lp", "equal", "measured")
DEFAULTS = {"scale": 8.0, "numel": 2_500_000, "rounds": 3, "codec": "fp16",
            "chunk_values": 2**16, "timeout": 240.0, "raw_tcp": True, "nice": -10}
EXIT_GRACE = 5.0


# ---------------------------------------------------------------- model

def vector_bytes(numel: int, codec: str) -> int:
    """Bytes of one whole vector on the wire (payloads only) with ``codec``'s policy."""
    from simulations._allreduce_common import tensor_shapes  # torch: imported when needed

    policy = CodecPolicy(large=codec)
    sizes = [_prod(s) for s in tensor_shapes(numel)]
    return sum(choose_codec(n, policy).encoded_size(n) for n in sizes)


def _prod(shape: tuple[int, ...]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def model(caps_mbit: list[float], nbytes: int) -> dict[str, Any]:
    """Capacities, plans and predicted times for caps (Mbit/s) and a vector of ``nbytes``."""
    bandwidths = [c * 1e6 / 8 * TCP_EFFICIENCY for c in caps_mbit]
    capacities = [PeerCapacity(b, auxiliary=i in AUXILIARY) for i, b in enumerate(bandwidths)]
    lp = plan_load(capacities, nbytes)
    equal = equal_shares(capacities, nbytes)
    lp_t, lp_neck = round_time(capacities, lp.fractions, nbytes)
    eq_t, eq_neck = round_time(capacities, equal.fractions, nbytes)
    bound = max(nbytes / b for i, b in enumerate(bandwidths) if i not in AUXILIARY)
    return {"bandwidths": bandwidths, "lp_fractions": list(lp.fractions),
            "equal_fractions": list(equal.fractions), "lp_predicted_s": lp_t,
            "lp_bottleneck": lp_neck, "equal_predicted_s": eq_t, "equal_bottleneck": eq_neck,
            "bandwidth_bound_s": bound}


# ---------------------------------------------------------------- plain TCP over the slowest link

def calibrate(hosts: list[Any], caps: list[float], seconds: float = 2.5) -> dict[str, Any]:
    """Plain TCP (no p2pdl) between the slowest contributor and the auxiliary peer:
    one transfer up, then one each way at once (what the slowest link carries in
    the LP plan: its vector up, the average down).  About 2 x ``seconds``."""
    slow = min((i for i in range(len(caps)) if i not in AUXILIARY), key=lambda i: caps[i])
    aux = hosts[AUXILIARY[0]]
    nbytes = int(caps[slow] * 1e6 / 8 * seconds)
    out: dict[str, Any] = {
        "host": HOST_NAMES[slow], "peer": HOST_NAMES[AUXILIARY[0]], "cap_mbit": caps[slow],
        "bytes": nbytes,
        "what": "plain TCP payload rates (Mbit/s, and / cap), one transfer each: one way; "
                "then both ways at once over two connections, where pure ACKs share each "
                "direction with data (p2pdl's one connection piggybacks them)"}
    try:
        up = netlab.measure_throughput(hosts[slow], aux, nbytes, timeout=30)
        out["one_way_mbit"] = round(up.mbit_per_s, 3)
        both: dict[str, Any] = {}

        def transfer(key: str, sender: Any, receiver: Any) -> None:
            try:
                both[key] = netlab.measure_throughput(sender, receiver, nbytes, timeout=30)
            except Exception as exc:  # reported below
                both[key] = exc

        threads = [threading.Thread(target=transfer, args=("up", hosts[slow], aux)),
                   threading.Thread(target=transfer, args=("down", aux, hosts[slow]))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(40)
        for key in ("up", "down"):
            value = both.get(key)
            out[f"both_ways_{key}_mbit"] = round(value.mbit_per_s, 3) \
                if isinstance(value, netlab.Throughput) else f"failed: {value!r}"
    except Exception as exc:  # a calibration only: report it and go on
        out["error"] = f"{type(exc).__name__}: {exc}"
    for key in ("one_way_mbit", "both_ways_up_mbit", "both_ways_down_mbit"):
        if isinstance(out.get(key), float):
            out[key.replace("_mbit", "_ratio")] = round(out[key] / caps[slow], 4)
    return out


# ---------------------------------------------------------------- the run

def _null_result(args: argparse.Namespace, note: str) -> dict[str, Any]:
    return {"benchmark": "all-reduce: LP load plan vs equal shares in netlab",
            "lp_s": None, "equal_shares_s": None, "lp_predicted_s": None,
            "equal_predicted_s": None, "bandwidth_bound_s": None, "lp_vs_predicted": None,
            "equal_vs_lp": None, "scale": args.scale, "numel": args.numel, "codec": args.codec,
            "note": note}


def _args(args: Any) -> argparse.Namespace:
    """``args`` with every missing field at its default (bench_allreduce.py may pass
    a namespace of its own options)."""
    ns = argparse.Namespace(**DEFAULTS)
    for key in DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            setattr(ns, key, value)
    return ns


def run_netlab(args: Any = None) -> dict[str, Any]:
    """Run the benchmark; the JSON object (see the module docstring).  ``args`` may be
    any object with some of scale, numel, rounds, codec, chunk_values, timeout, raw_tcp,
    nice."""
    args = _args(args)
    ok, reason = netlab.available()
    if not ok:
        return _null_result(args, f"netlab unavailable: {reason}")
    began = time.time()
    deadline = began + args.timeout
    caps = [c / args.scale for c in FULL_CAPS_MBIT]
    nbytes = vector_bytes(args.numel, args.codec)
    plan = model(caps, nbytes)
    log_dir = Path(tempfile.mkdtemp(prefix="p2pdl-allreduce-netlab-"))
    print(f"netlab all-reduce: caps {caps} Mbit/s, {args.numel} values ({nbytes} B), "
          f"logs in {log_dir}", file=sys.stderr)

    def argv_of(rank: int, host: Any) -> list[str]:
        prefix = ["nice", "-n", str(args.nice)] if args.nice else []
        return [*prefix, sys.executable, "-m", "simulations._p2pdl_netlab_peer",
                "--rank", str(rank),
                "--ip", host.ip, "--bandwidths", ",".join(f"{b:.1f}" for b in plan["bandwidths"]),
                "--aux", ",".join(map(str, AUXILIARY)), "--pairs", str(args.rounds),
                "--numel", str(args.numel), "--codec", args.codec,
                "--chunk-values", str(args.chunk_values),
                "--timeout", f"{max(1.0, deadline - time.time()):.0f}"]

    rounds: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    estimates: list[dict[str, Any]] = []
    fractions_used: dict[str, list[float]] = {}
    raw_tcp: dict[str, Any] | None = None
    failure: str | None = None
    with netlab.Internet(term_timeout=2.0) as net:
        hosts = [net.add_public_host(name, rate_mbit=cap)
                 for name, cap in zip(HOST_NAMES, caps, strict=True)]
        if args.raw_tcp:
            raw_tcp = calibrate(hosts, caps)
        try:
            with Supervisor(log_dir=log_dir, timeout=deadline - time.time(),
                            exit_grace=EXIT_GRACE) as peers:
                for rank, host in enumerate(hosts):
                    peers.start(argv_of(rank, host), host=host)
                meter = CpuMeter(peers.pids)
                peers.exchange()
                for pair in range(args.rounds + 1):
                    for mode in MODES:
                        if mode == "measured":   # the estimates, to every peer
                            estimates = peers.exchange()
                        ready = peers.wait_all("ready", pair=pair, mode=mode)
                        if pair == 0 and mode == MODES[0]:
                            print(f"netlab all-reduce: peers up and connected after "
                                  f"{time.time() - began:.1f} s", file=sys.stderr)
                        fractions_used.setdefault(mode, ready[0]["fractions"])
                        if any(r["fractions"] != ready[0]["fractions"] for r in ready.values()):
                            raise RunFailed(f"peers disagree on the {mode} fractions: "
                                            f"{[r['fractions'] for r in ready.values()]}")
                        before = meter.sample()
                        released = peers.send("go")
                        done = peers.wait_all("done", pair=pair, mode=mode)
                        all_done = time.time()
                        usage = meter.sample().usage_since(before)
                        peers.send("next")
                        results = peers.wait_all("result", pair=pair, mode=mode)
                        rec = _round_record(pair, mode, released, all_done, done, results, usage)
                        print(f"netlab all-reduce: pair {pair} {mode}: {rec['round_s']:.3f} s "
                              f"(predicted {plan.get(mode + '_predicted_s', math.nan):.3f}), "
                              f"{'correct' if rec['correct'] else 'WRONG'}, peers' CPU "
                              f"{rec['cpu_s']:.2f} s", file=sys.stderr)
                        if pair > 0:
                            rounds[mode].append(rec)
        except RunFailed as exc:
            failure = f"{exc} (logs: {log_dir})"
        except Exception as exc:  # a broken pipe to a dead peer, a malformed message...
            failure = f"{type(exc).__name__}: {exc} (logs: {log_dir})"
    return _summary(args, caps, nbytes, plan, rounds, fractions_used, raw_tcp, failure,
                    time.time() - began, log_dir, estimates)


def _round_record(pair: int, mode: str, released: float, all_done: float,
                  done: dict[int, dict[str, Any]], results: dict[int, dict[str, Any]],
                  usage: CpuUsage) -> dict[str, Any]:
    contributors = [r for r in done if r not in AUXILIARY]
    wall = max(1e-9, all_done - released)
    cpu = list(usage.cpu_s)
    busy = usage.machine_busy_fraction
    checked = [results[r] for r in contributors]
    return {
        "pair": pair, "mode": mode,
        "round_s": max(done[r]["t_end"] for r in contributors) - released,
        "span_all_s": max(d["t_end"] for d in done.values()) - released,
        "per_rank_s": [done[r]["t_end"] - released for r in sorted(done)],
        "go_skew_s": max(d["t_start"] for d in done.values()) - released,
        # contributors hold every part's average; the auxiliary peer averaged its part
        "completed": all(done[r]["completed"] for r in contributors)
        and all(d["own_part_completed"] for d in done.values()),
        "errors": [f"rank {r}: {done[r]['error']}" for r in contributors if done[r]["error"]],
        "correct": all(c["ok"] for c in checked) and all(done[r]["completed"]
                                                         for r in contributors),
        "max_err": None if any(c["max_err"] is None for c in checked)
        else max(c["max_err"] for c in checked),
        "tol": min(c["tol"] for c in checked),
        "bytes_sent": [done[r]["bytes_sent"] for r in sorted(done)],
        "bytes_received": [done[r]["bytes_received"] for r in sorted(done)],
        "times": [done[r]["times"] for r in sorted(done)],
        "peer_predicted_s": done[0].get("predicted_s"),
        "wall_s": wall, "cpu_s": sum(cpu), "cpu_per_rank_s": cpu,
        "machine_busy": busy,
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _r(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(x, digits)


def _summary(args: argparse.Namespace, caps: list[float], nbytes: int, plan: dict[str, Any],
             rounds: dict[str, list[dict[str, Any]]], fractions_used: dict[str, list[float]],
             raw_tcp: dict[str, Any] | None, failure: str | None, wall: float,
             log_dir: Path, estimates: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    n_cores = cores()
    lp_s = _median([r["round_s"] for r in rounds["lp"]])
    eq_s = _median([r["round_s"] for r in rounds["equal"]])
    timed = rounds["lp"] + rounds["equal"]
    cpu_s = sum(r["cpu_s"] for r in timed)
    wall_s = sum(r["wall_s"] for r in timed)
    per_mode: dict[str, Any] = {}
    for mode in MODES:
        recs = rounds[mode]
        if not recs:
            continue
        ranks = range(len(recs[0]["per_rank_s"]))
        med_rank = [statistics.median(r["per_rank_s"][i] for r in recs) for i in ranks]
        sent = recs[-1]["bytes_sent"]
        recv = recs[-1]["bytes_received"]
        per_mode[mode] = {
            "per_rank_median_s": [_r(t, 3) for t in med_rank],
            "bytes_sent": sent, "bytes_received": recv,
            # the busier direction of each link over the rank's own time, vs its cap
            "link_use": [_r(max(s, v) * 8 / 1e6 / t / c, 3) if t > 0 else None
                         for s, v, t, c in zip(sent, recv, med_rank, caps, strict=True)],
            "times_last_round": [{k: _r(v, 3) for k, v in t.items()} for t in recs[-1]["times"]],
            "go_skew_max_s": _r(max(r["go_skew_s"] for r in recs), 4),
            "cpu_per_rank_median_s": [_r(statistics.median(r["cpu_per_rank_s"][i]
                                                            for r in recs), 3) for i in ranks],
            "cpu_fraction": _r(sum(r["cpu_s"] for r in recs)
                               / (sum(r["wall_s"] for r in recs) * n_cores), 3),
            "peer_predicted_s": _r(recs[-1]["peer_predicted_s"]),
        }
    correct = {m: sum(r["correct"] for r in rounds[m]) for m in MODES}
    max_err = [r["max_err"] for r in timed]
    lp_pred, eq_pred = plan["lp_predicted_s"], plan["equal_predicted_s"]
    measured_s = _median([r["round_s"] for r in rounds["measured"]])
    capacity = [{"host": name, "cap_mbit": cap,
                 **{f"{d}_mbit": _r(e[d] * 8 / 1e6, 3) if e.get(d) else None
                    for d in ("up", "down")},
                 **{f"{d}_vs_cap": _r(e[d] * 8 / 1e6 / cap, 3) if e.get(d) else None
                    for d in ("up", "down")}}
                for name, cap, e in zip(HOST_NAMES, caps, estimates or [{}] * len(caps),
                                        strict=True)]
    out: dict[str, Any] = {
        "benchmark": "all-reduce: LP load plan vs equal shares in netlab",
        "lp_s": _r(lp_s), "equal_shares_s": _r(eq_s),
        "lp_predicted_s": _r(lp_pred), "equal_predicted_s": _r(eq_pred),
        "bandwidth_bound_s": _r(plan["bandwidth_bound_s"]),
        "lp_vs_predicted": _r(lp_s / lp_pred) if lp_s else None,
        "equal_vs_predicted": _r(eq_s / eq_pred) if eq_s else None,
        "equal_vs_lp": _r(eq_s / lp_s) if lp_s and eq_s else None,
        "measured_s": _r(measured_s),
        "measured_plan_vs_true_caps": _r(measured_s / lp_s) if lp_s and measured_s else None,
        "capacity_estimates": capacity,
        "predicted_equal_vs_lp": _r(eq_pred / lp_pred),
        "goals": {"lp_s <= 1.15 lp_predicted_s": bool(lp_s and lp_s <= 1.15 * lp_pred),
                  "measured_plan_vs_true_caps <= 1.10": bool(lp_s and measured_s
                                                             and measured_s <= 1.10 * lp_s),
                  "equal_shares_s / lp_s >= 1.3": bool(lp_s and eq_s and eq_s / lp_s >= 1.3)},
        "lp_round_s": [_r(r["round_s"]) for r in rounds["lp"]],
        "equal_round_s": [_r(r["round_s"]) for r in rounds["equal"]],
        "measured_round_s": [_r(r["round_s"]) for r in rounds["measured"]],
        "lp_span_all_s": [_r(r["span_all_s"]) for r in rounds["lp"]],
        "equal_span_all_s": [_r(r["span_all_s"]) for r in rounds["equal"]],
        "correct_rounds": {m: f"{correct[m]}/{len(rounds[m])}" for m in MODES},
        "round_errors": [f"pair {r['pair']} {r['mode']}: {e}" for r in timed
                         for e in r["errors"]][:5],
        "max_err": None if not max_err or None in max_err else max(max_err),
        "tol": min((r["tol"] for r in timed), default=None),
        "fractions": {"lp": [_r(f, 6) for f in fractions_used.get("lp", plan["lp_fractions"])],
                      "equal": [_r(f, 6) for f in fractions_used.get("equal",
                                                                     plan["equal_fractions"])],
                      "measured": [_r(f, 6) for f in fractions_used.get("measured", [])]},
        "fractions_from": "lp: p2pdl.averaging.plan_fractions in every peer (as a matchmaking "
                          "leader) of the caps; equal: 1/5 each (the auxiliary peer reduces "
                          "too); measured: plan_fractions of the bandwidths the peers "
                          "measured of themselves (node.allreduce.capacity()), the last pair's",
        "hosts": list(HOST_NAMES), "auxiliary": list(AUXILIARY),
        "caps_mbit": caps, "full_caps_mbit": list(FULL_CAPS_MBIT), "scale": args.scale,
        "caps_symmetric": True,
        "tcp_efficiency": round(TCP_EFFICIENCY, 5),
        "bandwidth_bytes_per_s": [round(b) for b in plan["bandwidths"]],
        "raw_tcp_slowest_link": raw_tcp,
        "nice": args.nice,
        "numel": args.numel, "codec": args.codec, "chunk_values": args.chunk_values,
        "vector_bytes": nbytes, "rounds": args.rounds,
        "per_mode": per_mode,
        "cpu": {"cores": n_cores,
                "cpu_fraction": _r(cpu_s / (wall_s * n_cores), 3) if wall_s else None,
                "peers_cpu_s": _r(cpu_s, 2), "timed_wall_s": _r(wall_s, 2),
                "busiest_peer_fraction_of_a_core": _r(max(
                    (max(c / r["wall_s"] for c in r["cpu_per_rank_s"]) for r in timed),
                    default=0.0), 3),
                "machine_busy_fraction": _r(statistics.mean(r["machine_busy"] for r in timed),
                                            3) if timed else None,
                "what": "cpu_fraction: the peers' user+system CPU during the timed rounds / "
                        "(wall x cores); machine_busy_fraction: all CPUs' busy share then "
                        "(other work on the machine and the kernel's shaping included)"},
        "wall_s": round(wall, 1),
        "note": f"logs in {log_dir}",
    }
    if failure:
        out["note"] = f"failed: {failure}"
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=DEFAULTS["scale"],
                        help="divide every cap by this (default 8: 25/12.5/12.5/6.25 + "
                             "62.5 Mbit/s)")
    parser.add_argument("--numel", type=int, default=DEFAULTS["numel"],
                        help="values per peer (default 2.5M: 5 MB in fp16)")
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"],
                        help="timed rounds per mode, after one warm-up each (default 3)")
    parser.add_argument("--codec", choices=("none", "fp16"), default=DEFAULTS["codec"])
    parser.add_argument("--chunk-values", type=int, default=DEFAULTS["chunk_values"],
                        help="values per chunk (default 65536, 128 KiB in fp16; p2pdl's "
                             "default 2**20 would add a 2 MiB tail on a slow link)")
    parser.add_argument("--timeout", type=float, default=DEFAULTS["timeout"],
                        help="seconds for the whole run (default 240)")
    parser.add_argument("--nice", type=int, default=DEFAULTS["nice"],
                        help="run the peers at this niceness (default -10, as root: other "
                             "work on a shared machine delays their wake-ups less; 0: as is)")
    parser.add_argument("--no-raw-tcp", dest="raw_tcp", action="store_false",
                        help="skip the plain TCP calibration of the slowest link (~5 s)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.scale <= 0 or args.numel < 1 or args.rounds < 1 or args.timeout <= 0:
        print("--scale, --numel, --rounds and --timeout must be positive", file=sys.stderr)
        return 2
    print(json.dumps(run_netlab(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
