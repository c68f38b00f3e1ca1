"""Simulated trainers on real nodes: progress by gossip, or by polling the DHT.

Used by ``simulations/bench_progress.py`` (through the swarm agent's
``progress`` command) and by tests.  Each node plays a trainer that adds a
batch of samples after each step; step times vary (a log-normal factor on a
per-peer base time, and now and then a pause, as data loading and garbage
collection cause).  When its peer sees ``ready_to_step`` it stops, spends
``averaging_time`` (the all-reduce, simulated) and starts the next epoch.

* ``gossip`` -- ``node.progress.track(...)`` (the progress protocol).
* ``poll`` -- the reference's approach (hivemind 1.1.12's ProgressTracker):
  each peer stores its signed report in the DHT under its own subkey and
  fetches the whole key (``latest=True``) at the refresh rule
  ``clip(eta * n / max(n + 3, 1.2 n), 0.5, 10)`` s.  The reports are
  published when the same :class:`PublishPolicy` says so, and the same
  :class:`ProgressView` turns them into ``ready_to_step``, so the two modes
  differ only in how reports travel.

Every step and every ready event is logged with its wall-clock time, so that
the caller can compute when the global batch truly filled.
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import trio

from .. import TrioNode
from ..dht import DHT_PROTOCOL_ID
from ..progress import (
    PROGRESS_PROTOCOL_ID,
    SNAPSHOT_PREFIX,
    PeerReport,
    ProgressView,
    PublishPolicy,
    RateEMA,
    SnapshotEntry,
    sign_report,
    verify_report,
)
from ..wire import traffic

__all__ = ["simulate_progress", "hivemind_refresh_delay"]

MIN_REFRESH, MAX_REFRESH = 0.5, 10.0
DRIFT_PEERS, DRIFT_RATE = 3, 0.2


def hivemind_refresh_delay(eta_in: float, num_peers: int) -> float:
    """hivemind's next-fetch delay: ``clip(eta * n / expected_max_peers, 0.5, 10)``."""
    expected = max(num_peers + DRIFT_PEERS, num_peers * (1 + DRIFT_RATE))
    value = eta_in * num_peers / expected if math.isfinite(eta_in) else MAX_REFRESH
    return min(max(value, MIN_REFRESH), MAX_REFRESH)


class _Trainer:
    def __init__(self, index: int, seed: int, batch: int, base_range: tuple[float, float],
                 jitter: float, pause_p: float, pause_s: tuple[float, float]) -> None:
        self.rng = random.Random(seed * 7919 + index)
        self.base = self.rng.uniform(*base_range)
        self.batch = batch
        self.jitter = jitter
        self.pause_p = pause_p
        self.pause_s = pause_s

    def step_time(self) -> float:
        t = self.base * self.rng.lognormvariate(0.0, self.jitter)
        if self.rng.random() < self.pause_p:
            t += self.rng.uniform(*self.pause_s)
        return t


def _sent(protocols: tuple[str, ...]) -> dict[str, int]:
    table = traffic()
    return {p: table.get(p, (0, 0))[0] for p in protocols}


async def simulate_progress(nodes: list[TrioNode], *, mode: str, run_id: str, target: int,
                            epochs: int, seed: int, first_index: int, start_at: float,
                            averaging_time: float = 0.5, batch: int = 32,
                            base_range: tuple[float, float] = (0.25, 0.6), jitter: float = 0.35,
                            pause_p: float = 0.03, pause_s: tuple[float, float] = (0.5, 1.5),
                            max_seconds: float = 300.0) -> dict[str, Any]:
    """Run ``epochs`` epochs on every node; returns the logs and the bytes sent
    (``bytes_sent``, and ``bytes_by_protocol`` for the progress and DHT protocols).

    ``first_index`` numbers this process's nodes among all processes (the
    trainers' random streams depend on it).  Starts at wall time ``start_at``.
    """
    if mode not in ("gossip", "poll"):
        raise ValueError(f"mode must be gossip or poll, not {mode!r}")
    steps: list[list[Any]] = []     # [peer, epoch, samples, time]
    ready: list[list[Any]] = []     # [peer, epoch, time]
    protocols = (PROGRESS_PROTOCOL_ID, DHT_PROTOCOL_ID)
    await trio.sleep(max(0.0, start_at - time.time()))
    sent_before = _sent(protocols)
    started = time.time()
    with trio.move_on_after(max_seconds):
        async with trio.open_nursery() as nursery:
            for i, node in enumerate(nodes):
                trainer = _Trainer(first_index + i, seed, batch, base_range, jitter, pause_p,
                                   pause_s)
                runner = _run_gossip if mode == "gossip" else _run_poll
                nursery.start_soon(runner, node, trainer, first_index + i, run_id, target,
                                   epochs, averaging_time, steps, ready)
    elapsed = time.time() - started
    sent = {p: n - sent_before[p] for p, n in _sent(protocols).items()}
    return {"steps": steps, "ready": ready, "bytes_sent": sum(sent.values()),
            "bytes_by_protocol": sent, "seconds": elapsed, "nodes": len(nodes)}


async def _train_epoch(trainer: _Trainer, peer: int, epoch: int, report: Any,
                       is_ready: trio.Event, steps: list[list[Any]]) -> int:
    samples = 0
    while not is_ready.is_set():
        with trio.move_on_after(trainer.step_time()):
            await is_ready.wait()
        if is_ready.is_set():
            break
        samples += trainer.batch
        steps.append([peer, epoch, samples, time.time()])
        report(samples)
    return samples


async def _run_gossip(node: TrioNode, trainer: _Trainer, peer: int, run_id: str, target: int,
                      epochs: int, averaging_time: float, steps: list[list[Any]],
                      ready: list[list[Any]]) -> None:
    async with node.progress.track(run_id, target) as tracker:
        while tracker.local_epoch < epochs:
            epoch = tracker.local_epoch
            is_ready = trio.Event()

            async def watch(epoch: int = epoch, is_ready: trio.Event = is_ready) -> None:
                await tracker.wait_ready()
                ready.append([peer, epoch, time.time()])
                is_ready.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                await _train_epoch(trainer, peer, epoch, tracker.report, is_ready, steps)
            await trio.sleep(averaging_time)
            tracker.update_epoch(max(epoch + 1, tracker.global_progress().epoch))
        await trio.sleep(averaging_time)  # let the others see the last epoch


async def _run_poll(node: TrioNode, trainer: _Trainer, peer: int, run_id: str, target: int,
                    epochs: int, averaging_time: float, steps: list[list[Any]],
                    ready: list[list[Any]]) -> None:
    config = node.config.progress
    me = node.peer_id.to_bytes()
    view = ProgressView(me, target, config)
    policy = PublishPolicy(config)
    ema = RateEMA(config.rate_half_life)
    key = SNAPSHOT_PREFIX + run_id
    state = {"epoch": 0, "samples": 0}
    changed = trio.Event()
    store_wakeup = trio.Event()
    private_key = node.host.libp2p.get_private_key()

    def local(now: float) -> PeerReport:
        return PeerReport(me, state["epoch"], state["samples"], ema.rate, now)

    def report(samples: int) -> None:
        now = time.time()
        ema.update(samples - state["samples"], now)
        state["samples"] = samples
        view.set_local(local(now))
        store_wakeup.set()
        changed.set()

    async def publisher() -> None:
        nonlocal store_wakeup
        while True:
            now = time.time()
            mine = local(now)
            view.set_local(mine)
            due = policy.next_publish(mine, view.global_progress(now), ema.typical_batch, now)
            if due <= now:
                signed = sign_report(private_key, node.peer_id, run_id, mine.epoch,
                                     mine.samples_accumulated, mine.samples_per_second, now,
                                     False)
                policy.published(mine, now)
                await node.dht.store(key, SnapshotEntry(signed), now + config.snapshot_ttl,
                                     subkey=node.dht.own_subkey())
                continue
            store_wakeup = trio.Event()
            with trio.move_on_after(min(due - now, config.heartbeat_interval)):
                await store_wakeup.wait()

    async def fetcher() -> None:
        while True:
            found = await node.dht.get(key, latest=True)
            now = time.time()
            if found is not None and found.dictionary:
                for entry in found.value.values():
                    value = entry.value
                    if isinstance(value, SnapshotEntry) and verify_report(value.report):
                        r = value.report
                        view.offer(PeerReport(r.peer_id, r.epoch, r.samples_accumulated,
                                              r.samples_per_second, r.time, r.client_mode,
                                              r.auxiliary), now)
            view.set_local(local(now))
            progress = view.global_progress(now)
            changed.set()
            await trio.sleep(hivemind_refresh_delay(progress.eta_next_epoch - now,
                                                    progress.num_peers))

    async with trio.open_nursery() as services:
        services.start_soon(publisher)
        services.start_soon(fetcher)
        while state["epoch"] < epochs:
            epoch = state["epoch"]
            is_ready = trio.Event()

            async def watch(epoch: int = epoch, is_ready: trio.Event = is_ready) -> None:
                nonlocal changed
                while True:
                    now = time.time()
                    view.set_local(local(now))
                    if view.global_progress(now).ready_to_step:
                        break
                    changed = trio.Event()
                    with trio.move_on_after(max(0.001, min(view.ready_at(now) - now, 1.0))):
                        await changed.wait()
                ready.append([peer, epoch, time.time()])
                is_ready.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                await _train_epoch(trainer, peer, epoch, report, is_ready, steps)
            await trio.sleep(averaging_time)
            state["epoch"] = max(epoch + 1, view.global_progress(time.time()).epoch)
            state["samples"] = 0
            ema.reset_timer(time.time())
            store_wakeup.set()
        await trio.sleep(averaging_time)
        services.cancel_scope.cancel()
