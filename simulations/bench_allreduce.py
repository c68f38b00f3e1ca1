"""All-reduce of a model's worth of parameters: p2pdl, hivemind 1.1.12 and torch.distributed gloo,
side by side, in one run, on loopback.

    python simulations/bench_allreduce.py [--systems p2pdl,hivemind,gloo] [--peers 2,4,8]
        [--codecs none,fp16] [--rounds 5] [--numel 10000000] [--timeout 300]
    python simulations/bench_allreduce.py --netlab [options of simulations/_allreduce_netlab.py]

``--netlab`` (as root) measures the LP load plan against equal shares under the
DeDLOC bandwidth tiers in the emulated internet instead; see
simulations/_allreduce_netlab.py.

For every system, peer count N and codec, N worker processes (one per peer;
hivemind's each with its Go daemon) compute the weighted mean of their
tensors: ``--numel`` float32 values in 13 uneven tensors, peer i's drawn from
a generator seeded by (round, i), weight ``1 + i``
(simulations/_allreduce_common.py).  One untimed warm-up round, then
``--rounds`` timed ones.  Process start-up, connection set-up and the
warm-up are not timed.

Time.  Before each round every worker prepares its inputs (and the truth),
then says ``ready``; when all N have, the parent notes ``time.time()`` and
releases them all (the barrier).  A round's time is the latest peer's
``t_end`` (when it holds its averaged tensors) minus that release.  No
worker does any other work until all N are done (a second barrier), so
checking and the next round's data never steal CPU from a peer still
averaging.

Correct.  Each worker compares its result with the true weighted mean and
reports the largest absolute error; a round is correct when all N peers'
errors are within tolerance: ``1e-5·max|x|`` for codec none,
``max(4, N)·2^-11·max|x|`` for fp16 (``max|x|``: the largest input
magnitude of the round; see _allreduce_common.py).

Prints a JSON list of rows ``{system, peers, codec, numel, median_s, min_s,
max_s, round_s, rounds, correct_rounds, max_err, tol, cpu_s_median,
cpu_s_per_gib, note}``; a system that cannot run gets ``median_s: null`` and
its ``note`` says why.  ``cpu_s_median``: the median over rounds of the CPU-seconds
the N workers' processes spent in a round, summed (null where the workers do
not say: hivemind's daemons run outside them); ``cpu_s_per_gib`` that over
the GiB of float32 input the N peers averaged (``N * numel * 4`` bytes).

Parent <-> worker protocol (the same for every system)
-------------------------------------------------------

Events and commands of simulations/_harness.py (JSON lines: events on the
worker's stdout, commands on its stdin; stderr goes to a log file).  The
parent runs, from the repository root, each worker in a process group of its
own (hivemind's daemons with it)::

    <python> -m simulations._<system>_allreduce --rank I --peers N --rounds R \
        --codec none|fp16 --numel M --timeout S

``I`` in 0..N-1; ``R`` timed rounds, so the worker runs rounds 0 (warm-up)
to R; ``S`` the seconds left for the whole run (every wait of the worker
ends then; the parent kills the process groups at its own deadline anyway).
First the workers exchange what a system needs (addresses, a port) through
the parent: ``Worker.exchange(info)`` sends ``{"event": "address", "info":
...}`` and returns every worker's info, in rank order, from the parent's
``peers`` command.  Then for each round r:

1. ``{"event": "ready", "round": r, "rank": I}`` -- inputs ready (connections
   too, for r = 0).  The worker then waits for the command ``go``.
2. ``{"event": "done", "round": r, "rank": I, "t_start": t0, "t_end": t1,
   "error": null | "why"}`` (optionally ``"note": "..."``, copied into the
   row's note, and ``"cpu_s": c``, the CPU-seconds of the worker's process
   in the round) -- ``time.time()`` at the go and when the averaged tensors
   are in hand.  The worker then waits for ``next`` (all N are done).
3. ``{"event": "result", "round": r, "rank": I, "max_err": e | null,
   "tol": tol, "ok": bool}`` -- the check against the truth.

A fatal error: ``{"event": "fatal", "rank": I, "error": "why"}`` and exit.
``stop`` or the end of stdin means stop.  ``simulations._allreduce_common.Worker``
implements the worker's side (``exchange``, ``prepare``, ``ready``, ``done``,
``check``; ``exchange``, ``ready`` and ``done`` block on stdin: async workers
call them from a thread so the event loop keeps serving peers); see
_gloo_allreduce.py for the smallest worker.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from simulations._baselines import HIVEMIND_VERSION, hivemind_python  # noqa: E402
from simulations._harness import RunFailed, Supervisor  # noqa: E402

SYSTEMS = ("p2pdl", "hivemind", "gloo")
EXIT_GRACE = 10.0  # seconds workers get to exit by themselves after the last round


def run_workers(command: list[str], peers: int, codec: str, rounds: int, numel: int,
                timeout: float, log_dir: Path, env: dict[str, str] | None = None
                ) -> dict[str, Any]:
    """Run one system's workers through the protocol; the row's measured fields."""
    log_dir.mkdir(parents=True, exist_ok=True)
    round_s: list[float] = []
    cpu_s: list[float] = []   # per round, the peers' CPU-seconds summed (where they say)
    correct = 0
    max_err: float | None = 0.0
    tol = 0.0
    errors: list[str] = []
    notes: list[str] = []
    try:
        with Supervisor(log_dir=log_dir, timeout=timeout, exit_grace=EXIT_GRACE) as workers:
            for rank in range(peers):
                workers.start([*command, "--rank", str(rank), "--peers", str(peers),
                               "--rounds", str(rounds), "--codec", codec, "--numel", str(numel),
                               "--timeout", f"{timeout:.0f}"], env=env)
            workers.exchange()
            for r in range(rounds + 1):
                workers.wait_all("ready", round=r)
                released = workers.send("go")
                done = workers.wait_all("done", round=r)
                workers.send("next")
                results = workers.wait_all("result", round=r)
                if r == 0:
                    continue  # the warm-up
                round_s.append(max(d["t_end"] for d in done.values()) - released)
                if all(d.get("cpu_s") is not None for d in done.values()):
                    cpu_s.append(sum(d["cpu_s"] for d in done.values()))
                errors += [f"round {r} rank {i}: {d['error']}" for i, d in sorted(done.items())
                           if d.get("error")]
                notes += [f"round {r} rank {i}: {d['note']}" for i, d in sorted(done.items())
                          if d.get("note")]
                ok = all(res["ok"] and not done[i].get("error") for i, res in results.items())
                correct += ok
                errs = [res["max_err"] for res in results.values()]
                max_err = None if max_err is None or None in errs else max(max_err, *errs)
                tol = max(tol, *(res["tol"] for res in results.values()))
                print(f"bench:   round {r}: {round_s[-1]:.3f} s, "
                      f"{'correct' if ok else 'WRONG'} (max err "
                      f"{max(e or 0.0 for e in errs):.3g}"
                      f"{', a peer failed' if None in errs else ''}, tol {tol:.3g})",
                      file=sys.stderr)
    except RunFailed as exc:
        note = f"{exc} (logs: {log_dir})"
        return {"round_s": round_s, "correct_rounds": correct, "max_err": max_err, "tol": tol,
                "failed": note, "errors": errors[:5], "notes": notes[:5]}
    out: dict[str, Any] = {"round_s": round_s, "correct_rounds": correct, "max_err": max_err,
                           "tol": tol}
    if cpu_s:
        out["cpu_s"] = cpu_s
    out["errors"], out["notes"] = errors[:5], notes[:5]
    return out


def row(system: str, peers: int, codec: str, numel: int, run: dict[str, Any] | None,
        note: str) -> dict[str, Any]:
    times = run["round_s"] if run else []
    out: dict[str, Any] = {
        "system": system, "peers": peers, "codec": codec, "numel": numel,
        "median_s": round(statistics.median(times), 4) if times and not (run or {}).get("failed")
        else None,
        "min_s": round(min(times), 4) if times else None,
        "max_s": round(max(times), 4) if times else None,
        "round_s": [round(t, 4) for t in times],
        "rounds": len(times),
        "correct_rounds": run["correct_rounds"] if run else 0,
        "max_err": run["max_err"] if run else None,
        "tol": run["tol"] if run else None,
    }
    cpu = (run or {}).get("cpu_s")
    out["cpu_s_median"] = round(statistics.median(cpu), 4) if cpu else None
    out["cpu_s_per_gib"] = round(statistics.median(cpu) / (peers * numel * 4 / 2**30), 4) \
        if cpu else None
    notes = [note] if note else []
    if run and run.get("failed"):
        notes.append(f"failed: {run['failed']}")
    if run and run.get("errors"):
        notes.append("round errors: " + "; ".join(run["errors"]))
    if run and run.get("notes"):
        notes.append("workers said: " + "; ".join(run["notes"]))
    out["note"] = "; ".join(notes)
    return out


# ---------------------------------------------------------------- the three systems

def run_p2pdl(peers: int, codec: str, rounds: int, numel: int, timeout: float,
              log_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """p2pdl's all-reduce: workers ``python -m simulations._p2pdl_allreduce`` in p2pdl's
    environment (this interpreter), speaking the protocol above.  Whatever they time
    between the go and the averaged tensors is the row's time."""
    if not (HERE / "_p2pdl_allreduce.py").exists():
        return None, "simulations/_p2pdl_allreduce.py does not exist yet"
    run = run_workers([sys.executable, "-m", "simulations._p2pdl_allreduce"], peers, codec,
                      rounds, numel, timeout, log_dir)
    return run, "p2pdl all-reduce (simulations/_p2pdl_allreduce.py)"


def run_hivemind(peers: int, codec: str, rounds: int, numel: int, timeout: float,
                 log_dir: Path) -> tuple[dict[str, Any] | None, str]:
    python, why = hivemind_python()
    if python is None:
        return None, why
    run = run_workers([str(python), "-m", "simulations._hivemind_allreduce"], peers, codec,
                      rounds, numel, timeout, log_dir)
    return run, (f"hivemind {HIVEMIND_VERSION} AllReduceRunner (butterfly, part_size 512 KiB, "
                 f"{'Float16Compression' if codec == 'fp16' else 'NoCompression'}) for the fixed "
                 f"group of all peers, equal peer_fractions, no matchmaking; timed: iterating "
                 f"the runner and adding its deltas, as DecentralizedAverager does once a "
                 f"group is formed")


def run_gloo(peers: int, codec: str, rounds: int, numel: int, timeout: float,
             log_dir: Path) -> tuple[dict[str, Any] | None, str]:
    run = run_workers([sys.executable, "-m", "simulations._gloo_allreduce"], peers, codec,
                      rounds, numel, timeout, log_dir, env={"GLOO_SOCKET_IFNAME": "lo"})
    import torch

    return run, (f"torch {torch.__version__} gloo all_reduce(SUM) of one flat "
                 f"{'float16' if codec == 'fp16' else 'float32'} buffer pre-scaled by "
                 f"w_i/sum(w); timed: flatten + cast + all_reduce + cast back + split")


RUNNERS = {"p2pdl": run_p2pdl, "hivemind": run_hivemind, "gloo": run_gloo}


def main() -> None:
    if "--netlab" in sys.argv[1:]:  # the load plan under bandwidth caps, as root
        from simulations._allreduce_netlab import main as netlab_main

        sys.exit(netlab_main([a for a in sys.argv[1:] if a != "--netlab"]))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help="comma-separated, of p2pdl, hivemind, gloo (default: all)")
    parser.add_argument("--peers", default="2,4,8", help="peer counts (default 2,4,8)")
    parser.add_argument("--codecs", default="none,fp16", help="of none, fp16 (default both)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--numel", type=int, default=10_000_000,
                        help="float32 values per peer (default 10M)")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds for one system's run at one N and codec, start-up "
                             "included (default 300)")
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    codecs = [c for c in args.codecs.split(",") if c]
    try:
        peer_counts = [int(p) for p in args.peers.split(",") if p]
    except ValueError:
        parser.error("--peers takes comma-separated integers")
    if not systems or any(s not in SYSTEMS for s in systems):
        parser.error(f"--systems: choose from {','.join(SYSTEMS)}")
    if not codecs or any(c not in ("none", "fp16") for c in codecs):
        parser.error("--codecs: choose from none,fp16")
    if not peer_counts or any(p < 2 for p in peer_counts):
        parser.error("--peers: each at least 2")
    if args.rounds < 1 or args.numel < 1 or args.timeout <= 0:
        parser.error("--rounds, --numel and --timeout must be positive")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_root = Path(tempfile.gettempdir()) / f"p2pdl-bench-allreduce-{stamp}"
    print(f"bench: logs in {log_root}", file=sys.stderr)
    rows = []
    for peers in peer_counts:
        for codec in codecs:
            for system in systems:
                print(f"bench: {system}, {peers} peers, codec {codec}", file=sys.stderr)
                began = time.time()
                run, note = RUNNERS[system](peers, codec, args.rounds, args.numel, args.timeout,
                                            log_root / f"{system}-{peers}-{codec}")
                rows.append(row(system, peers, codec, args.numel, run, note))
                print(f"bench:   median {rows[-1]['median_s']} s, "
                      f"{rows[-1]['correct_rounds']}/{args.rounds} correct "
                      f"({time.time() - began:.0f} s)", file=sys.stderr)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
