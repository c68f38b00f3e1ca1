"""Volunteers leave: a swarm trained through kills and replacements, against the
same swarm without churn, side by side.  One JSON.

    python simulations/bench_churn.py [--peers 6] [--churn 0,0.3,0.6]
        [--kill-seconds 60] [--window 30] [--settle-epochs 5] [--load 0]
        [--seed 0] [--timeout 900]

Each run is :func:`p2pdl.testing.churn_run` (p2pdl/testing/_churn.py):
``--peers`` (6) sync nodes on loopback, in this process, train a small MLP
(16 -> 32 -> 1) on a regression task with :class:`p2pdl.Optimizer` (DeDLOC
mode, AdamW, a target batch of 96 samples, 16 per step).  A churn of ``f``
kills ``f x peers`` peers per ``--window`` (30) seconds for
``--kill-seconds`` (60) -- at 0.3, 4 kills; at 0.6, 7 -- each replaced at
once by a fresh volunteer (a new identity and a model of its own random
initialisation); the kinds of kill go in turn mid-round (as soon as an
all-reduce of the victim runs), plain, mid-round, and while the victim
serves its state to a joiner: half of them mid-round.  The first peer is
never killed.  After the last kill every peer trains ``--settle-epochs`` (5)
more epochs and stops at the same epoch.

Keys, per churn level (``runs``), with their goals:

* ``loss_ratio_vs_no_churn``: the first peer's held-out MSE at the highest
  epoch every run reached, over the run without churn's at that epoch (goal
  <= 1.10 at 0.3, <= 1.25 at 0.6); the run without churn goes last and
  trains as far as the furthest run with churn;
* ``distinct_states_at_end``: parameter states among the live peers at the
  end (a peer that did not reach the end epoch counts as one more; goal 1);
* ``join_catch_up_s``: p50 and max, seconds from a replacement's start to
  its first state download or merge (goal max <= 20);
* ``joiners_on_own_parameters``: replacements that reached an epoch of the
  swarm's without a download (goal 0);
* ``seconds_without_an_averaged_round_after_a_kill``: p50 and max, from each
  kill to the first peer's next averaged round;
* ``rounds``: every peer's rounds by outcome (averaged, partial, alone,
  failed), and ``state``: state syncs, merges, repairs, consistency checks,
  batches dropped as stale, and the all-reduce's parts lost
  (``parts_failed``), dropped after the post-round exchange
  (``parts_dropped``) and disputed (``parts_disputed``).

``--load N`` runs N busy processes beside the swarm for the whole
benchmark (the machine loaded); ``load`` in the JSON says how many.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from p2pdl.testing._churn import ChurnConfig, ChurnOutcome, churn_run  # noqa: E402

KINDS = ("mid_round", "plain", "mid_round", "download")


def _busy() -> None:   # pragma: no cover - a load process
    while True:
        pass


def kills_for(churn: float, peers: int, kill_seconds: float, window: float) -> int:
    return round(churn * peers * kill_seconds / window)


def run(args: argparse.Namespace) -> dict[str, Any]:
    # The runs with churn first; then the run without, trained as far as the
    # furthest of them, so that every run's loss is known at a common epoch.
    levels = sorted({float(x) for x in args.churn.split(",")} - {0.0}) + [0.0]
    outcomes: dict[float, ChurnOutcome] = {}
    started = time.monotonic()
    for level in levels:
        kills = kills_for(level, args.peers, args.kill_seconds, args.window)
        every = args.kill_seconds / kills if kills else args.kill_seconds
        remaining = args.timeout - (time.monotonic() - started)
        furthest = max((o.end_epoch for o in outcomes.values()), default=0)
        config = ChurnConfig(peers=args.peers, kills=kills, kill_every=every,
                             first_kill=min(6.0, every), kinds=KINDS,
                             settle_epochs=args.settle_epochs,
                             min_epochs=max(args.min_epochs, furthest),
                             seconds=max(60.0, remaining - 30), seed=args.seed)
        outcomes[level] = churn_run(config)
    common = min(max(o.losses, default=0) for o in outcomes.values())
    base = outcomes[0.0]
    runs = []
    for level, outcome in sorted(outcomes.items()):
        summary = outcome.summary()
        mine, theirs = outcome.losses.get(common), base.losses.get(common)
        ratio = None if mine is None or not theirs else round(mine / theirs, 4)
        runs.append({"churn": level, "loss_ratio_vs_no_churn": ratio,
                     "loss_at_common_epoch": mine, **summary})
    return {"benchmark": "churn", "peers": args.peers, "load": args.load,
            "common_epoch": common, "kill_seconds": args.kill_seconds,
            "window": args.window, "runs": runs,
            "seconds": round(time.monotonic() - started, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", type=int, default=6)
    parser.add_argument("--churn", default="0,0.3,0.6",
                        help="fractions of the peers killed per window, comma-separated")
    parser.add_argument("--kill-seconds", type=float, default=60.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--settle-epochs", type=int, default=5)
    parser.add_argument("--min-epochs", type=int, default=10)
    parser.add_argument("--load", type=int, default=0, help="busy processes beside the swarm")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.peers < 2 or args.load < 0 or not math.isfinite(args.timeout) \
            or args.kill_seconds <= 0 or args.window <= 0:
        parser.error("--peers must be at least 2; --load at least 0; times positive")
    try:
        levels = [float(x) for x in args.churn.split(",")]
    except ValueError:
        parser.error("--churn takes comma-separated fractions, e.g. 0,0.3,0.6")
    if any(not 0 <= x <= 10 for x in levels):
        parser.error("--churn fractions must be in 0..10")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(relativeCreated)9.0f %(name)s %(message)s")
    load = [multiprocessing.Process(target=_busy, daemon=True) for _ in range(args.load)]
    for process in load:
        process.start()
    try:
        result = run(args)
    finally:
        for process in load:
            process.terminate()
            process.join(5)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
