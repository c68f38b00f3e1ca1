"""What ``p2pdl.Optimizer`` costs a training step when no averaging round is due,
against the plain wrapped optimizer on the same model.

    python simulations/bench_overhead.py [--model bench|tiny] [--blocks 8] [--block-steps 4]
        [--memory-model mlp|bench|tiny] [--memory-steps 6] [--threads 1] [--quick]

**Time** (one process, so both loops share the machine alike): a
``p2pdl.Node`` listening on loopback, alone, and the example's
TinyTransformerLM (``--model bench``: d_model 256, 4 layers, context 128,
batch 8, 3.26M parameters; ``tiny``: the example's default, 446k).  Blocks
of ``--block-steps`` steps alternate between

* **plain**: ``loss.backward(); adamw.step(); adamw.zero_grad()``;
* **dedloc**: the same loop with ``opt.step(); opt.zero_grad()`` of a
  ``p2pdl.Optimizer`` wrapping that AdamW (the default DeDLOC mode, a target
  batch no peer reaches: every step accumulates the batch's gradients and
  reports progress, no round runs; the wrapped AdamW does not step);
* **diloco**: ``p2pdl.Optimizer(mode="diloco")``: every step is a local
  AdamW step plus what p2pdl adds (the samples counted, progress reported).

after one untimed block of each.  Each step's time is forward + backward +
step + zero_grad, on fixed batches.  ``step_overhead_ms`` = median dedloc
step - median plain step, ``step_overhead_fraction`` = that over the plain
median (negative: the DeDLOC step is cheaper, since the wrapped optimizer
steps once per global batch only); the same for DiLoCo
(``diloco_step_overhead_ms``, ``diloco_step_overhead_fraction``).  Goal for
both fractions: <= 0.03.

**Memory**: one child process per loop (plain, dedloc, diloco), each with
its own node and the ``--memory-model`` (``mlp``: 6 linear layers of
2048 x 2048, 25.2M parameters, batch 8: large enough that the parameters
dwarf the interpreter, the node and the activations), one step of the
plain AdamW (so that its state exists in every arm, as it does in a DeDLOC
peer after its first global step), then the peak resident memory is reset (glibc told to map every
allocation of 128 KiB or more on its own and to unmap it when freed, so
resident memory follows the live tensors)
(Linux ``clear_refs``) and the p2pdl optimizer made, ``--memory-steps`` steps
of the loop run, and the loop's peak (``VmHWM``) less the resident memory
before it is the arm's ``loop_peak_rss_mb``.
``extra_memory_parameter_copies`` = (dedloc's loop peak - plain's) /
(parameters x 4 bytes); ``diloco_extra_memory_parameter_copies`` the same.
Goal: <= 2 (the accumulators and one staging copy).

Where CUDA is available, ``cuda`` holds the same time comparison with the
model on the GPU, peak GPU memory (``torch.cuda.max_memory_allocated``) of
each loop in copies of the parameters, and ``staging_ms_100m``: staging a
round of 100M float32 values from the GPU into host memory and the result
back (``HostStaging``), median of 5.  Without CUDA it is null.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import p2pdl  # noqa: E402
from p2pdl.training import ExampleConfig, TinyTransformerLM, count_parameters  # noqa: E402

#: A target batch no single peer reaches in a benchmark: no round is ever due.
UNREACHED = 2**40
LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
ARMS = ("plain", "dedloc", "diloco")
#: glibc: every allocation of 128 KiB or more is its own mapping, returned at
#: once when freed (a fixed threshold: no dynamic raise), so that resident
#: memory follows the tensors alive and the workers' peaks compare.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072", "MALLOC_TRIM_THRESHOLD_": "131072"}


class Mlp(torch.nn.Module):
    """Wide linear layers: many parameters, little compute per step."""

    def __init__(self, width: int = 2048, layers: int = 6) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(width, width)
                                            for _ in range(layers)])
        self.width = width

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        return (self.layers(batch) ** 2).mean()


def build(name: str, device: str) -> tuple[torch.nn.Module, list[torch.Tensor], int]:
    """The model, a few fixed batches and the samples per batch."""
    torch.manual_seed(0)
    if name == "mlp":
        model: Any = Mlp()
        batches = [torch.randn(8, model.width) for _ in range(4)]
        size = 8
    else:
        config = ExampleConfig(d_model=256, n_layers=4, n_heads=4, context_length=128,
                               batch_size=8) if name == "bench" else ExampleConfig()
        model = TinyTransformerLM(config)
        batches = [torch.randint(0, 256, (config.batch_size, config.context_length + 1))
                   for _ in range(4)]
        size = config.batch_size
    return model.to(device), [b.to(device) for b in batches], size


def make_opt(arm: str, node: Any, model: torch.nn.Module, inner: torch.optim.Optimizer,
             size: int) -> Any:
    if arm == "plain":
        return inner
    return p2pdl.Optimizer(node=node, run_id=f"bench-overhead-{arm}", optimizer=inner,
                           target_batch_size=UNREACHED, batch_size_per_step=size,
                           mode=arm)


def one_step(model: Any, opt: Any, batch: torch.Tensor) -> None:
    model.loss(batch).backward()
    opt.step()
    opt.zero_grad()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_arms(node: Any, name: str, device: str, blocks: int, block_steps: int
              ) -> dict[str, Any]:
    """Median step time of each arm, blocks interleaved."""
    model, batches, size = build(name, device)
    opts = {}
    for arm in ARMS:
        # Each arm its own AdamW over the same parameters (DiLoCo's inner
        # steps move them; the others do not mind).
        inner = torch.optim.AdamW(model.parameters(), lr=1e-5)
        opts[arm] = make_opt(arm, node, model, inner, size)
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    peaks: dict[str, int] = {}
    try:
        for block in range(blocks + 1):
            for arm in ARMS if block % 2 == 0 else reversed(ARMS):
                if device.startswith("cuda"):
                    torch.cuda.reset_peak_memory_stats()
                for i in range(block_steps):
                    synchronize(device)
                    start = time.perf_counter()
                    one_step(model, opts[arm], batches[i % len(batches)])
                    synchronize(device)
                    if block > 0:   # the first block of each arm warms up
                        times[arm].append(time.perf_counter() - start)
                if device.startswith("cuda"):
                    peaks[arm] = max(peaks.get(arm, 0), torch.cuda.max_memory_allocated())
    finally:
        for arm in ARMS[1:]:
            opts[arm].close()
    medians = {arm: statistics.median(times[arm]) * 1000 for arm in ARMS}
    out: dict[str, Any] = {"model": name, "parameters": count_parameters(model),
                           "batch": size, "steps_per_arm": len(times["plain"]),
                           "plain_step_ms": round(medians["plain"], 3),
                           "dedloc_step_ms": round(medians["dedloc"], 3),
                           "diloco_step_ms": round(medians["diloco"], 3)}
    for arm, prefix in (("dedloc", ""), ("diloco", "diloco_")):
        extra = medians[arm] - medians["plain"]
        out[f"{prefix}step_overhead_ms"] = round(extra, 3)
        out[f"{prefix}step_overhead_fraction"] = round(extra / medians["plain"], 4)
    if peaks:
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        out["peak_memory_parameter_copies"] = {arm: round(peaks[arm] / param_bytes, 2)
                                               for arm in ARMS}
    return out


def staging_ms(values: int = 100_000_000, repeats: int = 5) -> float:
    """Stage ``values`` float32 from the GPU into host buffers and back (ms, median)."""
    from p2pdl.training._devices import HostStaging, to_device

    tensor = torch.randn(values, device="cuda")
    staging = HostStaging()
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize()
        start = time.perf_counter()
        host = staging.stage([tensor])[0]
        back = to_device(host, tensor)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        del back
    return round(statistics.median(times[1:]) * 1000, 2)


def _status(field: str) -> int | None:
    """A ``/proc/self/status`` field in bytes (None where there is none)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak() -> int:
    """Reset the peak resident memory to the current one (Linux: ``clear_refs``
    5); return the current resident memory (0 where it cannot be reset: the
    peak then counts from the start)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return 0
    return _status("VmRSS") or 0


def peak_rss() -> int:
    """The peak resident memory since :func:`reset_peak` (bytes)."""
    return _status("VmHWM") or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(arm: str, name: str, steps: int, threads: int) -> None:
    """One loop in this process; prints its peak resident memory and the parameter bytes."""
    torch.set_num_threads(threads)
    node = p2pdl.Node(listen=LOOPBACK)
    try:
        model, batches, size = build(name, "cpu")
        inner = torch.optim.AdamW(model.parameters(), lr=1e-5)
        # One step of the wrapped optimizer first, in every arm: its state
        # exists from then on (a DeDLOC peer's after its first global step).
        one_step(model, inner, batches[0])
        base = reset_peak()
        opt = make_opt(arm, node, model, inner, size)
        try:
            for i in range(steps):
                one_step(model, opt, batches[i % len(batches)])
            peak = peak_rss()
        finally:
            if arm != "plain":
                opt.close()
        param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        print(json.dumps({"arm": arm, "peak_rss_bytes": peak, "base_rss_bytes": base,
                          "param_bytes": param_bytes}))
    finally:
        node.shutdown()


def memory(name: str, steps: int, threads: int, timeout: float) -> dict[str, Any]:
    peaks: dict[str, int] = {}
    param_bytes = 0
    for arm in ARMS:
        result = subprocess.run(
            [sys.executable, __file__, "--worker", arm, "--memory-model", name,
             "--memory-steps", str(steps), "--threads", str(threads)],
            capture_output=True, text=True, timeout=timeout, cwd=ROOT,
            env={**os.environ, **MALLOC_ENV})
        if result.returncode != 0:
            raise RuntimeError(f"the {arm} worker failed: {result.stderr[-2000:]}")
        record = json.loads(result.stdout.strip().splitlines()[-1])
        peaks[arm] = record["peak_rss_bytes"] - record["base_rss_bytes"]
        param_bytes = record["param_bytes"]
    out: dict[str, Any] = {"memory_model": name, "memory_parameters": param_bytes // 4,
                           "loop_peak_rss_mb": {arm: round(peaks[arm] / 2**20, 1)
                                                for arm in ARMS}}
    for arm, prefix in (("dedloc", ""), ("diloco", "diloco_")):
        out[f"{prefix}extra_memory_parameter_copies"] = round(
            (peaks[arm] - peaks["plain"]) / param_bytes, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["bench", "tiny"], default="bench")
    parser.add_argument("--memory-model", choices=["mlp", "bench", "tiny"], default="mlp")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block-steps", type=int, default=4)
    parser.add_argument("--memory-steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="longest run of one memory worker (s)")
    parser.add_argument("--quick", action="store_true",
                        help="the tiny model, 2 blocks of 2 steps, 2 memory steps (a smoke test)")
    parser.add_argument("--worker", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("blocks", "block_steps", "memory_steps", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.worker:
        worker(args.worker, args.memory_model, args.memory_steps, args.threads)
        return 0
    if args.quick:
        args.model, args.memory_model = "tiny", "tiny"
        args.blocks, args.block_steps, args.memory_steps = 2, 2, 2
    torch.set_num_threads(args.threads)
    started = time.monotonic()
    node = p2pdl.Node(listen=LOOPBACK)
    try:
        report: dict[str, Any] = {"device": "cpu", "threads": args.threads,
                                  **time_arms(node, args.model, "cpu", args.blocks,
                                              args.block_steps)}
        cuda = None
        if torch.cuda.is_available():
            cuda = {**time_arms(node, args.model, "cuda", args.blocks, args.block_steps),
                    "staging_ms_100m": staging_ms(), "gpu": torch.cuda.get_device_name()}
    finally:
        node.shutdown()
    report.update(memory(args.memory_model, args.memory_steps, args.threads, args.timeout))
    report["cuda"] = cuda
    report["goals"] = {"step_overhead_fraction": 0.03, "extra_memory_parameter_copies": 2}
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
