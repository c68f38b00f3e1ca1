"""The two ways of training with the swarm: :class:`DeDLOCStrategy` and :class:`DiLoCoStrategy`.

A :class:`Strategy` says what happens to each batch, what a round averages,
how the average is applied, what a round that found no group leaves to apply,
and what it adds to the shared state.  Neither touches the network: the
:class:`~p2pdl.Optimizer` hands them tensors and gets tensors back.

* DeDLOC: each batch's gradients go into an accumulator, weighted by its
  samples; a round averages the mean gradients and the wrapped optimizer
  steps once with the average.
* DiLoCo: each batch is a local (inner) step; a round averages the parameter
  deltas since the last outer step, ``anchor - params``, and an outer
  Nesterov-momentum SGD step moves the anchor, where every peer goes on from.
  With ``delayed`` the inner steps go on while the round runs, and the outer
  step, once the round ends, moves them along with the anchor.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Protocol

import torch

from ..errors import ConfigError
from ._devices import to_device
from .config import ON_FAILURE, OptimizerConfig

__all__ = ["Strategy", "DeDLOCStrategy", "DiLoCoStrategy", "make_strategy", "check_like",
           "AUTO_MOMENTUM", "take_over_momentum", "split_fragments"]


class Strategy(Protocol):
    """What one mode does around a round.  Every method runs in the training thread."""

    def on_batch(self, samples: int) -> None:
        """The user's ``step()`` with a batch of ``samples`` (its gradients are in ``p.grad``)."""
        ...

    def reset(self) -> None:
        """Forget what was gathered towards the current epoch."""
        ...

    def round_tensors(self, samples: int, epoch: int = 0) -> list[torch.Tensor]:
        """What this peer averages in the round of ``epoch``, ``samples``
        having been counted since the last reset."""
        ...

    def on_failure(self, sent: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """What to apply when the round that was sent ``sent`` found no group (None: nothing)."""
        ...

    def apply(self, averaged: list[torch.Tensor] | None) -> None:
        """The global step with a round's result (None: the round is skipped)."""
        ...

    def extra_state(self) -> dict[str, list[torch.Tensor]] | None:
        """What this mode adds to the shared state (None: nothing)."""
        ...

    def check_extra_state(self, entry: Any) -> None:
        """Raise ConfigError unless ``entry`` (from a peer or a checkpoint) fits."""
        ...

    def load_extra_state(self, entry: Any) -> None:
        """Take ``entry``, already checked with :meth:`check_extra_state`."""
        ...

    def shared_params(self) -> list[torch.Tensor] | None:
        """The parameters the shared state holds (None: the live ones)."""
        ...

    def shares_optimizer_state(self) -> bool:
        """Whether the wrapped optimizer's state is the same on every peer of a
        round (DeDLOC: one step of the averaged gradients) and so part of the
        shared state; DiLoCo's inner optimizer runs on each peer's own batches."""
        ...


class DeDLOCStrategy:
    """Average the gradients of the global batch; one step of the wrapped optimizer per epoch.

    ``accumulators`` hold the sum of each batch's gradients times its samples
    (float32, made at the first batch with samples).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], *,
                 clip_grad_norm: float | None = None, on_failure: str = "local",
                 sent_momentum: float | str | None = None) -> None:
        _check_on_failure(on_failure)
        self._optimizer = optimizer
        self._params = list(params)
        self._clip_grad_norm = clip_grad_norm
        self._on_failure = on_failure
        #: "sgd" or "adam" when the wrapped optimizer's momentum was taken over
        #: (``sent_momentum="auto"``), else None
        self.taken_over: str | None = None
        if sent_momentum == AUTO_MOMENTUM:
            self.taken_over, sent_momentum = take_over_momentum(optimizer)
        self._sent_momentum: float | None = sent_momentum  # type: ignore[assignment]
        self.accumulators: list[torch.Tensor] | None = None
        #: this peer's own momentum of its mean gradients (``sent_momentum``):
        #: local, never part of the shared state
        self.momentum: list[torch.Tensor] | None = None
        #: rounds this momentum has taken in (for the Adam take-over's bias correction)
        self.momentum_rounds = 0

    def on_batch(self, samples: int) -> None:
        if samples == 0:
            return
        if self.accumulators is None:
            self.accumulators = [torch.zeros_like(p, dtype=torch.float32) for p in self._params]
        with torch.no_grad():
            for p, acc in zip(self._params, self.accumulators, strict=True):
                if p.grad is not None:
                    acc.add_(p.grad.to(torch.float32), alpha=float(samples))

    def reset(self) -> None:
        if self.accumulators is not None:
            for acc in self.accumulators:
                acc.zero_()

    def round_tensors(self, samples: int, epoch: int = 0) -> list[torch.Tensor]:
        """The mean gradients (zeros before any sample); with ``sent_momentum``
        ``beta``, this peer's momentum ``m = beta * m + mean`` instead."""
        if self.accumulators is None or samples == 0:
            mean = [torch.zeros_like(p, dtype=torch.float32) for p in self._params]
        else:
            mean = [acc / samples for acc in self.accumulators]
        if self._sent_momentum is None:
            return mean
        if self.taken_over is not None:
            self._keep_taken_over()
        beta = self._sent_momentum
        if self.momentum is None:
            self.momentum = [torch.zeros_like(g) for g in mean]
        self.momentum_rounds += 1
        if self.taken_over == "adam":
            # Adam's own first moment: m = beta m + (1 - beta) g, bias-corrected
            correction = 1.0 - beta ** self.momentum_rounds
            for m, g in zip(self.momentum, mean, strict=True):
                m.mul_(beta).add_(g, alpha=1.0 - beta)
            return [m / correction for m in self.momentum]
        for m, g in zip(self.momentum, mean, strict=True):
            m.mul_(beta).add_(g)
        return [m.clone() for m in self.momentum]

    def _keep_taken_over(self) -> None:
        """A scheduler that cycles momentum (OneCycleLR) writes it back into the
        wrapped optimizer: take its new value as this peer's and zero it again."""
        taken, beta = take_over_momentum(self._optimizer)
        if taken is not None and beta:
            self._sent_momentum = beta

    def on_failure(self, sent: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """``"local"``: step with this peer's own mean gradients; ``"skip"``: drop them."""
        return sent if self._on_failure == "local" else None

    def apply(self, averaged: list[torch.Tensor] | None) -> None:
        if averaged is None:
            return
        for p, g in zip(self._params, averaged, strict=True):
            p.grad = to_device(g, p)
        clip_gradients(self._params, self._clip_grad_norm)
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)

    def extra_state(self) -> None:
        return None

    def check_extra_state(self, entry: Any) -> None:
        """Nothing to check: the accumulators are this epoch's and never shared."""

    def load_extra_state(self, entry: Any) -> None:
        """Nothing to load."""

    def shared_params(self) -> None:
        """The live parameters: they are the shared ones after every global step."""
        return None

    def shares_optimizer_state(self) -> bool:
        return True


class DiLoCoStrategy:
    """Local inner steps; an outer Nesterov SGD step on the mean parameter delta per epoch.

    ``anchor`` holds the shared parameters of the last outer step, ``momentum``
    the outer momentum; both travel with the state (``{"anchor", "momentum"}``).
    The outer step: ``m = mu*m + d; anchor -= lr*(d + mu*m)``, then every
    parameter goes back to the anchor.

    ``fragments`` (Streaming DiLoCo): the parameter tensors fall into that
    many fragments of about equal size (:func:`split_fragments`); the round
    of epoch ``e`` averages fragment ``e % fragments`` alone, and its outer
    step moves that fragment's anchor, momentum and parameters; the others
    go on with their inner steps.

    ``delayed`` (``delay_updates``): the round of an epoch runs while the
    next epoch's inner steps go on from where this peer's parameters are
    (the **base**, kept when the delta is taken).  The outer step, once the
    round ends, moves the anchor as above and carries the inner steps taken
    since over to it: ``params = anchor + (params - base)``.  The next delta,
    ``anchor - params``, then holds every inner step since the base.  Costs
    one more copy of the round's parameters (the base) while a round runs.

    Every peer's anchor and momentum stay identical (they follow the
    averaged deltas alone).  With ``delayed`` or several fragments the live
    parameters hold this peer's own inner steps after an outer step, and the
    shared state holds the anchor as its parameters (:meth:`shared_params`).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], *,
                 outer_lr: float = 0.7, outer_momentum: float = 0.9,
                 clip_grad_norm: float | None = None, on_failure: str = "local",
                 delayed: bool = False, fragments: int = 1) -> None:
        _check_on_failure(on_failure)
        self._optimizer = optimizer
        self._params = list(params)
        self._outer_lr = outer_lr
        self._outer_momentum = outer_momentum
        self._clip_grad_norm = clip_grad_norm
        self._on_failure = on_failure
        self.delayed = delayed
        #: The tensors (indices into the parameters) of each fragment.
        self.fragments = split_fragments([p.numel() for p in self._params], fragments)
        self.anchor = [p.detach().clone() for p in self._params]
        self.momentum = [torch.zeros_like(p) for p in self._params]
        #: The parameters (by index) when the last delta was taken (``delayed`` only).
        self.base: dict[int, torch.Tensor] | None = None
        self._round = self.fragments[0]   # the tensors of the last delta taken

    def on_batch(self, samples: int) -> None:
        """One inner step (clipped); the samples only count towards the epoch."""
        clip_gradients(self._params, self._clip_grad_norm)
        self._optimizer.step()

    def reset(self) -> None:
        """Nothing: the delta is read from the parameters."""

    def fragment(self, epoch: int) -> list[int]:
        """The parameter tensors (indices) the round of ``epoch`` averages."""
        return self.fragments[epoch % len(self.fragments)]

    def round_tensors(self, samples: int, epoch: int = 0) -> list[torch.Tensor]:
        """The delta since the last outer step, ``anchor - params`` (float32), of
        the fragment of ``epoch``; ``delayed``: those parameters now become the base."""
        self._round = self.fragment(epoch)
        if self.delayed:
            with torch.no_grad():
                self.base = {i: self._params[i].detach().clone() for i in self._round}
        return [self.anchor[i] - self._params[i].detach().to(torch.float32)
                for i in self._round]

    def on_failure(self, sent: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """``"local"``: the outer step with this peer's own delta; ``"skip"``: none, so
        :meth:`apply` goes back to the last shared parameters."""
        return sent if self._on_failure == "local" else None

    def apply(self, averaged: list[torch.Tensor] | None) -> None:
        """The outer step of the last delta's fragment with the mean delta (None:
        its anchor unchanged); its parameters go back to the anchor, or
        (``delayed``) to the anchor plus the inner steps taken since the base."""
        mu, lr = self._outer_momentum, self._outer_lr
        base = self.base or {}
        with torch.no_grad():
            for k, i in enumerate(self._round):
                p, anchor, momentum = self._params[i], self.anchor[i], self.momentum[i]
                if averaged is not None:
                    d = to_device(averaged[k], anchor)
                    momentum.mul_(mu).add_(d)
                    anchor.sub_(d + mu * momentum, alpha=lr)
                if i in base:
                    p.sub_(base[i]).add_(anchor)
                else:
                    p.copy_(anchor)
        self.base = None

    def shared_params(self) -> list[torch.Tensor] | None:
        """The anchor where the live parameters hold this peer's own inner
        steps after an outer step (``delayed``, several fragments); else None:
        the live ones, which are the anchor after every outer step."""
        return list(self.anchor) if self.delayed or len(self.fragments) > 1 else None

    def shares_optimizer_state(self) -> bool:
        """No: the inner optimizer's state (AdamW's moments) is this peer's own."""
        return False

    def extra_state(self) -> dict[str, list[torch.Tensor]]:
        return {"anchor": list(self.anchor), "momentum": list(self.momentum)}

    def check_extra_state(self, entry: Any) -> None:
        if not isinstance(entry, dict):
            raise ConfigError("the state has no DiLoCo outer state")
        check_like(entry.get("anchor"), self.anchor, "DiLoCo anchor")
        check_like(entry.get("momentum"), self.momentum, "DiLoCo momentum")

    def load_extra_state(self, entry: Any) -> None:
        """Take the anchor and momentum; the inner steps since the base are dropped
        (the parameters were loaded, and a round in flight is dropped with them)."""
        with torch.no_grad():
            for a, value in zip(self.anchor, entry["anchor"], strict=True):
                a.copy_(value)
            for m, value in zip(self.momentum, entry["momentum"], strict=True):
                m.copy_(value)
        self.base = None


def split_fragments(sizes: Sequence[int], count: int) -> list[list[int]]:
    """The tensors (indices into ``sizes``, their element counts) of ``count``
    fragments of about equal size: largest tensor first (ties: the lower
    index), each to the fragment with the fewest elements so far (ties: the
    lower fragment); each fragment's indices in ascending order.  The same
    on every peer of the same model.  ConfigError if a fragment would be
    empty (more fragments than tensors)."""
    if count > len(sizes):
        raise ConfigError(f"fragments={count}, but the model has {len(sizes)} parameter "
                          f"tensors (each fragment needs one at least)")
    totals = [0] * count
    members: list[list[int]] = [[] for _ in range(count)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        f = min(range(count), key=lambda f: (totals[f], f))
        totals[f] += sizes[i]
        members[f].append(i)
    return [sorted(m) for m in members]


#: ``OptimizerConfig.sent_momentum`` that takes over the wrapped optimizer's momentum.
AUTO_MOMENTUM = "auto"


def take_over_momentum(optimizer: torch.optim.Optimizer) -> tuple[str | None, float | None]:
    """Move ``optimizer``'s momentum to the peer's side of the round (worker momentum).

    SGD with momentum ``mu`` (no dampening, not Nesterov): the peer sends
    ``m = mu m + g``, exactly SGD's buffer, and SGD's momentum is set to 0, so
    an honest swarm under the weighted mean steps as before (weight decay is
    added after averaging, not inside the momentum).  Adam and AdamW with
    ``betas = (b1, b2)``: the peer sends Adam's own bias-corrected first
    moment ``m = b1 m + (1 - b1) g``, and ``betas`` become ``(0, b2)``: the
    step is ``m / sqrt(v)`` as before, but ``v`` now follows the squares of
    the averaged moments.  Every group must agree (same kind, same value);
    otherwise, or for another optimizer, nothing is taken: ``(None, None)``.
    Returns the kind (``"sgd"`` or ``"adam"``) and the momentum taken; a
    momentum already 0 in the optimizer is taken as 0 (nothing to send).
    """
    groups = optimizer.param_groups
    if groups and all("betas" in g for g in groups):
        b1 = {float(g["betas"][0]) for g in groups}
        if len(b1) != 1 or not 0 <= next(iter(b1)) < 1:
            return None, None
        for g in groups:
            g["betas"] = (0.0, g["betas"][1])
        return "adam", next(iter(b1))
    if groups and all("momentum" in g for g in groups):
        mu = {float(g["momentum"]) for g in groups}
        if len(mu) != 1 or not 0 <= next(iter(mu)) < 1 \
                or any(g.get("nesterov") or g.get("dampening") for g in groups):
            return None, None
        for g in groups:
            g["momentum"] = 0.0
        return "sgd", next(iter(mu))
    return None, None


def make_strategy(config: OptimizerConfig, optimizer: torch.optim.Optimizer,
                  params: Sequence[torch.Tensor]) -> Strategy:
    """The strategy of ``config.mode`` over ``optimizer``'s ``params``."""
    if config.mode == "diloco":
        return DiLoCoStrategy(optimizer, params, outer_lr=config.outer_lr,
                              outer_momentum=config.outer_momentum,
                              clip_grad_norm=config.clip_grad_norm, on_failure=config.on_failure,
                              delayed=config.delay_updates, fragments=config.fragments)
    return DeDLOCStrategy(optimizer, params, clip_grad_norm=config.clip_grad_norm,
                          on_failure=config.on_failure, sent_momentum=config.sent_momentum)


def clip_total_norm(tensors: Sequence[torch.Tensor], max_norm: float | None) -> float:
    """Scale ``tensors`` in place so that their total norm is at most
    ``max_norm`` (None: leave them); the norm they had."""
    if not tensors:
        return 0.0
    norm = math.sqrt(math.fsum(float(torch.linalg.vector_norm(t.to(torch.float32))) ** 2
                               for t in tensors))
    if max_norm is not None and norm > max_norm:
        scale = max_norm / norm
        with torch.no_grad():
            for t in tensors:
                t.mul_(scale)
    return norm


def clip_gradients(params: Sequence[torch.Tensor], max_norm: float | None) -> None:
    """Clip the gradients of ``params`` to ``max_norm`` in total (None: leave them)."""
    if max_norm is not None:
        torch.nn.utils.clip_grad_norm_(params, max_norm)


def check_like(values: Any, reference: Sequence[torch.Tensor], what: str) -> None:
    """ConfigError unless ``values`` are finite float tensors shaped as ``reference``."""
    if not isinstance(values, (list, tuple)) or len(values) != len(reference):
        raise ConfigError(f"the state's {what} do not match this model "
                          f"({len(reference)} tensors expected)")
    for i, (value, ref) in enumerate(zip(values, reference, strict=True)):
        if not isinstance(value, torch.Tensor) or value.shape != ref.shape \
                or not value.is_floating_point() or not bool(torch.isfinite(value).all()):
            raise ConfigError(f"the state's {what} tensor {i} does not fit "
                              f"(expected finite {tuple(ref.shape)})")


def _check_on_failure(on_failure: str) -> None:
    if on_failure not in ON_FAILURE:
        raise ConfigError(f"on_failure must be one of {ON_FAILURE}, got {on_failure!r}")
