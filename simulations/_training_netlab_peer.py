"""One peer of ``simulations/bench_training.py``, run inside a netlab host's network
namespace, pinned to one core.

    python -m simulations._training_netlab_peer --mode solo|swarm --rank I --core C \
        --ip A.B.C.D [--initial-peer ADDR] --d-model D --layers L --heads H --batch B \
        --context T --lr LR --duration S --target N --epochs E [--delay-updates] \
        [--train-mode dedloc|diloco] [--fragments N] [--nice N] --run-id ID --timeout S

The process pins itself to core ``--core`` (``os.sched_setaffinity``, before any
thread starts, so the p2pdl node's trio thread shares that core), runs torch
with one thread and, with ``--nice``, runs at that niceness in a session and
scheduling autogroup of its own (``prioritize``).  The model is the example
task's TinyTransformerLM (``p2pdl.training._example``) of the given size, the
same initial parameters in every peer (seed 0); each rank draws its own
batches (``peer_index = rank``).

``--mode solo``: a plain torch loop (``loss.backward(); AdamW.step();
zero_grad()``), no p2pdl.  Two untimed warm-up steps, then the event
``{"event": "ready"}`` (simulations/_harness.py's protocol); after the
parent's ``go`` it trains for ``--duration`` seconds and sends ``{"event":
"result", "samples", "seconds", "samples_s", ...}``.

``--mode swarm``: a ``p2pdl.Node`` listening on ``/ip4/<ip>/tcp/0`` (with
``--initial-peer`` as its initial peer) sends ``{"event": "listening",
"addr"}`` and waits for a connection; then a ``p2pdl.Optimizer`` (mode
``--train-mode``, DeDLOC by default; the given ``--target``, AdamW) reports
a first count of 0 and waits until its progress view holds both peers: ``{"event": "ready"}``.  Each
matchmaking and all-reduce call the optimizer makes is timed (``instrument``).
After ``go``: the same loop with ``opt.step()`` until the optimizer's epoch
reaches ``1 + --epochs`` (epoch 0 is the warm-up epoch).  Every call of
``step`` that started, finished or skipped a round sends ``{"event":
"epoch", ...}``; at the end (after ``opt.close()``, which finishes a
background round with ``--delay-updates``) ``{"event": "result", ...}`` with
the measured window: from the return of the ``step`` call that took the
optimizer to epoch 1 to the return of the one that took it to ``1 +
--epochs``, the samples passed to ``step`` in between, and where the time
went.  Then it waits for ``stop`` (or the end of stdin) before shutting its node
down, so that no peer leaves while the other may still need it.

Every wait is bounded by ``--timeout`` (seconds for the whole process); on
error ``{"event": "fatal", "error"}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from simulations import _harness as harness
from simulations._harness import process_cpu_s, thread_cpu_s


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("solo", "swarm"), required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--core", type=int, default=None,
                        help="pin to this CPU (None: leave the affinity as it is)")
    parser.add_argument("--ip", default="127.0.0.1", help="this host's address in the lab")
    parser.add_argument("--initial-peer", default=None)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--duration", type=float, default=20.0, help="solo: seconds to train")
    parser.add_argument("--target", type=int, default=1280, help="swarm: target batch size")
    parser.add_argument("--epochs", type=int, default=3,
                        help="swarm: measured epochs after the warm-up epoch")
    parser.add_argument("--delay-updates", action="store_true")
    parser.add_argument("--train-mode", choices=("dedloc", "diloco"), default="dedloc")
    parser.add_argument("--fragments", type=int, default=1)
    parser.add_argument("--nice", type=int, default=0,
                        help="run at this niceness, in a scheduling autogroup of its own "
                             "(see prioritize)")
    parser.add_argument("--run-id", default="bench-training")
    parser.add_argument("--timeout", type=float, required=True,
                        help="seconds for the whole process")
    args = parser.parse_args(argv)
    args.deadline = time.time() + args.timeout
    return args


_T0 = time.time()


def log(*parts: object) -> None:
    print(f"[{time.time() - _T0:6.2f} s]", *parts, file=sys.stderr, flush=True)


def wait_command(expected: str, deadline: float) -> None:
    """The parent's command ``expected``, waited for at most until ``deadline``."""
    harness.wait_command(expected, timeout=max(0.0, deadline - time.time()))


def check_deadline(deadline: float, what: str) -> None:
    if time.time() > deadline:
        raise TimeoutError(f"timed out {what}")


def cpu_delta(a: dict[str, float], b: dict[str, float], total: float) -> dict[str, float]:
    """CPU seconds between two thread_cpu_s() readings: the compute thread (MainThread),
    the node's trio thread (p2pdl-node) and the rest of ``total`` (short-lived helper
    threads, whose time a per-thread reading can miss)."""
    out = {k: round(b.get(k, 0.0) - a.get(k, 0.0), 3) for k in ("MainThread", "p2pdl-node")
           if k in a or k in b}
    out["other"] = round(max(0.0, total - sum(out.values())), 3)
    return out


def prioritize(nice: int) -> str:
    """Run at niceness ``nice`` against the machine's other work, and say how.

    With ``kernel.sched_autogroup_enabled`` (on here) the scheduler first shares a
    core between autogroups (one per session), and a process's niceness counts only
    inside its own group: a plain ``nice -n -10`` does nothing against other
    sessions' work.  So the peer starts a session of its own (a new autogroup) and
    sets that group's niceness (``/proc/self/autogroup``, root only), as well as its own.
    """
    if not nice:
        return "as is"
    done = []
    try:
        os.setsid()
        done.append("own session")
    except OSError:
        pass
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(nice))
        done.append(f"autogroup nice {nice}")
    except OSError as exc:
        done.append(f"autogroup unchanged ({exc.strerror})")
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        done.append(f"nice {nice}")
    except OSError as exc:
        done.append(f"nice unchanged ({exc.strerror})")
    return ", ".join(done)


def build(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    import torch

    from p2pdl.training import ExampleConfig, ExampleTask

    config = ExampleConfig(d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
                           context_length=args.context, batch_size=args.batch)
    task = ExampleTask(config)
    model = task.build_model()
    inner = torch.optim.AdamW(model.parameters(), lr=args.lr)
    return model, inner, task.batches(peer_index=args.rank)


def run_solo(args: argparse.Namespace) -> None:
    model, inner, batches = build(args)
    params = sum(p.numel() for p in model.parameters())
    for _ in range(2):  # untimed: the first steps allocate
        model.loss(next(batches)).backward()
        inner.step()
        inner.zero_grad()
    harness.emit("ready", rank=args.rank, params=params,
                 affinity=sorted(os.sched_getaffinity(0)), priority=args.priority)
    wait_command("go", args.deadline)
    cpu0, proc0 = thread_cpu_s(), process_cpu_s()
    start = time.time()
    end = start + args.duration
    samples = steps = 0
    losses: list[float] = []
    compute_s = compute_cpu_s = 0.0  # forward + backward: wall, and this thread's CPU
    while time.time() < end:
        check_deadline(args.deadline, "training solo")
        batch = next(batches)
        t0, c0 = time.time(), time.thread_time()
        loss = model.loss(batch)
        loss.backward()
        compute_s += time.time() - t0
        compute_cpu_s += time.thread_time() - c0
        inner.step()
        inner.zero_grad()
        samples += args.batch
        steps += 1
        losses.append(float(loss.detach()))
    seconds = time.time() - start
    harness.emit("result", rank=args.rank, mode="solo", samples=samples,
                 steps=steps, seconds=seconds, samples_s=samples / seconds,
                 step_s=seconds / max(1, steps), params=params, compute_s=compute_s,
                 compute_cpu_s=compute_cpu_s,
                 cpu_s=process_cpu_s() - proc0,
                 cpu_threads_s=cpu_delta(cpu0, thread_cpu_s(), process_cpu_s() - proc0),
                 loss_first=losses[0] if losses else None,
                 loss_last=losses[-1] if losses else None)


def run_swarm(args: argparse.Namespace) -> None:
    import torch  # noqa: F401  (imported by build; here for the node's start order)

    import p2pdl

    model, inner, batches = build(args)
    params = sum(p.numel() for p in model.parameters())
    log(f"rank {args.rank}: model built")
    initial = [args.initial_peer] if args.initial_peer else []
    node = p2pdl.Node(listen=[f"/ip4/{args.ip}/tcp/0"], initial_peers=initial,
                      start_timeout=max(1.0, min(60.0, args.deadline - time.time())))
    try:
        addr = next(a for a in node.addrs if a.startswith(f"/ip4/{args.ip}/"))
        harness.emit("listening", rank=args.rank, addr=addr, peer_id=str(node.peer_id))
        log(f"rank {args.rank}: listening at {addr}")
        # Track the run only once the two nodes are connected, so that each one's first
        # progress snapshot lands in the other's DHT (alone, a node's store reaches
        # nobody and its next one is snapshot_interval away).
        node.wait_for_peers(1, timeout=max(1.0, min(60.0, args.deadline - time.time())))
        log(f"rank {args.rank}: connected")
        calls = instrument(node)
        opt = p2pdl.Optimizer(node=node, run_id=args.run_id, optimizer=inner,
                              target_batch_size=args.target, batch_size_per_step=args.batch,
                              delay_updates=args.delay_updates, mode=args.train_mode,
                              fragments=args.fragments)
        try:
            train_swarm(args, node, opt, model, batches, params, calls)
        finally:
            opt.close()
        wait_command("stop", args.deadline)
    finally:
        node.shutdown()


def instrument(node: Any) -> list[dict[str, Any]]:
    """Time each matchmaking and all-reduce call the optimizer makes (observation only:
    the node's two services get a timing wrapper around their public call).  Returns
    the list the records go to; empty and harmless if the node's layout differs."""
    records: list[dict[str, Any]] = []
    trio_node = getattr(node, "_node", None)
    services = [(getattr(trio_node, "matchmaking", None), "form_group"),
                (getattr(trio_node, "allreduce", None), "all_reduce")]
    for service, name in services:
        original = getattr(service, name, None)
        if original is None:
            continue

        def wrap(original: Any = original, name: str = name) -> Any:
            async def timed(*args: Any, **kwargs: Any) -> Any:
                start = time.time()
                record: dict[str, Any] = {"call": name, "t_start": start}
                try:
                    result = await original(*args, **kwargs)
                except BaseException as exc:
                    record["error"] = type(exc).__name__
                    raise
                finally:
                    record["seconds"] = time.time() - start
                    records.append(record)
                if name == "all_reduce":
                    record.update(completed=result.completed, bytes_sent=result.bytes_sent,
                                  bytes_received=result.bytes_received,
                                  times={k: round(v, 3) for k, v in result.times.items()},
                                  predicted_s=result.predicted_s)
                else:
                    record["group_size"] = len(result.members)
                return result
            return timed

        setattr(service, name, wrap())
    return records


def train_swarm(args: argparse.Namespace, node: Any, opt: Any, model: Any, batches: Any,
                params: int, calls: list[dict[str, Any]]) -> None:
    # Join the progress view with a count of 0, then wait until both peers are in it.
    opt.step(batch_size=0)
    while opt.global_progress().num_peers < 2:
        check_deadline(args.deadline, "waiting for the other peer in the progress view")
        time.sleep(0.1)
        opt.step(batch_size=0)
    log(f"rank {args.rank}: both peers in the progress view")
    harness.emit("ready", rank=args.rank, params=params,
                 affinity=sorted(os.sched_getaffinity(0)), priority=args.priority,
                 client_mode=node.client_mode, reachability=str(node.reachability))
    wait_command("go", args.deadline)
    began = time.time()
    final = 1 + args.epochs
    # the measured window: (time, samples, cpu) at epoch 1 and at epoch `final`
    window_start: dict[str, Any] | None = None
    window_end: dict[str, Any] | None = None
    samples_total = 0          # passed to step since go
    samples_in_window = 0
    round_calls: list[dict[str, Any]] = []   # step calls that ran a global step / round
    step_seconds = compute_seconds = 0.0     # inside step(); forward + backward
    compute_cpu_seconds = 0.0                # this thread's CPU in forward + backward
    steps_in_window = 0
    losses: list[float] = []
    while opt.local_epoch < final:
        check_deadline(args.deadline, f"training at epoch {opt.local_epoch}")
        batch = next(batches)
        t0, c0 = time.time(), time.thread_time()
        loss = model.loss(batch)
        loss.backward()
        t1, c1 = time.time(), time.thread_time()
        epoch_before = opt.local_epoch
        counters_before = _round_counters(opt)
        opt.step()
        opt.zero_grad()
        t2 = time.time()
        samples_total += args.batch
        losses.append(float(loss.detach()))
        in_window = window_start is not None
        if in_window:
            samples_in_window += args.batch
            steps_in_window += 1
            step_seconds += t2 - t1
            compute_seconds += t1 - t0
            compute_cpu_seconds += c1 - c0
        counters_after = _round_counters(opt)
        if opt.local_epoch != epoch_before or counters_after != counters_before:
            info = opt.last_round
            delta = {k: counters_after[k] - counters_before[k] for k in counters_after}
            kinds = [kind for kind, changed in (
                ("round", delta["rounds"] > 0),
                ("finish", sum(delta[k] for k in ("averaged", "partial", "alone", "failed")) > 0
                 and not delta["rounds"]),
                ("sync", delta["state_syncs"] + delta["state_sync_failures"] > 0)) if changed]
            call = {"epoch_before": epoch_before, "epoch_after": opt.local_epoch,
                    "t_call": t1, "t_return": t2, "step_s": t2 - t1,
                    "in_window": in_window, "kinds": kinds,
                    "outcome": info.outcome if info else None,
                    "round_epoch": info.epoch if info else None,
                    "round_s": info.seconds if info else None,
                    "group_size": info.group_size if info else None,
                    "error": info.error if info else None}
            round_calls.append(call)
            harness.emit("epoch", rank=args.rank, epoch=opt.local_epoch, t=t2,
                         step_s=round(t2 - t1, 3), outcome=call["outcome"],
                         round_s=call["round_s"])
        if window_start is None and opt.local_epoch >= 1:
            window_start = {"t": t2, "samples": samples_total, "cpu": thread_cpu_s(),
                            "proc": process_cpu_s(), "statistics": opt.statistics()}
        if opt.local_epoch >= final:
            window_end = {"t": t2, "samples": samples_total, "cpu": thread_cpu_s(),
                          "proc": process_cpu_s()}
    assert window_start is not None and window_end is not None
    close_start = time.time()
    opt.close()  # finishes a background round (delay_updates)
    close_s = time.time() - close_start
    seconds = window_end["t"] - window_start["t"]
    window_rounds = [c for c in round_calls if c["in_window"]]
    result = {
        "rank": args.rank, "mode": "swarm",
        "delay_updates": args.delay_updates, "params": params,
        "t_go_to_end_s": window_end["t"] - began,
        "t_start": window_start["t"], "t_end": window_end["t"], "seconds": seconds,
        "samples": samples_in_window, "steps": steps_in_window,
        "samples_s": samples_in_window / seconds if seconds > 0 else None,
        "compute_s": compute_seconds, "compute_cpu_s": compute_cpu_seconds,
        "step_calls_s": step_seconds,
        "round_calls_s": sum(c["step_s"] for c in window_rounds
                             if "round" in c["kinds"] or "finish" in c["kinds"]),
        "sync_calls_s": sum(c["step_s"] for c in window_rounds
                            if "sync" in c["kinds"] and "round" not in c["kinds"]
                            and "finish" not in c["kinds"]),
        "round_calls": round_calls, "close_s": close_s,
        "statistics": opt.statistics(), "statistics_at_start": window_start["statistics"],
        "network_calls": [{**c, "in_window": window_start["t"] <= c["t_start"]
                           <= window_end["t"]} for c in list(calls)],
        "cpu_s": window_end["proc"] - window_start["proc"],
        "cpu_threads_s": cpu_delta(window_start["cpu"], window_end["cpu"],
                                   window_end["proc"] - window_start["proc"]),
        "loss_first": losses[0] if losses else None,
        "loss_last": losses[-1] if losses else None}
    harness.emit("result", **result)


COUNTERS = ("rounds", "averaged", "partial", "alone", "failed", "state_syncs",
            "state_sync_failures")


def _round_counters(opt: Any) -> dict[str, int]:
    stats = opt.statistics()
    return {k: stats[k] for k in COUNTERS}


def main() -> None:
    args = parse_args()
    # Pin before torch or the node start any thread: threads inherit the affinity.
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    args.priority = prioritize(args.nice)
    harness.peer_process(args.rank)
    with harness.reporting(rank=args.rank):
        if args.mode == "solo":
            run_solo(args)
        else:
            run_swarm(args)


if __name__ == "__main__":
    main()
