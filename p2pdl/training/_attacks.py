"""Members that misbehave on purpose, with the real protocols: each wraps a
member's real :class:`Optimizer` and is driven by the same training loop
(``loss.backward(); attacker.step(); attacker.zero_grad()``).

They show what an admitted but malicious member can try, and what stops
it is the honest peers' bookkeeping (progress quorum and role caps, the
all-reduce's robust rule, evidence, share caps and verification, the state
donors' vote).  ``p2pdl train --attack KIND`` and ``p2pdl demo --attacker
KIND`` run them (:data:`ATTACKS`); ``p2pdl.testing`` re-exports them for
tests and simulations.

* :class:`GradientScaler` -- its gradients times ``scale`` (``sign_flip``:
  -1; ``scale``: -20), at an honest weight.
* :class:`GaussianNoise` -- noise 1000 times its gradients' size added.
* :class:`WeightInflater` -- flipped gradients, and ``2**31`` samples
  claimed in the step that completes the swarm's batch.
* :class:`ALIE` -- "a little is enough": its own gradients' mean minus 1.5
  standard deviations, inside the honest spread.
* :class:`LyingReducer` -- honest values; as a reducer, its part's result
  shifted by 10.
* :class:`EpochLiar` -- a far newer epoch in every progress report and a
  poisoned state offered at it.

Only :class:`LyingReducer` changes the client itself (its node's reducer
class); the others use nothing but what any member's program can do with
the public API.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from ._optimizer import Optimizer
from .config import MAX_STEP_SAMPLES

__all__ = ["GradientScaler", "GaussianNoise", "WeightInflater", "ALIE", "LyingReducer",
           "Equivocator", "EpochLiar", "ATTACKS"]

logger = logging.getLogger(__name__)


class _Attacker:
    """What every attacker does as its optimizer does: the training loop's
    ``zero_grad``, ``local_epoch``, ``statistics`` and ``close``."""

    optimizer: Optimizer

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    @property
    def local_epoch(self) -> int:
        return self.optimizer.local_epoch

    def statistics(self) -> dict[str, Any]:
        return self.optimizer.statistics()

    def close(self) -> None:
        self.optimizer.close()

    def __getattr__(self, name: str) -> Any:
        """Everything else is the optimizer's (``global_progress``, ``last_round``...)."""
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)


class WeightInflater(_Attacker):
    """A member that claims a huge batch and sends flipped gradients.

    Args:
        optimizer: the member's :class:`p2pdl.Optimizer` (its own node, run, model).
        claimed_batch: the batch size claimed in the step that completes the
            swarm's batch (default ``2**31``, the most ``step`` accepts).
        scale: the gradients are multiplied by ``-scale`` before every step
            (1.0: flipped; 0: sends zeros).

    Timing, as a careful attacker would: every other step claims the real
    batch, so that the inflater is ready when the others are and lands in
    their group; the step after which the swarm's count (as its progress
    view sees it) reaches the target claims ``claimed_batch``.  That is the
    weight its all-reduce parts then declare.  Its progress report of that
    count is beyond any trainer's cap, so honest nodes drop it (and flag it).
    """

    def __init__(self, optimizer: Optimizer, *, claimed_batch: int = MAX_STEP_SAMPLES,
                 scale: float = 1.0) -> None:
        if not 1 <= claimed_batch <= MAX_STEP_SAMPLES:
            raise ValueError(f"claimed_batch must be in 1..{MAX_STEP_SAMPLES}")
        self.optimizer = optimizer
        self.claimed_batch = claimed_batch
        self.scale = float(scale)
        self.inflated_steps = 0
        self.inflated_epochs: list[int] = []   # the epochs whose round it claimed inflated

    def step(self, batch_size: int | None = None) -> bool:
        """Flip the gradients, claim the batch (inflated when the round is due), step."""
        opt = self.optimizer
        real = batch_size if batch_size is not None else opt.config.batch_size_per_step
        if real is None:
            raise ValueError("step() needs batch_size (or set batch_size_per_step)")
        with torch.no_grad():
            for group in opt.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(-self.scale)
        progress = opt.global_progress()
        due = progress.epoch <= opt.local_epoch and (
            progress.ready_to_step
            or progress.samples_accumulated + real >= progress.target_batch_size)
        claimed = self.claimed_batch if due else real
        if due:
            self.inflated_steps += 1
            if opt.local_epoch not in self.inflated_epochs:
                self.inflated_epochs.append(opt.local_epoch)
            logger.debug("weight inflater: claims %d samples at epoch %d", claimed,
                         opt.local_epoch)
        return opt.step(batch_size=claimed)

    def statistics(self) -> dict[str, Any]:
        """The optimizer's counters, ``inflated_steps`` and ``inflated_epochs``."""
        return {**self.optimizer.statistics(), "inflated_steps": self.inflated_steps,
                "inflated_epochs": list(self.inflated_epochs)}


class GradientScaler(_Attacker):
    """A member that sends its gradients multiplied by ``scale`` at an honest weight.

    What a robust aggregation rule is for: its weight is exactly its evidence,
    so only the values are wrong (``scale=-100``: flipped and a hundred times
    too large; ``-10``, ``100``...).
    """

    def __init__(self, optimizer: Optimizer, *, scale: float = -100.0) -> None:
        self.optimizer = optimizer
        self.scale = float(scale)

    def step(self, batch_size: int | None = None) -> bool:
        with torch.no_grad():
            for group in self.optimizer.optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(self.scale)
        return self.optimizer.step(batch_size=batch_size)


class EpochLiar(_Attacker):
    """A member that claims a far newer epoch and offers a poisoned state at it.

    Args:
        optimizer: the member's :class:`p2pdl.Optimizer`.
        claimed_epoch: the epoch it claims (default ``10**6``).
        from_epoch: it trains honestly until its optimizer reaches this
            epoch (0: it lies from its first step).  Lying once the swarm
            is established is the harder case for the others: they already
            hold each other's reports.
        poison_scale, seed: the poisoned parameters are
            ``poison_scale * N(0, 1)`` from a generator seeded with ``seed``
            (finite, the model's shapes and dtypes).

    Every :meth:`step`, once lying: the optimizer's state keeper is set to
    ``claimed_epoch`` and the poisoned parameters (again, whenever a step of
    its own moved them) and the state is offered through state sync
    (``state_keeper.share``); then the optimizer's own ``step`` reports the
    samples at that epoch.  Rounds it starts there find no group (nobody
    else is there), cost it ``matchmaking_time`` and move its epoch on by
    one (``on_failure``): it then claims that epoch (its reports never go
    back), still far beyond the others'.
    """

    def __init__(self, optimizer: Optimizer, *, claimed_epoch: int = 10**6,
                 from_epoch: int = 0, poison_scale: float = 1.0, seed: int = 666) -> None:
        if claimed_epoch < 1:
            raise ValueError("claimed_epoch must be at least 1")
        self.optimizer = optimizer
        self.claimed_epoch = claimed_epoch
        self.from_epoch = from_epoch
        self.poison_scale = float(poison_scale)
        self.seed = seed
        self.lying = False
        self.shares = 0
        self._lied_at = -1
        self.lied_epochs: list[int] = []   # the epochs it claimed (its reports' epochs)

    def poisoned_parameters(self) -> list[torch.Tensor]:
        """The parameters it offers: the same on every call."""
        generator = torch.Generator().manual_seed(self.seed)
        return [(torch.randn(p.shape, generator=generator) * self.poison_scale).to(p.dtype)
                for group in self.optimizer.optimizer.param_groups for p in group["params"]]

    def lie(self) -> None:
        """Take the claimed epoch and the poisoned parameters, and offer that state."""
        opt = self.optimizer
        params = [p for group in opt.optimizer.param_groups for p in group["params"]]
        with torch.no_grad():
            for p, value in zip(params, self.poisoned_parameters(), strict=True):
                p.copy_(value)
        # A round of its own (which finds nobody at the claimed epoch) moves it on
        # by one; epochs never go back in its reports, so it claims that one then.
        opt.state_keeper.epoch = max(self.claimed_epoch, opt.local_epoch)
        opt.state_keeper.share(force=True)
        self.shares += 1
        if opt.state_keeper.epoch not in self.lied_epochs:
            self.lied_epochs.append(opt.state_keeper.epoch)
        if not self.lying:
            logger.info("epoch liar: claims epoch %d and offers a poisoned state",
                        self.claimed_epoch)
        self.lying = True

    def step(self, batch_size: int | None = None) -> bool:
        """Step honestly before ``from_epoch``; then lie (:meth:`lie`) and step."""
        opt = self.optimizer
        if not self.lying and opt.local_epoch < self.from_epoch:
            return opt.step(batch_size=batch_size)
        if not self.lying or opt.local_epoch != self._lied_at:
            self.lie()
            self._lied_at = opt.local_epoch
        return opt.step(batch_size=batch_size)

    def statistics(self) -> dict[str, Any]:
        """The optimizer's counters, ``lying``, ``shares`` (poisoned states offered)
        and ``lied_epochs`` (the epochs it claimed)."""
        return {**self.optimizer.statistics(), "lying": self.lying, "shares": self.shares,
                "lied_epochs": list(self.lied_epochs)}


class GaussianNoise(_Attacker):
    """A member that adds Gaussian noise ``scale`` times its gradients' own
    root-mean-square to every gradient, at an honest weight."""

    def __init__(self, optimizer: Optimizer, *, scale: float = 1000.0, seed: int = 666) -> None:
        self.optimizer = optimizer
        self.scale = float(scale)
        self._generator = torch.Generator().manual_seed(seed)

    def step(self, batch_size: int | None = None) -> bool:
        with torch.no_grad():
            for p in _gradients(self.optimizer):
                rms = p.grad.float().pow(2).mean().sqrt()
                noise = torch.randn(p.grad.shape, generator=self._generator)
                p.grad.add_((noise * (self.scale * rms)).to(p.grad.dtype))
        return self.optimizer.step(batch_size=batch_size)


class ALIE(_Attacker):
    """"A little is enough" (Baruch et al., 2019) from what one member sees: it
    keeps an exponential mean and variance (``decay``) of each coordinate of
    its own gradients and sends ``mean - z * std``, a push against the
    descent direction that stays within the spread of honest gradients (so
    no robust rule can tell it from one), at an honest weight."""

    def __init__(self, optimizer: Optimizer, *, z: float = 1.5, decay: float = 0.9) -> None:
        self.optimizer = optimizer
        self.z = float(z)
        self.decay = float(decay)
        self._moments: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def step(self, batch_size: int | None = None) -> bool:
        d = self.decay
        with torch.no_grad():
            for i, p in enumerate(_gradients(self.optimizer)):
                g = p.grad.float()
                if i not in self._moments:
                    self._moments[i] = (g.clone(), torch.zeros_like(g))
                mean, var = self._moments[i]
                delta = g - mean
                mean.add_(delta, alpha=1 - d)
                var.mul_(d).add_(delta * (g - mean), alpha=1 - d)
                p.grad.copy_((mean - self.z * var.clamp(min=0).sqrt()).to(p.grad.dtype))
        return self.optimizer.step(batch_size=batch_size)


class LyingReducer(_Attacker):
    """A member that sends honest values and, as a reducer, returns its part
    shifted by ``shift``: each chunk is averaged honestly, then ``shift`` is
    added to every value (its own copy too), so every member receives the
    shifted part.  A modified client: it replaces the reducer class of its
    own node's all-reduce (``AllReduceService.part_reducer``), nothing more.
    Verification fails its part on every honest member, and the dispute
    proves it (``reducer_lie``)."""

    def __init__(self, optimizer: Optimizer, *, shift: float = 10.0) -> None:
        self.optimizer = optimizer
        self.shift = float(shift)
        _install_reducer(optimizer, _shifting_reducer(self.shift))

    def step(self, batch_size: int | None = None) -> bool:
        return self.optimizer.step(batch_size=batch_size)


class Equivocator(_Attacker):
    """A member that sends honest values and, as a reducer, averages its part
    honestly but sends one member (the lowest-indexed other contributor) a
    result with one value changed, under its own signature.  A modified
    client: it replaces the reducer class of its own node's all-reduce
    (``AllReduceService.part_reducer``).  The members compare their signed
    results after the round: every one that sees both drops the part and
    bans it (``equivocation``), and in a certificate run the proof travels
    to every member of the run."""

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer
        _install_reducer(optimizer, _equivocating_reducer())

    def step(self, batch_size: int | None = None) -> bool:
        return self.optimizer.step(batch_size=batch_size)


def _install_reducer(optimizer: Optimizer, reducer: type) -> None:
    """Make ``reducer`` the class of the reducers of ``optimizer``'s node."""
    node: Any = optimizer.node
    trio_node = getattr(node, "trio_node", node)
    portal = getattr(node, "portal", None)
    if portal is not None:
        portal.run_sync(lambda: setattr(trio_node.allreduce, "part_reducer", reducer))
    else:
        trio_node.allreduce.part_reducer = reducer


def _equivocating_reducer() -> type:
    from ..averaging import PartReducer

    class EquivocatingReducer(PartReducer):
        """A reducer whose first chunk, as sent to one member, has its first
        byte flipped (one value changed: the fp16 or float32 lowest bits)."""

        def _victim(self) -> int | None:
            others = sorted(self.receivers())
            return others[0] if others else None

        def payload_for(self, sender: int, k: int) -> bytes | memoryview:
            payload = super().payload_for(sender, k)
            if k != 0 or sender != self._victim() or not len(payload):
                return payload
            changed = bytearray(payload)
            changed[0] ^= 1
            return bytes(changed)

        def digest_for(self, sender: int) -> bytes:
            if sender != self._victim():
                return super().digest_for(sender)
            return self.digest_of([self.payload_for(sender, k)
                                   for k in range(len(self.payloads))])

    return EquivocatingReducer


def _shifting_reducer(shift: float) -> type:
    from ..averaging import PartReducer

    class ShiftingReducer(PartReducer):
        """A reducer that adds ``shift`` to every averaged value it sends."""

        def finalize(self) -> list[int]:
            done = super().finalize()
            for k in done:
                chunk = self.chunks[k]
                lo = chunk.start - chunk.part_start
                out = self.sum[lo:lo + chunk.count]
                out.add_(shift)
                self.payloads[k] = chunk.codec.encode(out)
            return done

    return ShiftingReducer


def _gradients(optimizer: Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters that hold a gradient."""
    return [p for group in optimizer.optimizer.param_groups for p in group["params"]
            if p.grad is not None]


#: ``p2pdl demo --attacker`` / ``p2pdl train --attack``: each kind of attack and
#: how it wraps a member's optimizer.
ATTACKS: dict[str, Callable[[Optimizer], Any]] = {
    "sign_flip": lambda opt: GradientScaler(opt, scale=-1.0),
    "scale": lambda opt: GradientScaler(opt, scale=-20.0),
    "noise": lambda opt: GaussianNoise(opt, scale=1000.0),
    "inflate": lambda opt: WeightInflater(opt),
    "alie": lambda opt: ALIE(opt, z=1.5),
    "lying_reducer": lambda opt: LyingReducer(opt, shift=10.0),
    "equivocate": lambda opt: Equivocator(opt),
    "epoch_liar": lambda opt: EpochLiar(opt, from_epoch=2),
}
