"""``collaborate(trainer, node=..., run_id=..., target_batch_size=...)``.

What it does to the ``transformers.Trainer``:

* **The optimizer.**  The Trainer's own (``trainer.create_optimizer()``: the
  optimizer its arguments choose, AdamW with weight decay by default, or the
  one passed with ``optimizers=``) is wrapped in a :class:`p2pdl.Optimizer`,
  which becomes ``trainer.optimizer``.  Each optimizer step of the Trainer
  counts ``per_device_train_batch_size x gradient_accumulation_steps``
  samples (the Trainer steps once per accumulation cycle); the model's
  persistent buffers train with the parameters (``model=``).
* **The LR schedule** follows global epochs, not the Trainer's own steps
  (peers take different numbers of them): with ``epochs=N`` the Trainer's
  ``lr_scheduler_type``, ``warmup_steps``/``warmup_ratio`` and
  ``lr_scheduler_kwargs`` make a schedule over N global epochs, which p2pdl
  steps once per global epoch and keeps in the shared state; without it the
  learning rate stays the Trainer's ``learning_rate``.  ``trainer.lr_scheduler``
  becomes an :class:`EpochSchedule`, whose ``step`` (called by the Trainer
  after each of its optimizer steps) does nothing.
* **The end**: with ``epochs=N`` the training stops once the model took N
  global steps (every peer at the same epoch, with the same parameters).
* **The logs**: :class:`CollaborationCallback` adds the run's progress to
  every log record (``p2pdl_epoch``, ``p2pdl_peers``, ``p2pdl_samples``,
  ``p2pdl_target``, ``p2pdl_rounds_averaged``), before the Trainer's printer
  and reporters see it, and into ``trainer.state.log_history``.

Mixed precision (``fp16=True``/``bf16=True``) works as with any optimizer: the
Trainer's scaler unscales the gradients before ``step`` and skips a step
whose gradients overflowed (that batch counts nothing).  Close the returned
optimizer when done (``opt.close()``, or ``with``).
"""

from __future__ import annotations

import logging
from typing import Any

from transformers import Trainer, TrainerCallback, get_scheduler

from ..errors import ConfigError
from ..training import Optimizer

__all__ = ["CollaborationCallback", "EpochSchedule", "collaborate"]

logger = logging.getLogger(__name__)


class EpochSchedule:
    """The Trainer's ``lr_scheduler`` once collaborative: ``step`` does nothing
    (p2pdl steps the real schedule once per global epoch), ``get_last_lr``
    reads the learning rates the optimizer steps with, and the state is the
    optimizer's (its ``state_dict`` holds the schedule's)."""

    def __init__(self, optimizer: Optimizer) -> None:
        self.optimizer = optimizer

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: schedules follow global epochs."""

    def get_last_lr(self) -> list[float]:
        return [float(group["lr"]) for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing: the schedule's state comes with the optimizer's."""


class CollaborationCallback(TrainerCallback):
    """Adds the run's progress to the Trainer's log records, and stops the
    training once the model took ``epochs`` global steps (None: never)."""

    def __init__(self, optimizer: Optimizer, epochs: int | None = None) -> None:
        self.optimizer = optimizer
        self.epochs = epochs

    def progress(self) -> dict[str, int]:
        """The fields added to each log record."""
        opt = self.optimizer
        seen = opt.global_progress()
        return {"p2pdl_epoch": opt.local_epoch, "p2pdl_peers": seen.num_peers,
                "p2pdl_samples": seen.samples_accumulated,
                "p2pdl_target": seen.target_batch_size,
                "p2pdl_rounds_averaged": opt.statistics()["averaged"]}

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.epochs is not None and self.optimizer.local_epoch >= self.epochs:
            control.should_training_stop = True

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if logs is None:
            return
        fields = self.progress()
        logs.update(fields)
        if state.log_history:   # the record the Trainer just appended (a copy of logs)
            state.log_history[-1].update(fields)


def collaborate(trainer: Trainer, *, node: Any, run_id: str, target_batch_size: int,
                epochs: int | None = None, **options: Any) -> Optimizer:
    """Make ``trainer`` train with the swarm; returns the :class:`p2pdl.Optimizer`.

    Call it after building the Trainer and before ``trainer.train()``.

    Args:
        trainer: a ``transformers.Trainer`` (or a subclass) that has not
            trained yet, on one process (no ``torch.distributed``).
        node: a running :class:`p2pdl.Node`.
        run_id: the collaboration's name.
        target_batch_size: samples the swarm processes per global epoch.
        epochs: the run's length in global epochs: the Trainer's LR
            schedule spans them, and training stops once the model took
            that many global steps (``max_steps`` and ``num_train_epochs``
            still bound the Trainer's own steps).  None: a constant learning
            rate, and the Trainer's own bounds alone.
        options: :class:`~p2pdl.training.OptimizerConfig` fields (``mode``,
            ``delay_updates``, ``checkpoint_dir``, ...).

    Raises :class:`~p2pdl.ConfigError` for a Trainer that cannot be made
    collaborative (distributed, or already collaborative) and for invalid
    options.
    """
    if not isinstance(trainer, Trainer):
        raise ConfigError(f"collaborate() takes a transformers.Trainer, got "
                          f"{type(trainer).__name__}")
    args = trainer.args
    if getattr(args, "world_size", 1) != 1:
        raise ConfigError("collaborate(): one Trainer process per peer (world_size 1); "
                          "the swarm is the data parallelism")
    if isinstance(trainer.optimizer, Optimizer) or any(
            isinstance(c, CollaborationCallback) for c in trainer.callback_handler.callbacks):
        raise ConfigError("collaborate(): this Trainer is collaborative already")
    if trainer.lr_scheduler is not None:
        raise ConfigError("collaborate(): the Trainer has an LR scheduler of its own (from "
                          "optimizers=); pass epochs= and its arguments set the schedule")
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int)
                               or epochs < 1):
        raise ConfigError(f"epochs must be None or an integer >= 1, got {epochs!r}")
    inner = trainer.optimizer if trainer.optimizer is not None else trainer.create_optimizer()
    scheduler = None
    if epochs is not None:
        scheduler = get_scheduler(args.lr_scheduler_type, optimizer=inner,
                                  num_warmup_steps=args.get_warmup_steps(epochs),
                                  num_training_steps=epochs,
                                  scheduler_specific_kwargs=args.lr_scheduler_kwargs or {})
    samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
    opt = Optimizer(node=node, run_id=run_id, optimizer=inner,
                    target_batch_size=target_batch_size, batch_size_per_step=samples,
                    scheduler=scheduler, model=trainer.model, **options)
    trainer.optimizer = opt
    trainer.lr_scheduler = EpochSchedule(opt)
    # First, so that the printer and the reporters see the fields it adds.
    trainer.callback_handler.callbacks.insert(0, CollaborationCallback(opt, epochs))
    logger.info("run %s: the Trainer trains with the swarm (%d samples per step, target %d)",
                run_id, samples, target_batch_size)
    return opt
