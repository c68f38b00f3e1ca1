"""Hugging Face integration: a ``transformers.Trainer`` that trains with the swarm.

``pip install p2pdl[hf]`` installs ``transformers`` and ``accelerate``; this
package imports them only when it is imported.

Modules:

* ``_trainer`` -- :func:`collaborate`: one call between building a
  ``Trainer`` and ``trainer.train()`` wraps its optimizer in a
  :class:`p2pdl.Optimizer`, hands its LR schedule to p2pdl (stepped once per
  global epoch), and adds :class:`CollaborationCallback`, which puts the
  run's progress into the Trainer's logs.
"""

from ._trainer import CollaborationCallback as CollaborationCallback
from ._trainer import EpochSchedule as EpochSchedule
from ._trainer import collaborate as collaborate

__all__ = ["CollaborationCallback", "EpochSchedule", "collaborate"]
