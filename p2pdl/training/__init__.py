"""Training layer: the PyTorch adapter over the layers below (docs/training.md).

Modules:

* ``config`` -- :class:`OptimizerConfig` (documented defaults).
* ``_optimizer`` -- :class:`Optimizer`: a torch optimizer that trains with the
  swarm (DeDLOC gradient averaging, delayed updates, DiLoCo outer steps,
  catch-up by state sync, consistency checks, checkpoints, LR schedulers).
* ``_example`` -- the built-in example task: a small transformer language
  model on the documentation text that ships with CPython (no downloads).
* ``_checkpoint`` -- atomic checkpoints (temp file, fsync, rename) and resuming.

State sync, which the Optimizer uses to catch up, is the package
``p2pdl.statesync``; its public names are re-exported here for old imports.
"""

from ..statesync import STATESYNC_PROTOCOL_ID as STATESYNC_PROTOCOL_ID
from ..statesync import StateDownload as StateDownload
from ..statesync import StateSyncConfig as StateSyncConfig
from ..statesync import StateSyncService as StateSyncService
from ._example import ExampleConfig as ExampleConfig
from ._example import ExampleTask as ExampleTask
from ._example import TinyTransformerLM as TinyTransformerLM
from ._example import count_parameters as count_parameters
from ._optimizer import Optimizer as Optimizer
from ._optimizer import RoundInfo as RoundInfo
from .config import OptimizerConfig as OptimizerConfig
