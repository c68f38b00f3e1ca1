"""What run membership costs, and what an admitted attacker gets: three measurements, one JSON.

    python simulations/bench_membership.py [--handshakes 200] [--rounds 10]
        [--numel 10000000] [--peers 4] [--epochs 6] [--skip handshake,rounds,loss]
        [--timeout 600]

1. **Handshake** (``handshake_ms_p50``, ``handshake_ms_p99``): two nodes in
   this process (trio), both members of one certificate run.  ``--handshakes``
   times (after 5 untimed ones) the first node drops its connection to the
   second, dials it again (``connect``: TCP + Noise + Yamux, timed as
   ``connect_ms_*``) and then shows its certificate on the fresh connection
   (``node.membership.introduce``: one request of protocols/membership.md
   each way's certificate checked; timed as ``handshake_ms_*``).  That
   introduction is what membership adds to every new connection of a run.
2. **Round overhead** (``round_overhead_fraction``): ``--peers`` (4) worker
   processes, one node each (simulations/_membership_peer.py), every node a
   member of two runs at once: an open one and a certificate run.  Rounds
   alternate between them (open, certificate, certificate, open, open, ...:
   neither always goes first) over the same
   processes, nodes and connections: an all-reduce of ``--numel`` (10M)
   float32 values in a fixed group of all peers, released together by the
   parent (the barrier of bench_allreduce.py); a round's time is the latest
   peer's end minus the release.  Two warm-up rounds (one per run: the
   certificates are exchanged then) are not counted, then ``--rounds`` of
   each.  ``round_overhead_fraction`` = median(certificate) / median(open) - 1
   (goal <= 0.02); the raw rounds are in ``open_round_s`` / ``closed_round_s``.
3. **Honest loss** (``honest_loss_ratio``): the example task (a small model)
   trained by 4 sync nodes on loopback in this process, one thread each
   (``p2pdl.testing.train_swarm``), all members of a certificate run: first
   4 honest peers, then 2 honest peers with a ``WeightInflater`` and an
   ``EpochLiar`` (p2pdl.testing), each until the honest peers reach
   ``--epochs``.  ``honest_loss_ratio`` = the honest peers' held-out loss in
   the attacked run over the honest run's at the same epoch (goal <= 1.05);
   ``flags_seen`` lists what the honest peers flagged, ``honest_identical``
   whether the honest peers ended bit-identical.  ``attack_rounds`` gives,
   per attacker, the epochs in which its attack reached the honest peers
   (``SwarmOutcome.attack_rounds``: the inflater's inflated rounds with an
   honest peer, the liar's claimed epochs once flagged); an attacker with
   none is listed in ``unmounted`` and the ratio is null (a note says why).

Context keys: ``peers``, ``numel``, ``rounds``, ``handshakes``, the medians,
``epochs``, the losses, ``untrained_loss``, ``seconds`` per part.  A part that
fails has its keys null and a ``notes`` entry.  Children's logs go to a
temporary directory (printed on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulations._harness import Supervisor  # noqa: E402

RUN = "bench-membership"
PARTS = ("handshake", "rounds", "loss")


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# ---------------------------------------------------------------- 1. the handshake

def measure_handshakes(count: int, warmup: int = 5) -> dict[str, Any]:
    import trio
    from libp2p.crypto.ed25519 import create_new_key_pair
    from libp2p.peer.id import ID

    import p2pdl
    from p2pdl.testing import loopback_config, wait_until

    authority = p2pdl.Authority.generate()
    keys = [create_new_key_pair() for _ in range(2)]
    policies = [p2pdl.CertificateRun(RUN, authority.id, authority.issue(
        RUN, ID.from_pubkey(k.public_key), p2pdl.Role.TRAINER, expires_in=86400))
        for k in keys]
    connect_ms: list[float] = []
    handshake_ms: list[float] = []
    counted: list[int] = []

    async def main() -> None:
        async with p2pdl.open_node(loopback_config(), key_pair=keys[0], runs=[policies[0]]) as a, \
                p2pdl.open_node(loopback_config(), key_pair=keys[1], runs=[policies[1]]) as b:
            address = f"{b.addrs[0]}"
            for i in range(warmup + count):
                for _ in range(4):  # bounded: a connection may be redialled meanwhile
                    if not (a.host.is_connected(b.peer_id) or b.host.is_connected(a.peer_id)):
                        break
                    await a.host.libp2p.disconnect(b.peer_id)
                    await b.host.libp2p.disconnect(a.peer_id)
                    try:
                        await wait_until(lambda: not a.host.is_connected(b.peer_id)
                                         and not b.host.is_connected(a.peer_id), timeout=5)
                    except trio.TooSlowError:
                        continue
                else:
                    raise RuntimeError("the two nodes would not disconnect")
                sent = a.membership.statistics().handshakes_sent
                t0 = time.perf_counter()
                await a.connect(address)
                t1 = time.perf_counter()
                await a.membership.introduce(b.peer_id, RUN)
                t2 = time.perf_counter()
                if not a.membership.is_member(b.peer_id, RUN):
                    raise RuntimeError("the introduction did not admit the peer")
                if i >= warmup:
                    connect_ms.append((t1 - t0) * 1e3)
                    handshake_ms.append((t2 - t1) * 1e3)
                    counted.append(a.membership.statistics().handshakes_sent - sent)

    trio.run(main)
    if any(c != 1 for c in counted):
        raise RuntimeError(f"expected one handshake per fresh connection, got {counted[:10]}")
    return {"handshake_ms_p50": round(percentile(handshake_ms, 0.5), 3),
            "handshake_ms_p99": round(percentile(handshake_ms, 0.99), 3),
            "connect_ms_p50": round(percentile(connect_ms, 0.5), 3),
            "connect_ms_p99": round(percentile(connect_ms, 0.99), 3),
            "handshakes": count}


# ---------------------------------------------------------------- 2. round overhead

def measure_rounds(peers: int, rounds: int, numel: int, timeout: float,
                   log_dir: Path) -> dict[str, Any]:
    from libp2p.peer.id import ID

    import p2pdl
    from p2pdl.net import load_or_create_identity

    log_dir.mkdir(parents=True, exist_ok=True)
    authority = p2pdl.Authority.generate()
    argv = []
    for rank in range(peers):
        identity = log_dir / f"identity-{rank}.key"
        key = load_or_create_identity(str(identity))
        cert = log_dir / f"peer-{rank}.cert"
        authority.issue("bench-closed", ID.from_pubkey(key.public_key), p2pdl.Role.TRAINER,
                        expires_in=86400).save(cert)
        argv.append([sys.executable, "-m", "simulations._membership_peer", "--rank", str(rank),
                     "--peers", str(peers), "--rounds", str(2 * rounds), "--numel", str(numel),
                     "--identity", str(identity), "--authority", authority.id,
                     "--certificate", str(cert), "--timeout", f"{timeout:.0f}"])
    times: dict[str, list[float]] = {"bench-open": [], "bench-closed": []}
    errors: list[str] = []
    handshakes: list[Any] = []
    with Supervisor(name="membership", log_dir=log_dir, timeout=timeout, exit_grace=10) as sup:
        for command in argv:
            sup.start(command)
        sup.exchange()
        for r in range(2 * rounds + 2):
            sup.wait_all("ready", round=r)
            released = sup.send("go")
            done = sup.wait_all("done", round=r)
            sup.send("next")
            errors += [f"round {r} rank {i}: {d['error']}" for i, d in sorted(done.items())
                       if d.get("error")]
            took = max(d["t_end"] for d in done.values()) - released
            run = next(iter(done.values()))["run"]
            print(f"bench:   round {r} ({run}): {took:.3f} s", file=sys.stderr)
            if r >= 2:
                times[run].append(took)
        stats = sup.wait_all("membership")
        handshakes = [stats[i].get("handshakes_sent") for i in sorted(stats)]
    open_median = statistics.median(times["bench-open"])
    closed_median = statistics.median(times["bench-closed"])
    return {"round_overhead_fraction": round(closed_median / open_median - 1, 4),
            "open_round_s_median": round(open_median, 4),
            "closed_round_s_median": round(closed_median, 4),
            "open_round_s": [round(t, 4) for t in times["bench-open"]],
            "closed_round_s": [round(t, 4) for t in times["bench-closed"]],
            "peers": peers, "numel": numel, "rounds": rounds,
            "handshakes_sent_per_peer": handshakes, "round_errors": errors[:5]}


# ---------------------------------------------------------------- 3. honest loss

def measure_loss(epochs: int, seconds: float) -> dict[str, Any]:
    import torch

    import p2pdl
    from p2pdl.averaging import AllReduceConfig
    from p2pdl.testing import train_swarm
    from p2pdl.training import ExampleConfig, ExampleTask

    torch.set_num_threads(1)
    small = ExampleConfig(context_length=32, d_model=32, n_layers=1, n_heads=2, batch_size=8)
    task = ExampleTask(small)
    allreduce = AllReduceConfig()   # the defaults: evidence rides on ar.begin

    def runner(run_id: str):  # noqa: ANN202
        return lambda node, model: p2pdl.Optimizer(
            node=node, run_id=run_id, optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
            target_batch_size=64, batch_size_per_step=small.batch_size, matchmaking_time=8.0,
            allreduce=allreduce)

    honest = train_swarm(task, ["honest"] * 4, "bench-honest", epochs=epochs,
                         certificates=True, make_optimizer=runner("bench-honest"),
                         seconds=seconds)
    attacked = train_swarm(task, ["honest", "honest", "inflater", "liar"], "bench-attacked",
                           epochs=epochs, certificates=True,
                           make_optimizer=runner("bench-attacked"), seconds=seconds)
    honest_loss = honest.losses[0]
    attacked_loss = statistics.mean(attacked.losses[i] for i in attacked.honest())
    flags: dict[str, dict[str, int]] = {}
    attack_rounds: dict[str, list[int]] = {}
    for role in ("inflater", "liar"):
        flags[role] = attacked.flags_on(attacked.of(role))
        attack_rounds[role] = attacked.attack_rounds(attacked.of(role))
    return {"honest_loss_ratio": round(attacked_loss / honest_loss, 4),
            "honest_run_loss": round(honest_loss, 4),
            "attacked_run_honest_loss": round(attacked_loss, 4),
            "untrained_loss": round(task.validation_loss(task.build_model()), 4),
            "epochs": epochs, "honest_identical": attacked.identical(),
            "honest_run_identical": honest.identical(),
            "attacked_epochs": attacked.epochs, "flags_seen": flags,
            "attack_rounds": attack_rounds, "unmounted": attacked.unmounted(),
            "weights_capped": [attacked.allreduce[i]["weights_capped"]
                               for i in attacked.honest()],
            "inflated_steps": attacked.stats[attacked.of("inflater")]["inflated_steps"],
            "loss_seconds": round(honest.seconds + attacked.seconds, 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handshakes", type=int, default=200,
                        help="fresh connections timed (default 200)")
    parser.add_argument("--rounds", type=int, default=10,
                        help="timed rounds of each run, open and certificate (default 10)")
    parser.add_argument("--numel", type=int, default=10_000_000,
                        help="float32 values averaged per round (default 10M)")
    parser.add_argument("--peers", type=int, default=4, help="round-overhead peers (default 4)")
    parser.add_argument("--epochs", type=int, default=6,
                        help="epochs of the honest-loss runs (default 6)")
    parser.add_argument("--skip", default="", help=f"comma-separated parts of {','.join(PARTS)}")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds for the round-overhead part, start-up included (600)")
    args = parser.parse_args(argv)
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(PARTS):
        parser.error(f"--skip: choose from {','.join(PARTS)}")
    if min(args.handshakes, args.rounds, args.numel, args.epochs) < 1 or args.peers < 2:
        parser.error("--handshakes, --rounds, --numel, --epochs must be >= 1, --peers >= 2")
    log_dir = Path(tempfile.mkdtemp(prefix="p2pdl-bench-membership-"))
    print(f"bench: logs in {log_dir}", file=sys.stderr)
    out: dict[str, Any] = {"handshake_ms_p50": None, "handshake_ms_p99": None,
                           "round_overhead_fraction": None, "honest_loss_ratio": None}
    notes: list[str] = []
    seconds: dict[str, float] = {}
    parts = [("handshake", lambda: measure_handshakes(args.handshakes)),
             ("rounds", lambda: measure_rounds(args.peers, args.rounds, args.numel,
                                               args.timeout, log_dir / "rounds")),
             ("loss", lambda: measure_loss(args.epochs, seconds=300.0))]
    for name, part in parts:
        if name in skip:
            continue
        print(f"bench: {name}", file=sys.stderr)
        began = time.monotonic()
        try:
            out.update(part())
        except Exception as exc:  # noqa: BLE001 -- a part that fails is a note, not a crash
            notes.append(f"{name} failed: {type(exc).__name__}: {exc}")
        if name == "loss" and out.get("unmounted"):
            # An attack that never reached the honest peers measured nothing.
            notes.append(f"loss: the attack of {', '.join(out['unmounted'])} reached no "
                         f"honest peer (attack_rounds {out['attack_rounds']}); "
                         f"honest_loss_ratio is not a measurement")
            out["honest_loss_ratio"] = None
        seconds[name] = round(time.monotonic() - began, 1)
    out["seconds"] = seconds
    out["notes"] = notes
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
