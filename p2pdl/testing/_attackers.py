"""Swarms with members that misbehave on purpose: :func:`train_swarm`,
:func:`loopback_swarm`, and :func:`flagged` to see what the honest nodes caught.

The attackers themselves (:class:`WeightInflater`, :class:`GradientScaler`,
:class:`GaussianNoise`, :class:`ALIE`, :class:`LyingReducer`,
:class:`EpochLiar`, ``ATTACKS``) live in ``p2pdl.training`` (``p2pdl train
--attack`` runs them) and are re-exported here.  Each wraps a real
:class:`p2pdl.Optimizer` on a real node, admitted to the run like any
member, and is driven by the same training loop.

* :func:`train_swarm` -- a whole scenario: sync nodes on loopback (optionally
  members of a certificate run made on the spot), one training thread per
  peer of the given roles on an example task, until the honest peers reach
  an epoch; returns a :class:`SwarmOutcome` (parameters, epochs, held-out
  losses, counters, flag books, all-reduce statistics and rounds per peer,
  and where each attacker's attack reached the honest peers).

Neither is a test double of p2pdl: both are clients of it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID

from .. import Authority, CertificateRun, Node, Role
from ..training import (
    ALIE,
    ATTACKS,
    EpochLiar,
    ExampleTask,
    GaussianNoise,
    GradientScaler,
    LyingReducer,
    Optimizer,
    RoundInfo,
    WeightInflater,
)
from ..training.config import MAX_STEP_SAMPLES
from ._swarm import LOOPBACK

__all__ = ["WeightInflater", "GradientScaler", "GaussianNoise", "ALIE", "LyingReducer",
           "EpochLiar", "ATTACKS", "flagged", "MAX_STEP_SAMPLES", "ROLES", "SwarmOutcome",
           "train_swarm", "loopback_swarm"]

logger = logging.getLogger(__name__)


def flagged(node: Any, run_id: str | None = None) -> dict[str, dict[str, int]]:
    """What ``node`` (a sync :class:`p2pdl.Node` or a trio node) caught: flag counts by kind
    of every flagged peer (base58 id), in ``run_id`` or in every run.

    A sync node's flag book is read on its own thread (through its portal).
    """
    portal = getattr(node, "portal", None)
    if portal is not None and hasattr(node, "trio_node"):
        trio_node = node.trio_node
        return portal.run_sync(lambda: trio_node.flags.flagged(run_id))
    return node.flags.flagged(run_id)


#: Seconds :func:`train_swarm` waits, at most, for its peers to see each other before training.
JOIN_BARRIER = 30.0

#: The roles :func:`train_swarm` knows.
ROLES = ("honest", "late", "inflater", "scaler", "liar", "liar0", "lying_reducer",
         "equivocate", "sign_flip", "scale", "noise", "alie")
#: The roles that corrupt the values they send every round (``p2pdl.training.ATTACKS``).
_VALUE_ROLES = ("inflater", "scaler", "sign_flip", "scale", "noise", "alie")


@dataclasses.dataclass
class SwarmOutcome:
    """What :func:`train_swarm` ended with, one entry per peer in the order of ``roles``.

    ``params``: the model's parameters, flat; ``epochs``: each optimizer's last
    epoch; ``losses``: the held-out loss (``task.validation_loss``); ``stats``:
    each driver's ``statistics()``; ``flags``: each node's flag book for the run
    (:func:`flagged`); ``allreduce``: each node's all-reduce statistics (a dict);
    ``bans``: each node's bans in force for the run (``Node.banned``);
    ``rounds``: each optimizer's ``round_history()``.

    :meth:`attack_rounds` says where each attacker's attack reached the honest
    peers; :meth:`unmounted` lists the attackers whose attack never did (a
    scenario with one tested nothing about it).
    """

    roles: list[str]
    params: list[torch.Tensor]
    epochs: list[int]
    losses: list[float]
    stats: list[dict[str, Any]]
    flags: list[dict[str, dict[str, int]]]
    peer_ids: list[str]
    allreduce: list[dict[str, Any]]
    seconds: float
    bans: list[dict[str, dict[str, object]]] = dataclasses.field(default_factory=list)
    rounds: list[list[RoundInfo]] = dataclasses.field(default_factory=list)

    def honest(self) -> list[int]:
        """The honest peers' indices (``late`` ones included)."""
        return [i for i, r in enumerate(self.roles) if r in ("honest", "late")]

    def of(self, role: str) -> int:
        return self.roles.index(role)

    def identical(self) -> bool:
        """Whether every honest peer ended with bit-identical parameters."""
        honest = self.honest()
        return all(torch.equal(self.params[honest[0]], self.params[i]) for i in honest[1:])

    def attackers(self) -> list[int]:
        """The attackers' indices."""
        return [i for i, r in enumerate(self.roles) if r not in ("honest", "late")]

    def rounds_with(self, index: int) -> list[int]:
        """The epochs of rounds in which some honest peer's part took peer ``index``'s
        values (it was a contributor in that peer's round: not excluded), sorted."""
        peer = self.peer_ids[index]
        return sorted({info.epoch for i in self.honest() if i != index
                       for info in self.rounds[i] if peer in info.contributors})

    def attack_rounds(self, index: int) -> list[int]:
        """The epochs in which attacker ``index``'s attack reached the honest peers.

        An inflater, a scaler or another attacker on values (``sign_flip``,
        ``scale``, ``noise``, ``alie``): every round in which an honest peer
        took its values (each sends corrupted gradients every round; the
        inflater also inflates its weight in its ``inflated_epochs``); a
        liar, whose attack is its reports and its offered state rather than
        values in a round: the epochs it claimed, once the honest peers heard
        the claim (they flagged it ``epoch_ahead``).  Empty: the attack was
        never mounted.  A lying reducer: the rounds in which an honest peer took
        its values, once an honest check proved its part a lie (``reducer_lie``);
        an equivocating one, once an honest peer proved it (``equivocation``).
        """
        role, stats = self.roles[index], self.stats[index]
        if role in _VALUE_ROLES:
            return self.rounds_with(index)
        if role in ("liar", "liar0"):
            heard = self.flags_on(index).get("epoch_ahead", 0) > 0
            return sorted(stats.get("lied_epochs", ())) if heard else []
        if role == "lying_reducer":   # its shifted part reached an honest peer's check
            caught = self.flags_on(index).get("reducer_lie", 0) > 0
            return self.rounds_with(index) if caught else []
        if role == "equivocate":   # two of its signed results reached honest peers
            caught = self.flags_on(index).get("equivocation", 0) > 0
            return self.rounds_with(index) if caught else []
        return []

    def unmounted(self) -> list[str]:
        """The attackers (``role#index``) whose attack reached no honest peer."""
        return [f"{self.roles[i]}#{i}" for i in self.attackers() if not self.attack_rounds(i)]

    def flags_on(self, index: int) -> dict[str, int]:
        """Every flag kind the honest peers raised against peer ``index``, summed."""
        out: dict[str, int] = {}
        for i in self.honest():
            for kind, count in self.flags[i].get(self.peer_ids[index], {}).items():
                out[kind] = out.get(kind, 0) + count
        return out


@contextlib.contextmanager
def loopback_swarm(count: int, run_id: str | None = None, *,
                   certificates: bool = False) -> Iterator[list[Node]]:
    """``count`` sync nodes on loopback, connected through the first; with
    ``certificates`` each is a trainer of a certificate run of ``run_id`` under an
    authority made here.  They shut down at the end of the block."""
    keys = [create_new_key_pair() for _ in range(count)]
    policies: list[list[CertificateRun]] = [[] for _ in range(count)]
    if certificates:
        if run_id is None:
            raise ValueError("a certificate run needs its run_id")
        authority = Authority.generate()
        for i, key in enumerate(keys):
            cert = authority.issue(run_id, ID.from_pubkey(key.public_key), Role.TRAINER,
                                   expires_in=86400)
            policies[i] = [CertificateRun(run_id, authority.id, cert)]
    nodes: list[Node] = []
    try:
        nodes.append(Node(listen=list(LOOPBACK), key_pair=keys[0], runs=policies[0]))
        for i in range(1, count):
            nodes.append(Node(listen=list(LOOPBACK), initial_peers=nodes[0].addrs[:1],
                              key_pair=keys[i], runs=policies[i]))
        for node in nodes[1:]:
            node.wait_for_peers(1)
        yield nodes
    finally:
        for node in nodes:
            node.shutdown()


def train_swarm(task: ExampleTask, roles: Sequence[str], run_id: str, *,
                make_optimizer: Callable[[Node, torch.nn.Module], Optimizer],
                epochs: int = 6, certificates: bool = False, late_at: int = 2,
                seconds: float = 150.0) -> SwarmOutcome:
    """Train peers of ``roles`` on ``task`` until every honest peer reached ``epochs``.

    ``make_optimizer(node, model)`` builds each peer's :class:`p2pdl.Optimizer`
    for ``run_id`` (the same settings for all).  Roles: ``honest``; ``late``
    (honest, starts once the others reached ``late_at``, from parameters
    shifted by 1.0: only a download can make it match); ``inflater``
    (:class:`WeightInflater`); ``scaler`` (:class:`GradientScaler`, -100);
    ``sign_flip``, ``scale``, ``noise``, ``alie``, ``equivocate`` (as
    ``p2pdl.training.ATTACKS`` makes them);
    ``liar`` (:class:`EpochLiar`, lying from epoch
    1, once the swarm has stepped together) and ``liar0`` (lying from its
    first step).  Training starts once every peer (but ``late``) counts all the
    others in its progress view (at most :data:`JOIN_BARRIER` seconds), so
    that nobody starts the swarm's epochs before an attacker has joined.
    The attackers train until the honest peers are done.  Each
    peer draws batches ``task.batches(i)``.  AssertionError if the honest peers
    do not get there within ``seconds``.
    """
    unknown = sorted(set(roles) - set(ROLES))
    if unknown:
        raise ValueError(f"unknown roles {unknown} (known: {ROLES})")
    roles = list(roles)
    started = time.monotonic()
    models = [task.build_model() for _ in roles]
    honest = [i for i, r in enumerate(roles) if r in ("honest", "late")]
    with loopback_swarm(len(roles), run_id, certificates=certificates) as nodes:
        opts: list[Optimizer | None] = [None] * len(roles)
        drivers: list[Any] = [None] * len(roles)

        def start(i: int) -> None:
            opt = opts[i] = make_optimizer(nodes[i], models[i])
            if roles[i] == "inflater":
                drivers[i] = WeightInflater(opt)
            elif roles[i] == "scaler":
                drivers[i] = GradientScaler(opt)
            elif roles[i] in ("liar", "liar0"):
                drivers[i] = EpochLiar(opt, from_epoch=1 if roles[i] == "liar" else 0)
            elif roles[i] == "lying_reducer":
                drivers[i] = LyingReducer(opt)
            elif roles[i] in ATTACKS:   # sign_flip, scale, noise, alie, equivocate
                drivers[i] = ATTACKS[roles[i]](opt)
            else:
                drivers[i] = opt

        for i, role in enumerate(roles):
            if role != "late":
                start(i)
        # Everyone (but the late joiner) trains from the moment all of them see each
        # other: a peer whose optimizer came up last would otherwise find the swarm
        # epochs ahead, and an attacker could miss every round (nothing tested).
        first = [i for i, role in enumerate(roles) if role != "late"]
        wait_until = time.monotonic() + min(JOIN_BARRIER, seconds)
        while time.monotonic() < wait_until and any(
                opts[i].global_progress().num_peers < len(first) for i in first):
            time.sleep(0.05)
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
                    while min(epoch_of(j) for j in honest if j != i) < late_at:
                        assert time.monotonic() < deadline, "the others never got going"
                        time.sleep(0.05)
                    with torch.no_grad():
                        for p in models[i].parameters():
                            p.add_(1.0)
                    start(i)
                batches = task.batches(i)
                while (epoch_of(i) < epochs) if i in honest else not done.is_set():
                    assert time.monotonic() < deadline, \
                        f"peer {i} ({roles[i]}) at epoch {epoch_of(i)} of {epochs} in time"
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
            with concurrent.futures.ThreadPoolExecutor(len(roles)) as pool:
                futures = [pool.submit(loop, i) for i in range(len(roles))]
                for future in futures:
                    future.result(timeout=seconds + 60)
            stats = [d.statistics() for d in drivers]
            flags = [flagged(n, run_id) for n in nodes]
            allreduce = [dataclasses.asdict(n.portal.run_sync(
                lambda n=n: n.trio_node.allreduce.statistics())) for n in nodes]
            peer_ids = [n.peer_id.to_base58() for n in nodes]
            bans = [n.banned(run_id) for n in nodes]
            rounds = [o.round_history() if o is not None else [] for o in opts]
        finally:
            done.set()
            for o in opts:
                if o is not None:
                    o.close()
    return SwarmOutcome(roles, [_flat(m) for m in models],
                        [epoch_of(i) for i in range(len(roles))],
                        [task.validation_loss(m) for m in models], stats, flags, peer_ids,
                        allreduce, time.monotonic() - started, bans, rounds)


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])
