"""A swarm whose volunteers leave and are replaced: :func:`churn_run`.

``peers`` sync :class:`~p2pdl.Node` s on loopback train a small regression
model together (:class:`RegressionTask`), each with its own
:class:`~p2pdl.Optimizer`.  While they train, peers are killed -- their node
shut down at once, whatever it was doing -- and each is replaced at once by a
fresh volunteer: a new node (a new identity) with a model of its own random
initialisation, which only a state download makes the swarm's.  The first
peer is never killed (it is the bootstrap, and the one whose held-out loss
is reported).  A kill is one of:

* ``mid_round``: the victim is killed as soon as an all-reduce of its runs
  (its group formed; its part and its values are in flight);
* ``download``: a peer is killed while a joiner downloads the state (another
  peer, so most likely one of its donors);
* ``plain``: whenever the schedule says.

After the last kill, once every replacement has caught up (at most
JOIN_PATIENCE s), the swarm trains on until every live peer reached
``end_epoch`` (the first peer's epoch then plus ``settle_epochs``), and
stops there, once it has run the consistency check its next step would
have run (after a partial round, or on a state nobody confirmed yet).
:class:`ChurnOutcome` says how many distinct states the peers at that epoch
hold, how long joiners took to catch up, whether any trained on its own
parameters, how long the swarm went without an averaged round after each
kill, and the rounds by outcome.

In-process, so a "kill" is a node shutdown: every connection closes at
once, as the kernel closes those of a killed process; nothing is said
beforehand (there is no goodbye in any protocol).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import random
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from .. import Node
from ..errors import P2PDLError
from ..training import Optimizer
from ._swarm import LOOPBACK

__all__ = ["RegressionTask", "ChurnConfig", "ChurnOutcome", "churn_run", "KILL_KINDS"]

logger = logging.getLogger(__name__)

#: The kinds of kill :func:`churn_run` makes.
KILL_KINDS = ("mid_round", "download", "plain")
#: Seconds a kill waits, at most, for its moment (a round, an upload) before it kills anyway.
KILL_PATIENCE = 10.0
#: How often the controller looks at the swarm (s).
POLL = 0.02
_SEEDING = threading.Lock()
#: Seconds the settling waits, at most, for the last replacements to catch up.
JOIN_PATIENCE = 30.0
#: Seconds a peer at the end epoch spends, at most, on its last consistency check.
SETTLE_CHECKS = 15.0


class RegressionTask:
    """``y = tanh(x @ A) @ b + noise`` with ``x`` of ``dim`` features: a small
    MLP learns it in a few hundred steps.  Held-out MSE on a fixed set."""

    def __init__(self, dim: int = 16, hidden: int = 32, batch_size: int = 16,
                 noise: float = 0.01, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.dim, self.hidden, self.batch_size, self.noise = dim, hidden, batch_size, noise
        self._a = torch.randn(dim, hidden, generator=gen) / dim ** 0.5
        self._b = torch.randn(hidden, 1, generator=gen) / hidden ** 0.5
        self._held_out = self._sample(512, gen)

    def _sample(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(n, self.dim, generator=gen)
        y = torch.tanh(x @ self._a) @ self._b + self.noise * torch.randn(n, 1, generator=gen)
        return x, y

    def build_model(self, seed: int = 0) -> torch.nn.Module:
        """The model, initialised from ``seed`` (peers that start together share one).
        Thread-safe: torch's initialisers draw from its global generator."""
        with _SEEDING:
            torch.manual_seed(seed)
            return torch.nn.Sequential(torch.nn.Linear(self.dim, self.hidden),
                                       torch.nn.Tanh(), torch.nn.Linear(self.hidden, 1))

    def batches(self, seed: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        gen = torch.Generator().manual_seed(10_000 + seed)
        while True:
            yield self._sample(self.batch_size, gen)

    @staticmethod
    def loss(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(model(x), y)

    def held_out_mse(self, model: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(self.loss(model, self._held_out))


@dataclasses.dataclass(frozen=True)
class ChurnConfig:
    """One churn run.  ``kills``: how many peers are killed and replaced, one every
    ``kill_every`` seconds from ``first_kill`` on; ``kinds``: the kinds of kill,
    in turn (:data:`KILL_KINDS`).  ``options``: more :class:`~p2pdl.Optimizer` options."""

    peers: int = 6
    kills: int = 0
    kill_every: float = 6.0
    first_kill: float = 6.0
    kinds: tuple[str, ...] = ("mid_round", "plain")
    settle_epochs: int = 3
    min_epochs: int = 10
    target_batch_size: int = 96
    lr: float = 0.01
    seconds: float = 240.0
    seed: int = 0
    options: tuple[tuple[str, Any], ...] = (("matchmaking_time", 5.0),)


@dataclasses.dataclass
class ChurnOutcome:
    """What :func:`churn_run` measured (times in seconds)."""

    end_epoch: int
    #: held-out MSE of the first peer at ``end_epoch``, and of the untrained model
    loss: float
    untrained_loss: float
    #: held-out MSE of the first peer after each epoch it reached
    losses: dict[int, float]
    #: distinct states (parameter digests) among the peers that reached ``end_epoch``,
    #: plus one for each live peer that did not reach it
    distinct_states_at_end: int
    peers_at_end: int
    #: the kills made: (seconds from the start, kind, slot, whether its moment came:
    #: a round running, a download running; False: killed after KILL_PATIENCE anyway)
    kills: list[tuple[float, str, int, bool]]
    #: per replacement: seconds from its start to its first state download or merge
    join_catch_up_s: list[float]
    #: replacements that reached an epoch of the swarm's without any download
    joiners_on_own_parameters: int
    #: replacements alive at the end that never caught up (one killed before it
    #: caught up is not counted)
    joiners_not_caught_up: int
    #: per kill: seconds until the first peer's next averaged round ended
    seconds_without_an_averaged_round_after_a_kill: list[float]
    #: rounds of every peer (every generation) by outcome
    rounds: dict[str, int]
    #: state syncs, merges, repairs and the all-reduce's lost, dropped and
    #: disputed parts of every peer, summed
    state: dict[str, int]
    seconds: float
    #: every generation of every slot: slot, generation, start and catch-up
    #: times, statistics, rounds (epoch, outcome, group size)
    peers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    #: every live peer at the end: (slot, epoch, first 8 hex digits of its
    #: parameters' digest)
    finals: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        """The JSON-friendly figures (p50 and max of the lists)."""

        def p50_max(values: list[float]) -> dict[str, float | None]:
            if not values:
                return {"p50": None, "max": None}
            return {"p50": round(statistics.median(values), 3), "max": round(max(values), 3)}

        return {"end_epoch": self.end_epoch, "loss": self.loss,
                "untrained_loss": self.untrained_loss,
                "distinct_states_at_end": self.distinct_states_at_end,
                "peers_at_end": self.peers_at_end, "kills": len(self.kills),
                "kills_by_kind": {k: sum(1 for _, kind, _, _ in self.kills if kind == k)
                                  for k in KILL_KINDS},
                "kills_at_their_moment": sum(1 for *_, caught in self.kills if caught),
                "join_catch_up_s": p50_max(self.join_catch_up_s),
                "joiners_on_own_parameters": self.joiners_on_own_parameters,
                "joiners_not_caught_up": self.joiners_not_caught_up,
                "seconds_without_an_averaged_round_after_a_kill":
                    p50_max(self.seconds_without_an_averaged_round_after_a_kill),
                "rounds": dict(self.rounds), "state": dict(self.state),
                "finals": list(self.finals), "seconds": round(self.seconds, 1)}


#: The all-reduce's counters of the post-round exchange, summed into ``state``.
PARTS_KEYS = ("parts_failed", "parts_dropped", "parts_disputed")


@dataclasses.dataclass
class _Peer:
    """One generation of one slot: a volunteer from its start to its kill (or the end)."""

    slot: int
    generation: int
    node: Node
    model: torch.nn.Module
    opt: Optimizer
    started: float
    killed: threading.Event = dataclasses.field(default_factory=threading.Event)
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    caught_up_at: float | None = None
    killed_at: float | None = None   # None: alive at the end
    own_parameters: bool = False
    statistics: dict[str, Any] = dataclasses.field(default_factory=dict)
    history: list[Any] = dataclasses.field(default_factory=list)

    def stats(self) -> dict[str, Any]:
        try:
            statistics = self.opt.statistics()
            self.history = self.opt.round_history()
        except Exception:   # the optimizer is closing: its last statistics stand
            return self.statistics
        try:
            trio_node = self.node.trio_node
            averaging = self.node.portal.run_sync(lambda: trio_node.allreduce.statistics())
            statistics.update({key: getattr(averaging, key) for key in PARTS_KEYS})
        except Exception:   # the node is closing: its last counts stand
            statistics.update({key: self.statistics.get(key, 0) for key in PARTS_KEYS})
        self.statistics = statistics
        return self.statistics


def _digest(model: torch.nn.Module) -> bytes:
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    return hashlib.sha256(flat.numpy().tobytes()).digest()


def churn_run(config: ChurnConfig, task: RegressionTask | None = None) -> ChurnOutcome:
    """Train a swarm of ``config.peers`` through ``config.kills`` kills (see the module)."""
    task = task or RegressionTask(seed=config.seed)
    rnd = random.Random(config.seed)
    started = time.monotonic()
    deadline = started + config.seconds
    run_id = f"churn-{config.seed}-{rnd.randrange(1 << 30)}"
    lock = threading.Lock()
    current: dict[int, _Peer] = {}
    generations: list[_Peer] = []
    stop = threading.Event()
    end_epoch: list[int | None] = [None]
    errors: list[BaseException] = []
    losses: dict[int, float] = {}
    first_node = Node(listen=list(LOOPBACK))
    bootstrap = first_node.addrs[:1]
    go = threading.Event()   # the first generation trains once all see each other

    def start_peer(slot: int, generation: int, node: Node | None = None) -> _Peer:
        node = node or Node(listen=list(LOOPBACK), initial_peers=bootstrap)
        # Generation 0 starts from the swarm's common initialisation; a
        # replacement from its own: only a download makes it the swarm's.
        model = task.build_model(seed=0 if generation == 0 else 1000 * slot + generation)
        opt = Optimizer(node=node, run_id=run_id,
                        optimizer=torch.optim.AdamW(model.parameters(), lr=config.lr),
                        target_batch_size=config.target_batch_size,
                        batch_size_per_step=task.batch_size, **dict(config.options))
        peer = _Peer(slot, generation, node, model, opt, time.monotonic())
        with lock:
            current[slot] = peer
            generations.append(peer)
        return peer

    def train(peer: _Peer) -> None:
        batches = task.batches(1000 * peer.slot + peer.generation)
        try:
            while not stop.is_set() and not peer.killed.is_set():
                target = end_epoch[0]
                epoch = peer.opt.local_epoch
                if target is not None and epoch >= target:
                    _settle(peer.opt, deadline)
                    break
                if time.monotonic() > deadline:
                    break
                task.loss(peer.model, next(batches)).backward()
                peer.opt.step()
                peer.opt.zero_grad()
                if peer.slot == 0 and peer.opt.local_epoch not in losses:
                    losses[peer.opt.local_epoch] = task.held_out_mse(peer.model)
                if peer.generation and peer.caught_up_at is None:
                    s = peer.stats()
                    if s.get("state_syncs", 0) + s.get("merges", 0) + s.get("repairs", 0) > 0:
                        peer.caught_up_at = time.monotonic()
                    elif peer.opt.local_epoch > 0:
                        peer.own_parameters = True   # an epoch of the swarm's, no download
        except P2PDLError as exc:
            if not peer.killed.is_set():
                logger.warning("churn: peer %d.%d failed: %s", peer.slot, peer.generation, exc)
                errors.append(exc)
        except BaseException as exc:
            if not peer.killed.is_set():
                errors.append(exc)
                raise
        finally:
            peer.stats()
            peer.done.set()

    def slot_loop(slot: int) -> None:
        generation = 0
        node: Node | None = first_node if slot == 0 else None
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                peer = start_peer(slot, generation, node)
            except P2PDLError as exc:
                logger.warning("churn: slot %d could not start: %s", slot, exc)
                time.sleep(0.5)
                continue
            node = None
            go.wait(max(0.0, deadline - time.monotonic()))
            train(peer)
            if not peer.killed.is_set():
                break   # the run ended for this peer
            _close(peer)
            generation += 1

    # The first peer's rounds, timed as they end (for the gaps after kills).
    averaged_at: list[float] = []

    def watch_first() -> None:
        seen = 0
        while not stop.is_set():
            peer = current.get(0)
            if peer is not None:
                try:
                    history = peer.opt.round_history()
                except RuntimeError:   # appended to while copied: look again
                    continue
                for info in history[seen:]:
                    if info.outcome == "averaged":
                        averaged_at.append(time.monotonic())
                seen = len(history)
            time.sleep(POLL)

    threads = [threading.Thread(target=slot_loop, args=(i,), name=f"churn-slot-{i}",
                                daemon=True) for i in range(config.peers)]
    watcher = threading.Thread(target=watch_first, name="churn-watch", daemon=True)
    kills: list[tuple[float, str, int, bool]] = []
    try:
        for thread in threads:
            thread.start()
        watcher.start()
        _wait_for(lambda: len(current) == config.peers and all(
            p.opt.global_progress().num_peers >= config.peers for p in list(current.values())),
            min(30.0, config.seconds))
        go.set()
        next_kill = time.monotonic() + config.first_kill
        for k in range(config.kills):
            kind = config.kinds[k % len(config.kinds)]
            while time.monotonic() < next_kill and not errors:
                time.sleep(POLL)
            if errors or time.monotonic() > deadline:
                break
            victim, caught = _choose(kind, current, lock, rnd)
            if victim is None:
                continue
            victim.killed_at = time.monotonic()
            victim.killed.set()
            kills.append((time.monotonic() - started, kind, victim.slot, caught))
            logger.info("churn: killing peer %d.%d (%s)", victim.slot, victim.generation, kind)
            victim.node.shutdown()
            next_kill = time.monotonic() + config.kill_every
        # Settle: once every replacement has caught up (at most JOIN_PATIENCE s),
        # every live peer trains to the first peer's epoch + settle_epochs.
        _wait_for(lambda: not errors and all(
            p.generation == 0 or p.caught_up_at is not None for p in list(current.values())),
            min(JOIN_PATIENCE, max(0.0, deadline - time.monotonic())))
        first = current[0]
        end_epoch[0] = max(first.opt.local_epoch + config.settle_epochs, config.min_epochs)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()) + 5.0)
    finally:
        go.set()
        stop.set()
        for peer in list(current.values()):
            peer.killed.set()
        watcher.join(5.0)
        live = [current[s] for s in sorted(current)]
        finals = [(p.opt.local_epoch, _digest(p.model)) for p in live]
        final_slots = [p.slot for p in live]
        loss = task.held_out_mse(current[0].model) if 0 in current else float("nan")
        for peer in live:
            peer.stats()
            _close(peer)
        for thread in threads:
            thread.join(10.0)
    if errors:
        raise errors[0]
    target = end_epoch[0] or 0
    at_end = {digest for epoch, digest in finals if epoch == target}
    behind = sum(1 for epoch, _ in finals if epoch != target)
    joiners = [g for g in generations if g.generation > 0]
    gaps = []
    for at, *_ in kills:
        later = [t for t in averaged_at if t > started + at]
        gaps.append((later[0] if later else time.monotonic()) - (started + at))
    rounds: dict[str, int] = {}
    state: dict[str, int] = {}
    for g in generations:
        for key in ("averaged", "partial", "alone", "failed"):
            rounds[key] = rounds.get(key, 0) + int(g.statistics.get(key, 0))
        for key in ("state_syncs", "state_sync_failures", "merges", "repairs",
                    "consistency_checks", "stale_batches", *PARTS_KEYS):
            state[key] = state.get(key, 0) + int(g.statistics.get(key, 0))
    return ChurnOutcome(
        end_epoch=target, loss=loss, untrained_loss=task.held_out_mse(task.build_model(0)),
        losses=dict(sorted(losses.items())),
        distinct_states_at_end=len(at_end) + behind, peers_at_end=len(live),
        kills=kills,
        join_catch_up_s=[g.caught_up_at - g.started for g in joiners
                         if g.caught_up_at is not None],
        joiners_on_own_parameters=sum(1 for g in joiners if g.own_parameters),
        joiners_not_caught_up=sum(1 for g in joiners
                                  if g.caught_up_at is None and g.killed_at is None),
        seconds_without_an_averaged_round_after_a_kill=gaps, rounds=rounds, state=state,
        seconds=time.monotonic() - started,
        peers=[{"slot": g.slot, "generation": g.generation, "started": g.started - started,
                "caught_up": None if g.caught_up_at is None else g.caught_up_at - started,
                "killed": None if g.killed_at is None else g.killed_at - started,
                "own_parameters": g.own_parameters, "statistics": dict(g.statistics),
                "rounds": [(i.epoch, i.outcome, i.group_size) for i in g.history]}
               for g in generations],
        finals=[(slot, epoch, digest.hex()[:8])
                for slot, (epoch, digest) in zip(final_slots, finals, strict=True)])


def _choose(kind: str, current: dict[int, _Peer], lock: threading.Lock,
            rnd: random.Random) -> tuple[_Peer | None, bool]:
    """The victim of a kill of ``kind`` once its moment came, and whether it came
    (after KILL_PATIENCE s a random victim is killed anyway)."""
    def candidates() -> list[_Peer]:
        with lock:
            return [p for s, p in sorted(current.items()) if s != 0 and not p.killed.is_set()]

    until = time.monotonic() + KILL_PATIENCE
    if kind == "plain":
        peers = candidates()
        return (rnd.choice(peers) if peers else None), True
    while time.monotonic() < until:
        peers = candidates()
        rnd.shuffle(peers)
        for peer in peers:
            try:
                if kind == "mid_round" and _allreduce_active(peer.node):
                    return peer, True
                if kind == "download" and _downloading(peer.node):
                    others = [p for p in peers if p is not peer]
                    if others:
                        return rnd.choice(others), True
            except P2PDLError:
                continue
        time.sleep(POLL / 4)
    peers = candidates()
    return (rnd.choice(peers) if peers else None), False


def _allreduce_active(node: Node) -> bool:
    trio_node = node.trio_node
    return node.portal.run_sync(lambda: trio_node.allreduce.statistics().active) > 0


def _downloading(node: Node) -> bool:
    trio_node = node.trio_node
    return bool(node.portal.run_sync(lambda: trio_node.statesync.statistics().fetching))


def _settle(opt: Optimizer, deadline: float) -> None:
    """At the end epoch: finish the consistency check a step would run next (after a
    partial round, or on a state nobody confirmed yet), since no step follows."""
    keeper = opt.state_keeper
    if keeper.unconfirmed:   # offered after the next step, which does not come: now
        keeper.unconfirmed = False
        keeper.share(force=True)
        keeper.mark_suspect()
    until = min(deadline, time.monotonic() + SETTLE_CHECKS)
    while keeper.suspect and time.monotonic() < until:
        if keeper.check_due() and keeper.check_consistency(opt._tracker):
            opt._took_state()
        time.sleep(POLL)


def _close(peer: _Peer) -> None:
    try:
        peer.opt.close()
    except Exception:   # its node is gone
        pass
    peer.node.shutdown()


def _wait_for(predicate: Any, timeout: float) -> bool:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        try:
            if predicate():
                return True
        except P2PDLError:
            pass
        time.sleep(0.05)
    return False
