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
from p2pdl.averaging import AllReduceConfig
from p2pdl.testing import EpochLiar, WeightInflater, flagged
from p2pdl.training import ExampleConfig, ExampleTask, Optimizer

pytestmark = pytest.mark.timeout(240)

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]
SMALL = ExampleConfig(context_length=32, d_model=32, n_layers=1, n_heads=2, batch_size=8)
#: Epochs the honest peers train to in every scenario.
EPOCHS = 6
#: Held-out loss of the honest peers over the honest run's, at the same epoch: without a
#: weight inflater, noise only.  Measured here: honest 4-peer runs of EPOCHS epochs end
#: within 0.2 % of each other (4.627-4.637; which batches land in an epoch depends on
#: timing), and so do runs with a liar.
NOISE_BOUND = 1.02
#: With a weight inflater.  Its weight is capped at what its reports support, but its
#: flipped gradients still count at that weight (robust aggregation is not part of this),
#: and fully in the part its own node reduces (a reducer does not cap itself).  Measured
#: here: 1.00-1.07 with two honest peers, an inflater and a liar; the untrained model
#: is at 5.45 / 4.63 = 1.18.
ATTACK_BOUND = 1.10
TARGET = 64
#: The epoch of the others at which a ``late`` peer starts.
LATE_AT = 2
#: The run's all-reduce settings: the absolute slack on a sender's evidence is one batch,
#: not the default 64 samples, which is this small run's whole target batch (a sender
#: could then claim a whole epoch's worth beyond its reports).
ALLREDUCE = AllReduceConfig(weight_slack_samples=SMALL.batch_size)


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
    allreduce: list[dict[str, Any]]

    def honest(self) -> list[int]:
        return [i for i, r in enumerate(self.roles) if r in ("honest", "late")]

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
                     target_batch_size=TARGET, batch_size_per_step=SMALL.batch_size,
                     matchmaking_time=8.0, allreduce=ALLREDUCE)


def run_scenario(task: ExampleTask, roles: list[str], run_id: str, *, epochs: int = EPOCHS,
                 certificates: bool = False, seconds: float = 150.0) -> Outcome:
    """Train ``roles`` together until every honest peer reached ``epochs``; the attackers
    train until then too.

    Roles: ``honest``; ``late`` (honest, starts once the others reached epoch
    :data:`LATE_AT`, from other parameters: only a download can fix them);
    ``inflater`` (:class:`WeightInflater`); ``liar`` (:class:`EpochLiar` from epoch 1,
    once the swarm stepped together) and ``liar0`` (lying from its first step).
    """
    models = [task.build_model() for _ in roles]
    with swarm(len(roles), run_id, certificates=certificates) as nodes:
        opts: list[Optimizer | None] = [None if r == "late" else make_opt(n, m, run_id)
                                        for n, m, r in zip(nodes, models, roles, strict=True)]
        drivers: list[Any] = [None] * len(roles)

        def drive(i: int) -> Any:
            opt = opts[i]
            assert opt is not None
            if roles[i] == "inflater":
                return WeightInflater(opt)
            if roles[i] in ("liar", "liar0"):
                return EpochLiar(opt, from_epoch=1 if roles[i] == "liar" else 0)
            return opt

        for i in range(len(roles)):
            if opts[i] is not None:
                drivers[i] = drive(i)
        honest = [i for i, r in enumerate(roles) if r in ("honest", "late")]
        done = threading.Event()
        remaining = [len(honest)]
        lock = threading.Lock()
        deadline = time.monotonic() + seconds

        def epoch_of(i: int) -> int:
            opt = opts[i]
            return opt.local_epoch if opt is not None else 0

        def loop(i: int) -> None:
            try:
                if roles[i] == "late":
                    while min(epoch_of(j) for j in honest if j != i) < LATE_AT:
                        assert time.monotonic() < deadline, "the others never got going"
                        time.sleep(0.05)
                    with torch.no_grad():
                        for p in models[i].parameters():
                            p.add_(1.0)
                    opts[i] = make_opt(nodes[i], models[i], run_id)
                    drivers[i] = opts[i]
                batches = task.batches(i)
                while (epoch_of(i) < epochs) if i in honest else not done.is_set():
                    assert time.monotonic() < deadline, \
                        f"peer {i} ({roles[i]}) at epoch {epoch_of(i)} of {epochs}"
                    models[i].loss(next(batches)).backward()
                    drivers[i].step()
                    drivers[i].zero_grad()
            finally:
                if i in honest:
                    with lock:
                        remaining[0] -= 1
                        if remaining[0] == 0:
                            done.set()

        try:
            in_threads(*(lambda i=i: loop(i) for i in range(len(roles))))
            stats = [d.statistics() for d in drivers]
            flags = [flagged(n, run_id) for n in nodes]
            allreduce = [n.portal.run_sync(lambda n=n: n.trio_node.averaging.statistics())
                         for n in nodes]
            peer_ids = [n.peer_id.to_base58() for n in nodes]
        finally:
            for o in opts:
                if o is not None:
                    o.close()
    return Outcome(roles, [flat(m) for m in models], [epoch_of(i) for i in range(len(roles))],
                   [task.validation_loss(m) for m in models], stats, flags, peer_ids,
                   [dataclasses.asdict(a) for a in allreduce])


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
    assert not any(a["weights_capped"] for a in outcome.allreduce), outcome.allreduce
    return outcome


def check_honest_peers(outcome: Outcome, reference: Outcome | None = None,
                       bound: float = NOISE_BOUND) -> None:
    """Bit-identical honest peers at :data:`EPOCHS`, finite, and (against ``reference``)
    a held-out loss at most ``bound`` times the reference's."""
    honest = outcome.honest()
    first = outcome.params[honest[0]]
    assert all(torch.equal(first, outcome.params[i]) for i in honest[1:]), \
        ([outcome.losses[i] for i in honest], [outcome.stats[i] for i in honest])
    assert all(outcome.epochs[i] == EPOCHS for i in honest), outcome.epochs
    assert torch.isfinite(first).all()
    if reference is not None:
        loss, ref_loss = outcome.losses[honest[0]], reference.losses[0]
        assert loss <= ref_loss * bound, (loss, ref_loss, outcome.stats)


def check_inflater_capped(outcome: Outcome) -> None:
    inflater = outcome.of("inflater")
    assert outcome.stats[inflater]["inflated_steps"] >= 1
    # every honest reducer lowered its weight to its evidence, and flagged it
    assert outcome.flags_on("inflater").get("weight_beyond_evidence", 0) >= 1, outcome.flags
    assert all(outcome.allreduce[i]["weights_capped"] >= 1 for i in outcome.honest()), \
        outcome.allreduce


def check_liar_flagged(outcome: Outcome) -> None:
    liar = next(i for i, r in enumerate(outcome.roles) if r.startswith("liar"))
    assert outcome.stats[liar]["lying"] and outcome.epochs[liar] >= 10**6
    assert outcome.flags[liar] is not None
    target = outcome.peer_ids[liar]
    # every honest peer's progress caught it ahead of the quorum
    assert all(outcome.flags[i].get(target, {}).get("epoch_ahead", 0) >= 1
               for i in outcome.honest()), outcome.flags


def test_two_honest_peers_hold_against_an_inflater_and_a_liar(task, honest_run):
    outcome = run_scenario(task, ["honest", "honest", "inflater", "liar"], "mixed")
    check_honest_peers(outcome, honest_run, ATTACK_BOUND)
    check_inflater_capped(outcome)
    check_liar_flagged(outcome)


def test_a_late_joiner_takes_the_honest_state_not_the_liars(task, honest_run):
    """Three honest peers (one joining late, from other parameters) and a liar that offers
    a poisoned state at epoch 10**6: the joiner downloads the honest peers' state."""
    outcome = run_scenario(task, ["honest", "honest", "late", "liar"], "liar-late")
    check_honest_peers(outcome, honest_run)
    check_liar_flagged(outcome)
    late = outcome.of("late")
    assert outcome.stats[late]["state_syncs"] >= 1, outcome.stats[late]
    # its download voted the liar's offer out: past the quorum's epoch + 1
    assert outcome.flags[late][outcome.peer_ids[outcome.of("liar")]].get("state_lost_vote"), \
        outcome.flags[late]


def test_members_of_a_certificate_run_end_bit_identical(task):
    outcome = run_scenario(task, ["honest"] * 3, "closed", certificates=True)
    check_honest_peers(outcome)
    # under load a peer may miss a round and download the state instead
    assert sum(s["averaged"] for s in outcome.stats) >= 2 * EPOCHS, outcome.stats
    assert not any(outcome.flags), outcome.flags


@pytest.mark.slow
def test_three_honest_peers_and_an_inflater(task, honest_run):
    outcome = run_scenario(task, ["honest"] * 3 + ["inflater"], "inflater")
    check_honest_peers(outcome, honest_run, ATTACK_BOUND)
    check_inflater_capped(outcome)


@pytest.mark.slow
@pytest.mark.xfail(reason="a known hole: a peer that has just started and has heard only "
                          "the liar follows its epoch (docs/progress.md, the quorum's limits), "
                          "downloads its state as the lone donor's, and then, ahead of the "
                          "quorum, never syncs back", strict=False)
def test_a_liar_from_the_first_step(task, honest_run):
    """The liar claims epoch 10**6 before the honest peers have heard of each other."""
    outcome = run_scenario(task, ["honest"] * 3 + ["liar0"], "liar0")
    check_honest_peers(outcome, honest_run)
    check_liar_flagged(outcome)


@pytest.mark.slow
def test_an_inflater_and_a_liar_admitted_to_a_certificate_run(task, honest_run):
    outcome = run_scenario(task, ["honest", "honest", "inflater", "liar"], "closed-mixed",
                           certificates=True)
    check_honest_peers(outcome, honest_run, ATTACK_BOUND)
    check_inflater_capped(outcome)
    check_liar_flagged(outcome)
