"""One averaging round: form a group, then average with it.  The Optimizer's unit of work."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from .allreduce import AllReduceConfig, AllReduceResult, AllReduceService
    from .matchmaking import Group, MatchmakingService

from .matchmaking.config import MAX_RATE, MIN_RATE

__all__ = ["average_round"]


async def average_round(matchmaking: MatchmakingService, averaging: AllReduceService,
                        run_id: str, epoch: int, tensors: Sequence[torch.Tensor], *,
                        weight: float, config: AllReduceConfig | None = None,
                        inplace: bool = False, on_group: Callable[[Group], None] | None = None,
                        sent_error: bool = False, **group_options: Any) -> AllReduceResult:
    """Form a group for ``epoch`` of ``run_id`` and all-reduce ``tensors`` with it.

    ``group_options`` go to :meth:`MatchmakingService.form_group`
    (``target_group_size``, ``matchmaking_time``, ``auxiliary``,
    ``bandwidth``, ``reduce_rate``...: without them, what this node's rounds
    measured, :meth:`AllReduceService.capacity`); ``weight``,
    ``config``, ``inplace``
    and ``sent_error`` to :meth:`AllReduceService.all_reduce`; the aggregation rule and weight
    caps of ``config`` (or the node's) go to ``form_group`` too
    (``AllReduceConfig.aggregation_digest``), so that the group averages
    with one rule and one set of caps.  ``on_group(group)`` is called once
    the group formed, before the all-reduce starts (on the trio thread).  Raises
    :class:`~p2pdl.errors.MatchmakingFailedError` when no group formed.
    """
    group_options.setdefault("aggregation", (config or averaging.config).aggregation_digest())
    estimate = averaging.capacity()   # what this node's own rounds measured
    for option, measured in (("bandwidth", estimate.bandwidth),
                             ("reduce_rate", estimate.reduce)):
        if group_options.get(option) is None:   # (None before any sample: unknown)
            group_options[option] = None if measured is None \
                else min(max(measured, MIN_RATE), MAX_RATE)
    group = await matchmaking.form_group(run_id, epoch, **group_options)
    if on_group is not None:
        on_group(group)
    return await averaging.all_reduce(group, tensors, weight=weight, config=config,
                                      inplace=inplace, sent_error=sent_error)
