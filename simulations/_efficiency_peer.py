"""One peer of ``simulations/bench_efficiency.py``, run inside a netlab host's network
namespace.

    python -m simulations._efficiency_peer --rank I --ip A.B.C.D [--initial-peer ADDR]
        --peers N --train-mode dedloc|diloco|solo [--codec fp16|uint4|topk|qtopk|...]
        [--delay-updates] --target N --batch B --lr LR [--bandwidth BYTES_S]
        [--eval-every S] [--eval-batches K] --run-id ID --timeout S

The task is the example's (``p2pdl.training.ExampleTask``, its default model of
446k parameters), the same initial parameters in every peer, each rank its own
batches.  The peer starts a ``p2pdl.Node`` listening on the host's address
(``{"event": "listening", "addr"}``), waits for a connection, makes a
``p2pdl.Optimizer`` of the given mode, codec and target (AdamW inside; no
bandwidth typed in unless ``--bandwidth``), joins the progress view with a
count of 0 and waits until it holds all ``--peers``: ``{"event": "ready"}``.

``--train-mode solo``: no node; the same loop with the plain AdamW (its
``epoch`` in events: the steps taken).

After the parent's ``go`` it trains (``loss.backward(); opt.step();
opt.zero_grad()``) until the parent says ``stop``.  Rank 0 measures the
held-out loss of its live model (the first ``--eval-batches`` held-out windows)
at ``go`` and every ``--eval-every`` seconds after: ``{"event": "eval",
"t", "loss", "epoch"}`` (``t`` from ``go``).  At ``stop``: ``{"event":
"result", "bytes_sent", "bytes_received", "rounds", ...}``: the bytes
its link (``eth0`` in ``/proc/net/dev``: everything the peer sent and
received, the DHT and matchmaking included) carried since ``go``, each round
it finished since (epoch, outcome, seconds, group size; each also sent as
``{"event": "round", ...}`` when it ends) and the optimizer's round
counters.  It then closes the optimizer and waits for a second ``stop`` (or
the end of stdin) before shutting its node down, so that no peer leaves
while another still needs it.  Every wait is bounded by ``--timeout``; on
error ``{"event": "fatal", "error"}``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from simulations import _harness as harness

COUNTERS = ("rounds", "averaged", "partial", "alone", "failed", "state_syncs",
            "state_sync_failures")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--ip", default="127.0.0.1", help="this host's address in the lab")
    parser.add_argument("--initial-peer", default=None)
    parser.add_argument("--peers", type=int, required=True)
    parser.add_argument("--train-mode", choices=("dedloc", "diloco", "solo"),
                        default="dedloc")
    parser.add_argument("--codec", default=None, help="the codec of large tensors")
    parser.add_argument("--delay-updates", action="store_true")
    parser.add_argument("--target", type=int, required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--bandwidth", type=float, default=None)
    parser.add_argument("--eval-every", type=float, default=5.0)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--run-id", default="bench-efficiency")
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    args.deadline = time.time() + args.timeout
    return args


def link_bytes(device: str = "eth0") -> tuple[int, int]:
    """(sent, received) bytes of ``device`` in this network namespace."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, data = line.partition(":")
            if name.strip() == device:
                fields = data.split()
                return int(fields[8]), int(fields[0])
    raise RuntimeError(f"no {device} in /proc/net/dev")


def left(args: argparse.Namespace, what: str) -> float:
    remaining = args.deadline - time.time()
    if remaining <= 0:
        raise TimeoutError(f"--timeout passed while {what}")
    return remaining


def stop_requested() -> bool:
    """Whether the parent said stop (or closed stdin), without waiting."""
    try:
        command = harness.read_command(0)
    except TimeoutError:
        return False
    return command is None or command["command"] == "stop"


def run(args: argparse.Namespace) -> None:
    import torch

    import p2pdl
    from p2pdl.averaging import AllReduceConfig, CodecPolicy
    from p2pdl.training import ExampleConfig, ExampleTask

    task = ExampleTask(ExampleConfig(batch_size=args.batch))
    torch.manual_seed(0)
    model = task.build_model()
    batches = task.batches(peer_index=args.rank)
    held_out = task.validation_windows(args.eval_batches)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if args.train_mode == "solo":
        train_solo(args, model, inner, batches, held_out)
        return
    initial = [args.initial_peer] if args.initial_peer else []
    node = p2pdl.Node(listen=[f"/ip4/{args.ip}/tcp/0"], initial_peers=initial,
                      start_timeout=min(60.0, left(args, "starting the node")))
    try:
        addr = next(a for a in node.addrs if a.startswith(f"/ip4/{args.ip}/"))
        harness.emit("listening", rank=args.rank, addr=addr)
        node.wait_for_peers(1, timeout=min(60.0, left(args, "waiting for a peer")))
        fields: dict[str, Any] = {}
        if args.codec:
            fields["allreduce"] = AllReduceConfig(codecs=CodecPolicy(large=args.codec))
        if args.bandwidth:
            fields["bandwidth"] = args.bandwidth
        opt = p2pdl.Optimizer(node=node, run_id=args.run_id, optimizer=inner,
                              target_batch_size=args.target, batch_size_per_step=args.batch,
                              mode=args.train_mode, delay_updates=args.delay_updates,
                              **fields)
        try:
            train(args, opt, model, batches, held_out, task)
        finally:
            opt.close()
        harness.wait_command("stop", left(args, "waiting for exit"))
    finally:
        node.shutdown()


def train_solo(args: argparse.Namespace, model: Any, inner: Any, batches: Any,
               held_out: list[Any]) -> None:
    """The same loop alone: the wrapped optimizer itself, no node."""
    harness.emit("ready", rank=args.rank)
    harness.wait_command("go", left(args, "waiting for go"))
    began = time.time()
    next_eval = began
    samples = steps = 0
    while not stop_requested():
        left(args, "training alone")
        next_eval = evaluate_when_due(args, model, held_out, began, next_eval, steps)
        model.loss(next(batches)).backward()
        inner.step()
        inner.zero_grad()
        samples += args.batch
        steps += 1
    harness.emit("result", rank=args.rank, seconds=time.time() - began, bytes_sent=0,
                 bytes_received=0, samples=samples, steps=steps, epoch=steps, counters={},
                 rounds=[])
    harness.wait_command("stop", left(args, "waiting for exit"))


def evaluate_when_due(args: argparse.Namespace, model: Any, held_out: list[Any],
                      began: float, due: float, epoch: int) -> float:
    """Rank 0, once ``due`` (a time): the held-out loss as an ``eval`` event
    (``t`` from ``began``); when the next one is due."""
    now = time.time()
    if args.rank != 0 or now < due:
        return due
    harness.emit("eval", rank=0, t=now - began, loss=evaluate(model, held_out), epoch=epoch)
    return now + args.eval_every


def evaluate(model: Any, held_out: list[Any]) -> float:
    import torch

    with torch.no_grad():
        return sum(float(model.loss(w)) for w in held_out) / len(held_out)


def train(args: argparse.Namespace, opt: Any, model: Any, batches: Any,
          held_out: list[Any], task: Any) -> None:
    opt.step(batch_size=0)
    while opt.global_progress().num_peers < args.peers:
        left(args, "waiting for every peer in the progress view")
        time.sleep(0.1)
        opt.step(batch_size=0)
    harness.emit("ready", rank=args.rank)
    harness.wait_command("go", left(args, "waiting for go"))
    began = time.time()
    sent0, received0 = link_bytes()
    stats0 = opt.statistics()
    next_eval = began
    samples = steps = 0
    last = opt.last_round
    rounds: list[dict[str, Any]] = []   # every round this peer finished since go
    while True:
        left(args, f"training at epoch {opt.local_epoch}")
        if stop_requested():
            break
        next_eval = evaluate_when_due(args, model, held_out, began, next_eval,
                                      opt.local_epoch)
        loss = model.loss(next(batches))
        loss.backward()
        opt.step()
        opt.zero_grad()
        samples += args.batch
        steps += 1
        info = opt.last_round
        if info is not None and info is not last:
            last = info
            rounds.append({"epoch": info.epoch, "outcome": info.outcome,
                           "seconds": info.seconds, "group_size": info.group_size})
            harness.emit("round", rank=args.rank, **rounds[-1], error=info.error)
    sent, received = link_bytes()
    stats = opt.statistics()
    harness.emit("result", rank=args.rank, seconds=time.time() - began,
                 bytes_sent=sent - sent0, bytes_received=received - received0,
                 samples=samples, steps=steps, epoch=opt.local_epoch,
                 counters={k: stats[k] - stats0[k] for k in COUNTERS}, rounds=rounds)


def main() -> None:
    args = parse_args()
    harness.peer_process(args.rank)
    with harness.reporting(rank=args.rank):
        run(args)


if __name__ == "__main__":
    main()
