"""hivemind 1.1.12's side of ``simulations/bench_efficiency.py``: one peer, run
with hivemind's own interpreter (simulations/_baselines.py) inside a netlab
host's network namespace, from the repository root:

    <hivemind venv>/bin/python -m simulations._hivemind_efficiency_peer --rank I \
        --ip A.B.C.D [--initial-peer MADDR] --peers N [--local-updates] --target N \
        --batch B --lr LR [--eval-every S] [--eval-batches K] --run-id ID --timeout S

The same task, initial parameters, batches, held-out windows and loop as
``simulations/_efficiency_peer.py``, and the same events to the parent
(``listening``, ``ready``, ``eval`` from rank 0, ``result``); only the
optimizer differs (and before ``ready`` each peer reports one sample to
hivemind's progress tracker, which lists a peer only once it has samples;
no step is taken): ``hivemind.Optimizer`` over a ``hivemind.DHT`` listening
on the host's address (TCP, its Go daemon a child of this process), wrapping
the same ``torch.optim.AdamW``, with ``batch_size_per_step=--batch`` and
``target_batch_size=--target``.  The settings are hivemind's quickstart's
(``matchmaking_time=3.0``, ``averaging_timeout=10.0``) with fp16 on the
wire (``grad_compression`` and ``state_averaging_compression``
``Float16Compression()``: what DeDLOC sent), and hivemind's defaults
otherwise.  Without ``--local-updates`` the swarm averages gradients and
takes one AdamW step per epoch (DeDLOC's method); with it
(``use_local_updates=True``, the quickstart's mode) every peer steps on its
own gradients and the swarm averages parameters once per epoch.

p2pdl's example task (p2pdl/training/_example.py) uses torch and the
standard library only; it is loaded without p2pdl's package ``__init__``
(whose dependencies hivemind's environment lacks).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
import types
from pathlib import Path
from typing import Any

from simulations import _harness as harness
from simulations._efficiency_peer import (
    evaluate_when_due,
    left,
    link_bytes,
    stop_requested,
)

ROOT = Path(__file__).resolve().parents[1]
#: hivemind's quickstart's matchmaking time and averaging timeout (seconds)
MATCHMAKING_TIME = 3.0
AVERAGING_TIMEOUT = 10.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--ip", default="127.0.0.1", help="this host's address in the lab")
    parser.add_argument("--initial-peer", default=None)
    parser.add_argument("--peers", type=int, required=True)
    parser.add_argument("--local-updates", action="store_true")
    parser.add_argument("--target", type=int, required=True)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-every", type=float, default=5.0)
    parser.add_argument("--eval-batches", type=int, default=8)
    parser.add_argument("--run-id", default="bench-efficiency-hivemind")
    parser.add_argument("--timeout", type=float, required=True)
    args = parser.parse_args(argv)
    args.deadline = time.time() + args.timeout
    return args


def example_module() -> types.ModuleType:
    """``p2pdl.training._example``, its packages stood in for by empty ones."""
    for name, path in (("p2pdl", ROOT / "p2pdl"), ("p2pdl.training", ROOT / "p2pdl" / "training")):
        if name not in sys.modules:
            package = types.ModuleType(name)
            package.__path__ = [str(path)]
            sys.modules[name] = package
    return importlib.import_module("p2pdl.training._example")


def run(args: argparse.Namespace) -> None:
    import hivemind
    import torch
    from hivemind.compression import Float16Compression

    example = example_module()
    task = example.ExampleTask(example.ExampleConfig(batch_size=args.batch))
    torch.manual_seed(0)
    model = task.build_model()
    batches = task.batches(peer_index=args.rank)
    held_out = task.validation_windows(args.eval_batches)
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    initial = [args.initial_peer] if args.initial_peer else []
    dht = hivemind.DHT(start=True, host_maddrs=[f"/ip4/{args.ip}/tcp/0"],
                       initial_peers=initial)
    try:
        addr = next(str(a) for a in dht.get_visible_maddrs()
                    if str(a).startswith(f"/ip4/{args.ip}/"))
        harness.emit("listening", rank=args.rank, addr=addr)
        opt = hivemind.Optimizer(
            dht=dht, run_id=args.run_id, optimizer=inner, batch_size_per_step=args.batch,
            target_batch_size=args.target, use_local_updates=args.local_updates,
            matchmaking_time=MATCHMAKING_TIME, averaging_timeout=AVERAGING_TIMEOUT,
            grad_compression=Float16Compression(),
            state_averaging_compression=Float16Compression(), verbose=False)
        try:
            train(args, opt, model, batches, held_out)
        finally:
            opt.shutdown()
        harness.wait_command("stop", left(args, "waiting for exit"))
    finally:
        dht.shutdown()


def train(args: argparse.Namespace, opt: Any, model: Any, batches: Any,
          held_out: list[Any]) -> None:
    # hivemind's tracker publishes a peer's progress only once it has samples:
    # one sample each is reported (no step taken), so that every peer shows.
    opt.tracker.report_local_progress(opt.local_epoch, samples_accumulated=1)
    while opt.tracker.global_progress.num_peers < args.peers:
        left(args, "waiting for every peer in hivemind's progress tracker")
        time.sleep(0.2)
    harness.emit("ready", rank=args.rank)
    harness.wait_command("go", left(args, "waiting for go"))
    began = time.time()
    sent0, received0 = link_bytes()
    epoch0 = opt.local_epoch
    next_eval = began
    samples = steps = 0
    epochs: list[dict[str, Any]] = []   # when each epoch this peer reached began
    while True:
        left(args, f"training at epoch {opt.local_epoch}")
        if stop_requested():
            break
        next_eval = evaluate_when_due(args, model, held_out, began, next_eval,
                                      opt.local_epoch)
        model.loss(next(batches)).backward()
        epoch = opt.local_epoch
        opt.step()
        opt.zero_grad()
        samples += args.batch
        steps += 1
        if opt.local_epoch != epoch:
            epochs.append({"epoch": opt.local_epoch, "t": time.time() - began})
    sent, received = link_bytes()
    harness.emit("result", rank=args.rank, seconds=time.time() - began,
                 bytes_sent=sent - sent0, bytes_received=received - received0,
                 samples=samples, steps=steps, epoch=opt.local_epoch,
                 counters={"epochs": opt.local_epoch - epoch0}, rounds=[], epochs=epochs)


def main() -> None:
    args = parse_args()
    harness.peer_process(args.rank)
    with harness.reporting(rank=args.rank):
        run(args)


if __name__ == "__main__":
    main()
