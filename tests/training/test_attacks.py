"""Admitted members that lie about themselves, end to end: the example task, real
p2pdl.Node peers on loopback, one training thread each (p2pdl.testing's attackers).

What must hold for the honest peers: they end bit-identical to each other, at
the epoch they trained to, with a held-out loss within noise of a run without
attackers, and the attackers are in their flag books.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

import p2pdl
from p2pdl.testing import EpochLiar, WeightInflater, flagged
from p2pdl.training import ExampleConfig, ExampleTask, Optimizer

pytestmark = pytest.mark.timeout(240)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
SMALL = ExampleConfig(context_length=32, d_model=32, n_layers=1, n_heads=2, batch_size=8)
#: Epochs the honest peers train to in every scenario.
EPOCHS = 6
#: The honest peers' held-out loss may exceed the honest run's at the same epoch by this
#: factor.  Measured here: honest 4-peer runs of EPOCHS epochs spread by ~1 % (different
#: batches land in each epoch depending on timing); the attacked runs stay within 3 %.
LOSS_BOUND = 1.05


@pytest.fixture(scope="module")
def task() -> ExampleTask:
    torch.set_num_threads(1)
    return ExampleTask(SMALL)


@dataclasses.dataclass
class Outcome:
    """What a scenario ended with: per peer, in the order of ``roles``."""

    roles: list[str]
    params: list[torch.Tensor]
    epochs: list[int]
    losses: list[float]
    stats: list[dict[str, Any]]
    flags: list[dict[str, dict[str, int]]]
    peer_ids: list[str]

    def honest(self) -> list[int]:
        return [i for i, r in enumerate(self.roles) if r == "honest"]

    def of(self, role: str) -> int:
        return self.roles.index(role)

    def flags_on(self, role: str) -> dict[str, int]:
        """Every flag kind the honest peers raised against the peer of ``role``, summed."""
        target = self.peer_ids[self.of(role)]
        out: dict[str, int] = {}
        for i in self.honest():
            for kind, count in self.flags[i].get(target, {}).items():
                out[kind] = out.get(kind, 0) + count
        return out


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@contextlib.contextmanager
def swarm(count: int, run_id: str, *, certificates: bool = False
          ) -> Iterator[list[p2pdl.Node]]:
    """``count`` nodes on loopback through the first; with ``certificates`` each is a
    member of a certificate run of ``run_id`` (an authority made here)."""
    keys = [create_new_key_pair() for _ in range(count)]
    policies: list[list[object]] = [[] for _ in range(count)]
    if certificates:
        authority = p2pdl.Authority.generate()
        for i, key in enumerate(keys):
            cert = authority.issue(run_id, ID.from_pubkey(key.public_key), p2pdl.Role.TRAINER,
                                   expires_in=3600)
            policies[i] = [p2pdl.CertificateRun(run_id, authority.id, cert)]
    nodes: list[p2pdl.Node] = []
    try:
        nodes.append(p2pdl.Node(listen=LOOPBACK, key_pair=keys[0], runs=policies[0]))
        for i in range(1, count):
            nodes.append(p2pdl.Node(listen=LOOPBACK, initial_peers=nodes[0].addrs[:1],
                                    key_pair=keys[i], runs=policies[i]))
        for node in nodes[1:]:
            node.wait_for_peers(1)
        yield nodes
    finally:
        for node in nodes:
            node.shutdown()


def make_opt(node: p2pdl.Node, model: torch.nn.Module, run_id: str) -> Optimizer:
    return Optimizer(node=node, run_id=run_id,
                     optimizer=torch.optim.AdamW(model.parameters(), lr=3e-3),
                     target_batch_size=64, batch_size_per_step=SMALL.batch_size,
                     matchmaking_time=8.0)


def run_scenario(task: ExampleTask, roles: list[str], run_id: str, *, epochs: int = EPOCHS,
                 certificates: bool = False, seconds: float = 150.0) -> Outcome:
    """Train ``roles`` (``honest``, ``inflater``, ``liar``) together until every honest
    peer reached ``epochs``; the attackers train until then too."""
    models = [task.build_model() for _ in roles]
    with swarm(len(roles), run_id, certificates=certificates) as nodes:
        opts = [make_opt(n, m, run_id) for n, m in zip(nodes, models, strict=True)]
        drivers: list[Any] = []
        for role, opt in zip(roles, opts, strict=True):
            if role == "inflater":
                drivers.append(WeightInflater(opt))
            elif role == "liar":
                # it lies once the swarm has stepped together (the others hold each
                # other's reports): see test_a_liar_from_the_start for the start
                drivers.append(EpochLiar(opt, from_epoch=1))
            elif role == "liar0":
                drivers.append(EpochLiar(opt, from_epoch=0))
            else:
                drivers.append(opt)
        honest_done = threading.Event()
        remaining = [sum(r == "honest" for r in roles)]
        lock = threading.Lock()
        deadline = time.monotonic() + seconds

        def loop(i: int) -> None:
            batches = task.batches(i)
            driver, honest = drivers[i], roles[i] == "honest"
            try:
                while (opts[i].local_epoch < epochs) if honest else not honest_done.is_set():
                    assert time.monotonic() < deadline, \
                        f"peer {i} ({roles[i]}) at epoch {opts[i].local_epoch} of {epochs}"
                    models[i].loss(next(batches)).backward()
                    driver.step()
                    driver.zero_grad()
            finally:
                if honest:
                    with lock:
                        remaining[0] -= 1
                        if remaining[0] == 0:
                            honest_done.set()

        try:
            in_threads(*(lambda i=i: loop(i) for i in range(len(roles))))
            stats = [d.statistics() for d in drivers]
            flags = [flagged(n, run_id) for n in nodes]
            peer_ids = [n.peer_id.to_base58() for n in nodes]
        finally:
            for o in opts:
                o.close()
    return Outcome(roles, [flat(m) for m in models], [o.local_epoch for o in opts],
                   [task.validation_loss(m) for m in models], stats, flags, peer_ids)


def in_threads(*calls: Callable[[], object]) -> list[object]:
    with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(call) for call in calls]
        return [f.result(timeout=200) for f in futures]


@pytest.fixture(scope="module")
def honest_run(task) -> Outcome:
    """Four honest peers: the reference every attacked run is held to."""
    outcome = run_scenario(task, ["honest"] * 4, "honest-reference")
    check_honest_peers(outcome)
    assert not any(outcome.flags), outcome.flags
    return outcome


def check_honest_peers(outcome: Outcome, reference: Outcome | None = None) -> None:
    honest = outcome.honest()
    first = outcome.params[honest[0]]
    assert all(torch.equal(first, outcome.params[i]) for i in honest[1:]), \
        [outcome.stats[i] for i in honest]
    assert all(outcome.epochs[i] == EPOCHS for i in honest), outcome.epochs
    assert all(torch.isfinite(outcome.params[i]).all() for i in honest)
    if reference is not None:
        ref_loss = reference.losses[0]
        loss = outcome.losses[honest[0]]
        assert loss <= ref_loss * LOSS_BOUND, (loss, ref_loss, outcome.stats)


def test_two_honest_peers_hold_against_an_inflater_and_a_liar(task, honest_run):
    outcome = run_scenario(task, ["honest", "honest", "inflater", "liar"], "mixed")
    check_honest_peers(outcome, honest_run)
    assert outcome.stats[outcome.of("inflater")]["inflated_steps"] >= 1
    assert outcome.stats[outcome.of("liar")]["lying"]
    assert outcome.flags_on("liar"), outcome.flags
    assert outcome.flags_on("inflater"), outcome.flags
